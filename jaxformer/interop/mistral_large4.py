"""Mistral Large 4 (``mistral_large4_text``, and the text model of ``mistral_large4`` files): config and tensor
rules, both directions.

DeepSeek-V3.2's sparse latent attention and Mistral Small 4's softmax-routed experts (groups scored by their
best two, weights always renormalised; the router in float32, as ours always is), with four ideas of its own:
- a plain query projection; the indexer's queries come from the layer's input through a LayerNorm with bias, then
  ``wq_b`` (``index_query_from_input``), and its rotary part rotates adjacent pairs, as the attention's does;
- each head's queries, the attention's and the indexer's, times s_h ln(p + 1) + b_h at position p, s and b learned
  per layer (transformers' ``softmax_scaling``; ``query_log_position_scale``);
- LeRoPE: the rotary frequencies times exp(alpha), alpha learned, one per frequency for the whole model
  (``rope_learned_frequencies``);
- NoPE layers (``no_rope_layers``: 0 where a layer has no rotary positions, every fourth by default): no rotary key,
  the query's rotary numbers join its part without positions, the indexer rotates nothing. Their latent and key
  projections have shapes of their own: a block group of their own (``nope_blocks``).
The file's head is the wrapper's: ``MistralLarge4ForConditionalGeneration`` softcaps its logits by the text
config's ``final_logit_softcapping`` (the text model alone has no head, so the key changes nothing there; it is
kept in ``logits_softcap`` either way).

Refused by name: layers reading another layer's latent cache (``kv_source_layers`` other than each layer's own),
layers reusing an earlier layer's top-k choice (``indexer_types`` 'shared'), NoPE layers among the dense ones.

The tensors go by three sets of names. The wrapper as published and as transformers writes it by default
(``save_original_format``): Mistral's own at the root (``tok_embeddings``, ``layers.N.attention.wq``,
``wkv_a_with_mqa``, ``kv_a_norm``, ``wkv_b``, ``wo``, ``ssmax_scaling.s``/``.b``, ``attention_norm``,
``ffn_norm``, ``feed_forward.w1``/``w2``/``w3``, ``gate``, ``experts.E.w1``..., ``shared_experts.w1``...,
``lerope.alpha``, ``output``). The wrapper as its modules name them (``model.language_model.*``, ``lm_head``,
experts fused as ``gate_up_proj``). The text model as its save_pretrained writes it: Mistral's names where
transformers' text mapping reverses them, its modules' elsewhere (``embed_tokens``, ``attention.o_proj``,
``feed_forward.gate_proj``, ``shared_experts.gate_proj``, ``rotary_emb.alpha``). A wrapper is never written
(registry: wrappers), and the text model has no head, so a model with an LM head is not exported.
The vision tower and its projector are skipped with a note (text only).
"""

from __future__ import annotations

from typing import Any

from jaxformer.layer_plan import layer_plan
from jaxformer.model_config import ModelConfig
from jaxformer.interop import deepseek, glm_moe_dsa, mistral4
from jaxformer.interop.rules import (Architecture, Rule, copy, heads_in, heads_out, linear, refuse, rope_spec,
                                     rope_to_hf, stacked_experts, sub_config, text_model_from_hf)

TEXT, WRAPPER = "mistral_large4_text", "mistral_large4"
CLASSES = {TEXT: ("MistralLarge4TextModel",), WRAPPER: ("MistralLarge4ForConditionalGeneration",)}
MODULE_PREFIX = "model.language_model."  # the wrapper's text model as its modules name it
# MistralLarge4TextConfig's defaults, for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {TEXT: dict(
    vocab_size=204800, hidden_size=6144, intermediate_size=24576, moe_intermediate_size=6144, num_hidden_layers=72,
    num_attention_heads=64, num_key_value_heads=64, n_shared_experts=1, n_routed_experts=128,
    routed_scaling_factor=1.0, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=64,
    n_group=1, topk_group=1, num_experts_per_tok=4, hidden_act="silu", max_position_embeddings=1048576,
    rms_norm_eps=1e-5, pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    rope_parameters=None, mlp_layer_types=None, attention_bias=False, attention_dropout=0.0, index_topk=2048,
    index_head_dim=128, index_n_heads=32, first_k_dense_replace=1, layer_types=None, indexer_types=None,
    no_rope_layers=None, kv_source_layers=None, final_logit_softcapping=30.0),
    WRAPPER: dict(tie_word_embeddings=False)}
# the rotary settings MistralLarge4TextConfig writes for a file without any: yarn over a 512-token pretraining
# window, no magnitude scaling
DEFAULT_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2048.0, "original_max_position_embeddings": 512,
                "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.0}
VISION = ("vision_encoder.", "vision_tower.", "multi_modal_projector.", "pre_mm_projector_norm.", "patch_merger.",
          "vision_language_adapter.")


def nope_layers(hf: dict) -> tuple[int, ...]:
    """The layers without rotary positions: 0 in ``no_rope_layers`` (1 rotates), else every
    ``no_rope_layer_interval``-th layer (4), as the config class derives them."""
    layers, flags = hf["num_hidden_layers"], hf["no_rope_layers"]
    interval = hf.get("no_rope_layer_interval", 4)  # (read either way: beside the list it changes nothing)
    if flags is None:
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    refuse(len(flags) < layers, f"{TEXT}: no_rope_layers has {len(flags)} entries for {layers} layers")
    return tuple(i for i in range(layers) if not flags[i])


def text_config_from_hf(hf: dict, model_type: str, arch: str) -> dict[str, Any]:
    layers = hf["num_hidden_layers"]
    sources = hf["kv_source_layers"]
    refuse(sources is not None and len(sources) != layers, f"{TEXT}: kv_source_layers has {len(sources or ())} "
           f"entries for {layers} layers (transformers refuses it too)")
    shared_kv = [i for i, source in enumerate(sources or range(layers)) if source != i]
    refuse(bool(shared_kv), f"{TEXT}: kv_source_layers make layers {shared_kv} read an earlier layer's latent "
           "cache; jaxformer gives every latent layer its own")
    shared = [i for i, kind in enumerate(glm_moe_dsa.indexer_types(hf, TEXT)) if kind == "shared"]
    refuse(bool(shared), f"{TEXT}: indexer_types make layers {shared} 'shared' (reusing an earlier layer's top-k "
           "keys, from indexer_types or index_topk_freq / index_skip_topk_offset / index_topk_pattern); jaxformer "
           "runs the indexer in every layer")
    refuse(not hf["index_n_heads"], f"{TEXT}: index_n_heads={hf['index_n_heads']!r}; its sparse attention needs the "
           "indexer's heads")
    dense = deepseek.indexed_dense_layers(hf, TEXT)
    nope = nope_layers(hf)
    refuse(any(i < dense for i in nope), f"{TEXT}: no_rope_layers make dense layers {[i for i in nope if i < dense]} "
           "NoPE layers; jaxformer builds its NoPE latent layers with experts")
    legacy, current = hf.get("rope_scaling"), hf["rope_parameters"]  # (both read: a null beside the other is harmless)
    params = dict(legacy or current or DEFAULT_ROPE)
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    rope = rope_spec(params, hf["max_position_embeddings"])
    routed, renamed = hf["n_routed_experts"], hf.get("num_experts")  # the config class re-routes num_experts
    experts = routed if renamed is None else renamed
    softcap = hf["final_logit_softcapping"]
    fields = deepseek.latent_decoder(hf, model_type, arch, experts, rope)
    return dict(
        fields, q_lora_rank=None, latent_norm_eps=hf["rms_norm_eps"], rope_interleave=True,
        rope_learned_frequencies=True, nope_layers=nope or None,
        index_heads=hf["index_n_heads"], index_head_dim=hf["index_head_dim"], index_topk=hf["index_topk"],
        index_rope_interleave=True, index_query_from_input=True, query_log_position_scale=True,
        dense_layers=dense, router_score="softmax", router_group_score="best_two", router_groups=hf["n_group"] or 1,
        router_topk_groups=hf["topk_group"] or 1, router_bias=False, normalize_router_weights=True,
        logits_softcap=None if softcap is None else float(softcap))


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    if model_type == TEXT:
        return text_config_from_hf(hf, model_type, arch)
    refuse(hf.get("text_config") is None, f"{WRAPPER}: the file has no text_config; jaxformer reads the text model "
           "a file describes")
    refuse(sub_config(hf, "text_config").get("model_type", TEXT) != TEXT,
           f"{WRAPPER}: text_config model_type must be {TEXT!r}")
    return text_model_from_hf(hf, model_type, DEFAULTS[TEXT], lambda text: text_config_from_hf(text, TEXT, arch))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    if model_type != TEXT:
        raise ValueError(f"{WRAPPER}: a multimodal file is not written; its text model is written as {TEXT!r}")
    deepseek.config_to_hf(cfg, "deepseek_v32", out)
    L, k = cfg.decoder_layers, cfg.experts.dense_layers
    nope = set(cfg.nope.layers) if cfg.nope is not None else set()
    indexer = cfg.indexer
    out.update(rope_parameters=rope_to_hf(cfg), index_n_heads=indexer.heads, index_head_dim=indexer.head_dim,
               index_topk=indexer.topk, no_rope_layers=[int(i not in nope) for i in range(L)],
               kv_source_layers=list(range(L)), indexer_types=["full"] * L, layer_types=["indexed_attention"] * L,
               mlp_layer_types=["dense"] * k + ["sparse"] * (L - k), final_logit_softcapping=cfg.logits.softcap)
    for key in ("q_lora_rank", "norm_topk_prob", "head_dim"):  # not its class's keys, or derived by it
        out.pop(key, None)


def _names(layout: str) -> dict[str, str]:
    """The tensor names of one layout ('text', 'native' or 'modules'); ``{a}`` the attention, ``{m}`` the layer."""
    if layout == "modules":
        p = MODULE_PREFIX
        return dict(embed=f"{p}embed_tokens.weight", norm=f"{p}norm.weight", alpha=f"{p}rotary_emb.alpha",
                    head="lm_head.weight", layer=f"{p}layers.{{i}}", attn="self_attn", q="q_proj",
                    kv_a="kv_a_proj_with_mqa", kv_norm="kv_a_layernorm", kv_b="kv_b_proj", o="o_proj",
                    scale="softmax_scaling.scale", bias="softmax_scaling.bias", attn_norm="input_layernorm",
                    mlp_norm="post_attention_layernorm", mlp="mlp", gate="gate_proj", up="up_proj", down="down_proj",
                    router="mlp.gate", shared="mlp.shared_experts", shared_gate="gate_proj", shared_up="up_proj",
                    shared_down="down_proj")
    native = layout == "native"
    w = lambda n, name: n if native else name  # noqa: E731 (where the text model's save keeps the module's name)
    return dict(embed="tok_embeddings.weight" if native else "embed_tokens.weight", norm="norm.weight",
                alpha="lerope.alpha" if native else "rotary_emb.alpha", head="output.weight", layer="layers.{i}",
                attn="attention", q="wq", kv_a="wkv_a_with_mqa", kv_norm="kv_a_norm", kv_b="wkv_b", o=w("wo", "o_proj"),
                scale="ssmax_scaling.s", bias="ssmax_scaling.b", attn_norm="attention_norm", mlp_norm="ffn_norm",
                mlp="feed_forward", gate=w("w1", "gate_proj"), up=w("w3", "up_proj"), down=w("w2", "down_proj"),
                router="gate", shared="shared_experts", shared_gate=w("w1", "gate_proj"),
                shared_up=w("w3", "up_proj"), shared_down=w("w2", "down_proj"))


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    layout = "text" if model_type == TEXT else "modules" if prefix else "native"
    n = _names(layout)
    layer = n["layer"]
    a, m = f"{layer}.{n['attn']}", f"{layer}.{n['mlp']}"
    N, C, R, Hv = cfg.num_heads, cfg.latent.kv_rank, cfg.latent.rope_head_dim, cfg.value_dim
    ss = lambda where: (f"{where}.{n['scale']}", f"{where}.{n['bias']}")  # noqa: E731

    def block_rules(S: tuple[str, ...], group: str) -> list[Rule]:
        A, I, mlp = S + ("attn",), S + ("attn", "indexer"), S + ("mlp",)
        Hk = cfg.head_dim_ + (R if group == "nope_blocks" else 0)  # a NoPE layer's keys: no rotary key beside
        i = f"{a}.indexer"
        out = [copy(S + ("attn_norm", "scale"), f"{layer}.{n['attn_norm']}.weight"),
               copy(S + ("mlp_norm", "scale"), f"{layer}.{n['mlp_norm']}.weight"),
               heads_in(A + ("q",), f"{a}.{n['q']}.weight", N, cfg.head_dim_ + R),
               linear(A + ("kv_down",), f"{a}.{n['kv_a']}.weight"),
               copy(A + ("kv_norm",), f"{a}.{n['kv_norm']}.weight"),
               Rule((A + ("k_up",), A + ("v_up",)), (f"{a}.{n['kv_b']}.weight",), *deepseek.latent_up(C, N, Hk, Hv)),
               heads_out(A + ("o",), f"{a}.{n['o']}.weight", N, Hv),
               copy(A + ("log_position_scale",), ss(a)[0]), copy(A + ("log_position_bias",), ss(a)[1]),
               *deepseek.indexer_rules(cfg, I, i),
               copy(I + ("q_norm_scale",), f"{i}.q_input_norm.weight"),
               copy(I + ("q_norm_bias",), f"{i}.q_input_norm.bias"),
               copy(I + ("log_position_scale",), ss(i)[0]), copy(I + ("log_position_bias",), ss(i)[1])]
        if group == "dense_blocks":
            return out + [linear(mlp + ("wi_gate",), f"{m}.{n['gate']}.weight"),
                          linear(mlp + ("wi",), f"{m}.{n['up']}.weight"),
                          linear(mlp + ("wo",), f"{m}.{n['down']}.weight")]
        shared, s = mlp + ("shared",), f"{layer}.{n['shared']}"
        out += [linear(mlp + ("router",), f"{layer}.{n['router']}.weight"),
                linear(shared + ("wi_gate",), f"{s}.{n['shared_gate']}.weight"),
                linear(shared + ("wi",), f"{s}.{n['shared_up']}.weight"),
                linear(shared + ("wo",), f"{s}.{n['shared_down']}.weight")]
        if layout == "modules":  # fused [E, 2F, D] and [E, D, F], as transformers' modules hold them
            return out + mistral4.experts_rules(mlp, f"{layer}.mlp.experts")
        experts = [f"{layer}.experts.{e}" for e in range(cfg.experts.count)]
        return out + [stacked_experts(mlp + ("wi_gate",), [f"{e}.w1.weight" for e in experts]),
                      stacked_experts(mlp + ("wi",), [f"{e}.w3.weight" for e in experts]),
                      stacked_experts(mlp + ("wo",), [f"{e}.w2.weight" for e in experts])]

    plan = layer_plan(cfg, cfg.attention, cfg.decoder_layers)
    out = [copy(("embed", "table"), n["embed"]), copy(("decoder", "final_norm", "scale"), n["norm"]),
           copy(("decoder", "rope_log_scale"), n["alpha"])]
    for group in ("dense_blocks", "blocks", "nope_blocks"):
        layers = [i for i, spec in enumerate(plan.layers) if spec.group == group]
        if layers:
            out += [rule.at_layers(layers) for rule in block_rules(("decoder", group), group)]
    if cfg.head != "lm":
        return out, {}
    if cfg.embeddings.tie:
        return out, {n["head"]: n["embed"]}
    return out + [linear(("lm_head", "kernel"), n["head"])], {}


def ignored(hf: dict, names: set[str]) -> tuple[set[str], str]:
    """The wrapper's vision tower and projector (and its multi-token-prediction draft head, which transformers
    skips too): the text model never reads them."""
    skipped = {name for name in names if name.removeprefix("model.").startswith(VISION + ("mtp_dspark.",))}
    if not skipped:
        return set(), ""
    return skipped, (f"{len(skipped)} tensors of the vision tower, its projector or the draft head are not used by "
                     "jaxformer (it reads the text model) and were skipped")


_TEXT_HARMLESS = {
    **dict.fromkeys(("head_dim", "qk_head_dim"), "derived from qk_rope_head_dim and qk_nope_head_dim by the config "
                                                 "class, whatever the file says"),
    "output_router_logits": "what the forward returns beside the logits, not the numbers",
    **dict.fromkeys(("norm_topk_prob", "mlp_bias"), "removed from its config class; its modeling code never reads "
                                                    "it (the router's weights are always renormalised, no MLP bias)"),
}
HARMLESS = {**_TEXT_HARMLESS, **{f"text_config.{key}": why for key, why in _TEXT_HARMLESS.items()},
            "vision_config": "the vision tower's, which jaxformer does not run (text only)",
            **dict.fromkeys(("projector_hidden_act", "multimodal_projector_bias", "spatial_merge_size",
                             "vision_feature_layer"), "the vision projector's, which jaxformer does not run"),
            **dict.fromkeys(("image_token_index", "image_token_id"),
                            "the image placeholder token, which only the vision path reads")}

ARCHITECTURE = Architecture(CLASSES, {TEXT: "", WRAPPER: MODULE_PREFIX}, ("MistralLarge4TextModel",),
                            config_from_hf, config_to_hf, rules, ignored=ignored, harmless=HARMLESS,
                            defaults=DEFAULTS, wrappers=(WRAPPER,))
