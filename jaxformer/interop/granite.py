"""IBM Granite (``granite``, the Granite 3 dense decoders): config and tensor rules, both directions.

LLaMA's layers (RMSNorm, rotary positions, GQA, a SwiGLU MLP) under the multipliers of maximal-update
parametrisation (muP), each one number in the file:
- ``embedding_multiplier``: the token vectors times it (``embedding_multiplier``);
- ``residual_multiplier``: each sublayer's output times it as it joins the residual stream
  (``residual_multiplier``);
- ``attention_multiplier``: the softmax scale of q . k in place of head_dim ** -0.5 (``attention_scale``);
- ``logits_scaling``: the logits divided by it (``logits_divisor``).
``attention_bias`` puts biases on q, k, v and o alike; ``mlp_bias`` (biases on the three MLP matrices) is
refused, as for LLaMA.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.llama import DEFAULT_THETA, architecture, decoder_config, decoder_to_hf
from jaxformer.interop.llama import rules as llama_rules
from jaxformer.interop.rules import refuse, rope_from_hf

STEMS = {"granite": "Granite"}
# GraniteConfig's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"granite": dict(num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                            rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                            attention_dropout=0.0, mlp_bias=False, embedding_multiplier=1.0, logits_scaling=1.0,
                            residual_multiplier=1.0, attention_multiplier=1.0, pad_token_id=None, bos_token_id=1,
                            eos_token_id=2)}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(bool(hf["mlp_bias"]), "granite: mlp_bias=True (biases on gate_proj, up_proj and down_proj) is not "
           "supported: jaxformer's gated MLP has one input bias")
    fields = decoder_config(hf, model_type, arch, rope_from_hf(hf, DEFAULT_THETA))
    return {**fields, "embedding_multiplier": float(hf["embedding_multiplier"]),
            "residual_multiplier": float(hf["residual_multiplier"]),
            "attention_scale": float(hf["attention_multiplier"]), "logits_divisor": float(hf["logits_scaling"])}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    decoder_to_hf(cfg, out)
    out.update(attention_bias=cfg.biases.qkv, mlp_bias=False, embedding_multiplier=cfg.embeddings.multiplier,
               residual_multiplier=cfg.residual_multiplier, attention_multiplier=cfg.scale,
               logits_scaling=cfg.logits.divisor)


ARCHITECTURE = architecture(STEMS, config_from_hf, config_to_hf, llama_rules, defaults=DEFAULTS)
