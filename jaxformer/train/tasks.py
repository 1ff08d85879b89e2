"""Every training objective under its ``train.objective`` name: the language-model objectives and
sequence classification (objectives.py), token classification / NER (tagging.py), extractive
question answering (squad.py), contrastive image-text training of a dual encoder (contrastive.py) and questions
about pictures for a decoder that reads images (visual_qa.py), speech recognition for an encoder-decoder that
reads audio (transcription.py)."""

from __future__ import annotations

from jaxformer.train.contrastive import Contrastive
from jaxformer.train.objectives import (UL2, CausalLM, Classification, MaskedLM, Objective, PrefixLM,
                                        ReplacedTokenDetection, Seq2Seq, SentenceOrder, SpanCorruption)
from jaxformer.train.squad import QuestionAnswering
from jaxformer.train.tagging import TokenClassification
from jaxformer.train.transcription import Transcription
from jaxformer.train.visual_qa import VisualQA

OBJECTIVES = {cls.name: cls for cls in (CausalLM, MaskedLM, SentenceOrder, ReplacedTokenDetection, SpanCorruption,
                                        Seq2Seq, Classification, PrefixLM, UL2, TokenClassification, QuestionAnswering,
                                        Contrastive, VisualQA, Transcription)}


def make_objective(run, tokenizer) -> Objective:
    return OBJECTIVES[run.train.objective](run, tokenizer)
