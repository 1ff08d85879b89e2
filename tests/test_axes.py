"""Every parameter carries logical axis names: one per dimension, from one vocabulary, consistent
sizes per name, and a leading 'layers' axis on stacked block parameters."""

from __future__ import annotations

import math

import jax
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer.layer_plan import GROUPS, stack_plans
from jaxformer.layers import Buffer, RouterBias, logical_axes, param
from conftest import TINY, tiny_config, tiny_model

AXIS_NAMES = {"embed", "embed_out", "heads", "kv_heads", "head_dim", "mlp", "vocab", "layers", "unstaged_layers", "experts",
              "positions", "types", "buckets", "labels", "latent", "segments", "index_heads", "index_head_dim",
              "embedding", "relative", "conv_width", "conv_in", "conv_channels", "rotary_frequencies",
              "scalar",
              "aspect_ratio", "tile_embed",  # Llama 3.2 Vision's tile tables: a row per aspect-ratio id, tiles x width
              "patch",  # an image tower's flattened patch (channels x patch x patch), the patch projection's input
              # DeepSeek-V4: hyper-connections, the grouped output projection, compressors, hash routing
              "hc_in", "hc_mix", "hc_scales", "hc_streams", "out_groups", "group_in", "out_rank", "grouped_out",
              "compressed_width", "block_positions", "experts_per_token"}

VARIANTS = {
    "untied-lm-head": ("tiny-gpt", dict(tie_embeddings=False)),
    "decoder-no-head": ("tiny-gpt", dict(head="none")),
    "unrolled": ("tiny-gpt", dict(scan_layers=False)),
    "mlm-tied": ("tiny-bert", dict(head="mlm")),
    "mlm-untied": ("tiny-bert", dict(head="mlm", tie_embeddings=False)),
    "pretraining": ("tiny-bert", dict(head="pretraining")),
    "sequence-classification": ("tiny-bert", dict(head="sequence_classification", num_labels=3)),
    "token-classification": ("tiny-bert", dict(head="token_classification", num_labels=5)),
    "question-answering": ("tiny-bert", dict(head="question_answering", pooler=False)),
    "roberta-like": ("tiny-bert", dict(type_vocab_size=1, position_offset=2)),
    "albert-like": ("tiny-bert", dict(embedding_size=16, shared_layers=True, head="pretraining")),
    "electra-generator-like": ("tiny-bert", dict(embedding_size=24, head="mlm", tie_embeddings=False, pooler=False)),
    "electra-discriminator": ("tiny-bert", dict(head="discriminator", pooler=False)),
    "modernbert-like": ("tiny-bert", dict(norm_position="pre", final_norm=True, first_attn_norm=False,
                                          activation="geglu_erf", position="rope", attention="alternating",
                                          window_size=4, layer_types=("full", "sliding"), local_rope_theta=1e4,
                                          type_vocab_size=0, pooler=False, prediction_head=True,
                                          head="token_classification", num_labels=5, head_bias=False)),
    # DeBERTa v1 (keys without bias, own position projections) and v2 (buckets, a normed table, the convolution)
    "deberta-v1-like": ("tiny-bert", dict(position="disentangled", key_bias=False, max_relative_positions=6,
                                          type_vocab_size=0, head="sequence_classification", pooler_activation="gelu")),
    "deberta-v2-like": ("tiny-bert", dict(position="disentangled", position_buckets=4, max_relative_positions=8,
                                          relative_embedding_norm=True, conv_kernel_size=3, conv_groups=2,
                                          disentangled_terms=("c2p",), head="mlm", pooler=False)),
    "moe-qkv-bias": ("tiny-mixtral", dict(qkv_bias=True, num_experts=3, experts_per_token=1)),
    "mla-plain-query": ("tiny-deepseek", dict(q_lora_rank=None, dense_layers=0, shared_experts=0)),
    "mla-indexer": ("tiny-deepseek", dict(index_heads=2, index_head_dim=16, index_topk=8)),
    # gpt-oss: sinks, biased experts and router; Llama 4: a weightless q/k norm (no parameter), a shared expert
    "gpt-oss-like": ("tiny-mixtral", dict(attention_sinks=True, expert_bias=True, router_logit_bias=True,
                                          qkv_bias=True, swiglu_limit=7.0)),
    "maverick-like": ("tiny-mixtral", dict(decoder_layers=4, moe_layer_step=2, shared_experts=1)),
    "llama4-like": ("tiny-mixtral", dict(qk_norm=True, qk_norm_scale=False, router_score="sigmoid",
                                         router_weights_on_input=True, shared_experts=1, normalize_router_weights=False,
                                         nope_layers=(1,), temperature_floor_scale=8)),
    "llama-qkv-bias": ("tiny-llama", dict(qkv_bias=True, num_kv_heads=1)),
    "t5-v1_1-untied": ("tiny-t5", dict(tie_embeddings=False, scale_tied_logits=False, activation="geglu")),
    "t5-uneven-stacks": ("tiny-t5", dict(encoder_layers=3, decoder_layers=1)),
    "bart-logits-bias": ("tiny-transformer", dict(logits_bias=True)),  # a Buffer, not a Param
    "xlnet-like": ("tiny-transformer-xl", dict(relative_segments=True, shared_relative_biases=False,
                                               lm_head_bias=True, attention="bidirectional")),
}

CASES = [pytest.param(name, {}, id=name) for name in TINY] + [
    pytest.param(base, changes, id=variant) for variant, (base, changes) in VARIANTS.items()]


def _expected_sizes(cfg: jf.ModelConfig) -> dict[str, set[int]]:
    """The length each logical axis name must have in a model of ``cfg``."""
    f = cfg.to_flat()  # every setting, an absent part's at its 'off' value
    linear = cfg.linear_attention  # (Qwen3-Next's linear layers: key heads serving groups of value heads)
    # Qwen2-VL's merger: merge² states joined (the width of its MLP), then projected to the text model's width
    joined = {cfg.d_model * f["patch_merge_size"] ** 2} if f["patch_merge_size"] else set()
    own = {k for k in (f["full_kv_heads"],) if k}, {d for d in (f["full_head_dim"],) if d}  # Gemma 4's full layers
    return {
        "embed": {cfg.d_model}, "embed_out": {cfg.d_model, f["pooled_projection"]}  # (SigLIP's text head)
        | joined | ({f["merged_width"]} if joined else set()),
        "heads": {cfg.num_heads} | ({linear.value_heads} if linear else set()),
        "kv_heads": {cfg.kv_heads} | ({linear.key_heads} if linear else set()) | own[0],
        "head_dim": {cfg.head_dim_} | ({cfg.head_dim_ + f["rope_head_dim"], cfg.value_dim} if cfg.mla else set())
        | ({linear.key_head_dim, linear.value_head_dim} if linear else set()) | own[1],
        "mlp": {cfg.d_ff, cfg.expert_width, f["shared_experts"] * cfg.expert_width, f["kv_shared_d_ff"]} | joined,
        "vocab": {cfg.vocab_size, cfg.token_rows, f["per_layer_vocab_size"]},
        "experts": {f["num_experts"]},
        "latent": ({f["kv_lora_rank"], f["q_lora_rank"], f["kv_lora_rank"] + f["rope_head_dim"]} if cfg.mla else set())
        # Kimi Delta Attention's decay and gate bottlenecks, head-wide
        | ({linear.key_head_dim, linear.value_head_dim} if linear and linear.decay == "channel" else set()),
        "positions": {cfg.max_positions + f["position_offset"]}
        | ({cfg.audio.source_positions} if cfg.audio else set()),  # (Whisper's encoder table)
        "types": {f["type_vocab_size"]},
        "buckets": {f["relative_buckets"]},
        "labels": {f["num_labels"], 2, 1},  # classifiers: num_labels; NSP and QA spans: 2; ELECTRA's discriminator: 1
        "segments": {2},  # XLNet's relative segment encodings: same segment, other segment
        "index_heads": {f["index_heads"]}, "index_head_dim": {f["index_head_dim"]},  # DeepSeek-V3.2's indexer
        # factorised embeddings (ALBERT, ELECTRA); Gemma 4's per-layer inputs, one slice or every layer's
        "embedding": {f["embedding_size"], f["per_layer_input_size"], f["per_layer_input_size"] * cfg.decoder_layers},
        "scalar": {1},  # Gemma 4's stored per-layer output scale
        "rotary_frequencies": {cfg.rope_dim // 2} if cfg.rotary is not None else set(),  # LeRoPE's learned scales
        # (Qwen2-VL's patches span ``temporal`` frames)
        "patch": {cfg.patches.channels * cfg.patches.temporal * cfg.patches.patch_size ** 2} if cfg.patches else set(),
        "aspect_ratio": {len(cfg.patches.aspect_ratios) + 1} if cfg.patches else set(),  # (id 0: no image)
        "tile_embed": {n * cfg.patches.tiles * cfg.d_model for n in (1, cfg.patches.tokens)} if cfg.patches else set(),
        # DeBERTa: the relative-position table's rows, v2's convolution
        "relative": {2 * cfg.disentangled.span(cfg.max_positions)} if cfg.disentangled else set(),
        "conv_width": {f["conv_kernel_size"]} | ({linear.conv_kernel} if linear else set())
        | ({3} if cfg.audio else set()),  # Whisper's two convolutions of width 3, from mel bins, then from d_model
        "conv_in": {cfg.d_model // f["conv_groups"]} | ({f["num_mel_bins"]} if cfg.audio else set()),
        "conv_channels": {linear.conv_width} if linear else set(),
        **_compressed_sizes(cfg),
    }


def _compressed_sizes(cfg: jf.ModelConfig) -> dict[str, set[int]]:
    """DeepSeek-V4's axes: its hyper-connections' and compressed attention's (queries through ``latent``, the
    indexer's heads through ``index_heads`` and ``index_head_dim``)."""
    hyper, part, n = cfg.norms.hyper_connections, cfg.scores.compressed, cfg.to_flat()["hc_streams"]
    sizes = {"hc_in": {n * cfg.d_model}, "hc_mix": {(2 + n) * n}, "hc_scales": {3}, "hc_streams": {n}} if hyper else {}
    if part is None:
        return sizes
    H, G, Di = cfg.head_dim_, part.out_groups, part.index_head_dim
    return {**sizes, "out_groups": {G}, "group_in": {cfg.num_heads * H // G}, "out_rank": {part.out_rank},
            "grouped_out": {G * part.out_rank}, "compressed_width": {H, 2 * H, Di, 2 * Di},
            "block_positions": {part.sparse_rate, part.heavy_rate}, "experts_per_token": {cfg.experts.per_token},
            "latent": {part.q_rank}, "index_heads": {part.index_heads}, "index_head_dim": {Di}}


def _check_axes(cfg: jf.ModelConfig, flat: dict[tuple, tuple[tuple[int, ...], object]]) -> None:
    """``flat``: parameter path -> (shape, axes metadata)."""
    if cfg.family == "dual_encoder":  # each tower against its own config; then what joins them, widths of either
        towers = {"text": cfg.vision.text_tower(cfg), "vision": cfg.vision.tower}
        for name, tower in towers.items():
            _check_axes(tower, {path[1:]: value for path, value in flat.items() if path[0] == name})
        widths = {cfg.d_model, cfg.head_options.pooled_projection, cfg.vision.tower.d_model, cfg.vision.projection}
        for path, (shape, axes) in flat.items():
            if path[0] not in towers:
                assert len(axes) == len(shape) and set(axes) <= {"embed", "embed_out"}, f"{path}: {axes}"
                assert set(shape) <= widths, f"{path}: shape {shape}, widths {widths}"
        return
    if cfg.family == "decoder" and cfg.vision is not None:  # a decoder reading images: its tower, its projector
        _check_axes(cfg.vision.tower, {path[1:]: value for path, value in flat.items() if path[0] == "vision"})
        widths = {cfg.d_model, cfg.vision.tower.d_model * len(cfg.vision.feature_layers)}
        if cfg.vision.cross_attention:  # (Llama 3.2 Vision's projector reads the tiled tower's whole output)
            widths.add(cfg.vision.tower.patches.output_width(cfg.vision.tower.d_model))
        if cfg.vision.pooled_tokens:  # (Gemma 3's reads the tower's last state alone)
            widths.add(cfg.vision.tower.d_model)
        for path, (shape, axes) in flat.items():
            if path[0] == "projector":
                assert len(axes) == len(shape) and set(axes) <= {"embed", "embed_out"}, f"{path}: {axes}"
                assert set(shape) <= widths, f"{path}: shape {shape}, widths {widths}"
        flat = {path: value for path, value in flat.items() if path[0] not in ("vision", "projector")}
    sizes = _expected_sizes(cfg)
    # each block group holds as many layers as the layer plan places in it (ALBERT's shared group: one)
    stack_layers = {(stack, group): plan.count(group) for stack, plan in stack_plans(cfg).items() for group in GROUPS}
    assert flat, "no parameters found"
    for path, (shape, axes) in flat.items():
        where = "/".join(map(str, path))
        assert isinstance(axes, tuple) and all(isinstance(a, str) for a in axes), f"{where}: axes={axes!r}"
        assert len(axes) == len(shape), f"{where}: shape {shape} but axes {axes}"
        assert set(axes) <= AXIS_NAMES, f"{where}: unknown axis names {set(axes) - AXIS_NAMES}"
        assert len(set(axes)) == len(axes), f"{where}: repeated axis name in {axes} (unshardable)"
        stacked = len(path) > 1 and path[1] in GROUPS
        if stacked:
            # a stack's main run leads with 'layers' (pipeline stages split it); the other groups (layers run apart
            # before it, or of shapes of their own) with 'unstaged_layers' (every stage keeps them whole)
            leading = "layers" if path[1] == "blocks" else "unstaged_layers"
            assert axes[0] == leading, f"{where}: stacked block parameter must lead with {leading!r}, got {axes}"
            assert shape[0] == stack_layers[path[:2]], f"{where}: {shape[0]} layers in stack {path[:2]!r}"
        else:
            assert not {"layers", "unstaged_layers"} & set(axes), f"{where}: layers on a parameter outside the stack"
        for size, name in zip(shape[1:] if stacked else shape, axes[1:] if stacked else axes):
            assert size in sizes[name], f"{where}: axis {name!r} has size {size}, expected {sizes[name]}"


def _abstract_model(cfg: jf.ModelConfig):
    """The model as built by jf.build, traced abstractly (same parameters and metadata, no compute)."""
    return nnx.eval_shape(lambda: jf.build(cfg))


@pytest.mark.parametrize("base, changes", CASES)
def test_every_parameter_has_axes(base, changes):
    cfg = tiny_config(base, **changes)
    model = _abstract_model(cfg)
    axes = logical_axes(model)
    params = {path: var for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    # logical_axes covers every parameter, and only parameters
    assert sorted(axes) == sorted("/".join(map(str, p)) for p in params)
    _check_axes(cfg, {p: (var.shape, axes["/".join(map(str, p))]) for p, var in params.items()})
    trained = [v for v in params.values() if not isinstance(v, RouterBias)]  # HF counts the bias as a buffer
    assert sum(math.prod(v.shape) for v in trained) == jf.param_count(cfg)
    # Non-trained arrays that travel with the checkpoint (buffers) are sharded too: same rules.
    buffers = {path: (var.shape, var.get_metadata().get("axes"))
               for path, var in nnx.to_flat_state(nnx.state(model, Buffer))}
    if buffers:
        _check_axes(cfg, buffers)
    if cfg.logits.fixed_bias:
        assert buffers[("logits_bias",)] == ((cfg.vocab_size,), ("vocab",))


@pytest.mark.parametrize("name", [n for n in jf.presets() if not n.startswith("tiny-")])
def test_every_parameter_of_real_preset_has_axes(name):
    # Real sizes through abstract evaluation: nothing allocated. Parameters and buffers alike.
    model = _abstract_model(jf.config(name))
    flat = {path: (var.shape, var.get_metadata().get("axes"))
            for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    flat.update({path: (var.shape, var.get_metadata().get("axes"))
                 for path, var in nnx.to_flat_state(nnx.state(model, Buffer))})
    _check_axes(jf.config(name), flat)


@pytest.mark.parametrize("name", TINY)
def test_built_model_axes_equal_abstract_axes(name):
    model = tiny_model(name)
    axes = logical_axes(model)
    assert axes == logical_axes(_abstract_model(model.config))
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        assert len(axes["/".join(map(str, path))]) == var.ndim


def test_head_parameters_present_with_expected_axes():
    # The variants above must really contain the heads they are meant to cover.
    def axes_of(base, **changes):
        return logical_axes(_abstract_model(tiny_config(base, **changes)))

    assert axes_of("tiny-gpt", tie_embeddings=False)["lm_head/kernel"] == ("embed", "vocab")
    assert "lm_head/kernel" not in axes_of("tiny-gpt")
    mlm = axes_of("tiny-bert", head="pretraining", tie_embeddings=False)
    assert mlm["mlm/decoder/kernel"] == ("embed", "vocab")
    assert mlm["mlm/bias"] == ("vocab",)
    assert mlm["mlm/transform/kernel"] == ("embed", "embed_out")
    assert mlm["nsp/kernel"] == ("embed", "labels")
    assert mlm["pooler/kernel"] == ("embed", "embed_out")
    assert mlm["embeddings/token_types/table"] == ("types", "embed")
    qa = axes_of("tiny-bert", head="question_answering")
    assert qa["classifier/kernel"] == ("embed", "labels")
    moe = axes_of("tiny-mixtral")
    assert moe["decoder/blocks/mlp/wi"] == ("layers", "experts", "embed", "mlp")
    assert moe["decoder/blocks/mlp/router"] == ("layers", "embed", "experts")
    t5 = axes_of("tiny-t5")
    assert t5["encoder/relative_bias/table"] == ("buckets", "heads")
    assert t5["decoder/blocks/cross_attn/k"] == ("layers", "embed", "kv_heads", "head_dim")


def test_param_rejects_axes_of_wrong_rank():
    with pytest.raises(ValueError, match="axis names"):
        param(nnx.Rngs(0), (4, 8), ("embed",), jf.config("tiny-gpt"))


def test_axes_survive_split_and_merge():
    model = tiny_model("tiny-llama")
    graphdef, state = jf.split(model)
    merged = jf.merge(graphdef, jax.tree.map(lambda x: x, state))
    assert logical_axes(merged) == logical_axes(model)
