"""Baidu's ERNIE 4.5 dense decoders (``ernie4_5``: ERNIE-4.5-0.3B): config and tensor rules, both directions.

LLaMA's layers and tensors (RMSNorm, SwiGLU, grouped-query attention with its own ``head_dim``) with GLM's
rotary layout over the whole head: each rotary pair is two adjacent numbers (``rope_interleave``), computed in
float32 as jaxformer always does. The head is tied by default. ``use_bias`` would put biases on every
projection, the three MLP matrices included, which jaxformer's gated MLP (one input bias) cannot hold: refused;
the published files leave it false.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.llama import architecture, decoder_config, decoder_to_hf
from jaxformer.interop.llama import rules as llama_rules
from jaxformer.interop.rules import refuse, rope_from_hf

STEMS = {"ernie4_5": "Ernie4_5"}
# Ernie4_5Config's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"ernie4_5": dict(num_key_value_heads=2, hidden_act="silu", max_position_embeddings=131072,
                             rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                             tie_word_embeddings=True, use_bias=False, head_dim=128)}
DEFAULT_THETA = 500000.0  # Ernie4_5Config's rotary base when a file gives none


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(bool(hf["use_bias"]), "ernie4_5: use_bias=True (biases on every projection, the MLP's gate_proj, "
           "up_proj and down_proj among them) is not supported: jaxformer's gated MLP has one input bias")
    fields = decoder_config(hf, model_type, arch, rope_from_hf(hf, DEFAULT_THETA))
    # ERNIE's one use_bias decides; LLaMA's attention_bias and mlp_bias are never read by transformers' ERNIE
    # and Ernie4_5Config sets attention_dropout to 0 whatever the file says
    return {**fields, "qkv_bias": False, "out_bias": False, "mlp_bias": False, "rope_interleave": True,
            "attention_dropout_rate": 0.0}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    decoder_to_hf(cfg, out)
    out["use_bias"] = False


ARCHITECTURE = architecture(STEMS, config_from_hf, config_to_hf, llama_rules, defaults=DEFAULTS)
