"""Every rope scaling transformers knows (linear, llama3, yarn in its DeepSeek, Qwen and gpt-oss forms,
dynamic NTK, longrope) read from config.json, computed as transformers' own rope functions compute it,
and a whole tiny model of each matching transformers past its pretraining length, greedy generation
included (dynamic and longrope pick their frequencies by the length of each call)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import jax.numpy as jnp  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table, reference_model  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.interop.rules import rope_to_hf  # noqa: E402
from jaxformer.layers.positions import _dynamic_frequencies, rope_frequencies  # noqa: E402

from hf_factory import CHECKPOINTS  # noqa: E402

TOLERANCE = 1e-5
# A head of 16 rotated dimensions (8 frequencies), 64 positions.
BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)
SHORT, LONG = [1.0, 1.1, 1.3, 1.7, 2.0, 2.5, 3.0, 4.0], [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0]
# name -> (model_type, extra config.json keys): each a form real files take
FORMS = {
    "linear": ("llama", {"rope_scaling": {"type": "linear", "factor": 2.0}}),
    "llama3": ("llama", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                             "rope_theta": 5e5}}),
    "yarn-qwen2.5": ("qwen2", {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}}),
    "yarn-deepseek-v2": ("llama", {"rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                                    "mscale": 0.707, "mscale_all_dim": 0.707,
                                                    "original_max_position_embeddings": 16}}),
    "yarn-gpt-oss": ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                   "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                                   "original_max_position_embeddings": 4}}),
    "yarn-own-attention-factor": ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 3.0, "beta_fast": 8,
                                                                "beta_slow": 2, "attention_factor": 0.8,
                                                                "original_max_position_embeddings": 16}}),
    "yarn-factor-implied": ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": None,
                                                          "original_max_position_embeddings": 16}}),
    "dynamic": ("llama", {"rope_scaling": {"type": "dynamic", "factor": 2.5}}),
    "longrope": ("llama", {"rope_parameters": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                               "factor": 4.0, "original_max_position_embeddings": 16}}),
    # Phi-3.5: no factor (max / original, here 4), the pretraining length beside the rope dict
    "longrope-phi3": ("llama", {"original_max_position_embeddings": 16,
                                "rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG}}),
}


def _both(form: str):
    model_type, extra = FORMS[form]
    hf = {"model_type": model_type, **BASE, **copy.deepcopy(extra)}
    cls = transformers.CONFIG_MAPPING[model_type]
    reference = cls(**{k: v for k, v in copy.deepcopy(hf).items() if k != "model_type"})
    return config_from_hf(hf), reference


@pytest.mark.parametrize("form", sorted(FORMS))
def test_frequencies_and_attention_factor_are_transformers_own(form):
    """Inverse frequencies and the cos/sin factor at the lengths a call can have: none (the model's start),
    within the pretraining length, past it. The frequencies agree to one float32 ulp (numpy's and torch's
    float32 pow may round theta ** (2i / H) apart by one), dynamic NTK's grown base to a few (its power runs
    on device, where the length is traced)."""
    cfg, reference = _both(form)
    kind = reference.rope_parameters["rope_type"]
    assert (cfg.rotary.scaling.kind if cfg.rotary.scaling else "default") == kind
    for length in (None, 8, 17, 65, 1000):
        theirs, factor = ROPE_INIT_FUNCTIONS[kind](reference, None, seq_len=None if length is None else
                                                   torch.tensor(length) if kind == "dynamic" else length)
        if kind == "dynamic" and length is not None and length > cfg.max_positions:
            ours = np.asarray(_dynamic_frequencies(cfg, jnp.int32(length)))
            np.testing.assert_allclose(ours, theirs.numpy(), rtol=4e-7, atol=0)
            assert not np.allclose(ours, rope_frequencies(cfg), rtol=1e-3)  # the base really grew
        else:
            long = kind == "longrope" and length is not None and length > cfg.rotary.scaling.original_max_positions
            np.testing.assert_allclose(rope_frequencies(cfg, long=long), theirs.numpy(), rtol=2.4e-7, atol=0)
        assert (cfg.rotary.scaling.cos_sin_factor if cfg.rotary.scaling else 1.0) == pytest.approx(factor, rel=1e-15)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_written_back_it_reads_the_same(form):
    """rope_to_hf writes every setting; transformers and jaxformer read the written file as the original."""
    cfg, reference = _both(form)
    written = {"model_type": FORMS[form][0], **BASE, "rope_parameters": rope_to_hf(cfg)}
    assert config_from_hf(written).rotary.scaling == cfg.rotary.scaling
    again = transformers.CONFIG_MAPPING[FORMS[form][0]](**{k: v for k, v in written.items() if k != "model_type"})
    kind = reference.rope_parameters["rope_type"]
    for length in (None, 65):
        ours, theirs = (ROPE_INIT_FUNCTIONS[kind](c, None, seq_len=length) for c in (again, reference))
        np.testing.assert_array_equal(ours[0].numpy(), theirs[0].numpy())
        assert ours[1] == theirs[1]


def test_deepseek_yarn_also_corrects_the_softmax_scale():
    """DeepSeek multiplies its softmax scale by mscale(factor, mscale_all_dim)^2; transformers' attention
    module holds the number."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    _, _, kwargs = CHECKPOINTS["deepseek-v3-yarn"]
    cfg = config_from_hf({"model_type": "deepseek_v3", **kwargs})
    reference = DeepseekV3Attention(transformers.DeepseekV3Config(**kwargs), layer_idx=0)
    assert cfg.scale == pytest.approx(reference.scaling, rel=1e-12)
    assert cfg.scale > 1.8 * (cfg.head_dim_ + cfg.latent.rope_head_dim) ** -0.5  # (0.1 ln 40 + 1)^2 = 1.87


@pytest.mark.parametrize("name, threshold", [("qwen2-rope-yarn", 16), ("llama-rope-dynamic", 16),
                                             ("llama-rope-longrope", 16), ("phi3-longrope", 16),
                                             ("deepseek-v2-lite-yarn", 16),
                                             ("deepseek-v3-yarn", 16)])
def test_a_scaled_model_matches_transformers_past_its_pretraining_length(name, threshold, checkpoints):
    """Every layer and the logits at 1.5 times the pretraining length (max_position_embeddings for dynamic),
    one row padded; transformers' model without its scaling differs, so the test sees the scaling."""
    folder = checkpoints(name)
    rng = np.random.default_rng(0)
    length = threshold + threshold // 2
    ids = rng.integers(3, 97, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, length - 3:] = 0
    rows = compare(folder, ids, mask)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
    reference = reference_model(folder)
    with torch.no_grad():
        scaled = reference(torch.as_tensor(ids[:1])).logits
        reference.config.rope_parameters = {"rope_type": "default", "rope_theta": reference.config.rope_parameters["rope_theta"]}
        reference.model.rotary_emb.__init__(reference.config)
        for layer in reference.model.layers:  # DeepSeek's softmax correction is fixed at construction
            if hasattr(layer.self_attn, "qk_head_dim"):
                layer.self_attn.scaling = layer.self_attn.qk_head_dim ** -0.5
        plain = reference(torch.as_tensor(ids[:1])).logits
    assert (scaled - plain).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["llama-rope-dynamic", "llama-rope-longrope", "deepseek-v2-lite-yarn"])
def test_greedy_generation_across_the_pretraining_length_is_token_identical(name, checkpoints):
    """A prompt within the pretraining length and 14 new tokens past it: each decode step picks its
    frequencies by its own length, as transformers' generation does (dynamic: past max_positions, which
    generate allows without allow_beyond_max_positions)."""
    folder = checkpoints(name)
    model, reference = jf.from_pretrained(folder), reference_model(folder)
    rng = np.random.default_rng(1)
    ids = rng.integers(3, 97, (2, 8))
    mask = np.ones_like(ids)
    mask[1, :3] = 0
    ids = ids * mask
    kwargs = dict(max_new_tokens=14, do_sample=False, eos_token_id=None)
    ours = model.generate(ids, mask, **kwargs)
    with torch.no_grad():
        theirs = reference.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), **kwargs).numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_bad_scaling_settings_are_refused_by_name():
    for rope, message in [
        ({"type": "yarn", "factor": 4.0, "partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
        ({"type": "linear", "factor": 2.0, "mscale": 1.0}, r"mscale=1.0 are not supported for rope type 'linear'"),
        ({"type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3}, "has 3 factors but"),
        ({"type": "longrope", "short_factor": [1.0] * 8}, "needs long_factor"),
        ({"type": "dynamic"}, "needs factor"),
        ({"type": "ntk-by-parts", "factor": 2.0}, "rope type 'ntk-by-parts' is not supported"),
        ({"type": "yarn", "factor": 4.0, "beta_fast": 1, "beta_slow": 32}, "beta_slow <= beta_fast"),
    ]:
        with pytest.raises(ValueError, match=message):
            config_from_hf({"model_type": "llama", **BASE, "rope_scaling": rope})


def test_a_phi3_generation_across_the_switch_is_refused_and_one_past_it_matches(checkpoints):
    """transformers' Phi-3 rebuilds its cache when the input first passes the pretraining length (every key
    then takes the long factors); jaxformer refuses a generation that would cross it, and matches
    transformers on each side of it."""
    folder = checkpoints("phi3-longrope")
    model, reference = jf.from_pretrained(folder), reference_model(folder)
    ids = np.random.default_rng(2).integers(3, 96, (2, 8))
    with pytest.raises(ValueError, match="rebuilds its cache with the long factors"):
        model.generate(ids, max_new_tokens=14)
    for prompt, new in ((ids, 9), (np.concatenate([ids, ids + 1, ids[:, :2]], axis=1), 6)):  # 8 + 9 - 1 = 16; 18
        ours = model.generate(prompt, max_new_tokens=new, eos_token_id=None)
        with torch.no_grad():
            theirs = reference.generate(torch.as_tensor(prompt), max_new_tokens=new, do_sample=False,
                                        eos_token_id=None).numpy()
        np.testing.assert_array_equal(ours, theirs)
