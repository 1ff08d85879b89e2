"""Llama 4's text model (``llama4_text``); config and tensor rules, both directions.

A LLaMA block with four ideas of its own, each a ModelConfig field of the shared block:
- chunked local attention: the rotary layers see the keys of their own ``attention_chunk_size``-position
  chunk (``layer_types`` 'chunked'); every ``no_rope_layer_interval``-th layer is global and has no rotary
  positions (``nope_layers``), its queries tuned by a temperature that grows with the token's index
  (``temperature_floor_scale``, ``temperature_scale``);
- a weightless RMS norm over each rotated query and key head (``qk_norm`` with ``qk_norm_scale=False``);
- rotary pairs adjacent, as complex numbers (``rope_interleave``);
- experts chosen by the top-k router logits, each taking its token times sigmoid(logit) as input
  (``router_score='sigmoid'``, ``router_weights_on_input``), beside one always-on shared expert.
Experts are stored fused and in x @ W layout: ``gate_up_proj`` [E, D, 2F] (the gate's F columns first),
``down_proj`` [E, F, D]. Dense layers (``moe_layers`` leaves them out) use ``intermediate_size_mlp``: the first
layers (``dense_layers``, as DeepSeek's), or all but every ``interleave_moe_layer_step``-th (Maverick's,
``moe_layer_step``).

The multimodal ``llama4`` checkpoints (Llama4ForConditionalGeneration, as Scout and Maverick are published)
nest this model under ``language_model`` with its config under ``text_config``: their text model loads (the
vision tower and its projector are skipped with a note) and is written back as ``llama4_text``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.layer_plan import dense_layers, local_layers
from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (Architecture, Rule, activation, attention, copy, linear, lm_head, refuse,
                                     rope_from_hf, rope_to_hf, text_model_from_hf)

CLASSES = {"llama4_text": ("Llama4TextModel", "Llama4ForCausalLM"), "llama4": ("Llama4ForConditionalGeneration",)}
MULTIMODAL_PREFIX = "language_model."  # where Llama4ForConditionalGeneration keeps its Llama4ForCausalLM
# Llama4TextConfig's defaults, for the keys a file may leave out (the rotary base is its default_theta)
DEFAULTS = {"llama4_text": dict(vocab_size=202048, hidden_size=5120, intermediate_size=8192,
                                intermediate_size_mlp=16384, num_hidden_layers=48, num_attention_heads=40,
                                num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=131072,
                                rms_norm_eps=1e-5, pad_token_id=None, bos_token_id=1, eos_token_id=2,
                                tie_word_embeddings=False, attention_dropout=0.0, num_experts_per_tok=1,
                                num_local_experts=16, moe_layers=None, interleave_moe_layer_step=1, use_qk_norm=True,
                                router_aux_loss_coef=0.001, router_jitter_noise=0.0, no_rope_layers=None,
                                no_rope_layer_interval=4, attention_chunk_size=8192, layer_types=None,
                                attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
                                attention_bias=False),
            "llama4": dict(tie_word_embeddings=False)}
DEFAULT_THETA = 500000.0
KINDS = {"chunked_attention": "chunked", "full_attention": "full"}


def _layers(hf: dict) -> tuple[list[bool], list[str], list[int]]:
    """(does layer i rotate, its attention kind, the MoE layers) as Llama4TextConfig derives them: every
    ``no_rope_layer_interval``-th layer without rotary positions (an empty list counts as absent), the rotary
    layers chunked when there is a chunk size, MoE every ``interleave_moe_layer_step``-th layer."""
    layers, chunk, interval = hf["num_hidden_layers"], hf["attention_chunk_size"], hf["no_rope_layer_interval"]
    rotary = [bool(r) for r in (hf["no_rope_layers"] or [(i + 1) % interval != 0 for i in range(layers)])]
    types = hf["layer_types"] or ["chunked_attention" if r and chunk is not None else "full_attention"
                                  for r in rotary]
    refuse(any(t not in KINDS for t in types), f"llama4_text: layer_types {sorted(set(types) - set(KINDS))} are not "
           f"supported; expected {sorted(KINDS)}")
    step = hf["interleave_moe_layer_step"]
    moe = hf["moe_layers"] if hf["moe_layers"] is not None else list(range(step - 1, layers, step))
    return rotary, [KINDS[t] for t in types], list(moe)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    if model_type == "llama4":  # the text model of a multimodal file
        return text_model_from_hf(hf, model_type, DEFAULTS["llama4_text"], lambda text: config_from_hf(
            text, "llama4_text", "Llama4ForCausalLM", tensor_names))
    layers, heads = hf["num_hidden_layers"], hf["num_attention_heads"]
    rotary, kinds, moe = _layers(hf)
    chunk = hf["attention_chunk_size"]
    refuse("chunked" in kinds and chunk is None, "llama4_text: chunked layers need an attention_chunk_size")
    dense = [i for i in range(layers) if i not in moe]
    step = next((s for s in range(2, layers + 1) if layers % s == 0 and moe == list(range(s - 1, layers, s))), 1)
    refuse(step == 1 and dense != list(range(len(dense))), f"llama4_text: MoE layers {moe} are supported as every "
           "step-th layer (interleave_moe_layer_step) or as the layers after the dense ones")
    theta, scaling = rope_from_hf(hf, DEFAULT_THETA)
    nope = tuple(i for i, r in enumerate(rotary) if not r)
    # published files write attn_temperature_tuning as 4; the reference code reads it as a truth value
    tuning = bool(hf["attn_temperature_tuning"]) and bool(nope)
    floor, scale = hf["floor_scale"], float(hf["attn_scale"])
    cfg = dict(family="decoder", d_model=hf["hidden_size"], num_heads=heads,
               num_kv_heads=hf["num_key_value_heads"] or heads, head_dim=hf["head_dim"],
               d_ff=hf["intermediate_size_mlp"], decoder_layers=layers, norm="rmsnorm", norm_eps=hf["rms_norm_eps"],
               norm_bias=False, activation=activation(hf["hidden_act"], True, model_type), position="rope",
               rope_theta=theta, rope_scaling=scaling, rope_interleave=True,
               max_positions=hf["max_position_embeddings"],
               attention="alternating" if "chunked" in kinds else "causal",
               layer_types=tuple(kinds) if "chunked" in kinds else None,
               attention_chunk_size=chunk if "chunked" in kinds else None, nope_layers=nope,
               temperature_floor_scale=floor if tuning else None, temperature_scale=scale if tuning else 0.1,
               qk_norm=bool(hf["use_qk_norm"]), qk_norm_scale=not hf["use_qk_norm"],
               qkv_bias=bool(hf["attention_bias"]), out_bias=bool(hf["attention_bias"]), mlp_bias=False,
               tie_embeddings=hf["tie_word_embeddings"], head="none" if arch.endswith("Model") else "lm",
               attention_dropout_rate=float(hf["attention_dropout"]))
    if moe:
        cfg.update(num_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
                   expert_d_ff=hf["intermediate_size"], shared_experts=1,
                   **(dict(moe_layer_step=step) if step > 1 else dict(dense_layers=len(dense))),
                   router_score="sigmoid", normalize_router_weights=False, router_weights_on_input=True,
                   router_aux_loss_coef=hf["router_aux_loss_coef"])
    return cfg


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    L = cfg.decoder_layers
    rotary = [int(i not in cfg.nope.layers) for i in range(L)]
    chunked = cfg.attention == "alternating"
    kinds = ["chunked_attention" if chunked and local_layers(cfg)[i] else "full_attention" for i in range(L)]
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
               head_dim=cfg.head_dim_, intermediate_size=cfg.expert_width if cfg.experts is not None else cfg.d_ff,
               intermediate_size_mlp=cfg.d_ff, num_hidden_layers=L, rms_norm_eps=cfg.norms.eps, hidden_act="silu",
               max_position_embeddings=cfg.max_positions, rope_parameters=rope_to_hf(cfg),
               tie_word_embeddings=cfg.embeddings.tie, attention_dropout=cfg.attention_dropout_rate,
               attention_bias=cfg.biases.qkv, no_rope_layers=rotary, layer_types=kinds,
               attention_chunk_size=cfg.attention_chunk_size, use_qk_norm=cfg.query_key_norm is not None,
               attn_temperature_tuning=cfg.nope.temperature_floor_scale is not None,
               floor_scale=cfg.nope.temperature_floor_scale or 8192, attn_scale=cfg.nope.temperature_scale,
               moe_layers=[i for i in range(L) if i not in dense_layers(cfg)] if cfg.experts is not None else [],
               interleave_moe_layer_step=cfg.experts.layer_step,
               num_local_experts=cfg.experts.count if cfg.experts is not None else 16,
               num_experts_per_tok=cfg.experts.per_token if cfg.experts is not None else 1,
               router_aux_loss_coef=cfg.experts.aux_loss_coef)
    for key in ("rope_theta", "rope_scaling"):
        out.pop(key, None)


def _halves(gate_path, up_path, name) -> Rule:
    """Llama 4's fused gate/up tensor [E, D, 2F] (the gate's F columns, then the up projection's) <-> two."""
    return Rule((gate_path, up_path), (name,), lambda t: np.split(t[0], 2, axis=-1),
                lambda ps: [np.concatenate(ps, axis=-1)])


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    layer = f"{p}layers.{{i}}"
    a, f = f"{layer}.self_attn", f"{layer}.feed_forward"

    def block_rules(S: tuple[str, ...], moe: bool) -> list[Rule]:
        mlp = S + ("mlp",)
        out = [*attention(cfg, S + ("attn",), f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight",
                          f"{a}.o_proj.weight", f"{a}.q_proj.bias", f"{a}.k_proj.bias", f"{a}.v_proj.bias",
                          f"{a}.o_proj.bias"),
               copy(S + ("attn_norm", "scale"), f"{layer}.input_layernorm.weight"),
               copy(S + ("mlp_norm", "scale"), f"{layer}.post_attention_layernorm.weight")]
        if not moe:
            return out + [linear(mlp + ("wi_gate",), f"{f}.gate_proj.weight"),
                          linear(mlp + ("wi",), f"{f}.up_proj.weight"),
                          linear(mlp + ("wo",), f"{f}.down_proj.weight")]
        return out + [linear(mlp + ("router",), f"{f}.router.weight"),
                      _halves(mlp + ("wi_gate",), mlp + ("wi",), f"{f}.experts.gate_up_proj"),
                      copy(mlp + ("wo",), f"{f}.experts.down_proj"),
                      linear(mlp + ("shared", "wi_gate"), f"{f}.shared_expert.gate_proj.weight"),
                      linear(mlp + ("shared", "wi"), f"{f}.shared_expert.up_proj.weight"),
                      linear(mlp + ("shared", "wo"), f"{f}.shared_expert.down_proj.weight")]

    dense = dense_layers(cfg)  # the first layers, or (Maverick) all but every moe_layer_step-th
    out = [copy(("embed", "table"), f"{p}embed_tokens.weight"),
           copy(("decoder", "final_norm", "scale"), f"{p}norm.weight")]
    if dense:
        experts = [i for i in range(cfg.decoder_layers) if i not in dense]
        out += [rule.at_layers(dense) for rule in block_rules(("decoder", "dense_blocks"), moe=False)]
        out += [rule.at_layers(experts) for rule in block_rules(("decoder", "blocks"), moe=True)]
    else:
        out += block_rules(("decoder", "blocks"), bool(cfg.experts.count))
    head, aliases = lm_head(cfg, f"{p}embed_tokens.weight")
    if model_type == "llama4":  # the head sits beside the text model, inside language_model
        head = [Rule(r.paths, tuple(MULTIMODAL_PREFIX + n for n in r.names), r.load, r.save) for r in head]
        aliases = {MULTIMODAL_PREFIX + alias: target for alias, target in aliases.items()}
    return out + head, aliases


def ignored(hf: dict, names: set[str]) -> tuple[set[str], str]:
    """A multimodal file's vision tower and projector: the text model never reads them."""
    if hf.get("model_type") != "llama4":
        return set(), ""
    vision = {n for n in names if not n.startswith(MULTIMODAL_PREFIX)}
    return vision, (f"{len(vision)} tensors of the vision tower and its projector are not used by jaxformer (it reads "
                    "the text model) and were skipped") if vision else ""


_TEXT_HARMLESS = {"router_jitter_noise": "Llama 4's router never reads it",
                  "for_llm_compressor": "a flag of the published files for a quantization tool"}
HARMLESS = {**_TEXT_HARMLESS, **{f"text_config.{key}": why for key, why in _TEXT_HARMLESS.items()},
            "vision_config": "the vision tower's, which jaxformer does not run (text only)",
            **dict.fromkeys(("boi_token_index", "eoi_token_index", "image_token_index"),
                            "image placeholder tokens, which only the vision path reads")}

ARCHITECTURE = Architecture(CLASSES, {"llama4_text": "model.", "llama4": MULTIMODAL_PREFIX + "model."},
                            ("Llama4TextModel",), config_from_hf, config_to_hf, rules, ignored=ignored,
                            defaults=DEFAULTS, harmless=HARMLESS, wrappers=("llama4",))
