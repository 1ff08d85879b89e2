"""MPNet: RoBERTa's encoder plus one relative bias (32 buckets, distance 128) between token indices. Parity with
transformers (every hidden state, attention map and the logits to 1e-5, with padding, past the exact buckets) on
copies of microsoft/mpnet-base's and all-mpnet-base-v2's config.json, jf.Embedder equal to
SentenceTransformer.encode on an all-mpnet-base-v2-shaped folder, the constants of transformers' modeling that a
file cannot change refused when it tries, and MLM training whose loss falls."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table  # noqa: E402
from jaxformer.interop.files import TensorFiles  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.train import run_config  # noqa: E402
from jaxformer.train.run import train  # noqa: E402

TOLERANCE = 1e-5
STD = 0.2  # random weights far from zero, so that differences cannot hide in tiny activations
TINY = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=2, vocab_size=97)
# microsoft/mpnet-base's config.json (no transformers_version), every key kept, sizes made tiny
MPNET_BASE = {"architectures": ["MPNetForMaskedLM"], "attention_probs_dropout_prob": 0.1, "pad_token_id": 1,
              "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
              "initializer_range": 0.02, "layer_norm_eps": 1e-05, "max_position_embeddings": 514,
              "relative_attention_num_buckets": 32, "model_type": "mpnet", **TINY}
# sentence-transformers/all-mpnet-base-v2's: it names MPNetForMaskedLM but its folder holds MPNetModel's tensors
ALL_MPNET_BASE_V2 = {"_name_or_path": "microsoft/mpnet-base", "architectures": ["MPNetForMaskedLM"],
                     "attention_probs_dropout_prob": 0.1, "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu",
                     "hidden_dropout_prob": 0.1, "initializer_range": 0.02, "layer_norm_eps": 1e-05,
                     "max_position_embeddings": 514, "model_type": "mpnet", "pad_token_id": 1,
                     "relative_attention_num_buckets": 32, "transformers_version": "4.8.2", **TINY}
WORDS = "the a cat dog sat on mat quick brown fox jumps over lazy hello world is blue red sky sun".split()
VOCAB = ["<s>", "<pad>", "</s>", "[UNK]", *WORDS, *(f"##{w}" for w in WORDS)]
VOCAB += [f"w{i}" for i in range(96 - len(VOCAB))] + ["<mask>"]
TEXTS = ["the cat sat on the mat", "hello", " ".join(["the quick brown fox jumps over the lazy dog"] * 5), "",
         "the sky is blue"]


def _save(published: dict, folder, model_class: str, seed: int = 0):
    """A random ``model_class`` of ``published`` saved with the published config.json beside its tensors."""
    config = transformers.MPNetConfig.from_dict(copy.deepcopy(published))
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # norms and biases too: every tensor's mapping is seen
            parameter.normal_(0.0, STD)
    model.save_pretrained(str(folder))
    (folder / "config.json").write_text(json.dumps(published, indent=2))
    return folder, model


def _padded(length: int, left: bool = False):
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 97, size=(2, length))
    mask = np.ones_like(ids)
    if left:
        mask[1, :5] = 0
    else:
        mask[1, length - 5:] = 0
    return np.where(mask == 1, ids, 1), mask


@pytest.mark.parametrize("left", [False, True])
def test_mpnet_base_matches_transformers_past_the_exact_buckets(left, tmp_path):
    """40 tokens: distances past 8 (16 buckets a direction, half of them exact) fall in the logarithmic buckets;
    padding on either side moves RoBERTa-style positions but not the bias, which counts indices."""
    folder, _ = _save(MPNET_BASE, tmp_path, "MPNetForMaskedLM")
    model = jf.from_pretrained(folder)
    assert model.config.head == "mlm" and (model.config.relative_bias is not None and model.config.position != "relative")
    rows = compare(folder, *_padded(40, left), model=model)
    assert any(r.name == "logits" for r in rows)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


def test_the_bias_counts_indices_whatever_the_position_ids(tmp_path):
    folder, reference = _save(MPNET_BASE, tmp_path, "MPNetForMaskedLM")
    model = jf.from_pretrained(folder)
    ids, mask = _padded(20)
    positions = np.broadcast_to(np.arange(2, 42, 2), ids.shape)  # every other row of the table
    with torch.no_grad():
        theirs = reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                           position_ids=torch.as_tensor(positions)).logits.numpy()
    # (jaxformer's position ids count from 0: a RoBERTa-style table's row is position + position_offset)
    ours = np.asarray(model(ids, mask, position_ids=positions - model.config.embeddings.position_offset).logits)
    real = mask.astype(bool)
    assert np.abs(ours - theirs)[real].max() <= TOLERANCE


def test_all_mpnet_base_v2_reads_as_the_base_model_its_folder_holds(tmp_path):
    folder, _ = _save(ALL_MPNET_BASE_V2, tmp_path / "st", "MPNetModel")
    model = jf.from_pretrained(folder)
    assert model.config.head == "none" and model.config.head_options.pooler
    reference = transformers.MPNetModel.from_pretrained(folder, attn_implementation="eager").eval()
    rows = compare(folder, *_padded(40), model=model, reference=reference)
    assert any(r.name == "pooler" for r in rows)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
    model.save_pretrained(tmp_path / "out")  # written as the MPNetModel it is, the same bytes
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == ["MPNetModel"]
    before, after = TensorFiles(folder), TensorFiles(tmp_path / "out")
    assert set(before.names) == set(after.names)
    assert all(before.get(n).tobytes() == after.get(n).tobytes() for n in after.names)


@pytest.mark.parametrize("key, value", [("pad_token_id", 0), ("relative_attention_num_buckets", 64)])
def test_constants_of_the_modeling_code_are_refused_when_a_file_changes_them(key, value):
    with pytest.raises(ValueError, match=key):
        config_from_hf({**MPNET_BASE, key: value})


def test_mlm_head_with_another_activation_is_refused():
    """MPNet's head applies exact gelu whatever hidden_act says; the shared prediction head would not."""
    with pytest.raises(ValueError, match="hidden_act"):
        config_from_hf({**MPNET_BASE, "hidden_act": "relu"})
    assert config_from_hf({**MPNET_BASE, "hidden_act": "relu", "architectures": ["MPNetModel"]}).activation == "relu"


def test_embedder_equals_sentence_transformers_on_an_all_mpnet_base_v2_folder(tmp_path):
    """The layout of all-mpnet-base-v2: MPNet (its config.json naming MPNetForMaskedLM), mean pooling, Normalize."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    encoder, _ = _save(ALL_MPNET_BASE_V2, tmp_path / "mpnet", "MPNetModel")
    tokenizer = transformers.MPNetTokenizer(vocab={t: i for i, t in enumerate(VOCAB)}, do_lower_case=True,
                                            model_max_length=512)
    tokenizer.save_pretrained(str(encoder))
    modules = [Transformer(str(encoder), max_seq_length=24), Pooling(32, "mean"), Normalize()]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "folder"))
    (tmp_path / "folder" / "config.json").write_text(json.dumps(ALL_MPNET_BASE_V2))  # as published
    theirs = st.SentenceTransformer(str(tmp_path / "folder"), device="cpu").encode(TEXTS)
    embedder = jf.Embedder.from_pretrained(tmp_path / "folder")
    ours = embedder.encode(TEXTS)
    assert ours.shape == theirs.shape == (len(TEXTS), 32)
    assert len(set(embedder.tokenizer.encode(TEXTS[0]).ids)) >= 5  # real word pieces, not unknowns
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


def test_masked_lm_trains_and_its_loss_falls(tmp_path):
    cfg = run_config.load("configs/bert_mlm.yaml", [
        "model.overrides.type_vocab_size=0", "model.overrides.index_relative_bias=true", "model.overrides.head=mlm",
        "model.overrides.pooler=false", "data.nsp=false", "train.steps=40", "train.seq_len=64", "train.log_every=5",
        "eval.every=40", "eval.batches=2", "optim.warmup_steps=5", "train.sample_tokens=0", f"run.dir={tmp_path}"])
    history = train(cfg, progress=False)["history"]
    losses = [r["loss"] for r in history]
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.1, losses
    assert np.isfinite(history[-1]["eval_loss"])


def test_a_model_built_here_exports_as_mpnet(tmp_path):
    """RoBERTa's tiny layout with MPNet's bias and no token types: written as MPNet (RoBERTa's files cannot hold
    the bias), and transformers' model of the folder gives the same numbers."""
    # std 0.1: at 0.2 this 64-wide head's logits reach the size where float32 rounding alone is 1e-5
    cfg = jf.config("tiny-bert").replace(type_vocab_size=0, index_relative_bias=True, head="mlm", pooler=False,
                                         pad_aware_positions=True, position_offset=2, pad_token_id=1, init_std=0.1)
    model = jf.build(cfg, seed=3)
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["model_type"], written["architectures"]) == ("mpnet", ["MPNetForMaskedLM"])
    ids, mask = _padded(40)
    rows = compare(tmp_path, ids, mask, model=model)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


@pytest.mark.parametrize("name, targets, task", [
    ("mpnet-tokcls", ["q", "k", "v", "o", "intermediate.dense"], "TOKEN_CLS"), ("mpnet-seqcls", ["q", "v"], "SEQ_CLS")])
def test_a_peft_lora_adapter_gives_peft_logits_and_goes_back_out(name, targets, task, checkpoints, tmp_path):
    peft = pytest.importorskip("peft")
    from hf_factory import build_reference

    reference = build_reference(name)
    ids = np.random.default_rng(0).integers(3, 97, size=(2, 7))
    torch.manual_seed(1)
    lora = peft.get_peft_model(copy.deepcopy(reference), peft.LoraConfig(
        init_lora_weights=False, r=4, lora_alpha=8, target_modules=targets, task_type=task)).eval()
    lora.save_pretrained(str(tmp_path / "adapter"))
    with torch.no_grad():
        want = lora(input_ids=torch.as_tensor(ids)).logits.numpy()
        plain = reference(input_ids=torch.as_tensor(ids)).logits.numpy()
    assert np.abs(want - plain).max() > 1e-2  # the adapter changes the logits
    ours = jf.from_pretrained(checkpoints(name), adapter=tmp_path / "adapter")
    got = np.asarray(ours(ids).logits)
    assert np.abs(got - want).max() <= TOLERANCE
    ours.save_adapter(tmp_path / "out")
    reloaded = peft.PeftModel.from_pretrained(build_reference(name), str(tmp_path / "out")).eval()
    with torch.no_grad():
        assert np.abs(reloaded(input_ids=torch.as_tensor(ids)).logits.numpy() - got).max() <= TOLERANCE
