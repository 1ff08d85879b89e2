"""Rotary corner cases of published LLaMA-lineage files, each read as transformers reads it: Phi-4-mini's
partial rotary under longrope, Llama 4 Scout's llama3 scaling with an empty blending band, and a Qwen3 file
whose missing key is filled in from the config class. Each file is a copy of the published config.json with
its sizes made tiny (every other key kept), saved with random weights in its published (legacy) form and in
the transformers-5 form save_pretrained writes."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table, reference_model  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.layers.positions import rope_frequencies  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from hf_reference import PHI4_MINI_LONG  # noqa: E402
from published_configs import PUBLISHED, TINY  # noqa: E402

TOLERANCE = 1e-5
STD = 0.2  # random weights far from zero, so that differences cannot hide in tiny activations

# microsoft/Phi-4-mini-instruct's config.json (transformers_version 4.45.0) as published, vendored in public
# repositories; shrunk: widths (3 heads of 32 for 24 of 128, one kv head for 8), 2 layers, a vocabulary of 97
# (its special ids 199999 moved to 96 with it: transformers' embedding needs its pad id in range), and each
# longrope factor list kept at every fourth entry (12 for a rotated width of 0.75 * 32 = 24).
PHI4_MINI = {
    "_name_or_path": "Phi-4-mini-instruct", "architectures": ["Phi3ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config", "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM",
                 "AutoTokenizer": "Xenova/gpt-4o"},
    "bos_token_id": 96, "embd_pdrop": 0.0, "eos_token_id": 96, "full_attn_mod": 1, "hidden_act": "silu",
    "hidden_size": 96, "initializer_range": 0.02, "intermediate_size": 64, "interpolate_factor": 1,
    "lm_head_bias": False, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "phi3",
    "num_attention_heads": 3, "num_hidden_layers": 2, "num_key_value_heads": 1,
    "original_max_position_embeddings": 4096, "pad_token_id": 96, "partial_rotary_factor": 0.75, "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"long_factor": list(PHI4_MINI_LONG[::4]), "short_factor": [1.0] * 12, "type": "longrope"},
    "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0", "use_cache": True, "vocab_size": 97}
# The same with its lengths shrunk too (pretrained 16, extended 32 times to 512), so that a test reaches
# the long factors.
PHI4_MINI_SHORT = {**PHI4_MINI, "original_max_position_embeddings": 16, "max_position_embeddings": 512}


def _save(published: dict, folder, seed: int = 0):
    """A random model of ``published`` saved twice: ``folder/modern`` as save_pretrained writes it
    (transformers 5's form), ``folder/published`` with the same tensors beside the published config.json."""
    config = transformers.CONFIG_MAPPING[published["model_type"]].from_dict(copy.deepcopy(published))
    torch.manual_seed(seed)
    model = getattr(transformers, published["architectures"][0])(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # norms and all: every tensor's mapping is seen
            parameter.normal_(0.0, STD)
    model.save_pretrained(str(folder / "modern"))
    shutil.copytree(folder / "modern", folder / "published")
    (folder / "published" / "config.json").write_text(json.dumps(published, indent=2))
    return {form: folder / form for form in ("published", "modern")}


def _assert_parity(folder, length: int, vocab: int):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, length - 3:] = 0
    rows = compare(folder, ids, mask)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


@pytest.fixture(scope="module")
def phi4(tmp_path_factory):
    root = tmp_path_factory.mktemp("phi4")
    return {"full": _save(PHI4_MINI, root / "full"), "short": _save(PHI4_MINI_SHORT, root / "short")}


def test_phi4_mini_reads_as_a_partial_rotary_with_longrope():
    """Three quarters of each head rotate; the longrope factors are sized for that part; the attention factor
    comes from the ratio of the two lengths (32), as transformers' longrope computes it."""
    cfg = config_from_hf(copy.deepcopy(PHI4_MINI))
    reference = transformers.Phi3Config.from_dict(copy.deepcopy(PHI4_MINI))
    assert (cfg.rotary.dim, cfg.rope_dim, cfg.head_dim_, cfg.embeddings.tie) == (24, 24, 32, True)
    assert (cfg.rotary.scaling.kind, cfg.rotary.scaling.factor, cfg.rotary.scaling.original_max_positions) == (
        "longrope", 32.0, 4096)
    for length, long in ((None, False), (4097, True)):
        theirs, factor = ROPE_INIT_FUNCTIONS["longrope"](reference, None, seq_len=length)
        np.testing.assert_allclose(rope_frequencies(cfg, long=long), theirs.numpy(), rtol=2.4e-7, atol=0)
        assert cfg.rotary.scaling.cos_sin_factor == pytest.approx(factor, rel=1e-15)


@pytest.mark.parametrize("form", ["published", "modern"])
@pytest.mark.parametrize("lengths, length", [("full", 12), ("short", 24)])
def test_phi4_mini_matches_transformers(phi4, form, lengths, length):
    """Every layer and the logits; ``short`` runs 24 positions past its pretraining length of 16, so the
    long factors rotate; ``full`` keeps the published lengths (short factors, all 1)."""
    _assert_parity(phi4[lengths][form], length, PHI4_MINI["vocab_size"])


def _assert_generation_identical(folder, prompts: list[tuple[int, int]], num_beams: int, seed: int):
    """Greedy or beam search from prompts of (length, new tokens), one row left-padded, token for token
    what transformers generates."""
    model, reference = jf.from_pretrained(folder, dtype="float32"), reference_model(folder)
    rng = np.random.default_rng(seed)
    for prompt_length, new in prompts:
        ids = rng.integers(0, 90, (2, prompt_length))
        mask = np.ones_like(ids)
        mask[1, :2] = 0
        kwargs = dict(max_new_tokens=new, num_beams=num_beams, do_sample=False, length_penalty=1.0, eos_token_id=None)
        ours = model.generate(ids, mask, **kwargs)
        with torch.no_grad():
            theirs = reference.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), **kwargs).numpy()
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("form", ["published", "modern"])
def test_phi4_mini_generation_is_token_identical(phi4, form, num_beams):
    """Within the pretraining length of 16 (short factors) and wholly past it (long factors)."""
    _assert_generation_identical(phi4["short"][form], [(6, 9), (18, 6)], num_beams, seed=1)


def _reloaded(folder) -> tuple[dict, object]:
    """(the config transformers reads from ``folder`` as a dict, less the keys that only say who wrote it
    and the rope dict; the config itself)."""
    config = transformers.AutoConfig.from_pretrained(str(folder))
    as_dict = config.to_dict()
    for key in ("transformers_version", "_name_or_path", "architectures", "dtype", "torch_dtype", "rope_parameters"):
        as_dict.pop(key, None)
    return as_dict, config


def _assert_exports_as_the_same_config(folder, tmp_path, lengths=(None, 1 << 20)):
    """save_pretrained writes the same tensors, and a config.json transformers reads as the source's: every
    key equal, and the rope dict (which spells out what the published one leaves to be derived) giving the
    same frequencies and attention factor at every length; jaxformer reads it back as the same config."""
    model = jf.from_pretrained(folder, dtype="float32")  # as saved (the published file says bfloat16)
    model.save_pretrained(tmp_path)
    theirs, ours = (load_file(str(f / "model.safetensors")) for f in (folder, tmp_path))
    assert sorted(theirs) == sorted(ours)
    assert all(theirs[k].dtype == ours[k].dtype and np.array_equal(theirs[k], ours[k]) for k in theirs)
    (ours, ours_config), (theirs, theirs_config) = _reloaded(tmp_path), _reloaded(folder)
    derived = theirs["hidden_size"] // theirs["num_attention_heads"]  # written out, where the source derives it
    assert ours.pop("head_dim", derived) == theirs.pop("head_dim", derived)
    assert ours == theirs
    kind = theirs_config.rope_parameters["rope_type"]
    for length in lengths:
        a, b = (ROPE_INIT_FUNCTIONS[kind](c, None, seq_len=length) for c in (ours_config, theirs_config))
        np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
        assert a[1] == b[1]
    assert jf.from_pretrained(tmp_path, dtype="float32").config.replace(name="x") == model.config.replace(name="x")


@pytest.mark.parametrize("form", ["published", "modern"])
def test_phi4_mini_export_reloads_as_the_same_config(phi4, form, tmp_path):
    _assert_exports_as_the_same_config(phi4["full"][form], tmp_path)


# meta-llama/Llama-4-Scout-17B-16E-Instruct's text_config as published: llama3 scaling by 16 over 8192 positions
# with low_freq_factor == high_freq_factor == 1, an empty blending band; saved as the text model's own file
# (Llama4ForCausalLM). Shrunk: widths (heads of 16, 4 of them, 2 kv), 4 layers (the fourth global and
# unrotated), 4 experts, a vocabulary of 97 (the special ids moved into it); attn_temperature_tuning is published
# as 4, which transformers' strict config class refuses (True reads the same).
SCOUT_TEXT = {
    "_attn_implementation_autoset": True, "architectures": ["Llama4ForCausalLM"], "attention_bias": False,
    "attention_chunk_size": 8192, "attention_dropout": 0.0, "attn_scale": 0.1, "attn_temperature_tuning": True,
    "bos_token_id": 90, "eos_token_id": [91, 92, 93], "floor_scale": 8192, "for_llm_compressor": False,
    "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
    "interleave_moe_layer_step": 1, "intermediate_size": 16, "intermediate_size_mlp": 48,
    "max_position_embeddings": 10485760, "model_type": "llama4_text", "no_rope_layers": [], "num_attention_heads": 4,
    "num_experts_per_tok": 1, "num_hidden_layers": 4, "num_key_value_heads": 2, "num_local_experts": 4,
    "output_router_logits": False, "pad_token_id": 94, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "torch_dtype": "bfloat16",
    "use_cache": True, "use_qk_norm": True, "vocab_size": 97}


@pytest.fixture(scope="module")
def scout(tmp_path_factory):
    return _save(SCOUT_TEXT, tmp_path_factory.mktemp("scout"))


def test_scout_llama3_with_an_empty_band_computes_transformers_frequencies():
    """No frequency lies in the band, so each is kept or divided by 16 (three of eight here), exactly as
    transformers computes them; its multimodal file reads the same."""
    cfg = config_from_hf(copy.deepcopy(SCOUT_TEXT))
    reference = transformers.Llama4TextConfig.from_dict(copy.deepcopy(SCOUT_TEXT))
    theirs, factor = ROPE_INIT_FUNCTIONS["llama3"](reference, None)
    ours = rope_frequencies(cfg)
    assert np.isfinite(theirs.numpy()).all() and factor == 1.0
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=2.4e-7, atol=0)
    plain = rope_frequencies(cfg.replace(rope_scaling=None))
    np.testing.assert_allclose(ours[plain < 2 * np.pi / 8192], plain[plain < 2 * np.pi / 8192] / 16, rtol=1e-7)
    assert (plain < 2 * np.pi / 8192).sum() == 3
    wrapped = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "torch_dtype": "bfloat16",
               "text_config": {k: v for k, v in copy.deepcopy(SCOUT_TEXT).items() if k != "architectures"},
               "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 16, "num_hidden_layers": 1}}
    assert config_from_hf(wrapped).replace(name=cfg.name) == cfg


@pytest.mark.parametrize("form", ["published", "modern"])
def test_scout_matches_transformers(scout, form):
    """Every layer and the logits at 48 positions, where transformers' model without the scaling differs
    (so the test sees the three divided frequencies)."""
    _assert_parity(scout[form], 48, SCOUT_TEXT["vocab_size"])
    reference = reference_model(scout[form])
    ids = torch.as_tensor(np.random.default_rng(0).integers(0, 97, (1, 48)))
    with torch.no_grad():
        scaled = reference(ids).logits
        reference.config.rope_parameters = {"rope_type": "default", "rope_theta": SCOUT_TEXT["rope_theta"]}
        reference.model.rotary_emb.__init__(reference.config)
        assert (scaled - reference(ids).logits).abs().max() > 1e-4


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("form", ["published", "modern"])
def test_scout_generation_is_token_identical(scout, form, num_beams):
    _assert_generation_identical(scout[form], [(6, 8)], num_beams, seed=3)


def test_scout_export_reloads_as_the_same_config(scout, tmp_path):
    _assert_exports_as_the_same_config(scout["published"], tmp_path)


def test_scout_gradients_under_jit_are_finite(scout):
    """The empty band's 0 / 0 never reaches the program: loss and every gradient finite under jit."""
    model = jf.from_pretrained(scout["modern"], dtype="float32")
    graphdef, state = jf.split(model)
    ids = jnp.asarray(np.random.default_rng(4).integers(0, 97, (2, 10)))

    @jax.jit
    def loss_and_grads(state):
        def loss(state):
            logits = jf.merge(graphdef, state)(ids).logits
            return -jnp.mean(jax.nn.log_softmax(logits[:, :-1]) * jax.nn.one_hot(ids[:, 1:], logits.shape[-1]))
        return jax.value_and_grad(loss)(state)

    value, grads = loss_and_grads(state)
    assert np.isfinite(float(value))
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


def test_an_empty_band_on_a_wavelength_is_refused_where_transformers_gives_nan():
    """low == high with a wavelength exactly at original_max_positions / low: transformers' blend there is
    0 / 0 and its frequency NaN; jaxformer refuses it by name. The first frequency (1) has wavelength
    float32(2 pi)."""
    edge = 8192 / float(np.float32(2 * np.pi))
    hf = {**copy.deepcopy(SCOUT_TEXT), "rope_scaling": {**SCOUT_TEXT["rope_scaling"], "low_freq_factor": edge,
                                                         "high_freq_factor": edge}}
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](transformers.Llama4TextConfig.from_dict(copy.deepcopy(hf)), None)
    assert np.isnan(theirs.numpy()[0]) and np.isfinite(theirs.numpy()[1:]).all()
    with pytest.raises(ValueError, match=r"exactly original_max_positions / low_freq_factor .* 0 / 0 \(NaN\)"):
        rope_frequencies(config_from_hf(hf))


def _refusal(hf: dict) -> str:
    with pytest.raises(ValueError) as caught:
        config_from_hf(copy.deepcopy(hf))
    return str(caught.value)


def test_a_value_the_config_class_filled_in_is_named_as_its_default():
    """Qwen3-0.6B's file without num_key_value_heads: Qwen3Config fills in 32, which 4 heads cannot share.
    The refusal says in one more line that 32 is the class's default for a key the file leaves out, and
    what to add; a refusal of the file's own value (or of a key it has) carries no such line."""
    qwen3 = {k: v for k, v in PUBLISHED["qwen3-0.6b"].items() if k != "num_key_value_heads"}
    message = _refusal(qwen3)
    first, note = message.split("\n")
    assert "num_kv_heads=32 does not divide num_heads=4" in first
    assert note == ('num_key_value_heads=32: not in config.json, so transformers\' qwen3 config class fills in its '
                    'default; add "num_key_value_heads" with the model\'s own value to config.json')
    assert transformers.Qwen3Config.from_dict(copy.deepcopy(qwen3)).num_key_value_heads == 32
    assert "\n" not in _refusal({**qwen3, "num_key_value_heads": 3})  # the file's own value: its own fault
    # a default an architecture's own refusal names by its key (Qwen2-MoE's expert width, 1408 by default)
    moe = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_key_value_heads": 4,
           "shared_expert_intermediate_size": 100, **TINY}
    assert _refusal(moe).split("\n")[1].startswith("moe_intermediate_size=1408: not in config.json")
