"""ModelConfig validation: a bad config fails where it is written, naming the field and the value."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

import jaxformer as jf
from jaxformer.model_config import REMAT_POLICIES, ModelConfig, RopeScaling

# Valid starting points, one per family (tiny presets, so derived sizes are small and known).
BASE = {
    "decoder": lambda: jf.config("tiny-gpt"),  # d_model 64, 4 heads, learned positions
    "rope": lambda: jf.config("tiny-llama"),  # d_model 64, 4 heads, 2 kv heads, rotary positions
    "encoder": lambda: jf.config("tiny-bert"),
    "encoder_decoder": lambda: jf.config("tiny-t5"),
}


def _invalid(base: str, changes: dict, *fragments: str):
    return pytest.param(base, changes, fragments, id=f"{base}-" + "-".join(f"{k}={v}" for k, v in changes.items()))


INVALID = [
    # head geometry
    _invalid("decoder", dict(num_heads=5), "num_heads", "5", "d_model=64"),
    _invalid("decoder", dict(num_heads=3, num_kv_heads=None), "num_heads", "3"),
    _invalid("rope", dict(num_kv_heads=3), "num_kv_heads", "3", "num_heads=4"),
    _invalid("decoder", dict(num_kv_heads=0), "num_kv_heads", "0"),
    _invalid("decoder", dict(head_dim=0), "head_dim", "0"),
    _invalid("rope", dict(head_dim=15), "head_dim", "15"),  # rotary pairs need an even head_dim
    # windows
    _invalid("decoder", dict(attention="sliding", window_size=None), "window_size", "sliding"),
    _invalid("decoder", dict(attention="alternating", window_size=None), "window_size", "alternating"),
    _invalid("decoder", dict(attention="sliding", window_size=0), "window_size", "0"),
    _invalid("decoder", dict(attention="sliding", window_size=-2), "window_size", "-2"),
    _invalid("decoder", dict(attention="alternating", window_size=0), "window_size", "0"),
    _invalid("decoder", dict(attention="causal", window_size=4), "window_size", "4", "causal"),
    _invalid("decoder", dict(attention="prefix", window_size=4), "window_size", "4", "prefix"),
    # unknown enum values: the message also lists what is valid
    _invalid("decoder", dict(family="decoder_only"), "family", "decoder_only", "encoder_decoder"),
    _invalid("decoder", dict(norm="batchnorm"), "norm", "batchnorm", "rmsnorm"),
    _invalid("decoder", dict(norm_position="sandwich"), "norm_position", "sandwich", "pre"),
    _invalid("decoder", dict(activation="tanh"), "activation", "tanh", "swiglu"),
    _invalid("decoder", dict(position="alibi"), "position", "alibi", "rope"),
    _invalid("decoder", dict(attention="dilated"), "attention", "dilated", "sliding"),
    _invalid("decoder", dict(head="seq2seq"), "head", "seq2seq", "lm"),
    _invalid("decoder", dict(remat="everything"), "remat", "everything", "qkv_mlp"),
    _invalid("decoder", dict(dtype="float64"), "dtype", "float64", "bfloat16"),
    _invalid("decoder", dict(param_dtype="int8"), "param_dtype", "int8", "float32"),
    # family / layer counts
    _invalid("decoder", dict(encoder_layers=2), "encoder_layers", "2", "decoder"),
    _invalid("decoder", dict(decoder_layers=0), "decoder_layers", "0", "decoder"),
    _invalid("encoder", dict(decoder_layers=2), "decoder_layers", "2", "encoder"),
    _invalid("encoder", dict(encoder_layers=0), "encoder_layers", "0", "encoder"),
    _invalid("encoder_decoder", dict(encoder_layers=0), "encoder_layers", "0", "encoder_decoder"),
    _invalid("encoder_decoder", dict(decoder_layers=0), "decoder_layers", "0", "encoder_decoder"),
    _invalid("decoder", dict(decoder_layers=-1), "decoder_layers", "-1"),
    # attention pattern vs family
    _invalid("encoder", dict(attention="prefix"), "attention", "prefix", "encoder"),
    _invalid("encoder", dict(attention="causal"), "attention", "causal", "pooled_token"),  # (but a text tower)
    _invalid("decoder", dict(attention="bidirectional"), "attention", "bidirectional", "decoder"),
    _invalid("encoder_decoder", dict(attention="prefix"), "attention", "prefix", "encoder_decoder"),
    # heads vs family
    _invalid("decoder", dict(head="mlm"), "head", "mlm", "decoder"),
    _invalid("encoder", dict(head="lm"), "head", "lm", "encoder"),
    _invalid("encoder", dict(head="sequence_classification", pooler=False), "head", "sequence_classification",
             "pooler"),
    _invalid("decoder", dict(pooler=True), "pooler", "decoder"),
    # mixture of experts
    _invalid("rope", dict(num_experts=4, experts_per_token=5), "experts_per_token", "5", "num_experts=4"),
    _invalid("rope", dict(num_experts=4, experts_per_token=0), "experts_per_token", "0"),
    _invalid("encoder_decoder", dict(num_experts=4), "num_experts", "4", "encoder_decoder"),
    _invalid("rope", dict(num_experts=-1), "num_experts", "-1"),
    # rates and positive sizes
    _invalid("decoder", dict(dropout_rate=1.0), "dropout_rate", "1.0"),
    _invalid("decoder", dict(dropout_rate=-0.1), "dropout_rate", "-0.1"),
    _invalid("decoder", dict(attention_dropout_rate=1.5), "attention_dropout_rate", "1.5"),
    _invalid("decoder", dict(vocab_size=0), "vocab_size", "0"),
    _invalid("decoder", dict(d_model=-64), "d_model", "-64"),
    _invalid("decoder", dict(max_positions=0), "max_positions", "0"),
    _invalid("decoder", dict(norm_eps=0.0), "norm_eps", "0.0"),
    _invalid("decoder", dict(init_std=0.0), "init_std", "0.0"),
    _invalid("decoder", dict(attention_scale=-1.0), "attention_scale", "-1.0"),
    _invalid("decoder", dict(router_aux_loss_coef=-0.5), "router_aux_loss_coef", "-0.5"),
    # positions
    _invalid("decoder", dict(rope_scaling=RopeScaling("linear", 2.0)), "rope_scaling", "learned"),
    _invalid("encoder_decoder", dict(relative_buckets=2), "relative_buckets", "2"),
    # combinations
    _invalid("rope", dict(scale_tied_logits=True), "scale_tied_logits", "tie_embeddings"),
    _invalid("encoder", dict(logits_bias=True), "logits_bias", "head"),
    # Gemma's parts
    _invalid("rope", dict(norm_scale_offset=0.5), "norm_scale_offset", "0.5"),
    _invalid("decoder", dict(norm_position="post", sandwich_norm=True), "sandwich_norm", "post"),
    _invalid("rope", dict(attention="alternating", window_size=2, layer_types=("full", "local")), "layer_types",
             "local", "sliding"),
    _invalid("rope", dict(attention="alternating", window_size=2, layer_types=("full",)), "layer_types", "1 entries"),
    _invalid("rope", dict(layer_types=("full", "sliding")), "layer_types", "causal"),
    _invalid("rope", dict(attention_softcap=0.0), "attention_softcap", "0.0"),
    _invalid("rope", dict(logits_softcap=float("inf")), "logits_softcap", "inf"),
    _invalid("rope", dict(local_rope_theta=100.0), "local_rope_theta", "alternating"),
    _invalid("decoder", dict(shared_embeddings=False), "shared_embeddings", "encoder_decoder"),
    # gpt-oss's, Llama 4's and DeepSeek-V3.2's parts
    _invalid("decoder", dict(swiglu_limit=7.0), "swiglu_limit", "gelu"),
    _invalid("rope", dict(activation="swiglu", swiglu_limit=-1.0), "swiglu_limit", "-1.0"),
    _invalid("rope", dict(expert_bias=True), "expert_bias", "num_experts"),
    _invalid("rope", dict(router_weights_on_input=True), "router_weights_on_input", "num_experts"),
    _invalid("rope", dict(attention="alternating", layer_types=("chunked", "full")), "attention_chunk_size", "None"),
    _invalid("rope", dict(attention="alternating", layer_types=("chunked", "sliding"), attention_chunk_size=2),
             "layer_types", "mixes"),
    _invalid("rope", dict(attention_chunk_size=4), "attention_chunk_size", "chunked"),
    _invalid("rope", dict(nope_layers=(2,)), "nope_layers", "(2,)", "[0, 2)"),
    _invalid("decoder", dict(nope_layers=(0,)), "nope_layers", "position='rope'"),
    _invalid("rope", dict(temperature_floor_scale=8), "temperature_floor_scale", "nope_layers"),
    _invalid("rope", dict(qk_norm_scale=False), "qk_norm_scale", "qk_norm"),
    _invalid("rope", dict(index_heads=2), "index_heads", "kv_lora_rank"),
    _invalid("rope", dict(num_experts=4, decoder_layers=3, moe_layer_step=2), "moe_layer_step", "multiple"),
    _invalid("rope", dict(moe_layer_step=2), "moe_layer_step", "num_experts"),
    _invalid("encoder", dict(pooler_activation="sigmoid"), "pooler_activation", "sigmoid", "relu"),
    _invalid("encoder", dict(embedding_size=0), "embedding_size", "0"),
    # DeBERTa
    _invalid("encoder", dict(position="disentangled", disentangled_terms=("c2p", "p2p")), "disentangled_terms", "p2p"),
    _invalid("encoder", dict(position="disentangled", disentangled_terms=()), "disentangled_terms"),
    _invalid("decoder", dict(position="disentangled"), "position='disentangled'", "family='decoder'"),
    _invalid("encoder", dict(position_buckets=8), "position_buckets=8", "position='disentangled'"),
    _invalid("encoder", dict(position="disentangled", position_buckets=8, max_relative_positions=4),
             "position_buckets=8", "max_relative_positions=4"),
    _invalid("encoder", dict(conv_kernel_size=2), "conv_kernel_size=2", "odd"),
    _invalid("encoder", dict(conv_kernel_size=3, conv_groups=5), "conv_groups=5", "d_model=64"),
    _invalid("encoder", dict(conv_kernel_size=3, conv_activation="swiglu"), "conv_activation", "swiglu"),
    _invalid("decoder", dict(embedding_size=16), "embedding_size", "family='decoder'"),
    _invalid("decoder", dict(shared_layers=True), "shared_layers", "family='decoder'"),
    # special token ids must be valid ids
    _invalid("decoder", dict(pad_token_id=256), "pad_token_id", "256", "vocab_size=256"),
    _invalid("decoder", dict(bos_token_id=-1), "bos_token_id", "-1"),
    _invalid("encoder_decoder", dict(decoder_start_token_id=1000), "decoder_start_token_id", "1000"),
    _invalid("decoder", dict(eos_token_id=(2, 999)), "eos_token_id", "999"),
    _invalid("encoder", dict(pad_aware_positions=True, pad_token_id=None), "pad_aware_positions", "pad_token_id"),
]


@pytest.mark.parametrize("base, changes, fragments", INVALID)
def test_invalid_config_raises_naming_field_and_value(base, changes, fragments):
    cfg = BASE[base]()
    # Through replace() (the usual way to derive a variant) ...
    with pytest.raises(ValueError) as err:
        cfg.replace(**changes)
    message = str(err.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from error message: {message}"
    # ... and from the flat spelling and the nested form (as a run folder stores it): same check, same message.
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        ModelConfig.from_dict({**cfg.to_flat(), **changes})
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        ModelConfig.from_dict({**cfg.to_dict(), **changes})


def test_each_base_config_is_valid():
    # The invalid cases above must fail because of their change, not because of the base.
    for make in BASE.values():
        cfg = make()
        assert cfg.replace() == cfg


def test_explicit_head_dim_makes_indivisible_heads_valid():
    cfg = jf.config("tiny-gpt").replace(num_heads=5, head_dim=16)
    assert cfg.head_dim_ == 16
    assert cfg.num_heads * cfg.head_dim_ == 80 != cfg.d_model
    # and it builds: q kernel [layers, D, N, H] with N * H != D
    params = jf.abstract_params(cfg)
    assert params["decoder"]["blocks"]["attn"]["q"].shape == (2, 64, 5, 16)
    assert params["decoder"]["blocks"]["attn"]["o"].shape == (2, 5, 16, 64)


@pytest.mark.parametrize("changes", [
    dict(attention="sliding", window_size=3),
    dict(attention="alternating", window_size=1),
    dict(attention="prefix"),
    dict(num_kv_heads=1),
    dict(num_kv_heads=2),
    dict(remat="dots", scan_layers=False, dtype="bfloat16"),
    dict(dropout_rate=0.0, attention_dropout_rate=0.999),
], ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_valid_variants_accepted(changes):
    cfg = jf.config("tiny-gpt").replace(**changes)
    for key, value in changes.items():
        assert cfg.to_flat()[key] == value


def test_derived_sizes():
    cfg = jf.config("tiny-llama")
    assert (cfg.head_dim_, cfg.kv_heads, cfg.gated, cfg.num_layers) == (16, 2, True, 2)
    assert cfg.scale == pytest.approx(16 ** -0.5)
    t5 = jf.config("tiny-t5")
    assert t5.scale == 1.0 and t5.num_layers == 4 and t5.kv_heads == t5.num_heads


def test_replace_unknown_field_raises():
    cfg = jf.config("tiny-gpt")
    with pytest.raises(ValueError, match="num_layer"):
        cfg.replace(num_layer=3)
    with pytest.raises(ValueError, match="window"):
        cfg.replace(attention="sliding", window=3)  # close to a real field, still unknown


def test_from_dict_unknown_field_raises():
    data = jf.config("tiny-gpt").to_dict()
    data["n_layer"] = 2
    with pytest.raises(ValueError, match="n_layer"):
        ModelConfig.from_dict(data)


def test_config_is_frozen_and_replace_copies():
    cfg = jf.config("tiny-gpt")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 128  # type: ignore[misc]
    other = cfg.replace(decoder_layers=3)
    assert other.decoder_layers == 3 and cfg.decoder_layers == 2
    assert other != cfg


@pytest.mark.parametrize("name", jf.presets())
def test_presets_round_trip_through_dict_and_json(name):
    cfg = jf.config(name)
    data = cfg.to_dict()
    assert ModelConfig.from_dict(data) == cfg
    assert ModelConfig.from_dict(json.loads(json.dumps(data))) == cfg


def test_eos_list_becomes_tuple_and_round_trips():
    cfg = jf.config("tiny-llama").replace(eos_token_id=[1, 2])
    assert cfg.tokens.eos == (1, 2)
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("scaling", [
    RopeScaling("linear", 4.0),
    RopeScaling("llama3", 8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192),
    RopeScaling("yarn", 40.0, original_max_positions=4096, mscale=0.707, mscale_all_dim=0.707, truncate=False),
    RopeScaling("dynamic", 2.0),
    RopeScaling("longrope", 4.0, original_max_positions=4096, short_factor=(1.0,) * 64, long_factor=(2.0,) * 64),
], ids=["linear", "llama3", "yarn", "dynamic", "longrope"])
def test_rope_scaling_round_trips_as_dataclass(scaling):
    cfg = jf.config("llama-3-8b").replace(rope_scaling=scaling)
    data = json.loads(json.dumps(cfg.to_dict()))
    assert data["rotary"]["scaling"]["kind"] == scaling.kind
    back = ModelConfig.from_dict(data)
    assert isinstance(back.rotary.scaling, RopeScaling)
    assert back == cfg


@pytest.mark.parametrize("kwargs, fragments", [
    (dict(kind="ntk", factor=2.0), ("kind", "ntk")),
    (dict(kind="longrope", short_factor=(1.0, 2.0), long_factor=(1.0,)), ("short_factor", "2 and 1")),
    (dict(kind="yarn", factor=2.0, attention_factor=-1.0), ("attention_factor", "-1.0")),
    (dict(kind="linear", factor=2.0, long_factor=(1.0,)), ("long_factor", "'linear'")),
    (dict(kind="linear", factor=0.0), ("factor", "0.0")),
    (dict(kind="llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0), ("low_freq_factor", "4.0")),
])
def test_invalid_rope_scaling(kwargs, fragments):
    with pytest.raises(ValueError) as err:
        RopeScaling(**kwargs)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_error_lists_every_valid_enum_value():
    # "what would be valid": e.g. an unknown remat policy lists all of them.
    with pytest.raises(ValueError) as err:
        jf.config("tiny-gpt").replace(remat="sometimes")
    for policy in REMAT_POLICIES:
        assert policy in str(err.value)
