"""Token classification (named-entity recognition): CoNLL-style JSONL, BIO/BIOES tags, entity-level metrics.
Under construction: the objective's body lands in the next commits."""

from __future__ import annotations

from jaxformer.train.objectives import Objective


class TokenClassification(Objective):
    name, family = "token_classification", "encoder"

    def __init__(self, run, tokenizer):
        raise ValueError("train.objective='token_classification' is not built yet")
