"""``jaxformer serve`` on a sentence-transformers folder: the real ``openai`` client against one server subprocess
on loopback over a tiny BERT (mean pooling, Normalize). Vectors equal ``SentenceTransformer.encode`` within 1e-5
(float and base64), for a batch of inputs, concurrent requests and token-id inputs; Matryoshka ``dimensions`` as
``encode(truncate_dim=...)`` (the first values, not normalized again); errors have OpenAI's shape. In process: waiting
requests run as one batch, and ``dimensions`` is refused where the model does not declare Matryoshka widths."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")
openai = pytest.importorskip("openai")

import jaxformer as jf  # noqa: E402
from jaxformer.embedder import _embed  # noqa: E402
from jaxformer.serving.embeddings import EmbeddingLoop, Metrics, _inputs, compile_programs, create_app, \
    matryoshka_widths  # noqa: E402
from tests.hf_factory import save_checkpoint  # noqa: E402
from tests.serving_helpers import served  # noqa: E402
from tests.test_embeddings import LONG, VOCAB  # noqa: E402

KEY, NAME, MAX_SEQ = "sk-test", "tiny-st", 16
TEXTS = ["the cat sat on the mat", "Hello", "A man rides a horse on the road", "The Sky is blue",
         "unknownword fast car", "the quick brown fox jumps over the lazy dog", "red", "music"]
ABS = 1e-5


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A plain Hugging Face folder: a tiny random BERT with a cased WordPiece tokenizer."""
    path = save_checkpoint("bert", tmp_path_factory.mktemp("bert"))
    transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(VOCAB)}, do_lower_case=False,
                                   model_max_length=512).save_pretrained(str(path))
    return path


def save_sentence_transformer(encoder, path, **options):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    torch.manual_seed(1)
    modules = [Transformer(str(encoder), max_seq_length=MAX_SEQ), Pooling(32, "mean"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu", **options).save(str(path))
    return path


@pytest.fixture(scope="module")
def folder(encoder, tmp_path_factory):
    """A saved SentenceTransformer over the BERT: mean pooling, Normalize."""
    return save_sentence_transformer(encoder, tmp_path_factory.mktemp("st"))


@pytest.fixture(scope="module")
def reference(folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def server(folder):
    """The server process and its address."""
    with served(folder, "--served-model-name", NAME, "--max-num-seqs", "4", "--api-key", KEY,
                "--matryoshka-dimensions", "8", "16") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key=KEY, timeout=120, max_retries=0)


def assert_close(ours, theirs):
    ours, theirs = np.asarray(ours, np.float32), np.asarray(theirs, np.float32)
    assert ours.shape == theirs.shape
    diff = float(np.abs(ours - theirs).max())
    print(f"max abs diff {diff:.2e}")
    assert diff <= ABS, diff


def test_vectors_equal_sentence_transformers_as_floats_and_base64(client, reference):
    expected = reference.encode(TEXTS)
    for options in ({}, {"encoding_format": "float"}):  # none: the client asks for base64 and decodes it itself
        answer = client.embeddings.create(model=NAME, input=TEXTS, **options)
        assert [d.index for d in answer.data] == list(range(len(TEXTS)))
        assert_close([d.embedding for d in answer.data], expected)
    raw = client.embeddings.create(model=NAME, input=TEXTS, encoding_format="base64")  # asked: handed back as is
    assert_close([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in raw.data], expected)
    tokens = sum(len(reference.tokenize([t])["input_ids"][0]) for t in TEXTS)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens


def test_concurrent_requests_each_get_their_own_vectors(server, reference):
    async def ask(client, i):  # one text, two texts, and so on: requests of different sizes batched together
        return await client.embeddings.create(model=NAME, input=TEXTS[i:i + 1 + i % 3], encoding_format="float")

    async def all_at_once():
        async with openai.AsyncOpenAI(base_url=server[1] + "/v1", api_key=KEY, timeout=120, max_retries=0) as client:
            return await asyncio.gather(*(ask(client, i) for i in range(len(TEXTS))))

    for i, answer in enumerate(asyncio.run(all_at_once())):
        assert_close([d.embedding for d in answer.data], reference.encode(TEXTS[i:i + 1 + i % 3]))


def test_token_ids_embed_as_the_text_they_encode(client, reference):
    ids = [reference.tokenize([t])["input_ids"][0].tolist() for t in TEXTS[:3]]
    answer = client.embeddings.create(model=NAME, input=ids, encoding_format="float")
    assert_close([d.embedding for d in answer.data], reference.encode(TEXTS[:3]))
    one = client.embeddings.create(model=NAME, input=ids[0], encoding_format="float")
    assert_close(one.data[0].embedding, reference.encode(TEXTS[0]))
    assert one.usage.prompt_tokens == len(ids[0])


def test_matryoshka_dimensions_equal_sentence_transformers_truncate_dim(client, reference):
    answer = client.embeddings.create(model=NAME, input=TEXTS[:3], dimensions=8, encoding_format="float")
    assert_close([d.embedding for d in answer.data], reference.encode(TEXTS[:3], truncate_dim=8))


@pytest.mark.parametrize("request_, error, param, words", [
    ({"input": LONG}, openai.BadRequestError, "input", f"model's {MAX_SEQ} tokens (max_seq_length)"),
    ({"input": [list(range(5, 5 + MAX_SEQ + 1))]}, openai.BadRequestError, "input", f"more than the model's {MAX_SEQ}"),
    ({"input": [[5, 100000]]}, openai.BadRequestError, "input", "outside the vocabulary"),
    ({"input": ""}, openai.BadRequestError, "input", "empty string"),
    ({"encoding_format": "int8"}, openai.BadRequestError, "encoding_format", "encoding_format='int8'"),
    ({"dimensions": 12}, openai.BadRequestError, "dimensions", "want one of [8, 16]"),
    ({"extra_body": {"truncate": True}}, openai.BadRequestError, "truncate", "unknown parameter"),
    ({"model": "text-embedding-3-small"}, openai.NotFoundError, "model", NAME),
])
def test_bad_requests_get_openai_shaped_errors(client, request_, error, param, words):
    with pytest.raises(error) as err:
        client.embeddings.create(**{"model": NAME, "input": "hi", "encoding_format": "float", **request_})
    assert err.value.body["param"] == param and words in err.value.body["message"]


def test_models_health_metrics_the_api_key_and_no_completions(server, client):
    _, url = server
    assert [m.id for m in client.models.list()] == [NAME]
    assert httpx.get(url + "/health", timeout=30).json() == {"status": "ok"}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).embeddings.create(model=NAME, input="x")
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.completions.create(model=NAME, prompt="hi", max_tokens=4)
    from prometheus_client.parser import text_string_to_metric_families

    # (this test's own request: under xdist the module's other tests may run on another worker's server)
    client.embeddings.create(model=NAME, input=["two inputs", "counted"])
    samples = {s.name: s.value for family in text_string_to_metric_families(httpx.get(url + "/metrics").text)
               for s in family.samples}
    assert samples["jaxformer_embedding_inputs_total"] >= 2 and samples["jaxformer_queue_length"] == 0
    assert samples["jaxformer_embedding_batches_total"] > 0 and samples["jaxformer_prompt_tokens_total"] > 0


@pytest.fixture(scope="module")
def embedder(folder):
    return jf.Embedder.from_pretrained(folder)


def test_waiting_requests_run_as_one_batch(embedder, reference):
    """(In process: three requests arrive before the batcher runs, so it embeds them together.)"""
    async def three():
        metrics = Metrics(lambda: 0)
        loop = EmbeddingLoop(embedder, max_batch=8, max_queue=3, metrics=metrics)
        rows = [embedder.tokenizer.encode(t).ids for t in TEXTS[:4]]
        futures = [loop.submit(rows[:1], [0]), loop.submit(rows[1:3], [0, 0]), loop.submit(rows[3:], [0])]
        with pytest.raises(Exception, match="queue is full"):
            loop.submit(rows[:1], [0])
        loop.start()
        vectors = await asyncio.gather(*futures)
        await loop.stop()
        return vectors, metrics.batches._value.get()

    vectors, batches = asyncio.run(three())
    assert batches == 1
    assert_close(np.concatenate(vectors), reference.encode(TEXTS[:4]))


def test_dimensions_follow_config_json_and_are_refused_without(embedder, folder):
    from fastapi.testclient import TestClient

    with TestClient(create_app(embedder, NAME)) as http:
        answer = http.post("/v1/embeddings", json={"model": NAME, "input": "hi", "dimensions": 8})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "dimensions"
    assert "not trained to be truncated (Matryoshka)" in answer.json()["error"]["message"]
    assert matryoshka_widths(json.loads((folder / "config.json").read_text()), 32) is None
    assert matryoshka_widths({"matryoshka_dimensions": [4, 8]}, 32) == (4, 8)
    assert matryoshka_widths({"is_matryoshka": True}, 32) == tuple(range(1, 33))
    with pytest.raises(ValueError, match="matryoshka_dimensions=\\[64\\]"):
        matryoshka_widths({"matryoshka_dimensions": [64]}, 32)


def test_a_folder_saved_with_truncate_dim_serves_that_width_and_takes_dimensions(encoder, tmp_path):
    from fastapi.testclient import TestClient
    from sentence_transformers import SentenceTransformer

    path = save_sentence_transformer(encoder, tmp_path / "st", truncate_dim=8)
    assert json.loads((path / "config_sentence_transformers.json").read_text())["truncate_dim"] == 8
    embedder, theirs = jf.Embedder.from_pretrained(path), SentenceTransformer(str(path), device="cpu")
    assert_close(embedder.encode(TEXTS), theirs.encode(TEXTS))  # 8 wide: sentence-transformers' default width
    with TestClient(create_app(embedder, NAME)) as http:
        default, wider = (http.post("/v1/embeddings", json={"model": NAME, "input": TEXTS[:2], **options}).json()
                          for options in ({}, {"dimensions": 16}))
    assert_close([d["embedding"] for d in default["data"]], theirs.encode(TEXTS[:2]))
    assert_close([d["embedding"] for d in wider["data"]], theirs.encode(TEXTS[:2], truncate_dim=16))


def test_a_plain_encoder_folder_is_served_with_mean_pooling_as_sentence_transformers_reads_it(encoder, monkeypatch):
    """``SentenceTransformer(path)`` on a folder without modules.json pools an encoder's states by their mean (and
    normalizes nothing): ``jaxformer serve`` serves the same vectors (the server itself is the one tested above)."""
    from sentence_transformers import SentenceTransformer

    from jaxformer import cli
    from jaxformer.serving import embeddings

    served = {}
    monkeypatch.setattr(embeddings, "serve", lambda embedder, *args: served.update(embedder=embedder, args=args))
    assert cli.main(["serve", str(encoder), "--port", "0", "--served-model-name", NAME]) == 0
    embedder = served["embedder"]
    assert embedder.pipeline.pooling == ("mean",) and not embedder.pipeline.steps and served["args"][0] == NAME
    assert_close(embedder.encode(TEXTS), SentenceTransformer(str(encoder), device="cpu").encode(TEXTS))
    with pytest.raises(ValueError, match="modules.json"):  # jf.Embedder itself still asks for a pooling
        jf.Embedder.from_pretrained(encoder)


def test_the_generation_engines_flags_are_refused_by_name(folder, monkeypatch, capsys):
    from jaxformer import cli
    from jaxformer.serving import embeddings

    monkeypatch.setattr(embeddings, "serve", lambda *args: pytest.fail("served"))
    assert cli.main(["serve", str(folder), "--block-size", "8", "--prefill-chunk", "4", "--draft-tokens", "0"]) == 2
    assert "--block-size, --prefill-chunk, --draft-tokens: the generation engine's" in capsys.readouterr().err


def test_encode_ids_refuses_rows_it_cannot_embed(embedder):
    for rows, words in (([[]], "row 0 holds 0 token ids; want 1 to 16"),
                        ([[5], [5] * (MAX_SEQ + 1)], "row 1 holds 17 token ids; want 1 to 16"),
                        ([[5, 100000]], "row 0 holds id 100000, outside the model's vocabulary")):
        with pytest.raises(ValueError, match=words):
            embedder.encode_ids(rows)


def test_the_warm_up_compiles_every_program_requests_meet(embedder):
    """(Row counts 1, 2, 4 up to a batch of 4, widths 8 and 16 up to max_seq_length 16: 6 programs.)"""
    assert compile_programs(embedder, 4)[0] == 6
    compiled = _embed._cache_size()
    for count in range(1, 7):  # batches of 1 to 6 inputs of every length: run as chunks of at most 4
        for length in range(1, MAX_SEQ + 1):
            embedder.encode_ids([[5] * length] * count, 4)
    assert _embed._cache_size() == compiled


# ---------------------------------------------------------------------------------------------- CLIP and SigLIP

CAPTIONS = ["a photo of a red circle", "a blue square", "photo"]


def _dual_encoder_folder(name, folder):
    """A tiny CLIP or SigLIP folder as published: weights, its image processor's config, a tokenizer.json."""
    from tests.family_files import word_tokenizer

    save_checkpoint(name, folder)
    if name == "clip":
        transformers.CLIPImageProcessor(size={"shortest_edge": 30},
                                        crop_size={"height": 30, "width": 30}).save_pretrained(folder)
    else:
        transformers.SiglipImageProcessor(size={"height": 30, "width": 30}).save_pretrained(folder)
    word_tokenizer(folder)
    return folder


def _dual_reference(folder, siglip: bool):
    """transformers' text features of CAPTIONS (tokenized as the model's processor does) and a function giving an
    image's features."""
    from jaxformer.compare import reference_model

    tokenizer, model = transformers.AutoTokenizer.from_pretrained(folder), reference_model(folder)
    texts = tokenizer(CAPTIONS, return_tensors="pt", padding=True) if not siglip else tokenizer(
        CAPTIONS, return_tensors="pt", padding="max_length",
        max_length=model.config.text_config.max_position_embeddings)
    if siglip:  # SigLIP's tokenizer gives no attention mask: its pads are read
        texts.pop("attention_mask")
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    with torch.no_grad():
        text = model.get_text_features(**texts).pooler_output.numpy()

    def image(picture):
        with torch.no_grad():
            return model.get_image_features(**processor([picture], return_tensors="pt")).pooler_output.numpy()[0]
    return text, image


def _data_url(picture) -> str:
    import io

    png = io.BytesIO()
    picture.save(png, format="PNG")
    return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode("ascii")


def _image_message(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]


def test_a_clip_folder_serves_text_and_image_embeddings_equal_to_transformers(tmp_path):
    """``jaxformer serve`` on a CLIP folder (its warm-up run): the ``openai`` client's texts embed as transformers'
    ``get_text_features``, a drawn image sent as vLLM's chat-style ``messages`` (a data URL) as its
    ``get_image_features``, a text sent so as its ``input``; what the server cannot embed gets 400 by name."""
    from tests.family_files import shapes_picture

    folder = _dual_encoder_folder("clip", tmp_path / "clip")
    text, image_of = _dual_reference(folder, siglip=False)
    picture = shapes_picture((220, 30, 30), "circle")
    with served(folder, "--served-model-name", "clip", "--max-num-seqs", "4") as (_, url):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120, max_retries=0)
        answer = client.embeddings.create(model="clip", input=CAPTIONS, encoding_format="float")
        assert_close([d.embedding for d in answer.data], text)
        body = {"model": "clip", "messages": _image_message(_data_url(picture)), "encoding_format": "float"}
        image = httpx.post(url + "/v1/embeddings", json=body, timeout=120).json()
        assert_close([image["data"][0]["embedding"]], [image_of(picture)])
        as_message = httpx.post(url + "/v1/embeddings", json={**body, "messages": [
            {"role": "user", "content": [{"type": "text", "text": CAPTIONS[1]}]}]}, timeout=120).json()
        assert_close([as_message["data"][0]["embedding"]], text[1:2])
        for change, words in (({"input": "x"}, "give input (texts) or messages"),
                              ({"messages": _image_message("https://example.invalid/cat.png")}, "a data: URL"),
                              ({"messages": _image_message("data:image/png;base64,bm90IGFuIGltYWdl")},
                               "not an image PIL reads"),
                              ({"messages": [{"role": "user", "content": [
                                  {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}]},
                               "not both in one vector"),
                              ({"dimensions": 8}, "was not trained to be truncated")):
            answer = httpx.post(url + "/v1/embeddings", json={**body, **change}, timeout=120)
            assert answer.status_code == 400 and words in answer.json()["error"]["message"], answer.text
        with pytest.raises(openai.BadRequestError, match="longer than the model's 40 tokens"):
            client.embeddings.create(model="clip", input=" ".join(["photo"] * 50))


def test_a_siglip_folder_embeds_texts_and_images_in_process(tmp_path):
    """SigLIP through ``create_app``: texts read at their full length (no mask), as its tokenizer gives them, and an
    image, each as transformers' features; the warm-up compiles its text shapes (one width) and its image calls."""
    from fastapi.testclient import TestClient

    from tests.family_files import shapes_picture

    folder = _dual_encoder_folder("siglip", tmp_path / "siglip")
    text, image_of = _dual_reference(folder, siglip=True)
    embedder = jf.Embedder.from_pretrained(folder)
    assert isinstance(embedder, jf.ImageTextEmbedder)
    programs, _ = compile_programs(embedder, 4)
    assert programs == 3 * 1 + 3  # (rows 1, 2, 4) x (the one full width) + the image calls of 1, 2 and 4
    picture = shapes_picture((30, 30, 220), "square")
    with TestClient(create_app(embedder, "siglip")) as http:
        answer = http.post("/v1/embeddings", json={"model": "siglip", "input": CAPTIONS}).json()
        assert_close([d["embedding"] for d in answer["data"]], text)
        image = http.post("/v1/embeddings", json={"model": "siglip",
                                                  "messages": _image_message(_data_url(picture))}).json()
        assert_close([image["data"][0]["embedding"]], [image_of(picture)])


def test_waiting_images_run_as_one_batch_apart_from_texts(tmp_path):
    """(In process: four requests arrive before the batcher runs: an image, the captions, two images, an image.) The
    images embed in one call (four, as many as a batch holds), the captions in the next; each vector transformers';
    a request past the queue's bound is refused, an image as a text."""
    from tests.family_files import shapes_picture

    folder = _dual_encoder_folder("clip", tmp_path / "clip")
    text, image_of = _dual_reference(folder, siglip=False)
    embedder = jf.Embedder.from_pretrained(folder)
    drawn = (((220, 30, 30), "circle"), ((30, 30, 220), "square"), ((30, 200, 30), "circle"), ((200, 200, 30), ""))
    pictures = [shapes_picture(colour, shape) for colour, shape in drawn]

    async def four():
        metrics = Metrics(lambda: 0)
        loop = EmbeddingLoop(embedder, max_batch=4, max_queue=4, metrics=metrics)
        rows, skip = _inputs(CAPTIONS, embedder, "", 0)
        futures = [loop.submit([], [], images=pictures[:1]), loop.submit(rows, skip),
                   loop.submit([], [], images=pictures[1:3]), loop.submit([], [], images=pictures[3:])]
        with pytest.raises(Exception, match="queue is full"):
            loop.submit([], [], images=pictures[:1])
        loop.start()
        vectors = await asyncio.gather(*futures)
        await loop.stop()
        return vectors, metrics.batches._value.get()

    (first, captions, second, third), batches = asyncio.run(four())
    assert batches == 2
    assert_close(np.concatenate([first, second, third]), [image_of(picture) for picture in pictures])
    assert_close(captions, text)
