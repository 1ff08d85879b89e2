"""Presets: exact parameter counts (published numbers and Hugging Face's), the `jaxformer info` CLI,
and real-size shapes from abstract evaluation (nothing allocated)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer.layer_plan import dense_layers, local_layers
from jaxformer.cli import main as cli_main
from hf_reference import HF_REFERENCE, hf_param_count

EXACT = {
    "bert-base-uncased": 109_482_240,
    "gpt2": 124_439_808,
    "llama-3-8b": 8_030_261_248,
    "t5-base": 222_903_552,
    "gpt3-175b": 174_604_259_328,
    # Vaswani et al. 2017 with one shared 37000-token vocabulary (source, target, softmax)
    "transformer-base": 63_082_496,
    "transformer-big": 214_245_376,
    # Dai et al. 2019, WikiText-103 base with one tied softmax table instead of the adaptive one (paper: 151M)
    "transformer-xl": 150_838_570,
}


def _info_json(capsys, name: str) -> dict:
    assert cli_main(["info", name, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", jf.presets())
def test_info_json_every_preset(capsys, name):
    record = _info_json(capsys, name)
    assert {"name", "family", "params"} <= set(record)
    cfg = jf.config(name)
    assert record["name"] == name
    assert record["family"] == cfg.family
    assert isinstance(record["params"], int) and record["params"] > 0
    assert record["params"] == jf.param_count(name)
    if "config" in record:  # the full config travels too, and it is the preset's
        assert jf.ModelConfig.from_dict(record["config"]) == cfg


@pytest.mark.parametrize("name, expected", sorted(EXACT.items()))
def test_exact_parameter_counts(capsys, name, expected):
    assert jf.param_count(name) == expected
    assert _info_json(capsys, name)["params"] == expected


@pytest.mark.parametrize("name", sorted(HF_REFERENCE))
def test_param_count_matches_hugging_face(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    assert jf.param_count(name) == hf_param_count(name)


# What transformers' files cannot say about a preset: GPT-3's banded layers (GPT-2's files have no such
# setting), and T5 v1.1's untied head (T5Config forces tie_word_embeddings back to True on construction).
NOT_IN_THE_FILE = {"gpt3-175b": {"attention", "window_size"}, "t5-v1_1-base": {"tie_embeddings"}}
SHAPE = ("family", "d_model", "num_heads", "kv_heads", "head_dim_", "value_dim", "d_ff", "encoder_layers",
         "decoder_layers", "activation", "norm", "norm_eps", "position", "rope_theta", "rope_scaling",
         "local_rope_theta", "max_positions", "attention", "window_size", "sliding_layers", "qk_norm", "qkv_bias",
         "out_bias", "tie_embeddings", "num_experts", "experts_per_token", "expert_width", "shared_experts",
         "dense_layers", "kv_lora_rank", "q_lora_rank", "scale", "attention_softcap", "logits_softcap",
         "attention_sinks", "swiglu_limit", "swiglu_alpha", "expert_bias", "router_logit_bias",
         "normalize_router_weights", "router_aux_loss_coef", "attention_chunk_size", "nope_layers",
         "temperature_floor_scale", "temperature_scale", "qk_norm_scale", "rope_interleave", "router_score",
         "router_weights_on_input", "index_heads", "index_head_dim", "index_topk", "dense_layer_ids", "embedding_size",
         "shared_layers", "pooler_activation", "first_attn_norm", "head_bias", "mlm_bias", "disentangled_terms",
         "max_relative_positions", "position_buckets", "share_attention_key", "relative_embedding_norm",
         "position_biased_input", "key_bias", "conv_kernel_size", "type_vocab_size", "linear_layers",
         "linear_key_heads", "linear_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel",
         "attention_gate", "norm_scale_offset", "rotary_dim", "full_head_dim", "full_kv_heads", "full_keys_as_values",
         "kv_shared_layers", "kv_shared_d_ff", "per_layer_input_size", "v_norm", "rope_proportion", "layer_output_scale"
         ) + ("query_position_scale", "query_position_span", "router_group_score", "router_norm", "router_expert_scale",
              "experts_beside_dense", "vision", "rope_learned_frequencies", "query_log_position_scale",
              "index_query_from_input", "latent_norm_eps", "num_mel_bins", "max_source_positions")


@pytest.mark.parametrize("name", sorted(HF_REFERENCE))
def test_a_preset_is_what_its_published_config_reads_as(name):
    """Each published preset equals what jaxformer reads from its reference config.json (as transformers
    writes it): widths, rotary settings (DeepSeek's yarn, Gemma 3's scaled global layers), windows, ..."""
    import warnings

    transformers = pytest.importorskip("transformers")
    from jaxformer.interop.hf import config_from_hf

    cls, kwargs = HF_REFERENCE[name]
    written = getattr(transformers, cls).config_class(**kwargs).to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        read = config_from_hf({**written, "architectures": [cls]})
    preset = jf.config(name)
    fields = [f for f in SHAPE if f not in NOT_IN_THE_FILE.get(name, ())]
    assert _settings(preset, fields) == _settings(read, fields)


def _settings(cfg: jf.ModelConfig, names) -> dict:
    """Each named setting, under its flat name or as a derived property (kv_heads, scale, ...)."""
    flat = {**cfg.to_flat(), "sliding_layers": local_layers(cfg), "dense_layer_ids": dense_layers(cfg)}
    return {name: flat[name] if name in flat else getattr(cfg, name) for name in names}


def test_every_published_non_2017_preset_has_an_hf_reference():
    # A new published preset without a reference config would silently escape the check above.
    published = [n for n in jf.presets() if not n.startswith(("tiny-", "transformer-"))]
    assert sorted(published) == sorted(HF_REFERENCE)


@pytest.mark.parametrize("name, paper", [("transformer-base", 65_000_000), ("transformer-big", 213_000_000)])
def test_2017_transformer_close_to_paper(name, paper):
    # The paper's 65M / 213M depend on its exact vocabulary (~37000 BPE tokens, not stated to the
    # token), so allow a vocabulary difference of up to 5000 rows of the d_model-wide shared table.
    count = jf.param_count(name)
    assert count == EXACT[name]
    d_model = jf.config(name).d_model
    assert abs(count - paper) <= d_model * 5000


def test_info_prints_the_decode_cache_per_token_and_the_windowed_layers_bound(capsys):
    """Mistral's every layer is windowed (nothing grows with the length), Gemma 3 1B keeps 4 full layers of 26
    (1 KV head of 256: 2 x 256 x 4 bytes each per token) and rings of 512 slots in the other 22; Qwen3-Next's
    linear layers a state whatever the length."""
    mistral, gemma3, gpt2 = (_info_json(capsys, name)["decode_cache"] for name in ("mistral-7b", "gemma-3-1b", "gpt2"))
    assert mistral["bytes_per_token"] == 0 and mistral["windowed_bytes_at_most"] == 32 * 4096 * 2 * 8 * 128 * 4
    assert gemma3["bytes_per_token"] == 4 * 2 * 256 * 4
    assert gemma3["windowed_bytes_at_most"] == 22 * 512 * 2 * 256 * 4
    assert gpt2 == {"bytes_per_token": 12 * 2 * 768 * 4, "windowed_bytes_at_most": 0, "linear_state_bytes": 0,
                    "summary": "73,728 bytes per token (keys and values, float32)"}
    # Qwen3-Next: keys and values in its 12 attention layers (2 kv heads of 256), a fixed state in the 36 linear ones
    # (32 value heads' 128 x 128 float32 matrices, a window of 3 inputs over 2 x 16 x 128 + 32 x 128 channels)
    qwen3_next = _info_json(capsys, "qwen3-next-80b-a3b")["decode_cache"]
    assert qwen3_next["bytes_per_token"] == 12 * 2 * 2 * 256 * 4
    assert qwen3_next["linear_state_bytes"] == 36 * (32 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 32 * 128) * 4)
    assert cli_main(["info", "gemma-3-1b"]) == 0
    assert "decode cache: 8,192 bytes per token" in capsys.readouterr().out
    assert "decode_cache" not in _info_json(capsys, "bert-base-uncased")


def test_info_without_name_lists_every_preset(capsys):
    assert cli_main(["info"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}
    assert list(rows) == jf.presets()
    for name in ("gpt2", "llama-3-8b", "transformer-base"):
        assert f"{EXACT[name]:,}" in rows[name]
        assert jf.config(name).family in rows[name]


def test_info_without_name_json(capsys):
    assert cli_main(["info", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == jf.presets()
    by_name = {r["name"]: r for r in rows}
    for name, expected in EXACT.items():
        assert by_name[name]["params"] == expected


def test_info_unknown_preset_fails_listing_valid_names(capsys):
    assert cli_main(["info", "gpt-5"]) != 0
    err = capsys.readouterr().err
    assert "gpt-5" in err
    assert "gpt2" in err and "tiny-llama" in err


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("jaxformer")
    if script.exists():
        return [str(script)]
    found = shutil.which("jaxformer")
    if found is None:
        pytest.fail("the `jaxformer` console script is not installed (pip install -e .)")
    return [found]


def test_console_script_reports_gpt3_from_abstract_shapes():
    """One real process: the 175B count must come from abstract shapes, so it needs no memory for the
    weights (700 GB in float32). Measured by the process's peak memory, not its time, which a loaded
    machine stretches: VmHWM, the high-water mark of the process's own address space (getrusage's
    ru_maxrss survives exec and so counts the forking pytest worker's size too)."""
    result = subprocess.run([*_console_script(), "info", "gpt3-175b", "--json"], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["name"] == "gpt3-175b"
    assert record["family"] == "decoder"
    assert record["params"] == 174_604_259_328
    peak = subprocess.run([sys.executable, "-c", "import sys; from jaxformer.cli import main; "
                           "code = main(['info', 'gpt3-175b', '--json']); "
                           "print(open('/proc/self/status').read(), file=sys.stderr); sys.exit(code)"],
                          capture_output=True, text=True, timeout=600)
    assert peak.returncode == 0, peak.stderr[-2000:]
    kib = int(next(line for line in peak.stderr.splitlines() if line.startswith("VmHWM:")).split()[1])
    assert kib < 2 * 2**20, f"`jaxformer info gpt3-175b` peaked at {kib / 2**20:.1f} GiB"


# Real-size shapes from jax.eval_shape: parameter path -> (shape, logical axes).
REAL_SHAPES = {
    "llama-3-8b": {
        ("embed", "table"): ((128256, 4096), ("vocab", "embed")),
        ("decoder", "blocks", "attn", "q"): ((32, 4096, 32, 128), ("layers", "embed", "heads", "head_dim")),
        ("decoder", "blocks", "attn", "k"): ((32, 4096, 8, 128), ("layers", "embed", "kv_heads", "head_dim")),
        ("decoder", "blocks", "attn", "o"): ((32, 32, 128, 4096), ("layers", "heads", "head_dim", "embed")),
        ("decoder", "blocks", "mlp", "wi_gate"): ((32, 4096, 14336), ("layers", "embed", "mlp")),
        ("decoder", "blocks", "mlp", "wo"): ((32, 14336, 4096), ("layers", "mlp", "embed")),
        ("decoder", "final_norm", "scale"): ((4096,), ("embed",)),
        ("lm_head", "kernel"): ((4096, 128256), ("embed", "vocab")),
    },
    "gpt3-175b": {
        ("embeddings", "positions", "table"): ((2048, 12288), ("positions", "embed")),
        ("decoder", "blocks", "attn", "q"): ((96, 12288, 96, 128), ("layers", "embed", "heads", "head_dim")),
        ("decoder", "blocks", "mlp", "wi"): ((96, 12288, 49152), ("layers", "embed", "mlp")),
    },
    "mixtral-8x7b": {
        ("decoder", "blocks", "mlp", "router"): ((32, 4096, 8), ("layers", "embed", "experts")),
        ("decoder", "blocks", "mlp", "wi"): ((32, 8, 4096, 14336), ("layers", "experts", "embed", "mlp")),
    },
    "t5-11b": {
        ("encoder", "blocks", "attn", "q"): ((24, 1024, 128, 128), ("layers", "embed", "heads", "head_dim")),
        ("decoder", "blocks", "cross_attn", "k"): ((24, 1024, 128, 128),
                                                   ("layers", "embed", "kv_heads", "head_dim")),
        ("decoder", "blocks", "mlp", "wi"): ((24, 1024, 65536), ("layers", "embed", "mlp")),
        ("encoder", "relative_bias", "table"): ((32, 128), ("buckets", "heads")),
    },
}


@pytest.mark.parametrize("name", sorted(REAL_SHAPES))
def test_real_size_abstract_shapes(name):
    live_before = sum(a.nbytes for a in jax.live_arrays())
    params = jf.abstract_params(name)
    flat = dict(nnx.to_flat_state(params))
    leaves = jax.tree.leaves(params)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    for path, (shape, axes) in REAL_SHAPES[name].items():
        var = flat[path]
        assert var.shape == shape, path
        assert var.get_metadata()["axes"] == axes, path
    # billions of abstract parameters, and no device memory taken for them
    assert sum(x.size for x in leaves) == jf.param_count(name)
    assert sum(a.nbytes for a in jax.live_arrays()) - live_before < 1 << 20
