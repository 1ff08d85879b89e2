"""Bad input at the public boundary: a ValueError naming the problem, raised on the host before
anything is traced or compiled (JAX would otherwise clamp out-of-range gathers silently)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer as jf
from conftest import no_compilation, tiny_model, token_ids


def rejects(call, *fragments: str):
    """``call()`` raises ValueError mentioning every fragment, with nothing compiled first."""
    with no_compilation():
        with pytest.raises(ValueError) as err:
            call()
    message = str(err.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"
    return message


# Every test gets ids of a length no other test uses: if a check were missing (or ran after the
# computation), the model would run on shapes nothing compiled before and the guard would notice.
_LENGTHS = (9 + i % 100 for i in itertools.count())  # 9..108: within every tiny position table
B = 3


@pytest.fixture
def ids():
    """Encoder-side (or decoder-only) ids [3, T] with a fresh T."""
    return token_ids(B, next(_LENGTHS), seed=1)


@pytest.fixture
def dec_ids():
    """Decoder-side ids [3, S] with a fresh S."""
    return token_ids(B, next(_LENGTHS), seed=2)


def test_no_compilation_guard_can_fail():
    with pytest.raises(AssertionError, match="compiled"):
        with no_compilation():
            jax.jit(lambda x: x * 17)(1.0)  # a new function always traces and compiles


# ----------------------------------------------------------------------------------------------
# token ids


def _extra(model, dec_ids):
    return {"decoder_input_ids": dec_ids} if model.config.family == "encoder_decoder" else {}


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-bert", "tiny-t5"])
def test_negative_token_id(name, ids, dec_ids):
    model = tiny_model(name)
    bad = ids.at[1, 3].set(-1)
    rejects(lambda: model(bad, **_extra(model, dec_ids)), "input_ids", "-1", "[0, 256)")


@pytest.mark.parametrize("name, bad_id", [("tiny-gpt", 256), ("tiny-llama", 10_000), ("tiny-bert", 256),
                                          ("tiny-transformer", 256)])
def test_token_id_at_or_beyond_vocab(name, bad_id, ids, dec_ids):
    model = tiny_model(name)
    bad = ids.at[0, 0].set(bad_id)
    rejects(lambda: model(bad, **_extra(model, dec_ids)), "input_ids", str(bad_id), "[0, 256)")


@pytest.mark.parametrize("name", ["tiny-t5", "tiny-transformer"])
def test_decoder_token_id_out_of_range(name, ids, dec_ids):
    model = tiny_model(name)
    bad = dec_ids.at[2, 4].set(300)
    rejects(lambda: model(ids, decoder_input_ids=bad), "decoder_input_ids", "300", "[0, 256)")


def test_non_integer_ids(ids):
    model = tiny_model("tiny-gpt")
    bad = ids.astype(jnp.float32)
    rejects(lambda: model(bad), "input_ids", "integer", "float32")


@pytest.mark.parametrize("shape", [(9,), (1, 2, 9), ()], ids=["1-D", "3-D", "scalar"])
def test_ids_must_be_two_dimensional(shape):
    model = tiny_model("tiny-gpt")
    bad = jnp.ones(shape, jnp.int32)
    rejects(lambda: model(bad), "input_ids", "[batch, length]", str(shape))


def test_empty_sequence():
    model = tiny_model("tiny-gpt")
    empty = jnp.zeros((2, 0), jnp.int32)
    rejects(lambda: model(empty), "input_ids", "empty")


def test_numpy_ids_are_checked_too(ids):
    model = tiny_model("tiny-gpt")
    bad = np.asarray(ids, np.int64)
    bad[0, 1] = 999
    rejects(lambda: model(bad), "input_ids", "999")


# ----------------------------------------------------------------------------------------------
# lengths


@pytest.mark.parametrize("name, position", [("tiny-gpt", "learned"), ("tiny-bert", "learned"),
                                            ("tiny-transformer", "sinusoidal")])
def test_sequence_longer_than_position_table(name, position, dec_ids):
    model = tiny_model(name)
    limit = model.config.max_positions
    long = token_ids(B, limit + 1, seed=3)
    rejects(lambda: model(long, **_extra(model, dec_ids)), "input_ids", str(limit + 1), str(limit), position)


def test_decoder_sequence_longer_than_position_table(ids):
    model = tiny_model("tiny-transformer")
    long = token_ids(B, model.config.max_positions + 3, seed=4)
    rejects(lambda: model(ids, decoder_input_ids=long), "decoder_input_ids", "131", "128")


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-t5"])
def test_relative_and_rotary_positions_have_no_table_limit(name):
    # Only absolute tables limit the length; a rotary or T5-relative model runs past max_positions.
    # (Shape-level, under jax.eval_shape: the length check is a shape check, nothing is compiled.)
    model = tiny_model(name)
    long = token_ids(1, model.config.max_positions + 1, seed=5)
    out = jax.eval_shape(lambda ids: model(ids, decoder_input_ids=ids) if name == "tiny-t5" else model(ids), long)
    assert out.logits.shape == (1, long.shape[1], model.config.vocab_size)
    # the same length on a learned-position model is refused, also under eval_shape
    with pytest.raises(ValueError, match="positions"):
        jax.eval_shape(tiny_model("tiny-gpt"), long)


def test_position_ids_out_of_table(ids):
    model = tiny_model("tiny-gpt")
    T = ids.shape[1]
    positions = jnp.broadcast_to(jnp.arange(T) + 128 - T + 3, ids.shape)  # last one is 130
    rejects(lambda: model(ids, position_ids=positions), "position_ids", "130", "128")


# ----------------------------------------------------------------------------------------------
# masks and auxiliary inputs


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-bert", "tiny-t5"])
def test_attention_mask_shape_mismatch(name, ids, dec_ids):
    model = tiny_model(name)
    mask = jnp.ones((B, ids.shape[1] + 1), jnp.int32)
    rejects(lambda: model(ids, mask, **_extra(model, dec_ids)), "attention_mask", str(mask.shape),
            str(ids.shape))


def test_decoder_attention_mask_shape_mismatch(ids, dec_ids):
    model = tiny_model("tiny-t5")
    mask = jnp.ones(ids.shape, jnp.int32)  # the encoder's shape, not the decoder's
    rejects(lambda: model(ids, decoder_input_ids=dec_ids, decoder_attention_mask=mask),
            "decoder_attention_mask", str(ids.shape), str(dec_ids.shape))


def test_attention_mask_values_must_be_binary(ids):
    model = tiny_model("tiny-bert")
    mask = jnp.ones(ids.shape, jnp.int32).at[0, 0].set(2)
    rejects(lambda: model(ids, mask), "attention_mask", "0", "1")


@pytest.mark.parametrize("name", ["tiny-t5", "tiny-transformer"])
def test_encoder_decoder_needs_decoder_inputs(name, ids):
    model = tiny_model(name)
    rejects(lambda: model(ids), "decoder_input_ids")


def test_encoder_decoder_batch_mismatch(ids, dec_ids):
    # Encoder batch 3, decoder batch 2: caught on the host, before the encoder runs.
    model = tiny_model("tiny-t5")
    two_rows = dec_ids[:2]
    rejects(lambda: model(ids, decoder_input_ids=two_rows), "batch", "2", "3")


def test_token_type_ids_on_model_without_types(ids):
    model = tiny_model("tiny-bert", type_vocab_size=0)
    types = jnp.zeros(ids.shape, jnp.int32)
    rejects(lambda: model(ids, token_type_ids=types), "token_type_ids", "type_vocab_size")


def test_token_type_out_of_range(ids):
    model = tiny_model("tiny-bert")  # two types
    types = jnp.zeros(ids.shape, jnp.int32).at[1, 2].set(2)
    rejects(lambda: model(ids, token_type_ids=types), "token_type_ids", "2", "[0, 2)")


def test_token_type_shape_mismatch(ids):
    model = tiny_model("tiny-bert")
    types = jnp.zeros((B, ids.shape[1] - 1), jnp.int32)
    rejects(lambda: model(ids, token_type_ids=types), "token_type_ids", str(types.shape))


def test_prefix_lengths_missing_for_prefix_attention(ids):
    model = tiny_model("tiny-gpt", attention="prefix")
    rejects(lambda: model(ids), "prefix_lengths", "prefix")


def test_prefix_lengths_out_of_range(ids):
    model = tiny_model("tiny-gpt", attention="prefix")
    T = ids.shape[1]
    prefix = jnp.array([1, 2, T + 1])
    rejects(lambda: model(ids, prefix_lengths=prefix), "prefix_lengths", str(T + 1))


def test_prefix_lengths_wrong_shape(ids):
    model = tiny_model("tiny-gpt", attention="prefix")
    prefix = jnp.array([1, 2])
    rejects(lambda: model(ids, prefix_lengths=prefix), "prefix_lengths", "(2,)", "(3,)")


def test_prefix_lengths_on_causal_model(ids):
    model = tiny_model("tiny-gpt")
    prefix = jnp.array([1, 2, 3])
    rejects(lambda: model(ids, prefix_lengths=prefix), "prefix_lengths", "causal")


def test_ids_and_embeddings_together(ids):
    model = tiny_model("tiny-gpt")
    x = jnp.zeros((*ids.shape, 64))
    rejects(lambda: model(ids, inputs_embeds=x), "input_ids", "not both")


def test_embeddings_of_wrong_width(ids):
    model = tiny_model("tiny-gpt")
    x = jnp.zeros((*ids.shape, 32))
    # the message names the argument the caller used: `inputs_embeds`
    rejects(lambda: model(inputs_embeds=x), "inputs_embeds", "64", str(x.shape))


def test_decoder_embeddings_of_wrong_width(ids):
    model = tiny_model("tiny-t5")
    x = jnp.zeros((B, 4, 32))
    rejects(lambda: model(ids, decoder_inputs_embeds=x), "decoder_inputs_embeds", "64", str(x.shape))


def test_shape_checks_also_run_under_a_users_jit(ids):
    # Inside jax.jit the ids are tracers: value checks cannot run, but shape checks must.
    model = tiny_model("tiny-gpt")
    graphdef, state = jf.split(model)
    f = jax.jit(lambda s, x: jf.merge(graphdef, s)(x).logits)
    with pytest.raises(ValueError, match=r"\[batch, length\]"):
        f(state, ids[0])


# ----------------------------------------------------------------------------------------------
# build


def test_build_unknown_preset_lists_valid_names():
    with no_compilation():
        with pytest.raises(ValueError) as err:
            jf.build("gpt-5")
    message = str(err.value)
    assert "gpt-5" in message
    for name in jf.presets():
        assert name in message


def test_build_rejects_other_types():
    with pytest.raises(ValueError, match="dict"):
        jf.build({"family": "decoder"})  # type: ignore[arg-type]


def test_build_dtype_override_is_validated():
    with pytest.raises(ValueError, match="float64"):
        jf.build("tiny-gpt", dtype="float64")
