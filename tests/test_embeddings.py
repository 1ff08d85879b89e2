"""Sentence embeddings: jf.Embedder on tiny sentence-transformers folders equals SentenceTransformer.encode
(cosine >= 0.99999 per sentence, 1e-5 absolute in float32), the CLI prints the same vectors, and folder
options jaxformer cannot honour are refused by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

import jaxformer as jf  # noqa: E402
from jaxformer import cli  # noqa: E402

from hf_factory import save_checkpoint  # noqa: E402

WORDS = ("the a cat dog sat on mat quick brown fox jumps over lazy hello world is blue red sky sun "
         "man woman eats food rides horse plays guitar music car road fast slow".split())
# Cased vocabulary (lowercasing changes ids), padded to the factory BERT's 97 entries.
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *(w.capitalize() for w in WORDS), "##s", "##ing"]
VOCAB += [f"w{i}" for i in range(97 - len(VOCAB))]
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)  # 54 tokens: past every limit below
TEXTS = ["the cat sat on the mat", "Hello", "A man rides a horse on the road", LONG, "", "The Sky is blue",
         "unknownword fast car"]
# name -> (encoder, Pooling mode(s), max_seq_length or None (the tokenizer's 512, capped at BERT's 40 positions),
# modules after pooling); "t5" is sentence-t5's layout: a T5 encoder, mean, a bias-free linear Dense, Normalize.
FOLDERS = {
    "mean-normalize": ("bert", "mean", 12, ["normalize"]),
    "cls": ("bert", "cls", None, []),
    "max": ("bert", "max", 16, []),
    "other-modes-dense": ("bert", ("mean_sqrt_len_tokens", "weightedmean", "lasttoken"), 20, ["dense", "normalize"]),
    "t5": ("t5-encoder", "mean", 16, ["linear", "normalize"]),
    "llama-lasttoken": ("llama-base", "lasttoken", 16, ["normalize"]),  # e5-mistral / gte-Qwen2 layout, left pads
    "xlm-roberta-cls": ("xlm-roberta", "cls", 16, ["normalize"]),  # bge-m3's layout: XLM-R, <s>, normalized
    "distilbert-mean": ("distilbert", "mean", 16, []),  # msmarco-distilbert's layout
    "albert-mean": ("albert", "mean", 16, ["normalize"]),  # paraphrase-albert's layout: shared layers
    "electra-cls": ("electra-discriminator", "cls", 16, []),  # an ELECTRA discriminator's encoder
    "modernbert-mean": ("modernbert", "mean", 16, ["normalize"]),  # modernbert-embed's and gte-modernbert's layout
    "deberta-v3-mean": ("deberta-v2", "mean", 16, ["normalize"]),  # a DeBERTa-v3 sentence encoder's layout
}
COSINE, ABS = 0.99999, 1e-5


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    """``encoders(name)``: the factory's tiny random checkpoint ``name`` with a tokenizer over VOCAB: cased
    WordPiece for BERT, Unigram pieces for T5."""
    cache = {}

    def get(name):
        if name not in cache:
            folder = save_checkpoint(name, tmp_path_factory.mktemp(name))
            if name in ("bert", "distilbert", "albert", "electra-discriminator", "modernbert", "deberta-v2"):  # WordPiece
                kind = (transformers.DistilBertTokenizerFast if name == "distilbert"  # (gives no token types)
                        else transformers.BertTokenizerFast)
                tokenizer = kind(vocab={t: i for i, t in enumerate(VOCAB)}, do_lower_case=False, model_max_length=512)
                if name in ("modernbert", "deberta-v2"):  # these take no token types
                    tokenizer.model_input_names = ["input_ids", "attention_mask"]
            elif name == "llama-base":  # word-level, an end-of-text token appended, padded on the left
                from tokenizers import Tokenizer, models, pre_tokenizers, processors

                backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
                backend.pre_tokenizer = pre_tokenizers.Whitespace()
                backend.post_processor = processors.TemplateProcessing(single="$A [SEP]",
                                                                       special_tokens=[("[SEP]", 3)])
                tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]",
                                                                 eos_token="[SEP]", unk_token="[UNK]",
                                                                 padding_side="left", model_max_length=512)
            elif name == "xlm-roberta":  # XLM-R's Unigram pieces: <s> 0, <pad> 1, </s> 2, <unk> 3, <mask> last
                pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0),
                          *((f"\u2581{w}", -1.0) for w in WORDS), *((c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz\u2581"),
                          ("<mask>", 0.0)]
                tokenizer = transformers.XLMRobertaTokenizerFast(vocab=pieces, model_max_length=512)
            else:
                pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *((f"\u2581{w}", -1.0) for w in WORDS),
                          *((c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz\u2581")]
                tokenizer = transformers.T5TokenizerFast(vocab=pieces, extra_ids=0)
            tokenizer.save_pretrained(str(folder))
            cache[name] = folder
        return cache[name]

    return get


@pytest.fixture(scope="module")
def folders(encoders, tmp_path_factory):
    """``folders(name)``: a saved SentenceTransformer of FOLDERS[name], built once."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    cache = {}

    def get(name):
        if name not in cache:
            encoder, mode, length, extra = FOLDERS[name]
            torch.manual_seed(1)
            modules = [Transformer(str(encoders(encoder)), max_seq_length=length), Pooling(32, mode)]
            width = 32 * (1 if isinstance(mode, str) else len(mode))
            made = {"dense": lambda: Dense(width, 16), "normalize": Normalize,
                    "linear": lambda: Dense(width, 16, bias=False, activation_function=torch.nn.Identity())}
            modules += [made[kind]() for kind in extra]
            cache[name] = tmp_path_factory.mktemp(name)
            SentenceTransformer(modules=modules, device="cpu").save(str(cache[name]))
        return cache[name]

    return get


def reference(folder, texts, **kwargs):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(texts, **kwargs)


def assert_close(ours, theirs):
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    cosine = (ours * theirs).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)
    diff = float(np.abs(ours - theirs).max())
    print(f"min cosine {cosine.min():.8f}, max abs diff {diff:.2e}")
    assert cosine.min() >= COSINE and diff <= ABS, (cosine, diff)


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_encode_equals_sentence_transformers(name, folders):
    folder = folders(name)
    embedder = jf.Embedder.from_pretrained(folder)
    ours = embedder.encode(TEXTS)
    assert_close(ours, reference(folder, TEXTS))
    assert embedder.max_seq_length == (FOLDERS[name][2] or 40)
    if name.startswith("llama"):  # rotary positions: how far a row is left-padded changes nothing
        assert embedder.padding_side == "left"
        alone = embedder.encode(TEXTS[1])  # one string: a [D] vector, 6 pads on its left instead of 14
        np.testing.assert_allclose(alone, ours[1], atol=1e-5)
    assert len(set(embedder.tokenizer.encode(TEXTS[0]).ids)) >= 6  # real word pieces, not unknowns


def test_batches_sorted_by_length_come_back_in_input_order(folders):
    embedder = jf.Embedder.from_pretrained(folders("max"))
    whole = embedder.encode(TEXTS)
    np.testing.assert_allclose(embedder.encode(TEXTS, batch_size=4), whole, atol=1e-6)  # widths 16 and 8
    assert embedder.encode([]).shape == (0, 32)


def test_legacy_folder_with_lowercasing_and_pooling_booleans(folders, tmp_path):
    """Pre-v6 files: max_seq_length and do_lower_case in sentence_bert_config.json, pooling_mode_* booleans."""
    folder = shutil.copytree(folders("cls"), tmp_path / "legacy")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 10, "do_lower_case": True}))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
         "pooling_mode_max_tokens": True}))
    embedder = jf.Embedder.from_pretrained(folder)
    assert embedder.pipeline.pooling == ("max", "mean") and embedder.max_seq_length == 10
    assert embedder.tokenizer.encode("The Sky").ids == embedder.tokenizer.encode("the sky").ids  # cased vocabulary
    ours = embedder.encode(TEXTS, normalize_embeddings=True)
    assert_close(ours, reference(folder, TEXTS, normalize_embeddings=True))


def test_cli_prints_the_encode_vectors(folders, capsys):
    folder = folders("mean-normalize")
    assert cli.main(["embed", str(folder), "--text", "the cat sat", "--text", "Hello world", "--json"]) == 0
    printed = np.asarray(json.loads(capsys.readouterr().out)["embeddings"], np.float32)
    np.testing.assert_allclose(printed, jf.Embedder.from_pretrained(folder).encode(["the cat sat", "Hello world"]),
                               atol=1e-7)


@pytest.mark.parametrize("name", ["cosine", "dot", "euclidean", "manhattan"])
def test_similarity_follows_the_folders_function(name, folders):
    from sentence_transformers.util.similarity import SimilarityFunction

    embedder = jf.Embedder.from_pretrained(folders("cls"))
    embedder.similarity_fn_name = name
    a, b = np.random.default_rng(0).normal(size=(2, 3, 32)).astype(np.float32)
    expected = SimilarityFunction.to_similarity_fn(name)(a, b).numpy()
    np.testing.assert_allclose(embedder.similarity(a, b), expected, rtol=1e-5, atol=1e-5)


def _edit(folder, file, change):
    data = json.loads((folder / file).read_text())
    (folder / file).write_text(json.dumps(change(data)))


@pytest.mark.parametrize("file, change, named", [
    ("modules.json", lambda m: m + [{"idx": 2, "name": "2", "path": "2_LayerNorm",
                                     "type": "sentence_transformers.models.LayerNorm"}], "LayerNorm"),
    ("1_Pooling/config.json", lambda c: {**c, "pooling_mode": "median"}, "median"),
    ("1_Pooling/config.json", lambda c: {**c, "pooling_mode_attention": True}, "pooling_mode_attention"),
    ("sentence_bert_config.json", lambda c: {**c, "query_length": 32}, "query_length"),
    ("config_sentence_transformers.json", lambda c: {**c, "default_prompt_name": "passage"}, "passage"),
])
def test_unsupported_options_are_refused_by_name(folders, tmp_path, file, change, named):
    folder = shutil.copytree(folders("cls"), tmp_path / "edited")
    _edit(folder, file, change)
    with pytest.raises(ValueError, match=named) as err:
        jf.Embedder.from_pretrained(folder)
    assert file.split("/")[-1] in str(err.value)


def test_pickled_dense_weights_are_read_only_when_allowed(folders, tmp_path):
    from jaxformer.interop.sentence_transformers import read_folder
    from safetensors.torch import load_file

    folder = shutil.copytree(folders("other-modes-dense"), tmp_path / "pickled")
    dense = folder / "2_Dense"
    torch.save(load_file(dense / "model.safetensors"), dense / "pytorch_model.bin")
    (dense / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="pytorch_model.bin is a pickle file"):
        jf.Embedder.from_pretrained(folder)
    step = read_folder(folder, allow_pickle=True).steps[0]
    assert step.weight.shape == (16, 96) and step.bias.shape == (16,) and step.activation == "tanh"


def test_default_prompt_is_prepended_and_left_out_of_pooling_when_asked(folders, tmp_path):
    folder = shutil.copytree(folders("other-modes-dense"), tmp_path / "prompted")
    _edit(folder, "config_sentence_transformers.json",
          lambda c: {**c, "prompts": {"query": "hello world "}, "default_prompt_name": "query"})
    for include_prompt in (True, False):
        _edit(folder, "1_Pooling/config.json", lambda c: {**c, "include_prompt": include_prompt})
        embedder = jf.Embedder.from_pretrained(folder)
        assert_close(embedder.encode(TEXTS), reference(folder, TEXTS))
    assert embedder.prompt_length() == 3  # [CLS] hello world; the trailing [SEP] is not the prompt


def test_folder_without_modules_json_is_refused(encoders):
    with pytest.raises(ValueError, match="modules.json"):
        jf.Embedder.from_pretrained(encoders("bert"))


def test_left_padding_is_refused_where_it_would_move_learned_positions(folders, tmp_path):
    folder = shutil.copytree(folders("cls"), tmp_path / "gpt2")
    save_checkpoint("gpt2-base", folder)  # its config.json and model.safetensors replace BERT's
    _edit(folder, "tokenizer_config.json", lambda c: {**c, "padding_side": "left"})
    with pytest.raises(ValueError, match="tokenizer_config.json: padding_side='left' .* decoder with learned"):
        jf.Embedder.from_pretrained(folder)
