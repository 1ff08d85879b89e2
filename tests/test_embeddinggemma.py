"""EmbeddingGemma: a Gemma 3 file with ``use_bidirectional_attention: true`` reads as an encoder whose every
hidden state equals transformers' Gemma3TextModel (1e-5, float32, padded rows included), is written back as
one, and through jf.Embedder (mean pooling, two bias-free identity Dense modules, Normalize, named prompts)
gives SentenceTransformer.encode's vectors; what such a file cannot mean is refused by name."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

import jaxformer as jf  # noqa: E402
from jaxformer import cli  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402

from hf_factory import save_checkpoint  # noqa: E402

ATOL = 1e-5
# google/embeddinggemma-300m's config.json, every key kept (as transformers 4.56 wrote it: a public repo's dump
# of Gemma3TextConfig, DeepUnity's EmbeddingGemmaConfig), sizes made tiny: widths (3 heads spanning the width, as
# there), 6 of its 24 layers (the same
# 5:1 sliding/full pattern), a 97-token vocabulary, and the window: 512 there, 8 here (|t - s| <= 4), so that
# 12-token inputs reach past it.
PUBLISHED = {
    "_sliding_window_pattern": 6, "architectures": ["Gemma3TextModel"], "attention_bias": False,
    "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2, "dtype": "float32",
    "eos_token_id": 1, "final_logit_softcapping": None, "head_dim": 8, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 24, "initializer_range": 0.02, "intermediate_size": 48,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "max_position_embeddings": 64,
    "model_type": "gemma3_text", "num_attention_heads": 3, "num_hidden_layers": 6, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 8, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 8, "transformers_version": "4.56.0",
    "use_bidirectional_attention": True, "use_cache": True, "vocab_size": 97}
# Its config_sentence_transformers.json prompts (the same file; mteb and llama.cpp users quote them alike)
PROMPTS = {
    "query": "task: search result | query: ", "document": "title: none | text: ",
    "BitextMining": "task: search result | query: ", "Clustering": "task: clustering | query: ",
    "Classification": "task: classification | query: ", "InstructionRetrieval": "task: code retrieval | query: ",
    "MultilabelClassification": "task: classification | query: ",
    "PairClassification": "task: sentence similarity | query: ", "Reranking": "task: search result | query: ",
    "Retrieval": "task: search result | query: ", "Retrieval-query": "task: search result | query: ",
    "Retrieval-document": "title: none | text: ", "STS": "task: sentence similarity | query: ",
    "Summarization": "task: summarization | query: "}
# Its modules after the encoder: mean pooling, Dense 768 -> 3072 -> 768 without bias, identity activation (here
# 24 -> 96 -> 24), Normalize.
EXPANSION = 4
# Those modules' files as published (sentence-transformers 5.1's forms: legacy pooling booleans, the old module
# paths; quoted alike by a public OpenVINO conversion of the model and ollama's converter test), widths made tiny
# and max_seq_length 2048 -> 24.
PUBLISHED_MODULES = [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
                     for i, (path, kind) in enumerate([("", "Transformer"), ("1_Pooling", "Pooling"),
                                                       ("2_Dense", "Dense"), ("3_Dense", "Dense"),
                                                       ("4_Normalize", "Normalize")])]
PUBLISHED_FILES = {
    "1_Pooling/config.json": {"word_embedding_dimension": 24, "pooling_mode_cls_token": False,
                              "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                              "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
                              "pooling_mode_lasttoken": False, "include_prompt": True},
    "2_Dense/config.json": {"in_features": 24, "out_features": 96, "bias": False,
                            "activation_function": "torch.nn.modules.linear.Identity"},
    "3_Dense/config.json": {"in_features": 96, "out_features": 24, "bias": False,
                            "activation_function": "torch.nn.modules.linear.Identity"},
    "sentence_bert_config.json": {"max_seq_length": 24, "do_lower_case": False},
    "config_sentence_transformers.json": {"model_type": "SentenceTransformer", "__version__": {
        "sentence_transformers": "5.1.0", "transformers": "4.57.0.dev0", "pytorch": "2.8.0+cu128"},
        "prompts": PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine"},
}

WORDS = ("the a cat dog sat on mat quick brown fox jumps over lazy hello world is blue red sky sun man woman eats "
         "food rides horse plays guitar music car road fast slow task search result query title none text "
         "clustering classification code retrieval sentence similarity summarization".split())
VOCAB = ["<pad>", "<eos>", "<bos>", "<unk>", ":", "|", *WORDS]
VOCAB += [f"w{i}" for i in range(97 - len(VOCAB))]
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 4)  # past max_seq_length below
TEXTS = ["the cat sat on the mat", "hello", "a man rides a horse on the road fast", LONG, "",
         "the sky is blue and the sun is red", "unknownword fast car"]


def _reference(path) -> torch.nn.Module:
    return transformers.Gemma3TextModel.from_pretrained(str(path), attn_implementation="eager").eval()


def _published_checkpoint(folder, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.Gemma3TextConfig(**{k: v for k, v in PUBLISHED.items() if k != "architectures"})
    model = transformers.Gemma3TextModel(config).eval()
    with torch.no_grad():  # norms start at exactly 0 (scaled by 1 + w); perturb them so their mapping is tested
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.dim() == 1 else 0.2))
    model.save_pretrained(str(folder))
    return folder


def _inputs(side: str):
    """Two rows of 12 tokens, the second with 4 pads on ``side``: longer than every window here."""
    ids = np.random.default_rng(0).integers(3, 97, (2, 12))
    mask = np.ones((2, 12), np.int64)
    mask[1, 8:] = 0 if side == "right" else 1
    if side == "left":
        mask[1, :4] = 0
    ids[mask == 0] = 0
    return ids, mask


def _assert_same_states(model, reference, ids, mask):
    with torch.no_grad():
        theirs = reference(torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True)
    ours = model(ids, attention_mask=mask, output_hidden_states=True)
    assert len(ours.hidden_states) == len(theirs.hidden_states) == model.config.encoder_layers + 1
    real = mask.astype(bool)  # a pad's own row is no output: transformers' and ours differ there by design
    for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states)):
        np.testing.assert_allclose(np.asarray(a)[real], b.numpy()[real], atol=ATOL, rtol=0, err_msg=f"state {i}")
    np.testing.assert_allclose(np.asarray(ours.last_hidden_state)[real], theirs.last_hidden_state.numpy()[real],
                               atol=ATOL, rtol=0)


def test_published_config_reads_as_a_windowed_encoder():
    cfg = config_from_hf(copy.deepcopy(PUBLISHED))  # every key accounted for, or this refuses it
    assert (cfg.family, cfg.head, cfg.encoder_layers, cfg.decoder_layers) == ("encoder", "none", 6, 0)
    assert cfg.attention == "alternating" and cfg.layer_types == ("sliding",) * 5 + ("full",)
    assert cfg.window_size == 4  # the file's 8 spans both sides: Gemma3TextConfig's exclusive bound 8 // 2 + 1
    assert (cfg.rotary.theta, cfg.rotary.local_theta, cfg.query_key_norm is not None, cfg.norms.sandwich) == (1e6, 1e4, True, True)
    assert config_from_hf({**PUBLISHED, "sliding_window": 9}).window_size == 4  # 9 // 2 + 1 = 5, as 8's
    full = config_from_hf({**PUBLISHED, "layer_types": ["full_attention"] * 6})
    assert (full.attention, full.window_size) == ("bidirectional", None)
    causal = config_from_hf({**PUBLISHED, "use_bidirectional_attention": False})
    assert (causal.family, causal.attention, causal.window_size) == ("decoder", "alternating", 8)


@pytest.mark.parametrize("side", ["right", "left"])
def test_published_shape_hidden_states_equal_transformers(tmp_path, side):
    folder = _published_checkpoint(tmp_path)
    model = jf.from_pretrained(folder)
    _assert_same_states(model, _reference(folder), *_inputs(side))


@pytest.mark.parametrize("layer_types", [None, ["sliding_attention"] * 3, ["full_attention"] * 3],
                         ids=["alternating", "all-sliding", "all-full"])
def test_factory_hidden_states_equal_transformers(tmp_path, layer_types):
    """The factory's EmbeddingGemma: a linearly scaled global rotary, its own local base, a window of 6 (|d| <= 3);
    every layer sliding and every layer full too."""
    folder = save_checkpoint("embeddinggemma", tmp_path, changes={"layer_types": layer_types} if layer_types else None)
    model = jf.from_pretrained(folder)
    assert model.config.family == "encoder"
    _assert_same_states(model, _reference(folder), *_inputs("right"))


def test_export_is_a_bidirectional_gemma3_that_transformers_reloads(tmp_path):
    folder = _published_checkpoint(tmp_path / "published")
    model = jf.from_pretrained(folder)
    model.save_pretrained(tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == ["Gemma3TextModel"] and written["use_bidirectional_attention"] is True
    assert written["sliding_window"] == 8
    assert jf.from_pretrained(tmp_path / "out").config == model.config
    _assert_same_states(model, _reference(tmp_path / "out"), *_inputs("right"))


@pytest.mark.parametrize("change, named", [
    ({"architectures": ["Gemma3ForCausalLM"]}, "Gemma3ForCausalLM with use_bidirectional_attention=true"),
    ({"use_bidirectional_attention": "vision"}, "use_bidirectional_attention='vision'"),
    ({"sliding_window": 1}, "sliding_window=1"),
])
def test_what_a_bidirectional_file_cannot_mean_is_refused(change, named):
    with pytest.raises(ValueError, match=named):
        config_from_hf({**copy.deepcopy(PUBLISHED), **change})


def test_bidirectional_gemma2_is_refused():
    from published_configs import PUBLISHED as FILES

    with pytest.raises(ValueError, match="gemma2: use_bidirectional_attention=true is supported for gemma3_text"):
        config_from_hf({**copy.deepcopy(FILES["gemma-2-9b"]), "use_bidirectional_attention": True})


# --- the sentence-transformers folder -------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["left", "right"])
def folder(request, tmp_path_factory):
    """A tiny EmbeddingGemma-shaped SentenceTransformer folder: the published-shape encoder, a word-level
    tokenizer that adds <bos> and <eos> (padding on ``param``'s side: Gemma's tokenizer class pads left), mean
    pooling, the two Dense modules, Normalize and the published prompts."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    encoder = _published_checkpoint(tmp_path_factory.mktemp("encoder"))
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A <eos>",
                                                           special_tokens=[("<bos>", 2), ("<eos>", 1)])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        padding_side=request.param, model_max_length=64)
    tokenizer.save_pretrained(str(encoder))
    torch.manual_seed(1)
    width = PUBLISHED["hidden_size"]
    modules = [Transformer(str(encoder), max_seq_length=24), Pooling(width, "mean"),
               Dense(width, EXPANSION * width, bias=False, activation_function=torch.nn.Identity()),
               Dense(EXPANSION * width, width, bias=False, activation_function=torch.nn.Identity()), Normalize()]
    out = tmp_path_factory.mktemp(f"embeddinggemma-{request.param}")
    SentenceTransformer(modules=modules, prompts=PROMPTS, device="cpu").save(str(out))
    return out


def _sentence_transformer(path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


def test_folder_is_read_as_published(folder):
    from jaxformer.interop.sentence_transformers import DenseStep, read_folder

    dense = json.loads((folder / "2_Dense" / "config.json").read_text())
    assert dense["bias"] is False and dense["activation_function"] == "torch.nn.modules.linear.Identity"
    pipeline = read_folder(folder)
    assert pipeline.prompts == PROMPTS and pipeline.prompt == "" and pipeline.pooling == ("mean",)
    kinds = [(s.weight.shape, s.bias, s.activation) if isinstance(s, DenseStep) else s for s in pipeline.steps]
    assert kinds == [((96, 24), None, "identity"), ((24, 96), None, "identity"), "normalize"]


@pytest.mark.parametrize("prompt_name", [None, "query", "document", "STS"])
def test_encode_equals_sentence_transformers(folder, prompt_name):
    embedder = jf.Embedder.from_pretrained(folder)
    ours = embedder.encode(TEXTS, prompt_name=prompt_name)
    theirs = _sentence_transformer(folder).encode(TEXTS, prompt_name=prompt_name)
    assert ours.shape == theirs.shape == (len(TEXTS), PUBLISHED["hidden_size"]) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)
    if prompt_name is not None:  # the prompt reached the model: the vectors moved
        assert np.abs(ours - embedder.encode(TEXTS)).max() > 1e-3


def test_explicit_prompt_and_truncated_dimensions_as_sentence_transformers(folder):
    embedder = jf.Embedder.from_pretrained(folder)
    reference = _sentence_transformer(folder)
    ours = embedder.encode(TEXTS, prompt="title: none | text: ", prompt_name="query")  # the text wins, as there
    np.testing.assert_allclose(ours, embedder.encode(TEXTS, prompt_name="document"), atol=1e-6, rtol=0)
    short = embedder.encode(TEXTS, prompt_name="query", truncate_dim=8, normalize_embeddings=True)
    np.testing.assert_allclose(short, reference.encode(TEXTS, prompt_name="query", truncate_dim=8,
                                                       normalize_embeddings=True), atol=ATOL, rtol=0)
    assert short.shape == (len(TEXTS), 8)


def test_published_file_forms_read_alike(folder, tmp_path):
    """The same folder with its module files rewritten as google/embeddinggemma-300m publishes them."""
    import shutil

    published = shutil.copytree(folder, tmp_path / "published")  # the same module folders: 2_Dense, 3_Dense, ...
    (published / "modules.json").write_text(json.dumps(PUBLISHED_MODULES))
    for name, content in PUBLISHED_FILES.items():
        (published / name).write_text(json.dumps(content))
    ours = jf.Embedder.from_pretrained(published).encode(TEXTS, prompt_name="query")
    np.testing.assert_allclose(ours, _sentence_transformer(published).encode(TEXTS, prompt_name="query"),
                               atol=ATOL, rtol=0)
    np.testing.assert_allclose(ours, jf.Embedder.from_pretrained(folder).encode(TEXTS, prompt_name="query"),
                               atol=1e-6, rtol=0)


def test_unknown_prompt_name_and_bad_truncation_are_refused(folder):
    embedder = jf.Embedder.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"prompt_name='passage' is not one of this folder's prompts \['BitextMining'"):
        embedder.encode(TEXTS, prompt_name="passage")
    with pytest.raises(ValueError, match="truncate_dim=0"):
        embedder.encode(TEXTS, truncate_dim=0)


def test_cli_embeds_with_a_prompt_name(folder, capsys):
    args = ["embed", str(folder), "--text", TEXTS[0], "--text", TEXTS[2], "--prompt-name", "query", "--json"]
    assert cli.main(args) == 0
    printed = np.asarray(json.loads(capsys.readouterr().out)["embeddings"], np.float32)
    expected = jf.Embedder.from_pretrained(folder).encode([TEXTS[0], TEXTS[2]], prompt_name="query")
    np.testing.assert_allclose(printed, expected, atol=1e-7, rtol=0)
    assert cli.main(["embed", str(folder), "--text", "x", "--prompt-name", "passage"]) != 0
    assert "prompt_name='passage'" in capsys.readouterr().err
