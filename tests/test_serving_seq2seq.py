"""Encoder-decoders in the serving engine: each request's source is encoded once, when it is admitted, into blocks
of the pool the decoder's own keys use. Greedy output equals ``model.generate`` token for token whatever else runs
beside it (Marian with its pad and a second token banned and its forced EOS; T5 v1.1 with relative positions; BART
with its forced EOS; M2M100 with a target language forced first), under preemption too, with every block freed at
the end; refusals are named; and one Marian folder with its tokenizer is served to the real ``openai`` client
(completions; chat refused)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import jaxformer as jf
from jaxformer.generate import generation_defaults
from jaxformer.interop.tokenizer import Tokenizer, byte_level_tokenizer, load_tokenizer
from jaxformer.serving import Engine, SamplingParams
from jaxformer.serving import engine as serving_engine
from jaxformer.serving.engine import choose_program
from tests.hf_factory import save_checkpoint
from tests.sentencepiece_factory import marian_tokenizer
from tests.serving_helpers import served

BLOCK = 8
# ten sources of mixed lengths, each asking for one of two output lengths (EOS may end one sooner)
LENGTHS = (3, 17, 9, 25, 5, 12, 30, 7, 2, 20)
NEW = (5, 12) * 5
SAMPLED = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.95, seed=11)
TARGET_LANGUAGE = 7  # M2M100's (and NLLB's) target language token, forced first


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (model, sources, each source's generate tokens at its NEW), built on first use."""
    built = {}

    def get(name):
        if name not in built:
            folder = save_checkpoint(name, tmp_path_factory.mktemp(name))
            model = jf.from_pretrained(folder)
            rng = np.random.default_rng(0)
            sources = [rng.integers(3, 97, n).astype(np.int32) for n in LENGTHS]
            if name == "marian":  # OPUS-MT's generation_config bans its pad; a token the free run emits is banned too
                banned = int(_generated(model, sources[:1], 4)[0][1])
                settings = json.loads((folder / "generation_config.json").read_text())
                settings["bad_words_ids"] = [[1], [banned]]
                (folder / "generation_config.json").write_text(json.dumps(settings))
                model = jf.from_pretrained(folder)
            if name == "m2m100":
                settings = json.loads((folder / "generation_config.json").read_text())
                settings["forced_bos_token_id"] = TARGET_LANGUAGE
                (folder / "generation_config.json").write_text(json.dumps(settings))
                model = jf.from_pretrained(folder)
            by_length = {n: _generated(model, sources, n) for n in set(NEW)}
            built[name] = model, sources, [by_length[n][i] for i, n in enumerate(NEW)]
        return built[name]
    return get


def _generated(model, sources, new_tokens, **settings):
    """``model.generate``'s greedy tokens of each source (one right-padded batch), up to and with its first EOS."""
    width = max(len(s) for s in sources)
    ids, mask = np.zeros((len(sources), width), np.int32), np.zeros((len(sources), width), np.int32)
    for row, source in enumerate(sources):
        ids[row, :len(source)], mask[row, :len(source)] = source, 1
    eos = generation_defaults(model)["eos_token_id"]
    stops = {eos} if isinstance(eos, int) else set(eos or ())
    rows = []
    for row in model.generate(ids, mask, max_new_tokens=new_tokens, **settings)[:, 1:].tolist():
        ends = [i for i, token in enumerate(row) if token in stops]
        rows.append(row[:ends[0] + 1] if ends else row)
    return rows


def _engine(model, num_blocks=65, max_num_seqs=4):
    return Engine(model, num_blocks=num_blocks, block_size=BLOCK, max_num_seqs=max_num_seqs, prefill_chunk=8,
                  max_model_len=32)


def _all_freed(engine):
    manager = engine.manager
    return manager.used() == 0 and manager.available() == manager.usable and not any(manager.refs)


def test_a_requests_own_target_language_is_forced_first_as_generate_forces_it(checkpoints):
    """``SamplingParams.forced_bos_token_id`` overrides the checkpoint's (M2M100 forcing 7) for its request alone:
    requests to languages 9 and 11 and one with the checkpoint's own, run together, each equal generate's."""
    model, sources, expected = checkpoints("m2m100")
    engine = _engine(model)
    languages = (9, None, 11, 9)
    ids = [engine.add_request(None, SamplingParams(max_tokens=6, temperature=0, forced_bos_token_id=language),
                              source_ids=source) for source, language in zip(sources, languages)]
    out = engine.run()
    for i, (request, language) in enumerate(zip(ids, languages)):
        if language is None:
            assert out[request] == _generated(model, sources[i:i + 1], 6)[0]
        else:
            assert out[request] == _generated(model, sources[i:i + 1], 6, forced_bos_token_id=language)[0]
            assert out[request][0] == language
    with pytest.raises(ValueError, match="forced_bos_token_id=97 is outside the vocabulary"):
        engine.add_request(None, SamplingParams(forced_bos_token_id=97), source_ids=sources[0])
    with pytest.raises(ValueError, match="forced_bos_token_id=-1: want None or an int >= 0"):
        SamplingParams(forced_bos_token_id=-1)


@pytest.mark.parametrize("name", ["marian", "t5-v1_1", "bart", "m2m100"])
def test_concurrent_translations_equal_generate(checkpoints, name):
    """Ten requests through four rows: they join as others end, each source encoded at its admission."""
    model, sources, expected = checkpoints(name)
    engine = _engine(model)
    ids = [engine.add_request(None, SamplingParams(max_tokens=n, temperature=0), source_ids=source)
           for source, n in zip(sources, NEW)]
    out = engine.run()
    assert [out[i] for i in ids] == expected
    if name == "m2m100":
        assert all(row[0] == TARGET_LANGUAGE for row in expected)
    else:
        assert len({tuple(row) for row in expected}) > 3  # the outputs depend on the sources
    assert _all_freed(engine)
    assert any(program[0] == "encode" for program in engine.programs)


def test_after_the_warm_up_the_translations_compile_nothing(checkpoints, monkeypatch):
    """``warm_up`` compiles every source encoding and decoder step the scheduler can run (on XLA:CPU: 11 one-source
    encodings, one a source width bucket, and 4 one-token shapes, one a row bucket, their source tables as wide as
    the longest source's) and at each row count the choice of greedy rows, of draws, plain and top-p, and of the
    beams of the checkpoint's ``num_beams`` (OPUS-MT's 4), and the copies of shared blocks a step can make (1-4), on
    stand-in rows over the null block: the ten requests through four rows, then two searches of 4 beams, compile no
    program (sources admitted together are encoded one a call) and still give generate's tokens."""
    model, sources, expected = checkpoints("marian")
    saved = model.generation_config
    model.generation_config = json.dumps({**json.loads(saved), "num_beams": 4})  # (read once, by the engine)
    try:
        engine = _engine(model)
    finally:
        model.generation_config = saved
    assert engine.checkpoint_beams == 4
    programs, seconds = engine.warm_up()
    print(f"marian warm-up (4 rows): {programs} programs in {seconds:.1f} s")
    assert programs == 11 + 4 + 4 * 4 + 4 == len(engine.programs)
    ids = [engine.add_request(None, SamplingParams(max_tokens=n, temperature=0), source_ids=source)
           for source, n in zip(sources, NEW)]
    out = engine.run()
    assert [out[i] for i in ids] == expected
    copies = []  # (the copy calls' bucketed counts: beams wrote into blocks they shared)
    copy_blocks = serving_engine.copy_blocks
    monkeypatch.setattr(serving_engine, "copy_blocks", lambda k, v, sources, targets: copies.append(len(sources))
                        or copy_blocks(k, v, sources, targets))
    searches = [engine.add_request(None, SamplingParams(max_tokens=12, temperature=0, beam_width=4),
                                   source_ids=source) for source in sources[:2]]
    results = {}
    while engine.has_unfinished():
        results.update({result.request_id: result for result in engine.step()})
    assert all(len(results[i].beams) == 4 for i in searches) and copies
    assert len(engine.programs) == programs and _all_freed(engine)


def test_a_forced_first_token_runs_the_programs_a_plain_request_compiled(checkpoints):
    """An encoder-decoder's calls always carry the forced-token row, so a request forcing its first token (a
    target language) runs what a plain request of its shapes compiled, even for T5, whose checkpoint forces none
    (the jitted programs' own counts, which tell a variant of a shape apart, stay)."""
    model, sources, expected = checkpoints("t5-v1_1")
    engine = _engine(model, max_num_seqs=1)
    plain = engine.add_request(None, SamplingParams(max_tokens=5, temperature=0), source_ids=sources[2])
    assert engine.run()[plain] == _generated(model, sources[2:3], 5)[0]
    traced = engine.run_step._cache_size(), choose_program._cache_size()
    forced = engine.add_request(None, SamplingParams(max_tokens=5, temperature=0, forced_bos_token_id=9),
                                source_ids=sources[2])
    assert engine.run()[forced] == _generated(model, sources[2:3], 5, forced_bos_token_id=9)[0]
    assert (engine.run_step._cache_size(), choose_program._cache_size()) == traced


def test_preemption_recomputes_source_and_target(checkpoints):
    """A pool of 10 blocks for up to 8 sequences of up to 4 source and 2 target blocks: sequences are preempted,
    give back both kinds of block, and on readmission encode their source again; the tokens do not change, and a
    seeded draw draws the same tokens as in a roomy pool."""
    model, sources, expected = checkpoints("marian")
    draws = []
    for num_blocks in (65, 11):
        engine = _engine(model, num_blocks, max_num_seqs=8)
        ids = [engine.add_request(None, SamplingParams(max_tokens=n, temperature=0), source_ids=source)
               for source, n in zip(sources, NEW)]
        drawn = engine.add_request(None, SAMPLED, source_ids=sources[3])
        out = engine.run()
        assert [out[i] for i in ids] == expected
        assert _all_freed(engine)
        draws.append(out[drawn])
    assert engine.preemptions > 0
    assert draws[0] == draws[1] and len(draws[0]) >= 1


def test_refusals_are_named(checkpoints):
    model, sources, _ = checkpoints("marian")
    engine = _engine(model, num_blocks=5)  # 4 usable blocks
    greedy = SamplingParams(max_tokens=8, temperature=0)
    with pytest.raises(ValueError, match="needs source_ids"):
        engine.add_request([1, 5], greedy)
    with pytest.raises(ValueError, match="prompt_logprobs: an encoder-decoder's prompt is its source"):
        engine.add_request(None, SamplingParams(max_tokens=2, prompt_logprobs=1), source_ids=[3, 4])
    with pytest.raises(ValueError, match="source_ids is empty"):
        engine.add_request(None, greedy, source_ids=[])
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 97\)"):
        engine.add_request(None, greedy, source_ids=[3, 97])
    assert engine.max_source_len == 3 * BLOCK  # the pool beside the shortest target's block
    with pytest.raises(ValueError, match=r"exceeds max_source_len=24 \(the pool's size\)"):
        engine.add_request(None, greedy, source_ids=np.ones(25, np.int32))
    with pytest.raises(ValueError, match="and a source of 3 blocks; the pool has 4"):
        engine.add_request(None, greedy, source_ids=np.ones(17, np.int32))
    roomy = _engine(model)
    assert roomy.max_source_len == model.config.max_positions  # the encoder's position table
    with pytest.raises(ValueError, match=f"exceeds max_source_len={model.config.max_positions} .its position table"):
        roomy.add_request(None, greedy, source_ids=np.ones(model.config.max_positions + 1, np.int32))
    decoder = Engine(jf.build(jf.config("tiny-llama"), seed=0), num_blocks=9, block_size=BLOCK, max_model_len=32)
    with pytest.raises(ValueError, match="is a decoder: pass the prompt as prompt_ids"):
        decoder.add_request([1, 2], greedy, source_ids=[3])


@pytest.mark.parametrize("name", ["marian", "t5-v1_1"])
def test_beam_search_gives_transformers_hypotheses_and_scores(tmp_path, name):
    """Six translations by beam search (widths 2-4, each early-stopping rule, length penalties 0.6-2), run together
    through 8 rows, with two more stop ids so hypotheses end at different lengths: each request's every hypothesis
    is transformers' ``generate(num_beams=k, num_return_sequences=k)``'s, token for token, its score its
    ``sequences_scores`` within 1e-5 (float32 sums over one platform's logits and another's). Marian with OPUS-MT's
    processors: its pad and another token banned, EOS forced at ``max_tokens``, the log-probabilities normalised
    again (``renormalize_logits``); T5 v1.1 with relative positions, nothing forced."""
    import torch
    import transformers

    folder = save_checkpoint(name, tmp_path)
    if name == "marian":
        settings = json.loads((folder / "generation_config.json").read_text())
        settings.update(bad_words_ids=[[1], [5]], renormalize_logits=True)
        (folder / "generation_config.json").write_text(json.dumps(settings))
    model, reference = jf.from_pretrained(folder), transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    stops = (70, 14) if name == "marian" else (36, 27)
    searches = ((4, 1.0, False), (3, 0.6, True), (2, 2.0, "never"))
    rng = np.random.default_rng(0)
    sources = [rng.integers(3, 97, n).astype(np.int32) for n in (3, 17, 9, 25, 5, 12)]
    engine = _engine(model, num_blocks=80, max_num_seqs=8)
    ids = [engine.add_request(None, SamplingParams(max_tokens=12, temperature=0, stop_token_ids=stops, beam_width=width,
                                                   length_penalty=penalty, early_stopping=early), source_ids=source)
           for source, (width, penalty, early) in zip(sources, searches * 2)]
    results = {}
    while engine.has_unfinished():
        results.update({result.request_id: result for result in engine.step()})
    eos = reference.generation_config.eos_token_id
    lengths = set()
    for request, source, (width, penalty, early) in zip(ids, sources, searches * 2):
        with torch.no_grad():
            expected = reference.generate(torch.tensor(source[None].astype(np.int64)), max_new_tokens=12,
                                          do_sample=False, num_beams=width, num_return_sequences=width,
                                          length_penalty=penalty, early_stopping=early, eos_token_id=[eos, *stops],
                                          output_scores=True, return_dict_in_generate=True)
        fill = {reference.generation_config.pad_token_id, eos}  # (what transformers puts after a hypothesis ended)
        for hypothesis, row, score in zip(results[request].beams, expected.sequences[:, 1:].tolist(),
                                          expected.sequences_scores.tolist()):
            n = len(hypothesis.token_ids)
            assert list(hypothesis.token_ids) == row[:n] and set(row[n:]) <= fill
            assert abs(hypothesis.score - score) < 1e-5
            lengths.add(n)
        assert len(results[request].beams) == width
    assert len(lengths) > 1 and _all_freed(engine)


# ---------------------------------------------------------------------------------------------- the server

TEXTS = ["hello world", "guten tag, straße!", "über café", "the quick brown fox jumps over the lazy dog"]


@pytest.fixture(scope="module")
def marian_folder(tmp_path_factory):
    """A tiny Marian with its tokenizer as OPUS-MT publishes it: SentencePiece models and a vocab.json numbering
    their pieces, </s> first and <pad> last (``tests/sentencepiece_factory.py``), no tokenizer.json."""
    folder = marian_tokenizer(tmp_path_factory.mktemp("served"), legacy=True)
    size = len(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
    # (weights wider than the factory's, so each source gets a translation of its own)
    save_checkpoint("marian", folder, changes=dict(vocab_size=size, eos_token_id=0, pad_token_id=size - 1,
                                                   decoder_start_token_id=size - 1, forced_eos_token_id=0,
                                                   init_std=0.5))
    return folder


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
def test_a_marian_folder_serves_completions_to_the_openai_client(marian_folder):
    """Completions translate each prompt as transformers' MarianTokenizer encodes it, to generate's tokens as it
    decodes them."""
    openai = pytest.importorskip("openai")
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    from transformers import MarianTokenizer

    model, reference = jf.from_pretrained(marian_folder), MarianTokenizer.from_pretrained(str(marian_folder))
    sources = [np.asarray(reference(text).input_ids, np.int32) for text in TEXTS]
    assert all(source[-1] == 0 for source in sources)
    expected = [reference.decode(row, skip_special_tokens=True) for row in _generated(model, sources, 6)]
    assert len(set(expected)) == len(TEXTS)
    with served(marian_folder, "--host", "127.0.0.1", "--served-model-name", "marian", "--max-num-seqs", "4",
                "--block-size", "8", "--num-blocks", "33", "--no-warm-up") as (_, url):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120, max_retries=0)
        with ThreadPoolExecutor(len(TEXTS)) as pool:  # concurrent requests, batched by the engine
            answers = list(pool.map(lambda text: client.completions.create(
                model="marian", prompt=text, max_tokens=6, temperature=0), TEXTS))
        assert [a.choices[0].text for a in answers] == expected
        assert answers[0].usage.prompt_tokens == len(sources[0])
        metrics = {s.name: s.value for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
                   for s in f.samples}
        assert metrics["jaxformer_prompt_tokens_total"] == sum(map(len, sources))  # (sources, as usage counts)
        with pytest.raises(openai.BadRequestError, match="is an encoder-decoder"):
            client.chat.completions.create(model="marian", messages=[{"role": "user", "content": "Hi"}])
        with pytest.raises(openai.BadRequestError, match="nothing to echo"):
            client.completions.create(model="marian", prompt="Hi", max_tokens=2, echo=True)
        both = client.completions.create(model="marian", prompt=TEXTS[:2], max_tokens=6, temperature=0)
        assert [c.text for c in both.choices] == expected[:2]  # (a list of sources: one translation each)
        with pytest.raises(openai.BadRequestError, match="takes no language codes"):
            client.completions.create(model="marian", prompt="Hi", max_tokens=2, extra_body={"tgt_lang": "fra_Latn"})
        # a translation by beam search: its two hypotheses, as transformers' beam search over the same source
        beams = client.completions.create(model="marian", prompt=TEXTS[3], max_tokens=6, n=2,
                                          extra_body={"use_beam_search": True})
        searched = model.generate(sources[3][None], np.ones((1, len(sources[3])), np.int32), max_new_tokens=6,
                                  num_beams=2)
        assert beams.choices[0].text == reference.decode(searched[0, 1:], skip_special_tokens=True)
        assert len(beams.choices) == 2 and beams.choices[0].text != beams.choices[1].text


def _nllb_tokenizer(folder, **settings):
    """A tiny NllbTokenizer (transformers'; characters for a vocabulary, FLORES-200's codes added after them as it
    adds them) saved in ``folder``."""
    import string

    from transformers import NllbTokenizer

    vocab = {token: i for i, token in enumerate(["<s>", "<pad>", "</s>", "<unk>", "\u2581", *string.ascii_letters])}
    tokenizer = NllbTokenizer(vocab=vocab, merges=[], **settings)
    tokenizer.save_pretrained(str(folder))
    return tokenizer


@pytest.mark.parametrize("legacy", [False, True])
def test_languages_encode_a_source_as_nllbs_tokenizer_does(tmp_path, legacy):
    """``src_lang`` puts its code where NLLB's tokenizer puts it ([code] text </s>; legacy: text </s> [code]), as
    transformers' NllbTokenizer with that ``src_lang`` encodes; ``tgt_lang`` is its code's id; the saved default
    language is what the folder's tokenizer.json encodes; unknown codes are refused naming them; Marian's template
    names no language."""
    from tokenizers import processors
    from transformers import NllbTokenizer

    from jaxformer.interop.tokenizer import Languages

    reference = _nllb_tokenizer(tmp_path, src_lang="eng_Latn", legacy_behaviour=legacy)
    tokenizer = load_tokenizer(tmp_path)
    languages = Languages.of(tokenizer, tmp_path)
    assert len(languages.codes) == 202 and languages.source == "eng_Latn"
    text = "Hello world"
    assert languages.encode(text, "eng_Latn") == tokenizer.encode(text) == reference(text).input_ids
    for code in ("fra_Latn", "zho_Hans"):
        other = NllbTokenizer.from_pretrained(str(tmp_path), src_lang=code)
        assert languages.encode(text, code) == other(text).input_ids
        assert languages.target(code) == other.convert_tokens_to_ids(code)
    for bad in ("xx_Latn", "</s>", 7):
        with pytest.raises(ValueError, match="is not one of this model's 202 language codes"):
            languages.encode(text, bad)
    marian = tmp_path / "marian"
    marian.mkdir()
    plain = byte_level_tokenizer({256: "</s>"})
    plain.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 256)])
    assert Languages.of(Tokenizer(plain), marian) is None


def test_an_nllb_folder_translates_from_and_into_the_requested_languages(tmp_path):
    """An M2M100-architecture model with NLLB's tokenizer, served: ``src_lang`` and ``tgt_lang`` (the openai
    client's ``extra_body``) give generate's translation of the source NllbTokenizer encodes in that language into
    the target language forced first; without them, the folder's own source language and no forced token; a code
    the model lacks, and ``src_lang`` beside token ids, get 400s naming them."""
    openai = pytest.importorskip("openai")
    from transformers import NllbTokenizer

    reference = _nllb_tokenizer(tmp_path)
    save_checkpoint("m2m100", tmp_path, changes=dict(vocab_size=len(reference), max_position_embeddings=64))
    model, tokenizer = jf.from_pretrained(tmp_path), load_tokenizer(tmp_path)
    text = "Guten Tag"

    def expected(src_lang, tgt_lang):
        source = NllbTokenizer.from_pretrained(str(tmp_path), src_lang=src_lang)(text).input_ids
        forced = {} if tgt_lang is None else {"forced_bos_token_id": reference.convert_tokens_to_ids(tgt_lang)}
        return tokenizer.decode(_generated(model, [np.asarray(source, np.int32)], 5, **forced)[0])

    with served(tmp_path, "--host", "127.0.0.1", "--served-model-name", "nllb", "--max-num-seqs", "2",
                "--block-size", "8", "--num-blocks", "33", "--no-warm-up") as (_, url):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120, max_retries=0)

        def translate(**languages):
            return client.completions.create(model="nllb", prompt=text, max_tokens=5, temperature=0,
                                             extra_body=languages).choices[0].text
        asked = [("deu_Latn", "fra_Latn"), ("fra_Latn", "zho_Hans")]
        answers = {pair: translate(src_lang=pair[0], tgt_lang=pair[1]) for pair in asked}
        assert answers == {pair: expected(*pair) for pair in asked}
        assert answers[asked[0]] != answers[asked[1]]
        assert translate() == expected("eng_Latn", None)
        with pytest.raises(openai.BadRequestError, match="tgt_lang='klingon' is not one of"):
            translate(tgt_lang="klingon")
        with pytest.raises(openai.BadRequestError, match="src_lang applies to a text prompt"):
            client.completions.create(model="nllb", prompt=[5, 6, 2], max_tokens=2,
                                      extra_body={"src_lang": "fra_Latn"})


def test_logprobs_are_raw_under_a_ban_and_a_forced_eos(tmp_path):
    """Marian bans its pad and (here) the token its raw distribution likes best at the first step, and forces EOS
    last: each reported log-probability, the forced token's too, and the top list are transformers' log_softmax of
    the unprocessed logits."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    folder = save_checkpoint("marian", tmp_path)
    source = np.random.default_rng(1).integers(3, 97, 9).astype(np.int32)
    reference = AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
    start = reference.generation_config.decoder_start_token_id

    def raw(target):
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([source.tolist()]),
                               decoder_input_ids=torch.tensor([[start, *target]])).logits[0]
        return torch.log_softmax(logits, -1).numpy()

    banned = int(raw([])[0].argmax())
    settings = json.loads((folder / "generation_config.json").read_text())
    settings["bad_words_ids"] = [[1], [banned]]
    (folder / "generation_config.json").write_text(json.dumps(settings))
    engine = _engine(jf.from_pretrained(folder))
    engine.add_request(None, SamplingParams(max_tokens=4, temperature=0, logprobs=3), source_ids=source)
    outputs = [out for _ in range(20) if engine.has_unfinished() for out in engine.step()]
    entries = [entry for out in outputs for entry in out.logprobs]
    tokens = [entry.token_id for entry in entries]
    assert tokens[0] != banned and tokens[-1] == settings["forced_eos_token_id"] and len(tokens) == 4
    expected = raw(tokens[:-1])
    np.testing.assert_allclose([entry.logprob for entry in entries], expected[range(4), tokens], atol=1e-5)
    assert entries[0].top[0][0] == banned  # the banned token stays in the raw distribution
    for step, entry in enumerate(entries):
        assert [i for i, _ in entry.top] == expected[step].argsort()[::-1][:3].tolist()
        np.testing.assert_allclose([x for _, x in entry.top], np.sort(expected[step])[::-1][:3], atol=1e-5)
