"""Hugging Face's SmolLM3 (``smollm3``): config and tensor rules, both directions.

LLaMA's layers and tensors, with rotary positions left out of some layers (NoPE): ``no_rope_layers`` says per
layer whether it rotates (1) or not (0), and a file without it has every ``no_rope_layer_interval``-th layer
unrotated (default 4: layers 3, 7, 11, ...), jaxformer's ``nope_layers``. The layers ``layer_types`` calls
'sliding_attention' see ``sliding_window`` keys (a file without it: the unrotated layers, when
``use_sliding_window`` and a window are given); as published, SmolLM3-3B attends in full everywhere.
``attention_bias`` puts biases on q, k, v and o; ``mlp_bias`` is refused, as for LLaMA.
"""

from __future__ import annotations

from typing import Any

from jaxformer.layer_plan import local_layers
from jaxformer.model_config import ModelConfig
from jaxformer.interop.llama import architecture, decoder_config, decoder_to_hf
from jaxformer.interop.llama import rules as llama_rules
from jaxformer.interop.rules import refuse, rope_from_hf

STEMS = {"smollm3": "SmolLM3"}
# SmolLM3Config's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"smollm3": dict(num_key_value_heads=4, hidden_act="silu", max_position_embeddings=32768,
                            rms_norm_eps=1e-6, pad_token_id=128004, bos_token_id=128000, eos_token_id=128001,
                            use_sliding_window=False, sliding_window=None, no_rope_layers=None,
                            no_rope_layer_interval=4, layer_types=None, attention_bias=False, attention_dropout=0.0,
                            mlp_bias=False, tie_word_embeddings=True)}
DEFAULT_THETA = 2e6  # SmolLM3Config's rotary base when a file gives none
KINDS = {"full_attention": "full", "sliding_attention": "sliding"}


def _layers(hf: dict) -> tuple[list[bool], list[str]]:
    """(does layer i rotate, 'full' or 'sliding') as SmolLM3Config derives them and SmolLM3Model masks them: a
    'sliding_attention' layer sees ``sliding_window`` keys whatever ``use_sliding_window`` says (it only picks
    the default ``layer_types``: the unrotated layers, when a window is given)."""
    layers, interval = hf["num_hidden_layers"], hf["no_rope_layer_interval"]
    rotary = [bool(r) for r in (hf["no_rope_layers"] or [(i + 1) % interval != 0 for i in range(layers)])]
    refuse(len(rotary) != layers, f"smollm3: no_rope_layers has {len(rotary)} entries for {layers} layers")
    window, use_window = hf["sliding_window"], hf["use_sliding_window"]  # both read, whichever decides
    types = hf["layer_types"] or ["sliding_attention" if use_window and window is not None and not r
                                  else "full_attention" for r in rotary]
    refuse(len(types) != layers or any(t not in KINDS for t in types), f"smollm3: layer_types {types} must give "
           f"each of the {layers} layers one of {sorted(KINDS)}")
    kinds = [KINDS[t] for t in types]
    refuse("sliding" in kinds and window is None, "smollm3: layer_types has sliding_attention layers but "
           "sliding_window is null")
    return rotary, kinds


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(bool(hf["mlp_bias"]), "smollm3: mlp_bias=True (biases on gate_proj, up_proj and down_proj) is not "
           "supported: jaxformer's gated MLP has one input bias")
    rotary, kinds = _layers(hf)
    fields = decoder_config(hf, model_type, arch, rope_from_hf(hf, DEFAULT_THETA))
    nope = tuple(i for i, r in enumerate(rotary) if not r)
    if "sliding" in kinds:
        window = int(hf["sliding_window"])
        fields.update(attention="sliding" if "full" not in kinds else "alternating", window_size=window,
                      layer_types=tuple(kinds) if "full" in kinds else None)
    return {**fields, "nope_layers": nope} if nope else fields


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    decoder_to_hf(cfg, out)
    nope = cfg.nope.layers if cfg.nope is not None else ()
    L = cfg.decoder_layers
    sliding = local_layers(cfg) if cfg.attention == "alternating" else (cfg.attention == "sliding",) * L
    out.update(attention_bias=cfg.biases.qkv, mlp_bias=False,
               no_rope_layers=[int(i not in nope) for i in range(L)],
               use_sliding_window=any(sliding), sliding_window=cfg.window_size,
               layer_types=["sliding_attention" if s else "full_attention" for s in sliding])


ARCHITECTURE = architecture(STEMS, config_from_hf, config_to_hf, llama_rules, defaults=DEFAULTS)
