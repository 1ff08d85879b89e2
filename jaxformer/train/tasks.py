"""Every training objective under its ``train.objective`` name: the language-model objectives and
sequence classification (objectives.py), token classification / NER (tagging.py), extractive
question answering (squad.py) and contrastive image-text training of a dual encoder (contrastive.py)."""

from __future__ import annotations

from jaxformer.train.contrastive import Contrastive
from jaxformer.train.objectives import (UL2, CausalLM, Classification, MaskedLM, Objective, PrefixLM,
                                        ReplacedTokenDetection, Seq2Seq, SentenceOrder, SpanCorruption)
from jaxformer.train.squad import QuestionAnswering
from jaxformer.train.tagging import TokenClassification

OBJECTIVES = {cls.name: cls for cls in (CausalLM, MaskedLM, SentenceOrder, ReplacedTokenDetection, SpanCorruption,
                                        Seq2Seq, Classification, PrefixLM, UL2, TokenClassification, QuestionAnswering,
                                        Contrastive)}


def make_objective(run, tokenizer) -> Objective:
    return OBJECTIVES[run.train.objective](run, tokenizer)
