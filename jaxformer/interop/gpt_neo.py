"""GPT-Neo (``gpt_neo``): GPT-3's alternating dense and banded (local) attention as EleutherAI replicated
it; config and tensor rules, both directions.

A GPT-2-shaped pre-norm block with learned positions, but unscaled attention scores (no 1 / sqrt(head_dim)),
no biases on q, k and v, plain Linear tensors, and per layer ``global`` or ``local`` attention, the local
layers seeing the ``window_size`` latest positions (key within window_size - 1 of the query). In jaxformer
that is ``attention='alternating'`` with ``layer_types`` (or 'causal' / 'sliding' when every layer agrees).
"""

from __future__ import annotations

from typing import Any

from jaxformer.layer_plan import local_layers
from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, attention, copy, linear,
                                     lm_head, norm, refuse)

CLASSES = {"gpt_neo": ("GPTNeoModel", "GPTNeoForCausalLM")}
# GPTNeoConfig's defaults, for a file that leaves them out
DEFAULTS = {"gpt_neo": dict(attention_types=[[["global", "local"], 12]], max_position_embeddings=2048, window_size=256,
                            activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_dropout=0.0,
                            attention_dropout=0.0, intermediate_size=None, tie_word_embeddings=True,
                            bos_token_id=50256, eos_token_id=50256)}
KINDS = {"global": "full", "local": "sliding"}


def layer_kinds(hf: dict) -> list[str]:
    """'global' or 'local' per layer, as GPTNeoConfig expands attention_types ([[kinds, repeats], ...]; null is
    the class's own pattern)."""
    types = hf["attention_types"] or DEFAULTS["gpt_neo"]["attention_types"]
    kinds = [kind for pattern, repeats in types for _ in range(repeats) for kind in pattern]
    refuse(len(kinds) != hf["num_layers"], f"gpt_neo: attention_types gives {len(kinds)} layers but num_layers="
           f"{hf['num_layers']}")
    refuse(any(k not in KINDS for k in kinds), f"gpt_neo: attention types {sorted(set(kinds) - set(KINDS))} are "
           f"not supported; supported: {sorted(KINDS)}")
    return kinds


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    kinds = [KINDS[k] for k in layer_kinds(hf)]
    pattern = "causal" if set(kinds) == {"full"} else "sliding" if set(kinds) == {"sliding"} else "alternating"
    d_model, window = hf["hidden_size"], hf["window_size"]
    return dict(family="decoder", d_model=d_model, num_heads=hf["num_heads"],
                d_ff=hf["intermediate_size"] or 4 * d_model, decoder_layers=hf["num_layers"], norm_eps=hf["layer_norm_epsilon"],
                activation=activation(hf["activation_function"], False, model_type), position="learned",
                max_positions=hf["max_position_embeddings"], attention=pattern,
                window_size=window if pattern != "causal" else None,
                layer_types=tuple(kinds) if pattern == "alternating" else None, attention_scale=1.0,
                qkv_bias=False, out_bias=True, mlp_bias=True, head="none" if arch.endswith("Model") else "lm",
                tie_embeddings=hf["tie_word_embeddings"], dropout_rate=float(hf["resid_dropout"]),
                attention_dropout_rate=float(hf["attention_dropout"]))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    kinds = ["local" if sliding else "global" for sliding in local_layers(cfg)[:cfg.decoder_layers]]
    out.update(hidden_size=cfg.d_model, num_heads=cfg.num_heads, num_layers=cfg.decoder_layers,
               intermediate_size=cfg.d_ff, max_position_embeddings=cfg.max_positions,
               attention_types=[[[kind], 1] for kind in kinds], window_size=cfg.window_size or 256,
               layer_norm_epsilon=cfg.norms.eps, activation_function=INVERSE_ACTIVATIONS[cfg.activation],
               tie_word_embeddings=cfg.embeddings.tie, resid_dropout=cfg.dropout_rate, embed_dropout=cfg.dropout_rate,
               attention_dropout=cfg.attention_dropout_rate)
    out.pop("attention_layers", None)  # derived by the config class from attention_types


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("decoder", "blocks")
    layer = f"{p}h.{{i}}"
    a = f"{layer}.attn.attention"
    out = [
        copy(("embed", "table"), f"{p}wte.weight"),
        copy(("embeddings", "positions", "table"), f"{p}wpe.weight"),
        *attention(cfg, L + ("attn",), f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight",
                   f"{a}.out_proj.weight", o_bias=f"{a}.out_proj.bias"),
        *norm(L + ("attn_norm",), f"{layer}.ln_1", True),
        *norm(L + ("mlp_norm",), f"{layer}.ln_2", True),
        linear(L + ("mlp", "wi"), f"{layer}.mlp.c_fc.weight"),
        copy(L + ("mlp", "bi"), f"{layer}.mlp.c_fc.bias"),
        linear(L + ("mlp", "wo"), f"{layer}.mlp.c_proj.weight"),
        copy(L + ("mlp", "bo"), f"{layer}.mlp.c_proj.bias"),
        *norm(("decoder", "final_norm"), f"{p}ln_f", True),
    ]
    head, aliases = lm_head(cfg, f"{p}wte.weight")
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, {"gpt_neo": "transformer."}, ("GPTNeoModel",), config_from_hf,
                            config_to_hf, rules, harmless={
                                "attention_layers": "derived from attention_types by the config class",
                                **dict.fromkeys(("summary_type", "summary_use_proj", "summary_activation",
                                                 "summary_proj_to_labels"),
                                                "older files' sequence-summary settings, which no GPT-Neo class reads"),
                                "embed_dropout": "training-time dropout on the embeddings, not modelled"},
                            defaults=DEFAULTS)
