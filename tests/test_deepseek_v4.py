"""DeepSeek-V4 (``deepseek_v4``: compressed sparse and heavily compressed attention, hyper-connections, hash-routed
experts) as transformers computes it: a file as published (the older keys its config class folds in) reads as its
transformers-5 form and matches transformers' numbers on a sequence long enough that the compressors close blocks
and the indexer narrows them (16 tokens: 8 CSA blocks of 2, top 2 kept; 4 HCA blocks of 4; a window of 4); settings
jaxformer cannot honour are refused by name; a QLoRA fine-tune starts from the file and learns. The hidden states
compared are what transformers returns for each layer: the residual's copies [B, T, hc_mult, D], the last one after
the hyper-head and the final norm. Parity of every layer on the 9-token batch and the bit-exact round trip are in
test_hf_parity.py, every key changed one at a time in test_config_keys.py, the presets' counts in test_presets.py,
a cached step's logits equal a full pass's in test_generate.py (CACHE_CASES' "deepseek-v4"). DeepSeek's own tensor
names, its FP8 weights (``W.scale``) and FP4 experts read as transformers reads them; a sharded forward equals one
device's."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.interop.hf import config_from_hf, to_hf_tensors  # noqa: E402

from safetensors.numpy import load_file  # noqa: E402
from safetensors.torch import load_file as load_torch, save_file  # noqa: E402

from jaxformer.cache import CompressedCache, compressed_footprint  # noqa: E402
from jaxformer.compare import compare, format_table, reference_model  # noqa: E402
from jaxformer.interop import fp8, mxfp4  # noqa: E402

from conftest import simulated_devices  # noqa: E402
from family_files import (TOLERANCE, as_transformers_writes_it, generates_as_transformers,  # noqa: E402
                          matches_transformers, qlora_loss_falls, read, rewritten)

# deepseek-ai/DeepSeek-V4-Flash's config.json keys (public copies of the file; its fp8 quantization_config left out:
# the tiny weights are float), sizes those of hf_factory's "deepseek-v4": the schedule as compress_ratios with the
# tiny block sizes in the older compress_rate_csa / compress_rate_hca keys, num_hash_layers, qk_rope_head_dim and a
# flat yarn rope_scaling
PUBLISHED = {
    "architectures": ["DeepseekV4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "compress_ratios": [128, 4, 0, 4], "compress_rate_csa": 2, "compress_rate_hca": 4, "compress_rope_theta": 160000.0,
    "eos_token_id": 2, "hc_eps": 1e-06, "hc_mult": 3, "hc_sinkhorn_iters": 6, "head_dim": 16, "hidden_act": "silu",
    "hidden_size": 32, "index_head_dim": 12, "index_n_heads": 8, "index_topk": 2, "initializer_range": 0.2,
    "max_position_embeddings": 64, "model_type": "deepseek_v4", "moe_intermediate_size": 16, "n_routed_experts": 4,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 4, "num_experts_per_tok": 2,
    "num_hidden_layers": 4, "num_hash_layers": 1, "num_key_value_heads": 1, "num_nextn_predict_layers": 1,
    "o_groups": 2, "o_lora_rank": 8, "q_lora_rank": 24, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4, "original_max_position_embeddings": 16,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "sliding_window": 4,
    "swiglu_limit": 1.0, "tie_word_embeddings": False, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.57.1", "use_cache": True, "vocab_size": 97}


def test_the_published_file_reads_as_its_transformers_5_form_and_matches_transformers(checkpoints, tmp_path):
    cfg = read(PUBLISHED)
    assert read(as_transformers_writes_it(PUBLISHED)).replace(name=cfg.name) == cfg
    part = cfg.scores.compressed
    assert (part.layers, part.sparse_rate, part.heavy_rate, cfg.experts.hash_layers, cfg.rope_dim) == \
        (("heavy", "sparse", "sliding", "sparse"), 2, 4, 1, 8)
    # the window-only layers rotate unscaled; the compressed ones by yarn, cos and sin unscaled (attention_factor 1)
    assert cfg.rotary.scaling is None and part.rope_scaling.attention_factor == 1.0
    matches_transformers(rewritten(checkpoints("deepseek-v4"), tmp_path / "published", PUBLISHED), length=16)


def published_name(name: str) -> str:
    """The name DeepSeek's own files give a tensor transformers writes as ``name`` (its conversion mapping's
    anchored renames undone: no ``model.`` prefix, ``embed.weight``, ``hc_head_fn``)."""
    name = name.removeprefix("model.")
    return "embed.weight" if name == "embed_tokens.weight" else name.replace("hc_head.hc_", "hc_head_")


def fp4_packed(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` [out, in] rounded to FP4 (e2m1) numbers packed two a byte (the low nibble first) as int8, beside
    UE8M0 scales per 1 x 16 (each block's largest magnitude at most 6 times its power of two), as DeepSeek-V4's
    files store the experts (1 x 32 there)."""
    blocks = weight.reshape(weight.shape[0], -1, 16)
    exponents = np.ceil(np.log2(np.abs(blocks).max(-1) / 6)).astype(np.int32)
    nearest = np.abs(blocks[..., None] / np.exp2(exponents)[..., None, None] - mxfp4.E2M1).argmin(-1)
    nibbles = nearest.reshape(weight.shape).astype(np.uint8)
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).view(np.int8), (exponents + 127).astype(np.uint8)


@pytest.fixture(scope="module")
def published_files(checkpoints, tmp_path_factory):
    """The tiny checkpoint under DeepSeek's own tensor names: as floats ('float'); its Linear weights (not the
    embeddings, head or routers) in FP8 blocks of 8 x 8 with float32 scales named ``W.scale`` ('fp8'); and that with
    the experts packed as FP4 beside UE8M0 scales, ``expert_dtype`` 'fp4' at the top level as V4-Flash gives it
    ('fp4')."""
    root, source = tmp_path_factory.mktemp("published"), checkpoints("deepseek-v4")
    floats = {published_name(k): v for k, v in load_file(source / "model.safetensors").items()}
    hf = json.loads((source / "config.json").read_text())
    quantization = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [8, 8]}
    fp8s, fp4s = {}, {}
    for name, value in floats.items():
        stem = name.removesuffix("weight")
        if stem == name or value.ndim != 2 or name in ("embed.weight", "head.weight") or name.endswith("gate.weight"):
            fp8s[name] = fp4s[name] = torch.from_numpy(value)
            continue
        weight, scale = fp8.quantize(value, (8, 8))
        fp8s[name] = fp4s[name] = torch.from_numpy(weight.view(np.uint8)).view(torch.float8_e4m3fn)
        fp8s[stem + "scale"] = fp4s[stem + "scale"] = torch.from_numpy(scale)
        if ".experts." in name:
            packed, exponents = fp4_packed(value)
            fp4s[name], fp4s[stem + "scale"] = (torch.from_numpy(packed),
                                                torch.from_numpy(exponents).view(torch.float8_e8m0fnu))
    fp4_config = {**hf, "expert_dtype": "fp4", "quantization_config": {**quantization, "scale_fmt": "ue8m0"}}
    for kind, tensors, config in (("float", floats, hf), ("fp8", fp8s, {**hf, "quantization_config": quantization}),
                                  ("fp4", fp4s, fp4_config)):
        (root / kind).mkdir()
        save_file({k: torch.as_tensor(v).contiguous() for k, v in tensors.items()}, root / kind / "model.safetensors",
                  metadata={"format": "pt"})
        (root / kind / "config.json").write_text(json.dumps(config))
    return root


def transformers_reads(folder):
    with warnings.catch_warnings():  # (an FP8 file on CPU: its loader dequantizes, with a warning)
        warnings.simplefilter("ignore")
        model, info = transformers.DeepseekV4ForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not any(info.values()), info  # every tensor of the file read, none missing
    return model.eval()


@pytest.mark.parametrize("kind", ["float", "fp8", "fp4"])
def test_deepseeks_own_tensor_names_and_fp8_fp4_weights_read_as_transformers_reads_them(
        kind, published_files, checkpoints):
    """DeepSeek's own names (``layers.N.attn.wq_a.weight``, ``hc_head_fn``, ``ffn.experts.E.w1.weight``, ...) and
    its quantized weights (``W.scale`` beside float8 ``W``; experts in FP4), read through transformers' conversion
    mapping and dequantizing loader (its only FP8 path on CPU): every layer and the logits as transformers'."""
    folder, ids = published_files / kind, np.random.default_rng(0).integers(3, 97, (2, 16))
    reference = transformers_reads(folder)
    if kind == "float":  # the renames undone exactly: transformers computes what it computes from its own file
        with torch.no_grad():
            theirs, own = (m(torch.from_numpy(ids)).logits for m in (reference, reference_model(
                checkpoints("deepseek-v4"))))
        assert torch.equal(theirs, own)
    model = jf.from_pretrained(folder)
    rows = compare(folder, ids, model=model, reference=reference)
    # FP4 experts: weights on a grid of up to 6 times 2 ** e, larger than the float file's, and so the activations;
    # float32 rounding through four layers in the two libraries' orders reaches 1.4e-5 in the logits on an AVX-512
    # Xeon (under 1e-5 on the machine this test was written on), so 3e-5 there
    tolerance = 3e-5 if kind == "fp4" else TOLERANCE
    assert all(r.max_abs <= tolerance for r in rows), format_table(rows, tolerance)
    # the decoded weights are transformers' to the bit (an expert's up projection: FP8 blocks, or FP4 times 2 ** e)
    with torch.no_grad():
        theirs = reference.model.layers[1].mlp.experts.gate_up_proj[0, 16:].numpy()
    assert np.array_equal(to_hf_tensors(model)[0]["model.layers.1.ffn.experts.0.w3.weight"], theirs)


def test_an_fp4_scale_grid_that_does_not_divide_its_weights_is_refused_by_name(published_files, tmp_path):
    folder = rewritten(published_files / "fp4", tmp_path / "bad",
                       json.loads((published_files / "fp4" / "config.json").read_text()))
    tensors = load_torch(folder / "model.safetensors")
    name = "layers.1.ffn.experts.0.w1.scale"  # [16, 2] for 16 x 32 weights
    save_file({**tensors, name: tensors[name][:, :1].repeat(1, 3).contiguous()}, folder / "model.safetensors")
    with pytest.raises(ValueError, match=f"{name} has shape \\[16, 3\\], which does not divide the FP4 weights"):
        jf.from_pretrained(folder)


@pytest.mark.parametrize("changes, message", [
    ({"scoring_func": "softmax"}, "scoring_func='softmax' is not supported"),
    ({"compress_ratios": [128, 4, 0, 8]}, "compress_ratios .* must each be one of"),
    ({"mlp_layer_types": ["moe", "hash_moe", "moe", "moe"]}, "hash_moe layers first"),
    ({"mlp_bias": True}, "mlp_bias=true is not supported"),
    ({"expert_dtype": "fp6"}, "expert_dtype='fp6' is not supported"),
    ({"intermediate_size": 48}, "intermediate_size=48 and moe_intermediate_size=16 differ"),
    ({"rope_parameters": {"main": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
                          "compress": {"rope_type": "default", "rope_theta": 1.6e5, "partial_rotary_factor": 0.25}}},
     "rotary widths of rope_parameters' main \\(8\\) and compress \\(4\\) differ"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED, **changes})


def test_an_input_shorter_than_a_block_or_past_whole_blocks_matches_transformers(checkpoints):
    """1 token (shorter than both blocks, 2 and 4, and the window of 4: no entry at all) and 7 (a whole number of
    neither: each compressor leaves a tail): every layer and the logits as transformers'."""
    folder = checkpoints("deepseek-v4")
    model, reference = jf.from_pretrained(folder), reference_model(folder)
    for length in (1, 7):
        ids = np.random.default_rng(0).integers(3, 97, (2, length))
        rows = compare(folder, ids, model=model, reference=reference)
        assert all(r.max_abs <= TOLERANCE for r in rows), (length, format_table(rows, TOLERANCE))


def test_greedy_and_beam_search_match_transformers_full_forward_with_left_padding(checkpoints):
    """Generation against transformers' use_cache=False: its cached HCA step (one token) reads every entry whose
    block has closed, where its full forward and its prefill hide the entries a left-padded row's position_ids
    have not passed yet (query p reads block w < (p + 1) // rate). Its cached generation departs from its own full
    forward on the padded rows there (masking that step by position_ids makes them agree); ours follows the full
    forward at every step. Unpadded rows are the same either way. (Left pads do count: their states, which no
    real token attends to, are in the compressors' blocks, as there.)"""
    generates_as_transformers(checkpoints("deepseek-v4"), use_cache=False)


def test_the_state_is_what_jaxformer_info_counts_and_drafting_is_refused(checkpoints):
    model = jf.from_pretrained(checkpoints("deepseek-v4"))
    cfg, length = model.config, 8  # (a whole number of both blocks: the entries fill their slots exactly)
    state = model.init_cache(1, length).kv
    assert isinstance(state, CompressedCache)
    per_token, bounded = compressed_footprint(cfg)
    numbers = sum(leaf.size for leaf in jax.tree.leaves(state.by_kind))
    assert numbers == per_token * length + bounded
    with pytest.raises(ValueError, match="compressed-attention layers .* cannot be rewound"):
        model.generate(np.full((1, 5), 3), max_new_tokens=2, prompt_lookup_num_tokens=2)
    # its compressors pool blocks across documents: packed rows are refused before anything runs
    with pytest.raises(ValueError, match="cannot pack documents: DeepSeek-V4's compressors pool blocks"):
        model(np.full((1, 8), 3), segment_ids=np.array([[1] * 4 + [2] * 4]))


@pytest.mark.parametrize("changes, message", [
    (dict(qk_norm=True), r"compressed_layers .* does not take \['qk_norm'\]"),
    (dict(attention_dropout_rate=0.1), r"does not take \['attention_dropout_rate'\]"),
    (dict(sandwich_norm=True), r"hyper-connections.* \['sandwich_norm'\] cannot be combined"),
])
def test_a_setting_the_compressed_layers_would_ignore_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        jf.config("deepseek-v4-flash").replace(**changes)


def test_a_setting_of_an_absent_nested_part_is_refused_not_dropped():
    with pytest.raises(ValueError, match="compressed_q_rank=8 needs compressed_layers"):
        jf.config("tiny-llama").replace(compressed_q_rank=8)
    with pytest.raises(ValueError, match="hc_eps=0.001 needs hc_streams"):
        jf.config("tiny-llama").replace(hc_eps=1e-3)


def test_hash_routing_needs_the_compressed_layer_groups_and_offset_zero_a_clamp():
    with pytest.raises(ValueError, match="hash_layers=3 .* compressed attention's layer groups"):
        jf.config("deepseek-v3").replace(hash_layers=3)
    with pytest.raises(ValueError, match="swiglu_offset=0.0 .* only with a swiglu_limit"):
        jf.config("tiny-llama").replace(swiglu_alpha=1.702, swiglu_offset=0.0)


def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(checkpoints, tmp_path):
    qlora_loss_falls(checkpoints("deepseek-v4"), tmp_path, "finetune.lora.targets=q_up,o,wi")


SHARDED_FORWARD = """
import json, sys, numpy as np, jax, jax.numpy as jnp, jaxformer as jf
from flax import nnx
from jaxformer import sharding
# (97 rows divide over no tensor axis: the embedding, head and hash table take 128)
cfg = jf.from_pretrained(sys.argv[1]).config.replace(vocab_size=128)
def build():  # every float parameter moved off its initial value (the sinks, biases and scales start at 0 or 1)
    model = jf.build(cfg)
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(0), len(jax.tree.leaves(state))))
    nnx.update(model, jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype)
                                   if jnp.issubdtype(x.dtype, jnp.floating) else x, state))
    return model
whole, split = build(), sharding.shard_model(build(), sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}))
ids = np.random.default_rng(0).integers(3, 128, (2, 16))
ours, theirs = (m(ids, output_hidden_states=True) for m in (whole, split))
# relative to each state's largest magnitude (up to ~5 here): float32's rounding scales with it
error = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(1.0, np.max(np.abs(np.asarray(a)))))
            for a, b in zip((*ours.hidden_states, ours.logits), (*theirs.hidden_states, theirs.logits)))
specs = {"/".join(map(str, p)): str(v.get_value().sharding.spec)
         for p, v in nnx.to_flat_state(nnx.state(split, nnx.Param))}
print(json.dumps({"error": error, "specs": specs}))
"""


def test_a_forward_sharded_over_data_fsdp_and_tensor_equals_one_device(checkpoints):
    """V4's own parameters split as the other attention's are (sharding.RULES): the grouped output by groups of heads
    over `tensor` and its input width over `fsdp`, the compressors' and hyper-connections' maps by their input width
    over `fsdp` (the sinks, like every vector, replicated). data=2 x fsdp=2 x tensor=2 (one subprocess of 8
    simulated devices): every hidden state and the logits as one device's, within 1e-5 of their magnitude."""
    out = subprocess.run([sys.executable, "-c", SHARDED_FORWARD, str(checkpoints("deepseek-v4"))],
                         cwd=Path(__file__).resolve().parents[1], env=simulated_devices(8), capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["error"] < 1e-5  # float32: sums split over devices, in another order (measured 1.7e-6)
    specs, stack = report["specs"], "decoder/sparse_blocks"
    assert specs[f"{stack}/attn/o_group"] == "P(None, 'tensor', 'fsdp', None)"  # [layers, G, N H / G, R]
    assert specs[f"{stack}/attn/o"] == "P(None, 'tensor', 'fsdp')"  # [layers, G R, D]
    assert specs[f"{stack}/attn/compressor/position_bias"] == "P(None, None, 'fsdp')"  # [layers, rate, 2 H]
    assert specs[f"{stack}/attn/indexer/wq"] == "P(None, 'fsdp', 'tensor', None)"
    assert specs[f"{stack}/attn_hc/fn"] == specs[f"{stack}/attn/compressor/kv"] == "P(None, 'fsdp', None)"
    assert specs["decoder/hc_head/fn"] == "P('fsdp', None)" and specs[f"{stack}/attn/sinks"] == "P()"
