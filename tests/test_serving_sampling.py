"""The engine's per-row sampling: each processor equals transformers' logits processor of the same row (presence and
frequency, which transformers lacks, equal OpenAI's formula), a penalised greedy request equals transformers'
``generate`` with that penalty, log-probabilities equal ``log_softmax`` of transformers' logits, and a mixed batch
gives each row what it gets alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    SequenceBiasLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

import jaxformer as jf
from jaxformer.generate import _filter_candidates, filter_top_k_top_p
from jaxformer.serving import Engine, SamplingParams
from jaxformer.serving import engine as serving_engine
from jaxformer.serving.sampling import (MAX_LOGPROBS, SamplerFlags, bias_rows, choose_tokens, draw, greedy,
                                        penalize_rows, sampling_rows, warp_rows)
from tests.hf_factory import save_checkpoint

BLOCK, MAX_LEN = 8, 64


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Llama checkpoint (no EOS: requests run their max_tokens) as ours and as transformers'."""
    folder = save_checkpoint("llama", tmp_path_factory.mktemp("sampling"), changes=dict(eos_token_id=None))
    return jf.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(str(folder)).eval()


def _engine(model, max_num_seqs=8):
    return Engine(model, num_blocks=64, block_size=BLOCK, max_num_seqs=max_num_seqs, prefill_chunk=16,
                  max_model_len=MAX_LEN, seed=0)


def _run(engine, requests):
    """Each (prompt, params) request's tokens and logprobs, all submitted at once."""
    ids = [engine.add_request(prompt, params) for prompt, params in requests]
    tokens, logprobs = {i: [] for i in ids}, {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.token_ids
            logprobs[out.request_id] += out.logprobs or ()
    return [(tokens[i], logprobs[i]) for i in ids]


def test_each_processor_row_by_row_equals_transformers():
    """Repetition penalty over prompt + generated ids, presence and frequency over the generated ids, then
    temperature, top-k, top-p, min-p: each row of one batch against transformers' processors on that row alone."""
    rng = np.random.default_rng(0)
    B, V, W = 6, 64, 16
    logits = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    # (repetition, presence, frequency, temperature, top_k, top_p, min_p, history length, prompt length)
    rows = [(1.0, 0.0, 0.0, 1.0, 0, 1.0, 0.0, 5, 5), (1.3, 0.0, 0.0, 0.7, 5, 1.0, 0.0, 12, 4),
            (0.8, 0.5, 0.0, 1.3, 0, 0.8, 0.1, 9, 3), (1.0, -0.4, 1.5, 0.5, 10, 0.6, 0.0, 16, 6),
            (2.0, 2.0, -2.0, 2.0, 64, 0.95, 0.3, 7, 7), (1.1, 0.3, 0.6, 1.0, 0, 1.0, 0.05, 11, 2)]
    history = np.full((B, W), -1, np.int32)
    for r, (*_, length, _) in enumerate(rows):
        history[r, :length] = rng.integers(0, 12, length)  # a few ids, so some repeat
    rep, pres, freq, temp, top_k, top_p, min_p, _, prompt = (np.asarray(c) for c in zip(*rows))
    penalized = penalize_rows(jnp.asarray(logits), jnp.asarray(rep, jnp.float32), jnp.asarray(pres, jnp.float32),
                              jnp.asarray(freq, jnp.float32), jnp.asarray(history), jnp.asarray(prompt, jnp.int32))
    warped = np.asarray(warp_rows(penalized, jnp.asarray(temp, jnp.float32), jnp.asarray(top_k, jnp.int32),
                                  jnp.asarray(top_p, jnp.float32), jnp.asarray(min_p, jnp.float32)))
    for r, (rp, pr, fr, t, k, p, mp, length, prompt_length) in enumerate(rows):
        ids, scores = torch.tensor(history[r:r + 1, :length], dtype=torch.long), torch.tensor(logits[r:r + 1])
        scores = RepetitionPenaltyLogitsProcessor(float(rp))(ids, scores)
        counts = np.bincount(history[r, prompt_length:length], minlength=V)  # OpenAI's penalties, generated ids
        scores = scores - torch.tensor(fr * counts + pr * (counts > 0), dtype=torch.float32)
        np.testing.assert_allclose(np.asarray(penalized[r]), scores[0].numpy(), rtol=1e-6, atol=1e-6)
        warpers = [TemperatureLogitsWarper(float(t)), k > 0 and TopKLogitsWarper(int(k)),
                   p < 1 and TopPLogitsWarper(float(p)), mp > 0 and MinPLogitsWarper(float(mp))]
        for warper in filter(None, warpers):  # in transformers' order, those it would build
            scores = warper(ids, scores)
        theirs = scores[0].numpy()
        kept = np.isfinite(theirs)
        assert (np.isfinite(warped[r]) == kept).all(), f"row {r}: the kept tokens differ"
        assert kept.sum() < V or (k == 0 and p == 1 and mp == 0), f"row {r} filtered nothing"
        # ours is shifted to a maximum of 0 (the same distribution)
        np.testing.assert_allclose(warped[r][kept], theirs[kept] - theirs.max(), rtol=1e-6, atol=1e-6)


def _stable_top_k_top_p(logits: np.ndarray, top_k, top_p) -> np.ndarray:
    """The definition over whole rows, in float64: transformers' top-k then top-p warpers, the nucleus by a stable
    ascending sort (of tied tokens the lower id counts as less likely; torch's sort leaves ties in any order). Each
    top_p lies at least 2e-5 from every token's cumulative probability, far past float32's rounding of those sums,
    so no token's side of the edge is rounding's to decide."""
    out = logits.astype(np.float64)
    for row, k, p in zip(out, top_k, top_p):
        if k:
            row[row < np.sort(row)[-min(k, len(row))]] = -np.inf
        if p < 1:
            order = np.argsort(row, kind="stable")
            probs = np.exp(row[order] - row.max())
            cumulative = np.cumsum(probs / probs.sum())
            assert np.abs(cumulative - (1 - p)).min() > 2e-5, f"top_p={p} sits at a token's edge"
            remove = cumulative <= 1 - p
            remove[-1] = False
            row[order[remove]] = -np.inf
    return out


def test_top_k_and_top_p_among_the_likeliest_tokens_equal_the_whole_sorted_row():
    """``filter_top_k_top_p`` decides a row among its 256 likeliest tokens where they hold its k-th and its nucleus,
    else among more, else over the whole sorted row: each row keeps the tokens of the definition (ties too: 300 equal
    tokens across the 256th, of which the higher ids stay; ties with the k-th), and the same in any batch."""
    rng = np.random.default_rng(0)
    V = 5000
    rows, settings = [], []
    for scale, top_k, top_p in ((8, 0, 0.9), (8, 40, 0.95), (3, 0, 0.94), (0.5, 0, 0.88), (0.5, 300, 1.0),
                                (3, 5000, 0.85), (3, 0, 1.0), (0.5, 2, 0.3)):
        rows.append(rng.standard_normal(V) * scale)
        settings.append((top_k, top_p))
    tied = np.full(V, -30.0)
    tied[rng.choice(V, 300, replace=False)] = 0.0  # 300 equal likeliest: the nucleus ends inside them
    rows.append(tied)
    settings.append((0, 0.553))
    rows.append(np.round(rng.standard_normal(V) * 2))  # many ties, one with the 100th
    settings.append((100, 0.9))
    logits = np.stack(rows).astype(np.float32)
    logits -= logits.max(axis=-1, keepdims=True)
    top_k, top_p = (np.asarray(column) for column in zip(*settings))
    filtered = np.asarray(jax.jit(filter_top_k_top_p)(jnp.asarray(logits), jnp.asarray(top_k, jnp.int32),
                                                      jnp.asarray(top_p, jnp.float32)))
    expected = _stable_top_k_top_p(logits, top_k, top_p)
    for r in range(len(rows)):
        kept = np.isfinite(expected[r])
        assert (np.isfinite(filtered[r]) == kept).all(), f"row {r} {settings[r]}: {kept.sum()} kept, " \
            f"{np.isfinite(filtered[r]).sum()} by ours"
        np.testing.assert_array_equal(filtered[r][kept], logits[r][kept])
        alone = filter_top_k_top_p(jnp.asarray(logits[r:r + 1]), jnp.asarray(top_k[r:r + 1], jnp.int32),
                                   jnp.asarray(top_p[r:r + 1], jnp.float32))
        np.testing.assert_array_equal(np.asarray(alone)[0], filtered[r])
    kept = np.isfinite(expected).sum(axis=-1)
    assert kept[8] == 166 and kept[9] > 100  # (of the 300 tied, 134 removed; those tied with the 100th stay)
    # which rows the 256 likeliest decide: the peaked ones, top-k within them, no tie across their edge
    values, ids = jax.lax.top_k(jnp.asarray(logits), 257)
    _, decided = _filter_candidates(jnp.asarray(logits), jnp.asarray(top_k, jnp.int32),
                                    jnp.asarray(top_p, jnp.float32), ids[:, :-1], values[:, -1])  # (the 257th: edge)
    assert np.asarray(decided).tolist() == [True, True, False, False, False, False, True, True, False, True]


def _primitives(jaxpr) -> set[str]:
    """The primitives of a jaxpr's equations by name, those of the jaxprs inside them (calls, branches) too."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)  # (a ClosedJaxpr's own)
                if hasattr(inner, "eqns"):
                    names |= _primitives(inner)
    return names


def test_greedy_is_argmax_first_index_on_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(-3, 3, (64, 50)).astype(np.float32)  # many rows with several maximal entries
    scores[5, :] = -np.inf
    scores[6, [3, 40]] = np.inf
    assert np.array_equal(jax.jit(greedy)(scores), np.argmax(scores, axis=-1))


def test_a_draw_is_jax_random_categoricals_token():
    """The same token as ``jax.random.categorical`` by each row's key, over filtered (-inf) and flat rows too."""
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 3, (256, 300)).astype(np.float32)
    logits[rng.random(logits.shape) < 0.5] = -np.inf  # top-k / top-p filtered tokens
    logits[0, :] = 0.0  # a flat row
    logits[1, 1:] = -np.inf  # one token left
    keys = jax.vmap(lambda n: jax.random.fold_in(jax.random.PRNGKey(7), n))(jnp.arange(256))
    want = jax.jit(jax.vmap(jax.random.categorical))(keys, logits)
    got = jax.jit(draw)(keys, logits)
    assert np.array_equal(got, want) and len(set(np.asarray(got[2:]).tolist())) > 100 and got[1] == 0


def test_a_plain_greedy_batch_compiles_no_sort_penalty_or_log_softmax():
    def program(**params):
        rows, flags = sampling_rows([(SamplingParams(**params), 0, [1, 2, 3], 2)], 2, 64)
        return flags, _primitives(jax.make_jaxpr(lambda x, r: choose_tokens(x, r, flags))(jnp.zeros((2, 32)),
                                                                                           rows).jaxpr)
    flags, greedy = program(temperature=0)
    assert flags == SamplerFlags() and {"reduce_max", "reduce_min"} <= greedy  # (the names are read: its argmax)
    assert not {"sort", "exp", "log"} & greedy and not any(name.startswith("scatter") for name in greedy), greedy
    flags, plain_draw = program(temperature=0.8)
    assert flags == SamplerFlags(sample=True) and "sort" not in plain_draw
    assert "sort" in program(temperature=0.8, top_p=0.9)[1]
    assert program(temperature=0, repetition_penalty=1.2)[0] == SamplerFlags(penalize=True)
    assert program(temperature=0.5, top_p=0.9, min_p=0.1, logprobs=0)[0] == SamplerFlags(True, True, True, False,
                                                                                          True)
    # min-p and top-k of greedy rows are not compiled: they do not change an argmax
    assert program(temperature=0, top_k=3, min_p=0.2)[0] == SamplerFlags()
    flags, biased = program(temperature=0, logit_bias={3: 2.5})
    assert flags == SamplerFlags(bias=True) and any(name.startswith("scatter") for name in biased)


def test_a_logit_bias_row_by_row_equals_transformers_sequence_bias():
    """Each row's biases added at its ids (OpenAI's logit_bias: transformers' SequenceBiasLogitsProcessor with
    one-token sequences), rows of other widths and none beside it; then the penalties see the biased logits."""
    rng = np.random.default_rng(1)
    B, V = 5, 48
    logits = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    # the last row tells the order apart: biased then penalised, token 17 reads (2 + 2) / 2 < 2.2, token 40's; the
    # other way round 2 / 2 + 2 > 2.2
    logits[4] = rng.uniform(-1, 1, V)
    logits[4, 17], logits[4, 40] = 2.0, 2.2
    settings = [({3: -100.0, 17: 2.5, 40: 0.25}, 1.3), ({}, 1.3), ({0: 100.0}, 1.0), ({47: -1.5, 5: 7.0}, 1.3),
                ({17: 2.0}, 2.0)]
    rows, flags = sampling_rows([(SamplingParams(temperature=0, logit_bias=bias, repetition_penalty=penalty), 0,
                                  [5, 17, 9], 2) for bias, penalty in settings], B, 64)
    assert flags.bias and rows.bias_ids.shape == (B, 4)  # (the widest row's 3 entries in a power of two)
    biased = np.asarray(bias_rows(jnp.asarray(logits), rows.bias_ids, rows.bias_values))
    chosen = np.asarray(choose_tokens(jnp.asarray(logits), rows, flags)[0])
    for r, (bias, penalty) in enumerate(settings):
        ids = torch.tensor([[5, 17, 9]])
        expected = torch.tensor(logits[r:r + 1])
        if bias:  # (transformers refuses an empty bias)
            expected = SequenceBiasLogitsProcessor({(token,): value for token, value in bias.items()})(ids, expected)
        np.testing.assert_array_equal(biased[r], expected[0].numpy(), err_msg=f"row {r}")
        expected = RepetitionPenaltyLogitsProcessor(penalty)(ids, expected)
        assert chosen[r] == int(expected.argmax()), f"row {r}"
    assert not np.array_equal(biased[0], logits[0]) and np.array_equal(biased[1], logits[1]) and chosen[4] == 40


def test_a_penalised_greedy_request_equals_transformers_generate(models):
    ours, theirs = models
    prompt = [5, 9, 9, 17, 5, 40, 3]
    params = SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.8)
    (tokens, _), = _run(_engine(ours), [(prompt, params)])
    with torch.no_grad():
        expected = theirs.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                   max_new_tokens=12, do_sample=False, repetition_penalty=1.8)[0, len(prompt):]
        plain = theirs.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):]
    assert tokens == expected.tolist() and tokens != plain.tolist()  # (the penalty changed the output)


def test_a_biased_greedy_request_equals_transformers_generate_with_sequence_bias(models):
    ours, theirs = models
    prompt = [5, 9, 9, 17, 5, 40, 3]
    with torch.no_grad():
        plain = theirs.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):].tolist()
    bias = {plain[0]: -100.0, plain[3]: -4.0, 11: 3.0}  # (the plain first token barred: the output must change)
    (tokens, _), = _run(_engine(ours), [(prompt, SamplingParams(max_tokens=12, temperature=0, logit_bias=bias))])
    with torch.no_grad():
        expected = theirs.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                   max_new_tokens=12, do_sample=False,
                                   sequence_bias={(token,): value for token, value in bias.items()})
    assert tokens == expected[0, len(prompt):].tolist() and tokens != plain
    vocab = ours.config.vocab_size
    with pytest.raises(ValueError, match=rf"logit_bias holds \[{vocab}\] outside the vocabulary \[0, {vocab}\)"):
        _engine(ours).add_request(prompt, SamplingParams(logit_bias={vocab: 1.0, 2: 1.0}))


def test_prompt_logprobs_equal_log_softmax_of_transformers_logits_however_the_prompt_is_cut(models, monkeypatch):
    """Each prompt token's log-probability given those before it (and its k likeliest), as transformers' logits give
    them: prompts cut in chunks of 16, two scored in one call, one whose first call feeds a single token (the step's
    prompt budget spent), one whose prefix another request left in the prefix cache (computed anew: its positions
    are scored), beside an unscored request; the tokens are greedy generate's all the same. Where a call may hold
    one scored row only (``SCORE_CALL_BYTES``), the scores are the same."""
    ours, theirs = models
    rng = np.random.default_rng(5)
    first, second = rng.integers(3, 97, 23).tolist(), rng.integers(3, 97, 20).tolist()
    shared = first[:16] + rng.integers(3, 97, 5).tolist()  # (two blocks of 8 in common with the first)
    engine = Engine(ours, num_blocks=64, block_size=BLOCK, max_num_seqs=8, prefill_chunk=16, prefill_tokens=17,
                    max_model_len=MAX_LEN, seed=0)
    asked = SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=5)
    ids = [engine.add_request(first, asked), engine.add_request(second, asked),
           engine.add_request(first[:10], SamplingParams(max_tokens=3, temperature=0))]
    outputs = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id].append(out)
    taken, later = engine.shared_blocks, engine.add_request(shared, asked)
    outputs[later] = []
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id].append(out)
    assert taken == 1 and engine.shared_blocks == taken  # (the unscored prompt took the cached block, the scored none)
    assert any(program[:2] == ("score", 2) for program in engine.programs)  # (two prompts' chunks in one call)
    monkeypatch.setattr(serving_engine, "SCORE_CALL_BYTES", 4 * 16 * ours.config.vocab_size)  # (one row's)
    alone = Engine(ours, num_blocks=64, block_size=BLOCK, max_num_seqs=8, prefill_chunk=16, prefill_tokens=17,
                   max_model_len=MAX_LEN, seed=0)
    apart = [alone.add_request(prompt, asked) for prompt in (first, second)]
    results = {i: [] for i in apart}
    while alone.has_unfinished():
        for out in alone.step():
            results[out.request_id].append(out)
    assert all(program[:2] != ("score", 2) for program in alone.programs)
    for i, j in zip(apart, ids):  # (another batch shape: its matmuls round otherwise, a few ulps of values near -8)
        mine, batched = results[i][0].prompt_logprobs[1:], outputs[j][0].prompt_logprobs[1:]
        assert [e.token_id for e in mine] == [e.token_id for e in batched]
        np.testing.assert_allclose([e.logprob for e in mine], [e.logprob for e in batched], atol=1e-5)
    for prompt, i in ((first, ids[0]), (second, ids[1]), (shared, later)):
        scores = outputs[i][0].prompt_logprobs
        assert scores[0] is None and len(scores) == len(prompt) and all(o.prompt_logprobs is None
                                                                         for o in outputs[i][1:])
        with torch.no_grad():
            expected = torch.log_softmax(theirs(torch.tensor([prompt])).logits[0], dim=-1).numpy()
        for p in range(1, len(prompt)):
            entry = scores[p]
            assert entry.token_id == prompt[p]
            np.testing.assert_allclose(entry.logprob, expected[p - 1, prompt[p]], atol=1e-5, err_msg=f"position {p}")
            top_ids, top = zip(*entry.top)
            assert list(top_ids) == list(np.argsort(-expected[p - 1])[:5]), f"position {p}"
            np.testing.assert_allclose(top, np.sort(expected[p - 1])[::-1][:5], atol=1e-5)
        (tokens, _), = _run(_engine(ours), [(prompt, SamplingParams(max_tokens=4, temperature=0))])
        assert [t for o in outputs[i] for t in o.token_ids] == tokens
    with pytest.raises(ValueError, match=r"SamplingParams.prompt_logprobs=21: want None or an int in \[0, 20\]"):
        SamplingParams(prompt_logprobs=21)
    # preempted mid-prompt (5 blocks of 8: its third chunk finds none free), it is scored again from the start, once
    engine = Engine(ours, num_blocks=6, block_size=BLOCK, max_num_seqs=8, prefill_chunk=16, prefill_tokens=17,
                    max_model_len=MAX_LEN, seed=0)
    long = rng.integers(3, 97, 30).tolist()
    older = engine.add_request(second[:10], SamplingParams(max_tokens=30, temperature=0))
    scored = engine.add_request(long, asked)
    preempted = {older: [], scored: []}
    while engine.has_unfinished():
        for out in engine.step():
            preempted[out.request_id].append(out)
    assert engine.preemptions > 0 and [o.prompt_logprobs is not None for o in preempted[scored]] == [True] + [False] * 3
    with torch.no_grad():
        expected = torch.log_softmax(theirs(torch.tensor([long])).logits[0], dim=-1).numpy()
    np.testing.assert_allclose([e.logprob for e in preempted[scored][0].prompt_logprobs[1:]],
                               expected[range(29), long[1:]], atol=1e-5)


def test_logprobs_equal_log_softmax_of_transformers_logits(models):
    ours, theirs = models
    prompt = [4, 8, 15, 16, 23, 42]
    (tokens, logprobs), = _run(_engine(ours), [(prompt, SamplingParams(max_tokens=8, temperature=0.9, seed=1,
                                                                        logprobs=MAX_LOGPROBS))])
    with torch.no_grad():
        logits = theirs(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:]
    expected = torch.log_softmax(logits, dim=-1).numpy()
    assert [entry.token_id for entry in logprobs] == tokens
    chosen = [entry.logprob for entry in logprobs]
    np.testing.assert_allclose(chosen, expected[np.arange(len(tokens)), tokens], atol=1e-5)
    for step, entry in enumerate(logprobs):
        top_ids, top = zip(*entry.top)
        assert list(top_ids) == list(np.argsort(-expected[step])[:MAX_LOGPROBS]), f"step {step}"
        np.testing.assert_allclose(top, np.sort(expected[step])[::-1][:MAX_LOGPROBS], atol=1e-5)
    print(f"max |logprob - transformers'|: {np.abs(np.subtract(chosen, expected[np.arange(8), tokens])).max():.2e}")


def test_a_mixed_batch_gives_each_row_what_it_gets_alone(models):
    ours, _ = models
    rng = np.random.default_rng(3)
    mixed = [SamplingParams(max_tokens=9, temperature=0),
             SamplingParams(max_tokens=7, temperature=0, repetition_penalty=1.4, presence_penalty=0.5,
                            frequency_penalty=0.3),
             SamplingParams(max_tokens=10, temperature=0.9, min_p=0.1, seed=3),
             SamplingParams(max_tokens=6, temperature=0, logprobs=5),
             SamplingParams(max_tokens=8, temperature=1.2, top_p=0.9, top_k=20, seed=4, logprobs=2,
                            frequency_penalty=-0.5),
             SamplingParams(max_tokens=5, temperature=0, logit_bias={7: 4.0, 30: -2.0, 31: 1.0}, logprobs=1)]
    requests = [(rng.integers(3, 97, n).tolist(), params) for n, params in zip((4, 19, 7, 11, 2, 9), mixed)]
    together = _run(_engine(ours), requests)
    for i, request in enumerate(requests):
        (tokens, logprobs), = _run(_engine(ours), [request])
        assert together[i][0] == tokens, f"request {i}"
        assert [e.token_id for e in together[i][1]] == [e.token_id for e in logprobs]
        for a, b in zip(together[i][1], logprobs):
            # (a batch of another shape sums in another order: float32 rounding, ~1e-6 here; the tokens are equal)
            np.testing.assert_allclose([a.logprob, *(x for _, x in a.top)], [b.logprob, *(x for _, x in b.top)],
                                       atol=1e-5)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
    assert [len(e.top) for e in together[3][1]] == [5] * 6 and together[0][1] == []


@pytest.mark.parametrize("field, value, want", [
    ("min_p", 1.5, r"\[0, 1\]"), ("repetition_penalty", 0.0, "> 0"), ("presence_penalty", -2.5, r"\[-2, 2\]"),
    ("frequency_penalty", 3, r"\[-2, 2\]"), ("logprobs", 21, r"\[0, 20\]"), ("logprobs", True, "int"),
    ("logit_bias", {3: 100.5}, r"\[-100, 100\]"), ("logit_bias", {-1: 1.0}, "ints >= 0"),
    ("logit_bias", {2: float("nan")}, r"\[-100, 100\]"), ("logit_bias", 5, "mapping"),
])
def test_bad_sampling_values_are_refused_by_name(field, value, want):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}={value!r}: want .*{want}"):
        SamplingParams(**{field: value})


def test_prompt_lookup_drafts_keep_generates_greedy_tokens(models):
    """Greedy rows draft by prompt lookup beside a seeded draw (which drafts too) and a logit-biased greedy row
    (which drafts nothing: the verifying call takes the argmax of the unbiased logits): every row's tokens are
    unchanged, and drafts were accepted (this random model's greedy text repeats itself now and then)."""
    ours, _ = models
    rng = np.random.default_rng(0)
    prompts, new = [rng.integers(3, 97, 4).tolist() for _ in range(4)], 40
    ids = np.asarray(prompts, np.int32)
    expected = [list(row[4:]) for row in np.asarray(ours.generate(ids, np.ones_like(ids), max_new_tokens=new))]
    sampled = (prompts[0], SamplingParams(max_tokens=10, temperature=0.8, seed=9))
    # (its bias makes it write 7 and 8 in turn, which its prompt holds: a lookup would find drafts at every step)
    biased = (prompts[1] + [7, 8, 9, 7, 8], SamplingParams(max_tokens=12, temperature=0, logit_bias={7: 8, 8: 8}))
    engine = Engine(ours, num_blocks=64, block_size=BLOCK, max_num_seqs=8, prefill_chunk=16, max_model_len=MAX_LEN,
                    seed=0, draft_tokens=4)
    out = _run(engine, [(p, SamplingParams(max_tokens=new, temperature=0)) for p in prompts] + [sampled, biased])
    assert [tokens for tokens, _ in out[:-2]] == expected
    assert out[-2:] == _run(_engine(ours), [sampled, biased])
    stats = engine.stats()
    assert stats["accepted_drafts"] > 0 and stats["blocks_used"] == 0
    print(f"{stats['accepted_drafts']} of {stats['drafted']} drafts accepted")
    with pytest.raises(ValueError, match="Engine draft_tokens=-1"):
        Engine(ours, num_blocks=8, draft_tokens=-1)


def test_drawing_rows_draft_and_draw_the_tokens_they_draw_undrafted(models):
    """Speculative sampling with drafts that are a point mass (prompt lookup): a drawing row's verifying call draws
    each position by the key it would draw that token by undrafted, so a draft is kept exactly when the row draws it.
    Rows drawing plainly, with top-k, top-p and min-p, beside a greedy one, give the tokens an engine that drafts
    nothing gives, some of the draws' drafts kept and some not; after the warm-up a plain draw's verifying calls
    compile nothing (top-k, top-p and min-p compile their draws' program on first use, never a model step)."""
    ours, _ = models
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 97, 6).tolist() for _ in range(5)]
    # (a draw at a temperature of 0.05 follows the greedy text, whose repeats a lookup finds)
    drawing = [SamplingParams(max_tokens=30, temperature=0.05, seed=1),
               SamplingParams(max_tokens=30, temperature=0.5, top_k=5, seed=2),
               SamplingParams(max_tokens=30, temperature=0.4, top_p=0.8, seed=3),
               SamplingParams(max_tokens=30, temperature=0.3, min_p=0.1, seed=4)]
    requests = list(zip(prompts, [*drawing, SamplingParams(max_tokens=30, temperature=0)]))
    # (four rows at most: fewer programs to warm; the fifth request waits for a row)
    engine = Engine(ours, num_blocks=64, block_size=BLOCK, max_num_seqs=4, prefill_chunk=16, max_model_len=MAX_LEN,
                    seed=0, draft_tokens=4)
    engine.warm_up()
    warmed = set(engine.programs)
    out = _run(engine, requests)
    assert out == _run(_engine(ours), requests)
    compiled = set(engine.programs) - warmed
    assert {program[0] for program in compiled} == {"draw", "choose"}  # (no model step: min-p's choice, draws)
    assert all(flags.narrow or flags.min_p for kind, *_, flags in compiled if kind == "draw")
    only_draws = Engine(ours, num_blocks=64, block_size=BLOCK, max_num_seqs=8, prefill_chunk=16,
                        max_model_len=MAX_LEN, seed=0, draft_tokens=4)
    _run(only_draws, requests[:4])
    stats = only_draws.stats()
    assert 0 < stats["accepted_drafts"] < stats["drafted"]
    print(f"{stats['accepted_drafts']} of {stats['drafted']} drafts of drawing rows accepted")


def test_the_heuristic_schedule_drafts_fewer_where_drafts_are_rejected_and_keeps_the_tokens(models, monkeypatch):
    """``draft_schedule='heuristic'``, a row at a time: after a step that kept every draft two more (up to k), after
    one that did not one fewer (down to 1). Greedy and drawing rows drafting by prompt lookup give the tokens an
    engine drafting k every step gives, in fewer drafts, each row's limit moving by the rule (both ways); the model
    as its own assistant has every draft kept; a schedule by another name is refused."""
    ours, _ = models
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 97, 6).tolist() for _ in range(4)]
    params = [SamplingParams(max_tokens=30, temperature=0), SamplingParams(max_tokens=30, temperature=0.05, seed=1),
              SamplingParams(max_tokens=30, temperature=0.5, seed=2), SamplingParams(max_tokens=30, temperature=0)]
    requests, k = list(zip(prompts, params)), 4
    settings = dict(num_blocks=64, block_size=BLOCK, max_num_seqs=8, prefill_chunk=16, max_model_len=MAX_LEN, seed=0,
                    draft_tokens=k)
    constant = Engine(ours, **settings)
    expected = _run(constant, requests)
    engine = Engine(ours, draft_schedule="heuristic", **settings)
    moves, advance = [], engine._advance  # (a drafting row's limit as it drafted, its drafts, its limit after)

    def advancing(rows, *rest):
        drafting = [(seq, k if seq.draft_limit is None else seq.draft_limit, len(seq.draft)) for seq, _ in rows
                    if seq.draft]
        out = advance(rows, *rest)
        moves.extend((limit, proposed, seq.draft_limit) for seq, limit, proposed in drafting)
        return out

    monkeypatch.setattr(engine, "_advance", advancing)
    assert _run(engine, requests) == expected
    assert engine.stats()["drafted"] < constant.stats()["drafted"]
    assert all(proposed <= limit and after in (min(limit + 2, k), max(limit - 1, 1))
               for limit, proposed, after in moves)
    assert any(after < limit for limit, _, after in moves) and any(after > limit for limit, _, after in moves)
    own = Engine(ours, draft_schedule="heuristic", draft_model=ours, **{**settings, "draft_tokens": 3})
    greedy = [(p, SamplingParams(max_tokens=12, temperature=0)) for p in prompts]
    assert _run(own, greedy) == _run(_engine(ours), greedy)
    assert own.stats()["accepted_drafts"] == own.stats()["drafted"] > 0
    with pytest.raises(ValueError, match="Engine draft_schedule='adaptive': want 'constant' or 'heuristic'"):
        Engine(ours, num_blocks=8, draft_tokens=2, draft_schedule="adaptive")


def _generated(model, prompts, new_tokens):
    """``model.generate``'s greedy tokens of each prompt: one left-padded batch, one compiled loop."""
    width = max(map(len, prompts))
    ids = np.zeros((len(prompts), width), np.int32)
    mask = np.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):], mask[row, width - len(prompt):] = prompt, 1
    return [[int(t) for t in row[width:]] for row in np.asarray(model.generate(ids, mask, max_new_tokens=new_tokens))]


def _perturbed(model, noise: float):
    """A copy of ``model`` with every weight moved by ``noise`` standard normal draws: an assistant whose greedy tokens
    are often, not always, the model's."""
    from flax import nnx

    copy = jf.build(model.config, seed=0)
    leaves, tree = jax.tree.flatten(nnx.state(model))
    keys = jax.random.split(jax.random.key(3), len(leaves))
    nnx.update(copy, jax.tree.unflatten(tree, [leaf + noise * jax.random.normal(key, leaf.shape, leaf.dtype)
                                               for leaf, key in zip(leaves, keys)]))
    return copy


def _drafts_seen(engine, monkeypatch) -> list[tuple[list[int], int, list[int]]]:
    """Every drafting row's (tokens, how many of them its assistant's pool had not read, draft), as the engine
    drafts them."""
    seen, own = [], engine._assistant_drafts

    def drafting(rows):
        before = [(list(seq.tokens), len(seq.tokens) - seq.drafter_read) for seq, _ in rows]
        own(rows)
        seen.extend((tokens, behind, list(seq.draft)) for (tokens, behind), (seq, _) in zip(before, rows))
    monkeypatch.setattr(engine, "_assistant_drafts", drafting)
    return seen


def test_an_assistant_models_drafts_are_its_own_greedy_tokens_and_keep_generates(models, monkeypatch):
    """Greedy rows drafted by an assistant model (the target's weights perturbed) beside a seeded draw (drafted too,
    its tokens those it draws undrafted): every row's tokens are generate's, and every draft is the assistant's own
    greedy continuation of the row's tokens as they stood (``generate`` on the assistant), so its pool held the right
    keys at every step: after prompt chunks (prompts longer than a chunk, which its pool reads too: it is never more
    than two tokens behind), after a draft cut short (its tail rewritten) and after a wholly accepted one (two tokens
    caught up). Some drafts are accepted, not all."""
    ours, _ = models
    assistant = _perturbed(ours, 0.01)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 97, n).tolist() for n in (3, 40, 9, 21, 5, 12)]
    new = 20
    engine = Engine(ours, num_blocks=64, block_size=BLOCK, max_num_seqs=8, prefill_chunk=16, max_model_len=MAX_LEN,
                    seed=0, draft_tokens=3, draft_model=assistant)
    drafts = _drafts_seen(engine, monkeypatch)
    sampled = (prompts[0], SamplingParams(max_tokens=10, temperature=0.8, seed=9))
    out = _run(engine, [(p, SamplingParams(max_tokens=new, temperature=0)) for p in prompts] + [sampled])
    assert [tokens for tokens, _ in out[:-1]] == _generated(ours, prompts, new)
    assert out[-1] == _run(_engine(ours), [sampled])[0]
    assert drafts and max(behind for _, behind, _ in drafts) == 2  # (after a wholly accepted draft)
    for count in {len(draft) for *_, draft in drafts}:  # (a row's last drafts are fewer: max_tokens)
        rows = [(tokens, draft) for tokens, _, draft in drafts if len(draft) == count]
        assert [draft for _, draft in rows] == _generated(assistant, [tokens for tokens, _ in rows], count)
    stats = engine.stats()
    assert 0 < stats["accepted_drafts"] < stats["drafted"] and stats["blocks_used"] == 0
    print(f"{stats['accepted_drafts']} of {stats['drafted']} drafts accepted")


def test_an_assistant_that_is_the_model_has_every_draft_accepted_through_preemption_and_the_warm_up(models,
                                                                                                  monkeypatch):
    """The model as its own assistant: every draft is accepted (its pool never falls out of step with the target's:
    prompt chunks, caught-up tokens, preemptions that recompute both, blocks shared from the prefix cache), the
    tokens are generate's, and after the warm-up (the assistant's calls of one and two tokens at every row count,
    its prompt chunks beside the target's) the requests compile nothing."""
    ours, _ = models
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 97, n).tolist() for n in (3, 18, 9, 12, 5, 17)]
    prompts.append(prompts[1][:2 * BLOCK] + [5, 6])  # (its first two blocks from the prefix cache)
    engine = Engine(ours, num_blocks=10, block_size=BLOCK, max_num_seqs=4, prefill_chunk=16, max_model_len=32,
                    seed=0, draft_tokens=3, draft_model=ours)
    programs, _ = engine.warm_up()
    drafts = _drafts_seen(engine, monkeypatch)
    out = _run(engine, [(p, SamplingParams(max_tokens=12, temperature=0)) for p in prompts])
    assert [tokens for tokens, _ in out] == _generated(ours, prompts, 12)
    stats = engine.stats()
    assert stats["drafted"] > 0 and stats["accepted_drafts"] == stats["drafted"]
    assert max(behind for _, behind, _ in drafts) == 2  # (its pool at most two tokens behind the target's)
    assert engine.preemptions > 0 and engine.shared_blocks > 0 and stats["blocks_used"] == 0
    assert len(engine.programs) == programs


@pytest.mark.parametrize("first", ["greedy", "penalised"])
def test_an_assistants_pool_follows_one_token_prompt_chunks_and_blocks_shared_from_another_answer(models, monkeypatch,
                                                                                                   first):
    """The model as its own assistant (so a draft is rejected only where its pool holds a wrong key). A prompt budget
    of 17 tokens a step cuts a prompt into chunks of one token now and then (run as one-token calls, which the
    assistant reads too); then a second turn's prompt, the first request's prompt and answer and one more token, takes
    the first answer's blocks from the prefix cache, whose tokens the assistant did not read (a penalised draw's,
    which drafts nothing; a greedy one's last drafted step): it reads them with the prompt's chunk, so no row's
    assistant is more than two tokens behind when it drafts. Every draft is kept; the tokens are generate's."""
    ours, _ = models
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 97, n).tolist() for n in (16, 40)]
    engine = Engine(ours, num_blocks=40, block_size=BLOCK, max_num_seqs=4, prefill_chunk=16, prefill_tokens=17,
                    max_model_len=MAX_LEN, seed=0, draft_tokens=3, draft_model=ours)
    drafts = _drafts_seen(engine, monkeypatch)
    params = SamplingParams(max_tokens=10, temperature=0) if first == "greedy" else \
        SamplingParams(max_tokens=10, temperature=0.8, seed=1, presence_penalty=0.5)
    out = _run(engine, [(p, params if i == 0 else SamplingParams(max_tokens=10, temperature=0))
                        for i, p in enumerate(prompts)])
    second = prompts[0] + out[0][0] + [5]
    before = engine.shared_blocks
    [(tokens, _)] = _run(engine, [(second, SamplingParams(max_tokens=12, temperature=0))])
    assert engine.shared_blocks - before == 3  # (the prompt's two blocks and the answer's first)
    expected = _generated(ours, [prompts[1], second], 12)
    assert out[1][0] == expected[0][:10] and tokens == expected[1]
    stats = engine.stats()
    assert stats["drafted"] > 0 and stats["accepted_drafts"] == stats["drafted"]
    assert max(behind for _, behind, _ in drafts) <= 2  # (caught up before the row drafts: with the prompt's chunk)


def test_an_assistant_that_cannot_draft_is_refused_by_name(models):
    ours, _ = models
    cfg = ours.config
    cases = [(ours, 0, "give draft_tokens >= 1"),
             (jf.build(cfg.replace(vocab_size=cfg.vocab_size + 1), seed=0), 3, "its vocabulary .* is larger"),
             (jf.build(cfg.replace(max_positions=32), seed=0), 3, "it reads 32 positions at most, fewer than "
                                                                  "max_model_len=64"),
             (jf.build(cfg.replace(head="none"), seed=0), 3, "head 'none' gives no next-token logits")]
    for assistant, k, words in cases:
        with pytest.raises(ValueError, match=f"Engine draft_model .*: {words}"):
            Engine(ours, num_blocks=8, block_size=BLOCK, max_model_len=MAX_LEN, draft_tokens=k, draft_model=assistant)


def test_drafts_take_only_blocks_left_so_drafting_preempts_no_more(models):
    """An earlier greedy request that drafts and a later one, in a pool of 3 blocks of 8: after their prompts (6 and
    8 tokens) one block is free, which the later one needs for its next token. The earlier one's drafts take only
    what is left after it (a slot of its own block), so no one is preempted for a draft, and over the whole run
    drafting preempts no more often than not drafting; the tokens are the same."""
    ours, _ = models
    rng = np.random.default_rng(0)
    candidates = rng.integers(3, 97, (64, 6)).astype(np.int32)
    first = np.asarray(ours.generate(candidates, np.ones_like(candidates), max_new_tokens=1))[:, -1]
    early = next(row.tolist() for row, token in zip(candidates, first) if token in row)  # (so it drafts at once)
    late = rng.integers(3, 97, 8).tolist()
    runs = []
    for draft_tokens in (0, 4):
        engine = Engine(ours, num_blocks=4, block_size=BLOCK, max_num_seqs=2, prefill_chunk=16, max_model_len=24,
                        seed=0, draft_tokens=draft_tokens)
        ids = [engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0)) for prompt in (early, late)]
        engine.step()
        engine.step()  # the earlier drafts, the later takes the free block
        # (drafting: one draft, in the slot left in the earlier one's own block)
        assert engine.preemptions == 0 and len(engine.running) == 2 and engine.drafted == min(draft_tokens, 1)
        out = engine.run()
        runs.append((engine.preemptions, [out[i] for i in ids]))
    (plain, tokens), (drafting, drafted_tokens) = runs
    assert drafted_tokens == tokens and drafting <= plain
