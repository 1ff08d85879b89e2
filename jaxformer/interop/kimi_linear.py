"""Moonshot's Kimi Linear (``kimi_linear``: Kimi-Linear-48B-A3B): config and tensor rules, both directions.

Three of every four layers mix tokens by Kimi Delta Attention (``linear_layers``, ``linear_decay='channel'``:
jaxformer/layers/linear_attention.py): Gated DeltaNet's delta rule with one decay per key channel instead of one per
head, the decay input and the output gate each through a low-rank pair (f_a/f_b, g_a/g_b: head_dim wide), the
output gated by a sigmoid; q, k and v as many heads as each other (``linear_attn_config.num_heads``). The other
layers are DeepSeek's multi-head latent attention without positions (NoPE: the "rotary" part of each query and key
passes unrotated, whatever ``rope_theta`` says; ``position='none'``). The first ``first_k_dense_replace`` layers keep
a dense MLP, the rest DeepSeek-V3's experts (sigmoid scores, a selection bias, groups, renormalised and scaled
weights, shared experts).

The published config.json holds the linear layers' settings in ``linear_attn_config`` (its layer lists 1-based:
``kda_layers``, ``full_attn_layers``) and ``first_k_dense_replace``; transformers 5 writes ``layer_types``,
``mlp_layer_types`` and ``linear_*`` keys, and the MoE keys by the names of its ``attribute_map``
(``num_experts``, ``num_experts_per_token``, ``moe_renormalize``, ...), as the published file spells them too. Both
read. Tensors: the published files keep the dense layer's MLP under ``mlp.``, transformers writes it under
``block_sparse_moe.`` with the experts; both load, and it is written as transformers writes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop import deepseek
from jaxformer.interop.rules import (Architecture, Rule, activation, copy, heads_in, heads_out, linear, lm_head,
                                     refuse, stacked_experts, sub_config)

CLASSES = {"kimi_linear": ("KimiLinearModel", "KimiLinearForCausalLM")}
# the file's spelling (the config class's attribute_map) -> the attribute it sets; either may be in a file
ALIASES = {"num_experts": "num_local_experts", "num_experts_per_token": "num_experts_per_tok",
           "moe_renormalize": "norm_topk_prob", "num_expert_group": "n_group",
           "num_shared_experts": "n_shared_experts", "model_max_length": "max_position_embeddings"}
# KimiLinearConfig's defaults for the keys read below, by the attributes' own names (checked by
# tests/test_config_reading.py)
DEFAULTS = {"kimi_linear": dict(
    vocab_size=163840, hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024, num_hidden_layers=27,
    num_attention_heads=32, num_key_value_heads=32, n_shared_experts=1, routed_scaling_factor=2.446,
    kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=1,
    topk_group=1, num_experts_per_tok=8, norm_topk_prob=True, hidden_act="silu", max_position_embeddings=1048576,
    rms_norm_eps=1e-5, pad_token_id=163839, bos_token_id=163584, eos_token_id=163586, tie_word_embeddings=False,
    attention_bias=False, attention_dropout=0.0, num_local_experts=256, mlp_layer_types=None, layer_types=None,
    linear_head_dim=128, linear_num_heads=32, linear_conv_kernel_dim=4)}
KINDS = ("linear_attention", "full_attention")
# linear_attn_config's keys -> the top-level keys they replace (the sub-dict wins, as the config class reads it)
LINEAR_KEYS = {"head_dim": "linear_head_dim", "num_heads": "linear_num_heads",
               "short_conv_kernel_size": "linear_conv_kernel_dim"}


def _value(hf: dict, key: str):
    """A setting by its attribute_map spelling where the file has it, else by the attribute it sets (or that
    attribute's default)."""
    attribute = hf[ALIASES[key]]
    return hf[key] if key in hf else attribute


def _linear_settings(hf: dict) -> tuple[dict, dict]:
    """(linear_attn_config as read, or {}; the linear layers' head_dim, num_heads and conv kernel)."""
    sub = sub_config(hf, "linear_attn_config") if hf.get("linear_attn_config") else {}
    settings = {top: sub.get(key, hf[top]) for key, top in LINEAR_KEYS.items()}
    return sub, settings


def _layer_kinds(hf: dict, sub: dict) -> list[str]:
    """Each layer's kind as the config class decides it: ``layer_types``, else linear_attn_config's 1-based lists
    (both needed), else every fourth layer past the first full."""
    layers = hf["num_hidden_layers"]
    full, kda = sub.get("full_attn_layers"), sub.get("kda_layers")  # (read even where layer_types decides)
    kinds = hf["layer_types"]
    if kinds is None and full is not None and kda is not None:
        kinds = [None] * layers
        for kind, listed in (("full_attention", full), ("linear_attention", kda)):
            for layer in listed:
                refuse(not 1 <= layer <= layers, f"kimi_linear: linear_attn_config lists layer {layer}; its layers "
                       f"are counted from 1 to num_hidden_layers={layers}")
                kinds[layer - 1] = kind
    elif kinds is None:
        kinds = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]
    refuse(len(kinds) != layers or any(k not in KINDS for k in kinds), f"kimi_linear: the layer kinds {kinds} must "
           f"give each of the {layers} layers one of {KINDS} (layer_types, or linear_attn_config's full_attn_layers "
           "and kda_layers covering every layer)")
    return kinds


def _dense_layers(hf: dict, kinds: list[str]) -> int:
    """How many first layers keep a dense MLP (``mlp_layer_types``, else ``first_k_dense_replace``, 1 by default),
    refusing dense layers after expert ones and dense layers of both kinds (jaxformer keeps them in one group)."""
    layers = hf["num_hidden_layers"]
    first = hf.get("first_k_dense_replace", 1)  # read by the class only where mlp_layer_types is absent
    mlp = hf["mlp_layer_types"] or ["dense" if i < first else "sparse" for i in range(layers)]
    dense = [i for i, kind in enumerate(mlp) if kind == "dense"]
    refuse(len(mlp) != layers or set(mlp) - {"dense", "sparse"} or dense != list(range(len(dense))),
           f"kimi_linear: mlp_layer_types {mlp} are supported as dense layers first, then sparse ones, one per layer")
    refuse(len(dense) == layers, f"kimi_linear: every layer is dense ({mlp}); a Kimi Linear model needs experts")
    refuse(len({kinds[i] for i in dense}) > 1, f"kimi_linear: the dense layers {dense} mix linear and full attention "
           f"({[kinds[i] for i in dense]}); jaxformer supports dense layers of one kind")
    return len(dense)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    heads, kv_heads = hf["num_attention_heads"], hf["num_key_value_heads"]
    refuse(kv_heads not in (None, heads), f"kimi_linear: num_key_value_heads={kv_heads} differs from "
           f"num_attention_heads={heads}; latent attention has one key per query head")
    refuse(bool(hf["attention_bias"]), "kimi_linear: attention_bias=true is not supported")
    hf["tie_word_embeddings"]  # read and left: KimiLinearForCausalLM never ties its head (_tied_weights_keys {})
    refuse(hf["v_head_dim"] is None, "kimi_linear: v_head_dim must be set (latent attention's value heads)")
    experts = _value(hf, "num_experts")
    refuse(not experts, f"kimi_linear: num_experts={experts!r}; a Kimi Linear model needs routed experts")
    sub, settings = _linear_settings(hf)
    kinds = _layer_kinds(hf, sub)
    linear_heads, linear_width = settings["linear_num_heads"], settings["linear_head_dim"]
    return dict(
        family="decoder", d_model=hf["hidden_size"], num_heads=heads, head_dim=hf["qk_nope_head_dim"],
        rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"], kv_lora_rank=hf["kv_lora_rank"],
        q_lora_rank=hf["q_lora_rank"], d_ff=hf["intermediate_size"], decoder_layers=hf["num_hidden_layers"],
        norm="rmsnorm", norm_eps=hf["rms_norm_eps"], norm_bias=False,
        activation=activation(hf["hidden_act"], True, model_type), position="none",
        max_positions=_value(hf, "model_max_length"), attention="causal", qkv_bias=False, out_bias=False,
        mlp_bias=False, tie_embeddings=False, head="none" if arch.endswith("Model") else "lm",
        attention_dropout_rate=hf["attention_dropout"],
        linear_layers=tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention"),
        linear_key_heads=linear_heads, linear_value_heads=linear_heads, linear_key_head_dim=linear_width,
        linear_value_head_dim=linear_width, linear_conv_kernel=settings["linear_conv_kernel_dim"],
        linear_decay="channel",
        num_experts=experts, experts_per_token=_value(hf, "num_experts_per_token"),
        expert_d_ff=hf["moe_intermediate_size"], shared_experts=_value(hf, "num_shared_experts") or 0,
        dense_layers=_dense_layers(hf, kinds), router_score="sigmoid", router_groups=_value(hf, "num_expert_group"),
        router_topk_groups=hf["topk_group"], router_bias=True,
        normalize_router_weights=bool(_value(hf, "moe_renormalize")),
        routed_scaling=float(hf["routed_scaling_factor"]))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    """transformers 5's keys, each by the spelling the loaded file used (a published file's linear_attn_config and
    first_k_dense_replace, which the config class reads first, kept in step)."""
    la, experts, L = cfg.linear_attention, cfg.experts, cfg.decoder_layers
    kinds = ["linear_attention" if i in la.layers else "full_attention" for i in range(L)]
    spelled = lambda key: ALIASES[key] if ALIASES[key] in out else key  # noqa: E731
    out.update({spelled("num_experts"): experts.count, spelled("num_experts_per_token"): experts.per_token,
                spelled("moe_renormalize"): experts.normalize_weights,
                spelled("num_expert_group"): experts.router_groups, spelled("num_shared_experts"): experts.shared,
                spelled("model_max_length"): cfg.max_positions})
    out.update(hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, moe_intermediate_size=cfg.expert_width,
               num_hidden_layers=L, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
               qk_nope_head_dim=cfg.head_dim_, qk_rope_head_dim=cfg.latent.rope_head_dim, v_head_dim=cfg.value_dim,
               kv_lora_rank=cfg.latent.kv_rank, q_lora_rank=cfg.latent.q_rank, rms_norm_eps=cfg.norms.eps,
               hidden_act="silu", tie_word_embeddings=False, attention_bias=False,
               attention_dropout=cfg.attention_dropout_rate, topk_group=experts.router_topk_groups,
               routed_scaling_factor=experts.routed_scaling, layer_types=kinds,
               mlp_layer_types=["dense"] * experts.dense_layers + ["sparse"] * (L - experts.dense_layers),
               linear_head_dim=la.key_head_dim, linear_num_heads=la.key_heads, linear_conv_kernel_dim=la.conv_kernel)
    if isinstance(out.get("linear_attn_config"), dict):
        out["linear_attn_config"] = {
            **out["linear_attn_config"], "head_dim": la.key_head_dim, "num_heads": la.key_heads,
            "short_conv_kernel_size": la.conv_kernel,
            "full_attn_layers": [i + 1 for i, kind in enumerate(kinds) if kind == "full_attention"],
            "kda_layers": [i + 1 for i in la.layers]}
    if "first_k_dense_replace" in out:
        out["first_k_dense_replace"] = experts.dense_layers


def _delta_rules(cfg: ModelConfig, A: tuple[str, ...], a: str) -> list[Rule]:
    """Kimi Delta Attention's tensors: q, k, v [H Dk, D]; their convolutions [H Dk, 1, K] each (side by side in
    jaxformer's [K, 3 H Dk]); A_log [1, 1, H, 1]; dt_bias [H Dk]; f_a, g_a [Dk, D]; f_b, g_b [H Dk, Dk]; b [H, D];
    the output norm's scale [Dk]; o [D, H Dk]."""
    H, Dk = cfg.linear_attention.value_heads, cfg.linear_attention.key_head_dim
    convs = tuple(f"{a}.{n}_conv1d.weight" for n in "qkv")
    return [heads_in(A + (n,), f"{a}.{n}_proj.weight", H, Dk) for n in "qkv"] + [
        Rule((A + ("conv",),), convs, lambda t: [np.concatenate([w[:, 0] for w in t]).T],
             lambda p: [w.T[:, None] for w in np.split(p[0], 3, axis=1)]),
        Rule((A + ("A_log",),), (f"{a}.A_log",), lambda t: [t[0].reshape(-1)], lambda p: [p[0].reshape(1, 1, -1, 1)]),
        Rule((A + ("dt_bias",),), (f"{a}.dt_bias",), lambda t: [t[0].reshape(H, Dk)], lambda p: [p[0].reshape(-1)]),
        linear(A + ("f_down",), f"{a}.f_a_proj.weight"), heads_in(A + ("f_up",), f"{a}.f_b_proj.weight", H, Dk),
        linear(A + ("gate_down",), f"{a}.g_a_proj.weight"), heads_in(A + ("gate_up",), f"{a}.g_b_proj.weight", H, Dk),
        linear(A + ("b",), f"{a}.b_proj.weight"), copy(A + ("norm_scale",), f"{a}.o_norm.weight"),
        heads_out(A + ("o",), f"{a}.o_proj.weight", H, Dk)]


def _mlp_rules(cfg: ModelConfig, M: tuple[str, ...], m: str, published: str | None = None) -> list[Rule]:
    """A dense MLP's gate, up and down projections under ``m``; with ``published``, the same tensors under that name
    too, read when a file holds them there and never written (the published files' ``mlp.``)."""
    out = [linear(M + (p,), f"{m}.{n}.weight") for p, n in (("wi_gate", "gate_proj"), ("wi", "up_proj"),
                                                              ("wo", "down_proj"))]
    if published is None:
        return out
    read_only = [Rule(r.paths, (r.names[0].replace(m, published, 1),), r.load, lambda p: [], optional=True)
                 for r in out]
    return [Rule(r.paths, r.names, r.load, r.save, optional=True) for r in out] + read_only


def _moe_rules(cfg: ModelConfig, M: tuple[str, ...], m: str) -> list[Rule]:
    experts = range(cfg.experts.count)
    out = [linear(M + ("router",), f"{m}.gate.weight"), copy(M + ("router_bias",), f"{m}.gate.e_score_correction_bias"),
           stacked_experts(M + ("wi_gate",), [f"{m}.experts.{e}.w1.weight" for e in experts]),
           stacked_experts(M + ("wi",), [f"{m}.experts.{e}.w3.weight" for e in experts]),
           stacked_experts(M + ("wo",), [f"{m}.experts.{e}.w2.weight" for e in experts])]
    if cfg.experts.shared:
        out += _mlp_rules(cfg, M + ("shared",), f"{m}.shared_experts")
    return out


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    layer = f"{prefix}layers.{{i}}"
    a, moe = f"{layer}.self_attn", f"{layer}.block_sparse_moe"
    L, dense, linear_at = cfg.decoder_layers, range(cfg.experts.dense_layers), set(cfg.linear_attention.layers)

    def block(S: tuple[str, ...], linear_layer: bool, experts: bool) -> list[Rule]:
        mixer = (_delta_rules if linear_layer else deepseek.latent_rules)(cfg, S + ("attn",), a)
        mlp = _moe_rules(cfg, S + ("mlp",), moe) if experts else _mlp_rules(cfg, S + ("mlp",), moe, f"{layer}.mlp")
        return [*mixer, copy(S + ("attn_norm", "scale"), f"{layer}.input_layernorm.weight"),
                copy(S + ("mlp_norm", "scale"), f"{layer}.post_attention_layernorm.weight"), *mlp]

    groups = [("dense_blocks", list(dense), bool(set(dense) & linear_at), False),
              ("linear_blocks", [i for i in range(L) if i in linear_at and i not in dense], True, True),
              ("blocks", [i for i in range(L) if i not in linear_at and i not in dense], False, True)]
    out = [copy(("embed", "table"), f"{prefix}embed_tokens.weight"),
           copy(("decoder", "final_norm", "scale"), f"{prefix}norm.weight")]
    for group, layers, linear_layer, experts in groups:
        if layers:
            out += [rule.at_layers(layers) for rule in block(("decoder", group), linear_layer, experts)]
    head, aliases = lm_head(cfg, f"{prefix}embed_tokens.weight")
    return out + head, aliases


HARMLESS = {
    **dict.fromkeys(("head_dim", "qk_head_dim"), "derived from qk_rope_head_dim and qk_nope_head_dim by the config "
                                                 "class, whatever the file says"),
    **dict.fromkeys(("rope_theta", "rope_scaling", "rope_parameters"),
                    "its latent attention applies no rotary positions (NoPE), so no rotary setting changes a number"),
    **dict.fromkeys(("mla_use_nope", "moe_router_activation_func", "use_grouped_topk", "moe_layer_freq",
                     "pretraining_tp"),
                    "the released remote code's settings, which transformers' Kimi Linear never reads (its latent "
                    "attention is always NoPE, its router always sigmoid-scored and grouped, experts in every layer "
                    "past the dense ones)"),
    "num_nextn_predict_layers": "multi-token-prediction layers, which transformers' Kimi Linear never builds "
                                "(the published files hold none)",
}

ARCHITECTURE = Architecture(CLASSES, {"kimi_linear": "model."}, ("KimiLinearModel",), config_from_hf, config_to_hf,
                            rules, harmless=HARMLESS, defaults=DEFAULTS)
