"""Gemma 4's text model (``gemma4_text``, and the text model of the multimodal ``gemma4`` files); config and
tensor rules, both directions.

A file of its own rather than a branch of interop/gemma.py: Gemma 4 keeps Gemma 3's layout (sliding and full
layers from ``layer_types``, a norm before and after each sublayer, GeGLU, embeddings times sqrt(d_model), query
and key norms, a rotary setting per layer type) but changes most of its numbers, and reads keys Gemma 3 never
had. It reuses gemma.py's layer kinds; what differs, each a ModelConfig setting of the shared block:
- RMSNorm multiplies by its weight, not (1 + weight) (``norm_scale_offset=0``), and the scores are not scaled
  (``attention_scale=1``: the query and key norms set their size; no query_pre_attn_scalar);
- each value head is normed too, without a learned scale (``v_norm``);
- each layer's output is multiplied by its stored ``layer_scalar`` (``layer_output_scale``);
- the full layers' rotary is 'proportional': the whole head turns, only the first
  int(partial_rotary_factor * head_dim / 2) frequencies are non-zero (``rope_proportion``);
- per-layer inputs (``hidden_size_per_layer_input``, ``vocab_size_per_layer_input``): a second token table and a
  projection of the embeddings give each layer a small input that gates a projection of its output
  (``per_layer_input_size``, ``per_layer_vocab_size``);
- the full layers' own head size and kv head count (``global_head_dim``, with attention_k_eq_v
  ``num_global_key_value_heads``; transformers 5's ``per_layer_config``): ``full_head_dim``, ``full_kv_heads``,
  the full layers a block group of their own; their values the keys as projected (``attention_k_eq_v``:
  ``full_keys_as_values``);
- the experts beside every layer's dense MLP (``enable_moe_block``: the 26B A4B), ``num_experts`` of
  ``moe_intermediate_size`` with the layer's GeGLU, the best ``top_k_experts`` of a softmax kept and renormalised:
  the MLP reads the layer's normed input, the experts their own normed copy, each branch's output is normed and the
  sum is the feed-forward's output (``experts_beside_dense``); the router reads the layer's input itself through an
  RMSNorm times a learned scale and d_model^-0.5 (``router_norm``), and each chosen weight is multiplied by a learned
  scale of its expert's (``router_expert_scale``);
- the last ``num_kv_shared_layers`` layers reading the keys and values of the last earlier layer of their kind, with
  no key or value weights and no cache of their own (``kv_shared_layers``), their MLP twice as wide with
  ``use_double_wide_mlp`` (``kv_shared_d_ff``).

Refused by name (the load stops with a ValueError, nothing is dropped): the experts without their sizes
(``enable_moe_block`` with no ``num_experts``, ``top_k_experts`` or ``moe_intermediate_size``), bidirectional
attention (``use_bidirectional_attention='all'``), per-layer settings other than the full layers' head size and kv
heads, keys as values with no sliding layer, and every layer sharing keys and values (they would come from another
model).

The multimodal ``gemma4`` files (Gemma4ForConditionalGeneration) keep this model under
``model.language_model`` with its config under ``text_config``: the text model loads, the vision and audio
towers and their embedders are skipped with a note, and it is written back as ``gemma4_text``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.interop.gemma import layer_kinds
from jaxformer.interop.rules import (Architecture, Rule, activation, bias_heads, copy, heads_in, heads_out, linear,
                                     lm_head, refuse, rope_spec, text_model_from_hf, with_defaults)
from jaxformer.layer_plan import GROUPS, layer_config, layer_plan, local_layers
from jaxformer.model_config import ModelConfig

CLASSES = {"gemma4_text": ("Gemma4TextModel", "Gemma4ForCausalLM"), "gemma4": ("Gemma4ForConditionalGeneration",)}
MULTIMODAL_PREFIX = "model.language_model."  # where Gemma4ForConditionalGeneration keeps its text model
# Gemma4TextConfig's defaults, for the keys a file may leave out (global_head_dim is popped by its __post_init__)
DEFAULTS = {"gemma4_text": dict(vocab_size=262144, hidden_size=2304, intermediate_size=9216, num_hidden_layers=30,
                                num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                                rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                                tie_word_embeddings=True, rope_parameters=None, attention_bias=False,
                                attention_dropout=0.0, sliding_window=512, layer_types=None,
                                final_logit_softcapping=None, use_bidirectional_attention=None,
                                vocab_size_per_layer_input=262144, hidden_size_per_layer_input=256,
                                attention_k_eq_v=False, num_kv_shared_layers=0, enable_moe_block=False,
                                use_double_wide_mlp=False, num_experts=None, top_k_experts=None,
                                moe_intermediate_size=None),
            "gemma4": dict(tie_word_embeddings=True)}
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0}}
GLOBAL_HEAD_DIM = 512  # what Gemma4TextConfig gives the full layers when the file names no head size for them


def _layer_kinds(hf: dict) -> list[str]:
    """'full' or 'sliding' per layer as Gemma4TextConfig derives them (every sixth full: its fixed period, whatever
    a file's ``sliding_window_pattern``, a key it never reads, says), the last layer forced to full as transformers
    forces it."""
    types = hf["layer_types"] or ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                  for i in range(hf["num_hidden_layers"])]
    kinds = layer_kinds({"layer_types": types}, "gemma4_text")
    return [*kinds[:-1], "full"]


def _full_layers_shape(hf: dict, kinds: list[str], head_dim: int, kv_heads: int) -> tuple[int, int]:
    """(head size, kv head count) of the full layers, as Gemma4TextConfig resolves them: the published form names
    the head size ``global_head_dim`` (default 512) and, with attention_k_eq_v, the kv heads
    ``num_global_key_value_heads``; transformers 5's ``per_layer_config`` maps each layer to what it overrides
    (and wins when both are there). Only the full layers may differ, and all alike."""
    overrides = hf.get("per_layer_config")
    width = hf.get("global_head_dim", GLOBAL_HEAD_DIM)
    full_kv = hf.get("num_global_key_value_heads")
    if overrides is None:
        own = {"head_dim": width}
        if full_kv is not None and hf["attention_k_eq_v"]:
            own["num_key_value_heads"] = full_kv
        overrides = {i: own for i, kind in enumerate(kinds) if kind == "full"}
    shapes = {"sliding": set(), "full": set()}
    for layer, changes in dict(overrides).items():
        changes = dict(changes)
        other = sorted(set(changes) - {"head_dim", "num_key_value_heads"})
        refuse(bool(other), f"gemma4_text: per_layer_config gives layer {layer} settings of its own {other}: "
               "jaxformer reads only the full layers' head_dim and num_key_value_heads there")
        refuse(not 0 <= int(layer) < len(kinds), f"gemma4_text: per_layer_config names layer {layer}, outside the "
               f"{len(kinds)} layers")
        shapes[kinds[int(layer)]].add((changes.get("head_dim", head_dim), changes.get("num_key_value_heads",
                                                                                      kv_heads)))
    full = [i for i, kind in enumerate(kinds) if kind == "full"]
    if len(shapes["full"]) == 1 and len(full) != sum(kinds[int(i)] == "full" for i in dict(overrides)):
        shapes["full"].add((head_dim, kv_heads))  # (some full layers keep the model's shape)
    refuse(shapes["sliding"] - {(head_dim, kv_heads)} != set(), f"gemma4_text: per_layer_config gives sliding layers "
           f"attention of their own shape {sorted(shapes['sliding'])}: only the full layers may differ")
    refuse(len(shapes["full"]) > 1, f"gemma4_text: the full layers' attention shapes differ {sorted(shapes['full'])}"
           ": jaxformer's full layers share one head size and kv head count")
    return next(iter(shapes["full"]), (head_dim, kv_heads))


def _rotary(hf: dict, kinds: list[str], head_dim: int) -> dict[str, Any]:
    """ModelConfig rotary fields from ``rope_parameters`` keyed by layer type: the full layers' (default or
    proportional, whose ``factor`` divides the frequencies as linear scaling does), the sliding layers' own
    unscaled base."""
    rope = hf["rope_parameters"] or DEFAULT_ROPE
    refuse(not {"full_attention", "sliding_attention"} >= set(rope), f"gemma4_text: rope_parameters must be given per "
           f"layer type (full_attention, sliding_attention); got {sorted(rope)}")
    full = dict(rope.get("full_attention") or {"rope_type": "default", "rope_theta": 1e6})
    local = dict(rope.get("sliding_attention") or {"rope_type": "default", "rope_theta": 1e4})
    length = hf["max_position_embeddings"]
    proportion = None
    if full.get("rope_type") == "proportional":  # the default frequencies, the later ones zero, all / factor
        fraction = float(full.pop("partial_rotary_factor", 1.0))
        factor = float(full.pop("factor", 1.0))
        full["rope_type"] = "linear" if factor != 1.0 else "default"
        if factor != 1.0:
            full["factor"] = factor
        turning = int(fraction * head_dim // 2)
        refuse(turning == 0, f"gemma4_text: partial_rotary_factor={fraction} turns no frequency of a {head_dim}-wide "
               "head")
        proportion = fraction if turning < head_dim // 2 else None
    elif full.get("rope_type", "default") == "default":  # Gemma 4's default rotary turns the whole head,
        full.pop("partial_rotary_factor", None)  # whatever the factor says
    theta, scaling = rope_spec(full, length)
    if local.get("rope_type", "default") == "default":
        local.pop("partial_rotary_factor", None)
    local_theta, local_scaling = rope_spec(local, length)
    refuse(local_scaling is not None, "gemma4_text: scaled rotary sliding layers are not supported")
    if "sliding" not in kinds:
        return dict(rope_theta=theta, rope_scaling=scaling, rope_proportion=proportion)
    return dict(rope_theta=theta, rope_scaling=scaling, rope_proportion=proportion, local_rope_theta=local_theta)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    if model_type == "gemma4":  # the text model of a multimodal file
        return text_model_from_hf(hf, model_type, DEFAULTS["gemma4_text"], lambda text: config_from_hf(
            text, "gemma4_text", "Gemma4ForCausalLM", tensor_names))
    hf = with_defaults(hf, DEFAULTS["gemma4_text"])
    heads, layers = hf["num_attention_heads"], hf["num_hidden_layers"]
    kv_heads, head_dim = hf["num_key_value_heads"] or heads, hf["head_dim"]
    both_ways = hf["use_bidirectional_attention"]
    refuse(both_ways not in (None, "vision"), f"gemma4_text: use_bidirectional_attention={both_ways!r} is not "
           "supported; jaxformer reads Gemma 4 as a causal decoder (None, or 'vision', which only image tokens read)")
    experts = _experts(hf)
    kinds = _layer_kinds(hf)
    full_dim, full_kv = _full_layers_shape(hf, kinds, head_dim, kv_heads)
    window = hf["sliding_window"]
    alternating = "sliding" in kinds
    keys_as_values = bool(hf["attention_k_eq_v"])
    if not alternating:  # every layer full: the full shape is the model's
        refuse(keys_as_values, "gemma4_text: attention_k_eq_v=True with no sliding layer is not supported (jaxformer "
               "reuses keys as values in the full layers beside sliding ones)")
        head_dim, kv_heads = full_dim, full_kv
    shared = int(hf["num_kv_shared_layers"] or 0)
    refuse(shared >= layers, f"gemma4_text: num_kv_shared_layers={shared} of {layers} layers leaves no layer to "
           "compute the keys and values they share (transformers then reads them from another model: an assistant's)")
    double_wide = bool(hf["use_double_wide_mlp"]) and shared > 0  # (the kv-shared layers' MLP twice as wide)
    refuse(alternating and window is None, "gemma4_text: sliding layers need sliding_window")
    per_layer, per_layer_vocab = hf["hidden_size_per_layer_input"] or 0, hf["vocab_size_per_layer_input"]
    bias = bool(hf["attention_bias"])
    act = activation(hf["hidden_activation"] or "gelu_pytorch_tanh", True, model_type)
    own_full = alternating and (full_dim != head_dim or full_kv != kv_heads)
    return dict(family="decoder", decoder_layers=layers, d_model=hf["hidden_size"], num_heads=heads,
                num_kv_heads=kv_heads, head_dim=head_dim, d_ff=hf["intermediate_size"], norm="rmsnorm",
                full_head_dim=full_dim if own_full and full_dim != head_dim else None,
                full_kv_heads=full_kv if own_full and full_kv != kv_heads else None,
                full_keys_as_values=keys_as_values, kv_shared_layers=shared,
                kv_shared_d_ff=2 * hf["intermediate_size"] if double_wide else None,
                norm_eps=hf["rms_norm_eps"], norm_bias=False, norm_scale_offset=0.0, sandwich_norm=True,
                activation=act, position="rope", **_rotary(hf, kinds, full_dim),
                max_positions=hf["max_position_embeddings"], attention="alternating" if alternating else "causal",
                window_size=int(window) if alternating else None, layer_types=tuple(kinds) if alternating else None,
                attention_scale=1.0, qk_norm=True, v_norm=True, qkv_bias=bias, out_bias=bias, mlp_bias=False,
                scale_embeddings=True, layer_output_scale=True, per_layer_input_size=per_layer,
                # (0: the model's vocabulary; the table is read without per-layer inputs, never used)
                per_layer_vocab_size=per_layer_vocab if per_layer and per_layer_vocab != hf["vocab_size"] else 0,
                logits_softcap=hf["final_logit_softcapping"], tie_embeddings=hf["tie_word_embeddings"],
                head="none" if arch.endswith("Model") else "lm",
                attention_dropout_rate=float(hf["attention_dropout"] or 0.0), **experts)


def _experts(hf: dict) -> dict[str, Any]:
    """The experts beside each layer's MLP (``enable_moe_block``), as ModelConfig fields; none without them."""
    sizes = {key: hf[key] for key in ("num_experts", "top_k_experts", "moe_intermediate_size")}  # (read either way)
    if not hf["enable_moe_block"]:
        return {}
    missing = [key for key, value in sizes.items() if not value]
    refuse(bool(missing), f"gemma4_text: enable_moe_block=True needs {', '.join(missing)} (transformers cannot build "
           "the experts without them)")
    return dict(num_experts=sizes["num_experts"], experts_per_token=sizes["top_k_experts"],
                expert_d_ff=sizes["moe_intermediate_size"], router_score="softmax", normalize_router_weights=True,
                router_norm=True, router_expert_scale=True, experts_beside_dense=True)


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    L = cfg.decoder_layers
    sliding = local_layers(cfg)[:L] if cfg.attention == "alternating" else (False,) * L
    full_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rotary.theta}
    if cfg.rotary.proportion is not None or cfg.rotary.scaling is not None:
        full_rope = {"rope_type": "proportional", "partial_rotary_factor": cfg.rotary.proportion or 1.0,
                     "rope_theta": cfg.rotary.theta}
        if cfg.rotary.scaling is not None:
            full_rope["factor"] = cfg.rotary.scaling.factor
    local = cfg.rotary.local_theta if cfg.rotary.local_theta is not None else 10000.0
    embeddings, scores = cfg.embeddings, cfg.scores
    refuse(scores.kv_shared_d_ff not in (None, 2 * cfg.d_ff), f"gemma4_text: kv_shared_d_ff={scores.kv_shared_d_ff} "
           f"cannot be written: Gemma 4's kv-shared layers' MLP is d_ff ({cfg.d_ff}) or twice that wide")
    own = {k: v for k, v in (("head_dim", scores.full_head_dim), ("num_key_value_heads", scores.full_kv_heads))
           if v is not None}
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
               head_dim=cfg.head_dim_, intermediate_size=cfg.d_ff, num_hidden_layers=L, rms_norm_eps=cfg.norms.eps,
               hidden_activation="gelu_pytorch_tanh", max_position_embeddings=cfg.max_positions,
               sliding_window=cfg.window_size or cfg.max_positions, attention_bias=cfg.biases.qkv,
               attention_dropout=cfg.attention_dropout_rate,
               layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
               rope_parameters={"full_attention": full_rope,
                                "sliding_attention": {"rope_type": "default", "rope_theta": local}},
               # the full layers' own head size and kv heads, as transformers 5 writes them: only what differs
               per_layer_config={str(i): own for i, s in enumerate(sliding) if not s and own},
               final_logit_softcapping=cfg.logits.softcap, tie_word_embeddings=embeddings.tie,
               use_bidirectional_attention=None, hidden_size_per_layer_input=embeddings.per_layer_width,
               vocab_size_per_layer_input=embeddings.per_layer_vocab or cfg.vocab_size,
               attention_k_eq_v=scores.full_keys_as_values, num_kv_shared_layers=scores.kv_shared_layers,
               enable_moe_block=cfg.experts is not None, use_double_wide_mlp=scores.kv_shared_d_ff is not None)
    if cfg.experts is not None:  # (a config whose experts Gemma 4 does not have reads back otherwise: not its target)
        out.update(num_experts=cfg.experts.count, top_k_experts=cfg.experts.per_token,
                   moe_intermediate_size=cfg.expert_width)
    for key in ("hidden_act", "rope_theta", "rope_scaling"):
        out.pop(key, None)


def _scalar(path, name) -> Rule:
    """A layer's ``layer_scalar`` [1] <-> the layer's stored scale [1]."""
    return Rule((path,), (name,), lambda t: [t[0].reshape(1)], lambda p: [np.asarray(p[0]).reshape(1)])


def _gate_up(gate_path, up_path, name) -> Rule:
    """The experts' fused gate and up projections [E, 2F, D] (the gate's F rows first) <-> two kernels [E, D, F]."""
    return Rule((gate_path, up_path), (name,), lambda t: [w.transpose(0, 2, 1) for w in np.split(t[0], 2, axis=1)],
                lambda p: [np.concatenate([w.transpose(0, 2, 1) for w in p], axis=1)])


def _block_rules(cfg: ModelConfig, S: tuple[str, ...], layer: str, own_keys: bool, keys_as_values: bool
                 ) -> list[Rule]:
    """One block group's tensors (``cfg`` its layers' config: their head size, kv heads and MLP width)."""
    a = f"{layer}.self_attn"
    N, K, H, A = cfg.num_heads, cfg.kv_heads, cfg.head_dim_, S + ("attn",)
    bias = cfg.biases.qkv
    out = [heads_in(A + ("q",), f"{a}.q_proj.weight", N, H), heads_out(A + ("o",), f"{a}.o_proj.weight", N, H),
           copy(A + ("q_norm", "scale"), f"{a}.q_norm.weight"),
           linear(S + ("mlp", "wi_gate"), f"{layer}.mlp.gate_proj.weight"),
           linear(S + ("mlp", "wi"), f"{layer}.mlp.up_proj.weight"),
           linear(S + ("mlp", "wo"), f"{layer}.mlp.down_proj.weight"),
           _scalar(S + ("output_scale",), f"{layer}.layer_scalar")]
    out += [bias_heads(A + ("q_bias",), f"{a}.q_proj.bias", N, H)] if bias else []
    out += [copy(A + ("o_bias",), f"{a}.o_proj.bias")] if cfg.biases.out else []
    if own_keys:  # (a kv-shared layer has no key or value weights; a full layer's values may be its keys)
        out += [heads_in(A + ("k",), f"{a}.k_proj.weight", K, H), copy(A + ("k_norm", "scale"), f"{a}.k_norm.weight")]
        out += [bias_heads(A + ("k_bias",), f"{a}.k_proj.bias", K, H)] if bias else []
        if not keys_as_values:
            out += [heads_in(A + ("v",), f"{a}.v_proj.weight", K, H)]
            out += [bias_heads(A + ("v_bias",), f"{a}.v_proj.bias", K, H)] if bias else []
    norms = {"attn_norm": "input_layernorm", "attn_post_norm": "post_attention_layernorm",
             "mlp_norm": "pre_feedforward_layernorm", "mlp_post_norm": "post_feedforward_layernorm"}
    out += [copy(S + (ours, "scale"), f"{layer}.{theirs}.weight") for ours, theirs in norms.items()]
    if cfg.experts is not None:  # the experts beside the MLP: the router, the experts, their norms
        X = S + ("experts",)
        out += [linear(X + ("router",), f"{layer}.router.proj.weight"),
                copy(X + ("router_scale",), f"{layer}.router.scale"),
                copy(X + ("expert_scale",), f"{layer}.router.per_expert_scale"),
                _gate_up(X + ("wi_gate",), X + ("wi",), f"{layer}.experts.gate_up_proj"),
                Rule((X + ("wo",),), (f"{layer}.experts.down_proj",), lambda t: [t[0].transpose(0, 2, 1)],
                     lambda p: [p[0].transpose(0, 2, 1)]),
                copy(S + ("dense_post_norm", "scale"), f"{layer}.post_feedforward_layernorm_1.weight"),
                copy(S + ("experts_norm", "scale"), f"{layer}.pre_feedforward_layernorm_2.weight"),
                copy(S + ("experts_post_norm", "scale"), f"{layer}.post_feedforward_layernorm_2.weight")]
    if cfg.embeddings.per_layer_width:
        out += [linear(S + ("per_layer_gate", "kernel"), f"{layer}.per_layer_input_gate.weight"),
                linear(S + ("per_layer_projection", "kernel"), f"{layer}.per_layer_projection.weight"),
                copy(S + ("per_layer_norm", "scale"), f"{layer}.post_per_layer_input_norm.weight")]
    return out


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    out = [copy(("embed", "table"), f"{p}embed_tokens.weight"),
           copy(("decoder", "final_norm", "scale"), f"{p}norm.weight")]
    # each block group (Gemma 4's full layers of their own shape, its kv-shared layers of each kind) at its layers
    plan = layer_plan(cfg, cfg.attention, cfg.decoder_layers)
    for group in GROUPS:
        at = [i for i, spec in enumerate(plan.layers) if spec.group == group]
        if not at:
            continue
        spec = plan.first_of(group)
        block = _block_rules(layer_config(cfg, spec), ("decoder", group), f"{p}layers.{{i}}",
                             spec.kv_source is None, cfg.scores.full_keys_as_values and not spec.local)
        out += block if len(at) == len(plan) else [rule.at_layers(at) for rule in block]
    if cfg.embeddings.per_layer_width:
        P = ("per_layer_inputs",)
        out += [copy(P + ("table", "table"), f"{p}embed_tokens_per_layer.weight"),
                linear(P + ("projection", "kernel"), f"{p}per_layer_model_projection.weight"),
                copy(P + ("norm", "scale"), f"{p}per_layer_projection_norm.weight")]
    head, aliases = lm_head(cfg, f"{p}embed_tokens.weight")  # (a multimodal file's head sits at its top too)
    return out + head, aliases


def ignored(hf: dict, names: set[str]) -> tuple[set[str], str]:
    """A multimodal file's vision and audio towers and their embedders: the text model never reads them."""
    if hf.get("model_type") != "gemma4":
        return set(), ""
    towers = {n for n in names if not n.startswith(MULTIMODAL_PREFIX) and n != "lm_head.weight"}
    return towers, (f"{len(towers)} tensors of the vision and audio towers and their embedders are not used by "
                    "jaxformer (it reads the text model; issues 51 and 52 will read the towers) and were skipped: "
                    + ", ".join(sorted({n.split('.')[1] if n.startswith('model.') else n.split('.')[0]
                                        for n in towers}))) if towers else ""


_TEXT_HARMLESS = dict.fromkeys(("num_experts", "top_k_experts", "moe_intermediate_size"),
                               "read by the experts alone: nothing reads it without enable_moe_block")
HARMLESS = {**_TEXT_HARMLESS, **{f"text_config.{key}": why for key, why in _TEXT_HARMLESS.items()},
            "vision_config": "the vision tower's, which jaxformer does not run (text only; issue 51)",
            "audio_config": "the audio tower's, which jaxformer does not run (text only; issue 52)",
            **dict.fromkeys(("boi_token_id", "eoi_token_id", "image_token_id", "video_token_id", "boa_token_id",
                             "eoa_token_index", "eoa_token_id", "audio_token_id", "vision_soft_tokens_per_image"),
                            "image, video and audio placeholder tokens, which only the towers' path reads")}

ARCHITECTURE = Architecture(CLASSES, {"gemma4_text": "model.", "gemma4": MULTIMODAL_PREFIX},
                            ("Gemma4TextModel",), config_from_hf, config_to_hf, rules, ignored=ignored,
                            defaults=DEFAULTS, harmless=HARMLESS, wrappers=("gemma4",))
