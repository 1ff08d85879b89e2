"""BigBird (``big_bird``: block-sparse attention: global, window and random blocks) as transformers evaluates it: the
published file reads as its transformers-5 form and matches transformers' every layer, attention map and head on
inputs long enough for block-sparse attention (8 blocks of 8, and 61 tokens that transformers pads to 64) and on
short ones, where both attend densely; a question over a long context gets transformers' start and end logits and
answer span. Parity of the tiny checkpoints of every head (blocks of one token) and the bit-exact round trip are in
test_hf_parity.py, every key changed one at a time in test_config_keys.py, the presets' counts in test_presets.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table, reference_model  # noqa: E402

from family_files import TOLERANCE, as_transformers_writes_it, qlora_loss_falls, read, rewritten  # noqa: E402
from hf_factory import save_checkpoint  # noqa: E402

# google/bigbird-roberta-base's config.json (reconstructed: BigBirdConfig's defaults are that file's values), every
# key kept, sizes made tiny: blocks of 8 tokens and one random block, so inputs past (5 + 2) * 8 = 56 tokens run
# block-sparse
PUBLISHED = {"architectures": ["BigBirdForPreTraining"], "attention_probs_dropout_prob": 0.1,
             "attention_type": "block_sparse", "block_size": 8, "bos_token_id": 1, "eos_token_id": 2,
             "gradient_checkpointing": False, "hidden_act": "gelu_new", "hidden_dropout_prob": 0.1, "hidden_size": 32,
             "initializer_range": 0.2, "intermediate_size": 48, "layer_norm_eps": 1e-12, "max_position_embeddings": 80,
             "model_type": "big_bird", "num_attention_heads": 4, "num_hidden_layers": 2, "num_random_blocks": 1,
             "pad_token_id": 0, "rescale_embeddings": False, "sep_token_id": 66, "type_vocab_size": 2,
             "use_bias": True, "use_cache": True, "vocab_size": 97}
SIZES = {"block_size": 8, "num_random_blocks": 1, "max_position_embeddings": 80}


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
    """The pre-training checkpoint (MLM and NSP heads) under the published config.json."""
    folder = save_checkpoint("big_bird-pretraining", tmp_path_factory.mktemp("bb") / "saved", seed=1, changes=SIZES)
    return rewritten(folder, tmp_path_factory.mktemp("bb") / "published", PUBLISHED)


def _batch(length: int, rng: np.random.Generator):
    """Two rows, the second right-padded by 5 (ids away from the separator)."""
    ids = rng.integers(3, 60, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, length - 5:], ids[1, length - 5:] = 0, 0
    return ids, mask


@pytest.mark.parametrize("length", [64, 61])
def test_the_published_file_matches_block_sparse_attention(pretraining, length):
    """8 blocks of 8 tokens, and 61 tokens (transformers pads them to 64): every layer, attention map (one copy of
    each key's probability, as transformers scatters them), the MLM and NSP logits to 1e-5."""
    cfg = read(PUBLISHED)
    assert read(as_transformers_writes_it(PUBLISHED)).replace(name=cfg.name) == cfg
    assert (cfg.scores.sparse_block_size, cfg.scores.sparse_random_blocks, cfg.head) == (8, 1, "pretraining")
    rows = compare(pretraining, *_batch(length, np.random.default_rng(length)))
    assert {"attention 2", "logits", "nsp logits"} <= {r.name for r in rows}
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


def test_short_inputs_attend_densely_as_transformers_falls_back(pretraining):
    """56 tokens (= (5 + 2 r) blocks) attend densely on both sides (compared directly: transformers' switch to
    'original_full' swaps modules its attention recorders never see, so it returns no attentions)."""
    model = jf.from_pretrained(pretraining)
    ids, mask = _batch(56, np.random.default_rng(3))
    reference = reference_model(pretraining)  # (its switch to 'original_full' outlives the call: a fresh one)
    with torch.no_grad():
        theirs = reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                           output_hidden_states=True)
    ours = model(ids, mask, output_hidden_states=True)
    real = mask.astype(bool)
    assert len(theirs.hidden_states) == len(ours.hidden_states) == 3
    for r, o in zip(theirs.hidden_states, ours.hidden_states):
        np.testing.assert_allclose(np.asarray(o)[real], r.numpy()[real], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(np.asarray(ours.logits)[real], theirs.prediction_logits.numpy()[real],
                               atol=TOLERANCE, rtol=0)


def test_a_question_over_a_long_context_gets_transformers_answer(tmp_path):
    """A question of 10 tokens and a context of 100 (blocks of 8, one random block): the span head's start and end
    logits to 1e-5 (the question's pushed 1e6 down, its token types 0 and the context's 1, as transformers sets
    them when the call gives none) and the same best span."""
    folder = save_checkpoint("big_bird-qa", tmp_path / "qa", seed=2, changes={**SIZES, "max_position_embeddings": 128})
    rng = np.random.default_rng(5)
    ids = np.concatenate([[1], rng.integers(3, 97, 10), [2], rng.integers(3, 97, 100), [2]])[None]
    model, reference = jf.from_pretrained(folder), reference_model(folder)
    out = model(ids)
    with torch.no_grad():
        theirs = reference(input_ids=torch.as_tensor(ids))
    start, end = np.asarray(out.start_logits), np.asarray(out.end_logits)
    np.testing.assert_allclose(start, theirs.start_logits.numpy(), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(end, theirs.end_logits.numpy(), atol=TOLERANCE, rtol=0)
    assert (start[0, 1:12] < -1e5).all() and (start[0, 12:] > -1e5).all()  # the question (after <s>) is out
    best = lambda s, e: np.unravel_index(np.argmax(s[:, None] + e[None] - 1e9 * ~np.triu(  # noqa: E731
        np.ones((s.size, s.size), bool))), (s.size, s.size))
    assert best(start[0], end[0]) == best(theirs.start_logits.numpy()[0], theirs.end_logits.numpy()[0])


def test_a_qlora_fine_tune_lowers_the_mlm_loss_on_block_sparse_rows(pretraining, tmp_path):
    """QLoRA from the published file with the MLM objective on rows of 64 tokens (block-sparse: jaxformer trains with
    the evaluation pattern, see interop/big_bird.py)."""
    qlora_loss_falls(pretraining, tmp_path / "run", "train.objective=mlm", "train.seq_len=64",
                     "model.overrides.vocab_size=360")


@pytest.mark.parametrize("changes, message", [
    ({"attention_type": "sparse"}, "attention_type='sparse' must be"),
    ({"block_size": 0}, "block_size=0 must be a positive int"),
    ({"is_decoder": True}, "BigBirdForCausalLM"),
])
def test_settings_jaxformer_cannot_honour_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        read({**PUBLISHED, **changes})


def test_original_full_attends_densely_whatever_the_blocks():
    cfg = read({**PUBLISHED, "attention_type": "original_full"})
    assert (cfg.scores.sparse_block_size, cfg.scores.sparse_random_blocks) == (None, 0)


# google/bigbird-pegasus-large-arxiv's config.json (reconstructed from the published file as transformers 4 wrote
# it), every key kept, sizes made tiny: blocks of 8 tokens and one random block in the encoder
PUBLISHED_PEGASUS = {
    "activation_dropout": 0.1, "activation_function": "gelu_new",
    "architectures": ["BigBirdPegasusForConditionalGeneration"], "attention_dropout": 0.1,
    "attention_type": "block_sparse", "block_size": 8, "bos_token_id": 2, "classifier_dropout": 0.0, "d_model": 32,
    "decoder_attention_heads": 4, "decoder_ffn_dim": 48, "decoder_layerdrop": 0.0, "decoder_layers": 2,
    "decoder_start_token_id": 0, "dropout": 0.1, "encoder_attention_heads": 4, "encoder_ffn_dim": 48,
    "encoder_layerdrop": 0.0, "encoder_layers": 2, "eos_token_id": 1, "gradient_checkpointing": False,
    "init_std": 0.2, "is_encoder_decoder": True, "length_penalty": 0.8, "max_length": 256,
    "max_position_embeddings": 80, "model_type": "bigbird_pegasus", "num_beams": 5, "num_hidden_layers": 2,
    "num_random_blocks": 1, "pad_token_id": 0, "scale_embedding": True, "transformers_version": "4.10.0.dev0",
    "use_bias": False, "use_cache": True, "vocab_size": 97}


@pytest.fixture(scope="module")
def pegasus(tmp_path_factory):
    folder = save_checkpoint("bigbird_pegasus", tmp_path_factory.mktemp("bbp") / "saved", seed=1,
                             changes={"block_size": 8, "num_random_blocks": 1, "max_position_embeddings": 80,
                                      "activation_function": "gelu_new"})
    return rewritten(folder, tmp_path_factory.mktemp("bbp") / "published", PUBLISHED_PEGASUS)


def _left_padded(length: int, rng: np.random.Generator):
    """Three rows, the second and third left-padded by 3 and 9 (ids away from the special tokens)."""
    ids = rng.integers(3, 97, size=(3, length))
    mask = np.ones_like(ids)
    mask[1, :3], mask[2, :9] = 0, 0
    return ids * mask, mask


def test_the_published_bigbird_pegasus_file_matches_with_left_padding(pegasus):
    """61 source tokens (transformers pads them to 64: 8 blocks of 8), two rows left-padded: every encoder and
    decoder layer, attention map and the logits to 1e-5."""
    cfg = read(PUBLISHED_PEGASUS)
    assert read(as_transformers_writes_it(PUBLISHED_PEGASUS)).replace(name=cfg.name) == cfg
    assert (cfg.scores.sparse_block_size, cfg.biases.qkv, cfg.biases.out) == (8, False, False)
    rows = compare(pegasus, *_left_padded(61, np.random.default_rng(6)))
    assert {"encoder attention 2", "cross attention 2", "logits"} <= {r.name for r in rows}
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


def test_bigbird_pegasus_generates_as_transformers_with_left_padding(pegasus):
    """Greedy and beam search (3 beams) over 61-token left-padded sources (the encoder block-sparse), 10 new
    tokens, token-identical, with an EOS the first row writes early so that stopping is exercised."""
    model, reference = jf.from_pretrained(pegasus), reference_model(pegasus)
    ids, mask = _left_padded(61, np.random.default_rng(7))
    for num_beams in (1, 3):
        kwargs = dict(max_new_tokens=10, num_beams=num_beams, do_sample=False, length_penalty=1.0)
        kwargs["eos_token_id"] = int(model.generate(ids, mask, **kwargs)[0, 3])
        ours = model.generate(ids, mask, **kwargs)
        with torch.no_grad():
            theirs = reference.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), **kwargs).numpy()
        np.testing.assert_array_equal(ours, theirs, err_msg=f"num_beams={num_beams}")
