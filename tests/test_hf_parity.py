"""Parity with the PyTorch reference: every hidden state and the logits to 1e-5 (float32), for every
supported model_type and head, on an input with padding; round trips in both directions."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table, reference_model  # noqa: E402
from jaxformer.interop.files import TensorFiles  # noqa: E402

from hf_factory import (AUDIO_SHAPES, CHECKPOINTS, DUAL_ENCODERS, IMAGE_SIZES, NAFLEX, naflex_images,  # noqa: E402
                        save_checkpoint)

TOLERANCE = 1e-5


def padded_batch(name: str, rng: np.random.Generator, length: int = 9):
    """Two rows, the second right-padded by three, ids away from the special tokens."""
    ids = rng.integers(3, 97, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, length - 3:] = 0
    pad = 1 if name.startswith(("roberta", "xlm-roberta", "bart", "mbart", "m2m100", "marian", "mpnet",
                                "longformer")) else 0
    ids[1, length - 3:] = pad
    if name == "longformer-qa":  # its default global tokens, the question: before the first of three separators (2)
        ids[:, 2] = ids[:, 4] = ids[0, length - 1] = ids[1, length - 4] = 2
    if name.startswith("xlnet") and CHECKPOINTS[name][2]["attn_type"] == "uni":
        mask[:] = 1  # transformers' causal XLNet fails on any attention_mask in a batch (an in-place broadcast)
    token_types = np.zeros_like(ids)
    token_types[:, length // 2:] = 1
    typed = name.startswith(("bert", "xlnet", "albert", "electra")) or (
        name.startswith("deberta") and CHECKPOINTS[name][2].get("type_vocab_size", 0) > 0)
    return ids, mask, (token_types if typed else None)


def model_inputs(name: str, rng: np.random.Generator) -> dict:
    """compare()'s inputs of a checkpoint: two images drawn from ``rng`` for an image tower, padded_batch's for a
    text model, both for a dual encoder (a NaFlex tower's: two patched images of other grids, padded)."""
    images = {}
    if name in AUDIO_SHAPES:  # log-mel-like frames and decoder ids (an audio model reads no input_ids)
        return dict(input_ids=None, input_features=rng.standard_normal((2, *AUDIO_SHAPES[name])).astype(np.float32),
                    decoder_input_ids=rng.integers(3, 97, size=(2, 9)))
    if name in NAFLEX:
        images = naflex_images(name, rng)
        if name not in DUAL_ENCODERS:
            return dict(input_ids=None, **images)
    elif name in IMAGE_SIZES:
        # (in [-1, 1], what a processor's normalization gives: N(0, 1) draws put ViT's states near 13, where
        # float32's rounding of a convolution against a matmul alone reaches 1e-5)
        images = dict(pixel_values=rng.uniform(-1, 1, (2, *IMAGE_SIZES[name])).astype(np.float32))
        if name not in DUAL_ENCODERS:
            return dict(input_ids=None, **images)
    ids, mask, token_types = padded_batch(name, rng)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=token_types, **images)


def _read_config(folder):
    import json
    import warnings

    from jaxformer.interop.hf import config_from_hf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config_from_hf(json.loads((folder / "config.json").read_text()))


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_every_layer_matches_transformers(name, checkpoints):
    path = checkpoints(name)
    rows = compare(path, **model_inputs(name, np.random.default_rng(0)))
    assert len(rows) >= 4, "expected embeddings, every layer and the outputs"
    # output_attentions: every layer's probabilities are compared too (self; encoder-decoders: encoder,
    # decoder and cross), so a reference that stopped returning them would fail here, not pass quietly
    layers = [r for r in rows if r.name.startswith(("layer ", "encoder layer ", "decoder ", "text layer ",
                                                    "vision layer "))
              and r.name.rsplit(" ", 1)[-1].isdigit() and "attention" not in r.name]
    cross = sum(r.name.startswith("decoder ") for r in layers)
    # (a linear-attention layer, Qwen3-Next's, has no attention probabilities, in transformers either)
    linear = _read_config(path).linear_attention
    unweighted = 0 if linear is None else len(linear.layers)
    assert sum("attention" in r.name for r in rows) == len(layers) + cross - unweighted, [r.name for r in rows]
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5", "bart", "mbart", "m2m100", "marian", "pegasus"])
def test_encoder_decoder_and_decoder_logits_also_match_with_left_padding(name, checkpoints):
    """Left padding: real tokens sit after the pads (position ids still count from 0, as in HF)."""
    path = checkpoints(name)
    rng = np.random.default_rng(1)
    ids = rng.integers(3, 97, size=(2, 8))
    mask = np.ones_like(ids)
    mask[0, :3] = 0
    rows = compare(path, ids, mask)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_round_trip_is_bit_exact_and_transformers_reloads_it(name, checkpoints, tmp_path):
    source = checkpoints(name)
    model = jf.from_pretrained(source)
    model.save_pretrained(tmp_path)
    before, after = TensorFiles(source), TensorFiles(tmp_path)
    # XLNet's two-stream query embedding is skipped on load (jaxformer runs the content stream only)
    assert {n for n in before.names if not n.endswith("mask_emb")} == set(after.names)
    for tensor in after.names:
        a, b = before.get(tensor), after.get(tensor)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), tensor
    rows = compare(tmp_path, **model_inputs(name, np.random.default_rng(2)), model=model)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


EXPORTABLE = {
    "tiny-gpt": "gpt2",
    "tiny-llama": "llama",
    "tiny-mixtral": "mixtral",
    "tiny-qwen3": "qwen3",
    "tiny-t5": "t5",
    "tiny-bert": "bert",
    "tiny-gemma": "gemma2",
    "tiny-gemma3": "gemma3_text",
    "tiny-t5gemma": "t5gemma",
}


@pytest.mark.parametrize("preset", sorted(EXPORTABLE))
def test_models_built_here_export_to_transformers(preset, tmp_path):
    """jaxformer -> save_pretrained -> transformers gives the same outputs (no HF config to copy from)."""
    # T5 does not scale attention logits by 1/sqrt(head_dim), so its std stays at 0.1: at 0.2 the
    # logits reach ~40, the softmax saturates, and float32 rounding of the scores alone exceeds 1e-5.
    cfg = jf.config(preset).replace(init_std=0.1 if preset == "tiny-t5" else 0.2)
    if preset == "tiny-bert":
        cfg = cfg.replace(head="mlm", pooler=False)
    model = jf.build(cfg, seed=3)
    model.save_pretrained(tmp_path)
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, size=(2, 7))
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    rows = compare(tmp_path, ids, mask, model=model)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
    again = jf.from_pretrained(tmp_path)
    extra = {"decoder_input_ids": ids[:, :3]} if cfg.family == "encoder_decoder" else {}
    np.testing.assert_array_equal(np.asarray(again(ids, mask, **extra).logits), np.asarray(model(ids, mask, **extra).logits))


def test_a_gemma_config_without_an_explicit_scale_exports_as_gemma():
    """head_dim 12 and no attention_scale: 1 / sqrt(12) is not bit-equal to 12 ** -0.5, yet it is Gemma's scale."""
    from jaxformer.interop.registry import hf_target

    assert hf_target(jf.config("tiny-gemma").replace(head_dim=12, attention_scale=None)) == ("gemma2", "Gemma2ForCausalLM")


def test_bart_style_config_exports(tmp_path):
    cfg = jf.config("bart-base").replace(vocab_size=97, d_model=32, num_heads=4, d_ff=48, encoder_layers=2,
                                         decoder_layers=2, max_positions=40, init_std=0.2, dropout_rate=0.0,
                                         logits_bias=True, decoder_start_token_id=2)
    model = jf.build(cfg, seed=4)
    model.save_pretrained(tmp_path)
    rows = compare(tmp_path, np.random.default_rng(4).integers(3, 97, size=(2, 6)), model=model)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


@pytest.mark.parametrize("name", ["llama", "bert-mlm", "t5", "gemma2"])
def test_bfloat16_checkpoint(name, tmp_path):
    """A bf16 file loads as bf16 (dtype from config.json) and as exact float32 on request."""
    save_checkpoint(name, tmp_path, dtype=torch.bfloat16)
    ids, mask, token_types = padded_batch(name, np.random.default_rng(5))
    # Upcast on load is exact: the float32 reference of the same bf16 file agrees to 1e-5.
    upcast = jf.from_pretrained(tmp_path, dtype="float32")
    assert upcast.config.param_dtype == "float32"
    rows = compare(tmp_path, ids, mask, token_type_ids=token_types, model=upcast)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
    # Native bf16 (params and compute): bf16 keeps 8 significant bits (relative step 2^-8 = 0.4%), and
    # rounding compounds through the layers, so logits are held to 5% of their range and stay finite.
    native = jf.from_pretrained(tmp_path)
    assert native.config.param_dtype == "bfloat16" and native.config.dtype == "bfloat16"
    reference = reference_model(tmp_path, "float32")
    kwargs = {} if token_types is None else {"token_type_ids": torch.as_tensor(token_types)}
    if name == "t5":
        kwargs["decoder_input_ids"] = torch.as_tensor(ids[:, :4])
    with torch.no_grad():
        ref = reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), **kwargs).logits.numpy()
    ours_kwargs = {"decoder_input_ids": ids[:, :4]} if name == "t5" else {}
    if token_types is not None:
        ours_kwargs["token_type_ids"] = token_types
    ours = np.asarray(native(ids, mask, **ours_kwargs).logits, np.float32)
    valid = mask.astype(bool) if name != "t5" else np.ones(ids[:, :4].shape, bool)
    assert np.isfinite(ours).all()
    spread = ref[valid].max() - ref[valid].min()
    assert np.abs(ours - ref)[valid].max() <= 0.05 * spread


def test_t5_in_float16_clamps_like_transformers_instead_of_overflowing(tmp_path):
    """transformers keeps float16 T5 finite by clamping each sublayer's output to the float16 range
    (1000 inside it once anything overflowed); jaxformer does the same, so a feed-forward whose output
    exceeds 65504 gives the same finite hidden states, and generation runs instead of emitting token 0."""
    from hf_factory import build_reference

    reference = build_reference("t5", seed=6)
    with torch.no_grad():
        for block in reference.encoder.block:
            block.layer[-1].DenseReluDense.wo.weight.mul_(1e5)
    reference = reference.half().eval()
    reference.save_pretrained(str(tmp_path))
    rng = np.random.default_rng(6)
    ids, decoder_ids = rng.integers(3, 97, size=(2, 7)), rng.integers(3, 97, size=(2, 4))
    with torch.no_grad():
        ref = reference(input_ids=torch.as_tensor(ids), decoder_input_ids=torch.as_tensor(decoder_ids),
                        output_hidden_states=True)
    ref_layer = ref.encoder_hidden_states[1].float().numpy()
    assert np.isfinite(ref_layer).all() and np.abs(ref_layer).max() > 6e4  # clamped, not Inf: the case is real
    model = jf.from_pretrained(tmp_path)
    assert model.config.dtype == "float16" and model.config.clamp_float16
    out = model(ids, decoder_input_ids=decoder_ids, output_hidden_states=True)
    ours_layer = np.asarray(out.encoder_hidden_states[1], np.float32)
    assert np.isfinite(ours_layer).all()
    # The clamped entries agree exactly; float16 rounding (11 bits) bounds the others.
    np.testing.assert_allclose(ours_layer, ref_layer, rtol=1e-2, atol=1e-2 * np.abs(ref_layer).max())
    ref_logits, ours_logits = ref.logits.float().numpy(), np.asarray(out.logits, np.float32)
    assert np.isfinite(ours_logits).all()
    assert np.abs(ours_logits - ref_logits).max() <= 0.05 * (ref_logits.max() - ref_logits.min())
    assert model.generate(ids, max_new_tokens=3, decoder_start_token_id=0).shape == (2, 4)


def test_m2m100_padded_on_both_sides_matches_transformers(checkpoints):
    """M2M-100 counts positions over real tokens from the pad id on, on both sides: with the source and the target
    padded (the target's pads carry the pad id and the zero row), the logits of every real target token match."""
    path = checkpoints("m2m100")
    rng = np.random.default_rng(3)
    ids, mask, _ = padded_batch("m2m100", rng)
    target = rng.integers(3, 97, size=(2, 7))
    target_mask = np.ones_like(target)
    target[0, 5:], target_mask[0, 5:] = 1, 0
    model, reference = jf.from_pretrained(path), reference_model(path)
    ours = np.asarray(model(ids, mask, target, target_mask).logits)
    with torch.no_grad():
        theirs = reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                           decoder_input_ids=torch.as_tensor(target),
                           decoder_attention_mask=torch.as_tensor(target_mask)).logits.numpy()
    real = target_mask.astype(bool)
    np.testing.assert_allclose(ours[real], theirs[real], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("dim", [7, 32, 512])
def test_marian_sinusoids_are_transformers_table(dim):
    """Marian's and Pegasus' table, made on the host in float64 as transformers makes it: equal to the bit over
    600 rows (angles in float32 would already miss it by ~1e-5 there), odd widths included."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from jaxformer.layers.positions import marian_sinusoids

    theirs = MarianSinusoidalPositionalEmbedding(600, dim).create_weight().numpy()
    np.testing.assert_array_equal(marian_sinusoids(600, dim), theirs)


def test_a_changed_sinusoid_table_is_refused(checkpoints, tmp_path):
    """jaxformer computes Marian's table and holds no copy: a file whose table was changed (trained, say) is
    refused by name rather than read as if it held transformers' sinusoids."""
    import shutil

    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "changed"
    shutil.copytree(checkpoints("pegasus-base"), folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["decoder.embed_positions.weight"] = tensors["decoder.embed_positions.weight"] + 1e-3
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="decoder.embed_positions.weight differs from the sinusoids"):
        jf.from_pretrained(folder)
