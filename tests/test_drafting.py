"""Drafting: speculative decoding with an assistant model and prompt lookup. Greedy output is plain
greedy's on every cache kind (and transformers' assisted generation's), drafts are rewound where the
target rejects them, prompt lookup proposes what transformers' does, and speculative sampling draws from
the target's distribution (a chi-square test against the exact joint of two tokens)."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

import jaxformer as jf
from jaxformer import generate as gen


def _perturbed(model, scale: float, seed: int):
    """A copy of ``model`` with noise on every weight: a draft that agrees with it most of the time. Drawn in
    numpy: eagerly in JAX each weight shape compiled its own std, normal and sum (3 s for DeepSeek)."""
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(seed)

    def noisy(leaf):
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf
        value = np.asarray(leaf)
        return jnp.asarray(value + scale * value.std() * rng.standard_normal(value.shape).astype(value.dtype))

    return nnx.merge(graphdef, jax.tree.map(noisy, state))


def _batch(family, rng, vocab):
    ids = rng.integers(3, vocab, (2, 8))
    mask = np.ones_like(ids)
    if family == "decoder":
        mask[1, :3] = 0  # left padding
    else:
        mask[1, 6:] = 0
    return ids * mask, mask


# One per cache kind and attention pattern a rewind must respect.
CASES = {
    "llama-gqa": jf.config("tiny-llama").replace(init_std=0.2),
    "gpt-learned-positions": jf.config("tiny-gpt").replace(init_std=0.2),
    "deepseek-latent-cache": jf.config("tiny-deepseek").replace(init_std=0.2),
    "mistral-sliding-3": jf.config("tiny-llama").replace(init_std=0.2, attention="sliding", window_size=3),
    "t5-encoder-decoder": jf.config("tiny-t5").replace(init_std=0.1),
    # Llama 4: chunks of 2 on the rotary layer, and the NoPE layer's temperature read from the cache's write
    # index, which a rewind moves back
    "llama4-chunked": jf.config("tiny-mixtral").replace(
        init_std=0.2, attention="alternating", layer_types=("chunked", "full"), attention_chunk_size=2,
        nope_layers=(1,), temperature_floor_scale=2, temperature_scale=0.5, router_score="sigmoid",
        normalize_router_weights=False, router_weights_on_input=True, shared_experts=1, expert_d_ff=32),
}


LOOKUP_CASES = ("llama-gqa", "t5-encoder-decoder")


@pytest.mark.parametrize("case", sorted(CASES))
def test_drafted_greedy_is_plain_greedy(case):
    """A noisy copy of the target drafts 4 tokens a round (some accepted, some rejected: both caches are
    rewound mid-round), and (one model per family) prompt lookup drafts 3; both emit exactly plain greedy's
    tokens."""
    cfg = CASES[case]
    model = jf.build(cfg, seed=1)
    ids, mask = _batch(cfg.family, np.random.default_rng(0), cfg.vocab_size)
    N = 24
    kwargs = dict(max_new_tokens=N, eos_token_id=None, decoder_start_token_id=0)
    plain = model.generate(ids, mask, **kwargs)
    args, gc = gen.prepare(model, ids, mask, assistant_model=_perturbed(model, 0.02, seed=2), num_assistant_tokens=4,
                           num_assistant_tokens_schedule="constant", **kwargs)
    tokens, steps, bad, rounds = gen.drafted_tokens_jit(*args, config=gc)
    np.testing.assert_array_equal(gen.assemble(model, ids, tokens, steps, bad, gc), plain)
    assert N / 5 < int(rounds) + 1 < N, int(rounds)  # some drafts accepted, and some rejected
    if case in LOOKUP_CASES:  # a drafting source of its own; one cache kind per family is enough
        looked_up = model.generate(ids, mask, prompt_lookup_num_tokens=3, **kwargs)
        np.testing.assert_array_equal(looked_up, plain)


def test_eos_inside_an_accepted_round_stops_that_row_and_trims_like_greedy():
    """Rows finish at different tokens of one round: each is padded after its own EOS and the output is as
    long as plain greedy's; the model as its own assistant accepts whole rounds, the heuristic schedule
    adapts the count, a random one-layer assistant has almost nothing accepted."""
    cfg = CASES["llama-gqa"]
    model = jf.build(cfg, seed=1)
    ids, mask = _batch("decoder", np.random.default_rng(0), cfg.vocab_size)
    free = model.generate(ids, mask, max_new_tokens=12, eos_token_id=None)
    eos = int(free[0, ids.shape[1] + 5])
    plain = model.generate(ids, mask, max_new_tokens=12, eos_token_id=eos)
    small = jf.build(cfg.replace(decoder_layers=1), seed=7)
    for kwargs in (dict(assistant_model=model, num_assistant_tokens=4),
                   dict(assistant_model=small, num_assistant_tokens=3, num_assistant_tokens_schedule="heuristic"),
                   dict(prompt_lookup_num_tokens=2, max_matching_ngram_size=1)):
        out = model.generate(ids, mask, max_new_tokens=12, eos_token_id=eos, **kwargs)
        np.testing.assert_array_equal(out, plain, err_msg=str(kwargs))


def test_prompt_lookup_proposes_what_transformers_does():
    """``lookup_drafts`` against transformers' PromptLookupCandidateGenerator on random text over a small
    vocabulary (many matches), for n-gram bounds 1-3 and draft counts 1 and 4."""
    torch = pytest.importorskip("torch")
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = np.random.default_rng(0)
    width = 40  # the loop's text buffer runs past the text so far
    lookup = jax.jit(gen.lookup_drafts, static_argnums=(3, 4))
    for count in (1, 4):
        for ngram in (1, 2, 3):
            for _ in range(15):
                length = int(rng.integers(3, 30))
                text = rng.integers(0, 4, (1, length))
                reference = PromptLookupCandidateGenerator(num_output_tokens=count, max_matching_ngram_size=ngram,
                                                           max_length=1000)
                candidates, _ = reference.get_candidates(torch.as_tensor(text))
                room = np.pad(text, ((0, 0), (0, width - length)))
                drafts, real = lookup(jnp.asarray(room), jnp.asarray(np.arange(width)[None] < length),
                                      jnp.int32(length), count, ngram)
                np.testing.assert_array_equal(np.asarray(drafts)[0, :int(real[0])], candidates[0, length:].numpy(),
                                              err_msg=f"{text} count={count} ngram={ngram}")


def test_prompt_lookup_drafts_from_repeated_text_and_ignores_padding():
    text = jnp.asarray([[0, 0, 7, 8, 9, 7, 8, 0, 0, 0], [7, 8, 9, 1, 2, 7, 8, 0, 0, 0]])
    known = jnp.asarray([[False, False] + [True] * 5 + [False] * 3, [True] * 7 + [False] * 3])
    drafts, real = gen.lookup_drafts(text, known, jnp.int32(7), 4, 2)
    np.testing.assert_array_equal(real, [3, 4])  # row 0: "7 8" is followed by "9 7 8", where the text ends
    np.testing.assert_array_equal(np.asarray(drafts)[0, :3], [9, 7, 8])
    np.testing.assert_array_equal(drafts[1], [9, 1, 2, 7])
    # the pads (0) before row 0's text never match its trailing 0-free n-grams, nor a pad tail
    drafts, real = gen.lookup_drafts(text.at[0, 6].set(0), known, jnp.int32(7), 3, 1)
    assert int(real[0]) == 0


def test_assisted_and_lookup_greedy_match_transformers(tmp_path):
    """transformers' assisted generation (its default 20 drafts, confidence-stopped) and prompt lookup with
    the same pair exported to Hugging Face files: the same tokens."""
    torch = pytest.importorskip("torch")
    from hf_factory import save_checkpoint
    from jaxformer.compare import reference_model

    target_dir, draft_dir = save_checkpoint("llama", tmp_path / "target"), save_checkpoint(
        "llama", tmp_path / "draft", seed=5, changes={"num_hidden_layers": 1})
    model, assistant = jf.from_pretrained(target_dir), jf.from_pretrained(draft_dir)
    reference, reference_draft = reference_model(target_dir), reference_model(draft_dir)
    ids = np.array([[5, 17, 42, 9, 5, 17, 42, 9, 11]])
    ours = model.generate(ids, max_new_tokens=16, eos_token_id=None, assistant_model=assistant)
    looked_up = model.generate(ids, max_new_tokens=16, eos_token_id=None, prompt_lookup_num_tokens=3)
    with torch.no_grad():
        theirs = reference.generate(torch.as_tensor(ids), assistant_model=reference_draft, max_new_tokens=16,
                                    do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
        theirs_lookup = reference.generate(torch.as_tensor(ids), prompt_lookup_num_tokens=3, max_new_tokens=16,
                                           do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(looked_up, theirs_lookup)


def _joint_of_two(model, prompt, top_k):
    """The exact probability of each pair of first two tokens [V, V] under sampling with ``top_k``."""
    V = model.config.vocab_size
    gc = gen.GenerationConfig(do_sample=True, top_k=top_k)
    first = jax.nn.softmax(gen.warp_logits(model(prompt).logits[:, -1], gc), axis=-1)[0]
    extended = jnp.concatenate([jnp.repeat(prompt, V, axis=0), jnp.arange(V)[:, None]], axis=1)
    second = jax.nn.softmax(gen.warp_logits(model(extended).logits[:, -1], gc), axis=-1)
    return np.asarray(first[:, None] * second, np.float64)


def _chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """The chi-square test's p-value of ``counts`` drawn from ``probs``; 0 when an outcome of probability 0
    was drawn."""
    from scipy import stats

    keep = probs > 0
    if counts[~keep].sum():
        return 0.0
    return float(stats.chisquare(counts[keep], probs[keep] / probs[keep].sum() * counts.sum()).pvalue)


@pytest.mark.parametrize("top_k", [None, 3])
def test_speculative_sampling_draws_from_the_target(top_k):
    """6,000 sampled generations of two tokens (vmapped over seeds, batch 1 each, so every run accepts on
    its own) over a vocabulary of 6: the joint of the two tokens fits the target's exact distribution
    (chi-square p > 1e-4), while the draft's own distribution is rejected by the same test, so the test can
    tell them apart. Prompt lookup's sampled rule too."""
    cfg = jf.config("tiny-llama").replace(vocab_size=6, init_std=0.5)
    model, assistant = jf.build(cfg, seed=1), jf.build(cfg.replace(decoder_layers=1), seed=3)
    prompt = jnp.asarray([[1, 2, 3, 1, 2]])
    exact = _joint_of_two(model, prompt, top_k)
    draft_exact = _joint_of_two(assistant, prompt, top_k)
    runs = 6000
    keys = jax.random.split(jax.random.key(0), runs)
    for kwargs in (dict(assistant_model=assistant, num_assistant_tokens=2), dict(prompt_lookup_num_tokens=2)):
        args, gc = gen.prepare(model, prompt, max_new_tokens=2, do_sample=True, top_k=top_k, eos_token_id=None,
                               **kwargs)
        graphdef, state, ids, mask, _ = args
        sample = jax.jit(jax.vmap(lambda key: gen.drafted_tokens(graphdef, state, ids, mask, key, gc)[0][0]))
        tokens = np.asarray(sample(keys))
        counts = np.zeros_like(exact)
        np.add.at(counts, (tokens[:, 0], tokens[:, 1]), 1)
        assert _chi_square_p(counts.ravel(), exact.ravel()) > 1e-4, kwargs
        assert _chi_square_p(counts.ravel(), draft_exact.ravel()) < 1e-6


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt_lookup_num_tokens=3, num_beams=2), "beam search"),
    (dict(prompt_lookup_num_tokens=0), "prompt_lookup_num_tokens=0"),
    (dict(prompt_lookup_num_tokens=2, max_matching_ngram_size=0), "max_matching_ngram_size=0"),
    (dict(max_matching_ngram_size=2), "needs prompt_lookup_num_tokens"),
    (dict(num_assistant_tokens=3), "need an assistant_model"),
    (dict(assistant_model="tiny-llama"), "must be a jaxformer model"),
    (dict(assistant_model="t5", prompt_lookup_num_tokens=2), "not both"),
    (dict(assistant_model="t5"), "the same family"),
    (dict(assistant_model="self", num_assistant_tokens=0), "num_assistant_tokens=0"),
    (dict(assistant_model="self", num_assistant_tokens_schedule="dynamic"), "num_assistant_tokens_schedule"),
    (dict(assistant_model="xl"), "Transformer-XL"),
    (dict(prompt_lookup_num_tokens=2, num_assistant_tokens_schedule="heuristic"), "valid with prompt lookup"),
    (dict(num_assistant_tokens_schedule="constant"), "need drafting"),
    (dict(assistant_model="self", draft_costs=(0.1,)), "draft_costs"),
    (dict(assistant_model="self", draft_costs=(0.1, float("nan"))), "draft_costs"),
    (dict(target="xl", prompt_lookup_num_tokens=2), "cannot be rewound"),
])
def test_bad_drafting_arguments_are_refused_before_tracing(kwargs, message):
    named = {"self": lambda: model, "t5": lambda: jf.build("tiny-t5"), "xl": lambda: jf.build("tiny-transformer-xl")}
    kwargs = dict(kwargs)
    model = named[kwargs.pop("target")]() if "target" in kwargs else jf.build(CASES["llama-gqa"])
    if kwargs.get("assistant_model") in named:
        kwargs["assistant_model"] = named[kwargs["assistant_model"]]()
    traces = gen.TRACE_COUNT["generate"]
    with pytest.raises(ValueError, match=message):
        model.generate(np.array([[5, 6, 7]]), max_new_tokens=4, **kwargs)
    assert gen.TRACE_COUNT["generate"] == traces


def _rounds(model, ids, **kwargs):
    """(tokens as generate() returns them, target steps after the prefill) of one drafted generation."""
    args, gc = gen.prepare(model, ids, max_new_tokens=24, eos_token_id=None, **kwargs)
    tokens, steps, bad, rounds = gen.drafted_tokens_jit(*args, config=gc)
    return gen.assemble(model, ids, tokens, steps, bad, gc), int(rounds)


def test_the_adaptive_schedule_drafts_when_it_pays_and_steps_plainly_when_not():
    """Given costs (no timing in the test): with the model as its own assistant (every draft kept) and cheap
    drafting, rounds draft the bound, 4 tokens a step; with a random one-layer assistant (drafts rejected), or
    drafting priced above what a kept draft saves, rounds are plain steps but for the probes every PROBE_AFTER
    rounds. Every run emits plain greedy's tokens."""
    cfg = CASES["llama-gqa"]
    model, stranger = jf.build(cfg, seed=1), jf.build(cfg.replace(decoder_layers=1), seed=7)
    ids = np.random.default_rng(0).integers(3, cfg.vocab_size, (1, 8))
    plain = model.generate(ids, max_new_tokens=24, eos_token_id=None)
    cheap, dear = dict(draft_costs=(0.05, 0.05)), dict(draft_costs=(0.0, 3.0))
    most_plain = 23 - 23 // (gen.PROBE_AFTER + 1)  # plain rounds, a probe after every PROBE_AFTER of them
    for assistant, costs, bounds in ((model, cheap, (5, 6)), (stranger, cheap, (most_plain, 23)),
                                     (model, dear, (most_plain, 23))):
        out, rounds = _rounds(model, ids, assistant_model=assistant, num_assistant_tokens=4, **costs)
        np.testing.assert_array_equal(out, plain)
        assert bounds[0] <= rounds <= bounds[1], (costs, rounds)
    # prompt lookup over a vocabulary of 8 (greedy text repeats): cheap verification drafts, dear does not
    small = jf.build(jf.config("tiny-llama").replace(vocab_size=8), seed=1)
    prompt = np.asarray([[1, 2, 3, 1, 2]])
    repeats = small.generate(prompt, max_new_tokens=24, eos_token_id=None)
    for costs, bounds in (((0.0, 0.05), (1, 11)), ((0.0, 3.0), (most_plain, 23))):
        out, rounds = _rounds(small, prompt, prompt_lookup_num_tokens=3, draft_costs=costs)
        np.testing.assert_array_equal(out, repeats)
        assert bounds[0] <= rounds <= bounds[1], (costs, rounds)


def test_draft_costs_are_measured_once_per_shape():
    """generate() measures what drafting costs on this device once per model pair, batch and cache-length
    bucket: two finite numbers >= 0 in plain target steps, kept and reused by a prompt one token longer (same
    bucket), measured again for a batch of another size; the table keeps at most MEASURED_DRAFT_COSTS_KEPT."""
    cfg = CASES["gpt-learned-positions"]
    model, assistant = jf.build(cfg, seed=1), jf.build(cfg.replace(decoder_layers=1), seed=2)
    ids = np.random.default_rng(0).integers(3, cfg.vocab_size, (2, 6))
    before = dict(gen.MEASURED_DRAFT_COSTS)
    pair = dict(assistant_model=assistant, num_assistant_tokens=3)
    _, gc = gen.prepare(model, ids, max_new_tokens=8, **pair)
    assert len(gc.draft_costs) == 2 and all(0 <= c < float("inf") for c in gc.draft_costs), gc.draft_costs
    assert len(gen.MEASURED_DRAFT_COSTS) == len(before) + 1
    assert gen.cache_length_bucket(6 + 8) == gen.cache_length_bucket(7 + 8) == 16
    _, again = gen.prepare(model, np.concatenate([ids, ids[:, :1]], axis=1), max_new_tokens=8, **pair)
    assert again.draft_costs == gc.draft_costs and len(gen.MEASURED_DRAFT_COSTS) == len(before) + 1
    gen.prepare(model, ids[:1], max_new_tokens=8, **pair)
    assert len(gen.MEASURED_DRAFT_COSTS) == len(before) + 2
    kept = gen.MEASURED_DRAFT_COSTS_KEPT
    try:
        gen.MEASURED_DRAFT_COSTS_KEPT = len(gen.MEASURED_DRAFT_COSTS) - 1
        gen.prepare(model, ids, max_new_tokens=40, **pair)  # bucket 64: measured, the oldest entry dropped
        assert len(gen.MEASURED_DRAFT_COSTS) == gen.MEASURED_DRAFT_COSTS_KEPT
    finally:
        gen.MEASURED_DRAFT_COSTS_KEPT = kept