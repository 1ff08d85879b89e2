"""The encoder-decoders' classification and span heads (BART, mBART, T5, mT5): every hidden state, the logits
and the start/end logits to 1e-5 against transformers on padded rows, with the decoder inputs given and with
them derived from the source as transformers derives them; byte-exact round trips that transformers reloads;
bart-large-mnli's published config.json read with its label names; the EOS-pooling refusals; and a train.py
classification run of an encoder-decoder whose loss falls."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table, reference_model  # noqa: E402
from jaxformer.encoder_decoder import shifted_right  # noqa: E402
from jaxformer.interop.files import TensorFiles  # noqa: E402

from hf_factory import SEQ2SEQ_HEADS, save_checkpoint  # noqa: E402

TOLERANCE = 1e-5


def eos_batch(cfg: jf.ModelConfig, length: int = 9) -> tuple[np.ndarray, np.ndarray]:
    """Two rows with two EOS tokens each, the second right-padded by three: a classifier reads each row's last
    EOS, which sits at different positions (the first row's last token, the second's sixth)."""
    ids = np.random.default_rng(0).integers(3, 97, size=(2, length))
    mask = np.ones_like(ids)
    ids[0, [2, length - 1]] = cfg.tokens.eos
    ids[1, [1, 5]] = cfg.tokens.eos
    ids[1, 6:], mask[1, 6:] = cfg.tokens.pad, 0
    return ids, mask


def head_outputs(out) -> dict[str, np.ndarray]:
    return {name: np.asarray(getattr(out, name)) for name in ("logits", "start_logits", "end_logits")
            if getattr(out, name) is not None}


@pytest.mark.parametrize("name", sorted(SEQ2SEQ_HEADS))
def test_every_layer_and_the_head_match_transformers(name, checkpoints):
    path = checkpoints(name)
    model, reference = jf.from_pretrained(path), reference_model(path)
    ids, mask = eos_batch(model.config)
    # the decoder inputs given: every hidden state and attention map, the head's outputs
    rows = compare(path, ids, mask, decoder_input_ids=np.asarray(shifted_right(model.config, ids)), model=model,
                   reference=reference)
    assert any(r.name in ("logits", "start logits") for r in rows)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
    # none given: both derive them from input_ids (mBART: behind each row's last non-pad token)
    ours = model(ids, mask, output_hidden_states=True)
    with torch.no_grad():
        theirs = reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                           output_hidden_states=True)
    for ref, got in zip(theirs.decoder_hidden_states, ours.hidden_states, strict=True):
        np.testing.assert_allclose(np.asarray(got), ref.numpy(), atol=TOLERANCE, rtol=0)
    for key, got in head_outputs(ours).items():
        np.testing.assert_allclose(got, getattr(theirs, key).numpy(), atol=TOLERANCE, rtol=0, err_msg=key)
    if model.config.head == "sequence_classification":  # (BartConfig's default: 3 labels; MBartConfig's: 2)
        assert ours.logits.shape == (2, model.config.head_options.num_labels) and model.config.head_options.num_labels == reference.config.num_labels


@pytest.mark.parametrize("name", sorted(SEQ2SEQ_HEADS))
def test_round_trip_is_bit_exact_and_transformers_reloads_it(name, checkpoints, tmp_path):
    source = checkpoints(name)
    model = jf.from_pretrained(source)
    model.save_pretrained(tmp_path)
    before, after = TensorFiles(source), TensorFiles(tmp_path)
    assert set(before.names) == set(after.names)
    for tensor in after.names:
        a, b = before.get(tensor), after.get(tensor)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), tensor
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [SEQ2SEQ_HEADS[name][1]]
    ids, mask = eos_batch(model.config)
    rows = compare(tmp_path, ids, mask, decoder_input_ids=np.asarray(shifted_right(model.config, ids)), model=model)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


# facebook/bart-large-mnli's config.json (https://huggingface.co/facebook/bart-large-mnli/blob/main/config.json,
# transformers 4.7.0.dev0), every key kept, sizes made tiny (d_model, heads, ffn, layers, positions, vocabulary);
# taken from a public copy of it in the code index, less the "_attn_implementation" line that copy added
BART_LARGE_MNLI = {
    "_num_labels": 3, "activation_dropout": 0.0, "activation_function": "gelu", "add_final_layer_norm": False,
    "architectures": ["BartForSequenceClassification"], "attention_dropout": 0.0, "bos_token_id": 0,
    "classif_dropout": 0.0, "classifier_dropout": 0.0, "d_model": 32, "decoder_attention_heads": 4,
    "decoder_ffn_dim": 48, "decoder_layerdrop": 0.0, "decoder_layers": 2, "decoder_start_token_id": 2,
    "dropout": 0.1, "encoder_attention_heads": 4, "encoder_ffn_dim": 48, "encoder_layerdrop": 0.0,
    "encoder_layers": 2, "eos_token_id": 2, "forced_eos_token_id": 2, "gradient_checkpointing": False,
    "id2label": {"0": "contradiction", "1": "neutral", "2": "entailment"}, "init_std": 0.02,
    "is_encoder_decoder": True, "label2id": {"contradiction": 0, "entailment": 2, "neutral": 1},
    "max_position_embeddings": 40, "model_type": "bart", "normalize_before": False, "num_hidden_layers": 2,
    "output_past": False, "pad_token_id": 1, "scale_embedding": False, "transformers_version": "4.7.0.dev0",
    "use_cache": False, "vocab_size": 97}


def test_the_published_bart_large_mnli_config_loads_with_its_labels(tmp_path):
    """Tensors from transformers, config.json as published: the labels are named as in the file, and the
    logits are transformers' (the zero-shot pipeline's entailment logit is the last)."""
    save_checkpoint("bart-seqcls", tmp_path, changes=dict(id2label={0: "contradiction", 1: "neutral",
                                                                    2: "entailment"}))
    (tmp_path / "config.json").write_text(json.dumps(BART_LARGE_MNLI))
    model = jf.from_pretrained(tmp_path)
    cfg = model.config
    assert (cfg.head, cfg.head_options.num_labels, cfg.head_options.label_names) == ("sequence_classification", 3,
                                                           ("contradiction", "neutral", "entailment"))
    reference = reference_model(tmp_path)
    assert reference.config.id2label == {0: "contradiction", 1: "neutral", 2: "entailment"}
    ids, mask = eos_batch(cfg)
    with torch.no_grad():
        theirs = reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(ids, mask).logits), theirs, atol=TOLERANCE, rtol=0)
    model.save_pretrained(tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["id2label"] == BART_LARGE_MNLI["id2label"] and written["label2id"] == BART_LARGE_MNLI["label2id"]


def test_eos_pooling_refuses_what_transformers_refuses(checkpoints):
    path = checkpoints("bart-seqcls")
    model, reference = jf.from_pretrained(path), reference_model(path)
    ids, mask = eos_batch(model.config)
    uneven = ids.copy()
    uneven[1, 1] = 50  # the second row now holds one EOS, the first two
    with pytest.raises(ValueError, match=r"same number of eos_token_id=2 tokens .* counts are \[2, 1\]"):
        model(uneven, mask)
    with pytest.raises(Exception, match="same number of <eos> tokens"):
        reference(input_ids=torch.as_tensor(uneven), attention_mask=torch.as_tensor(mask))
    none = np.where(ids == 2, 50, ids)
    with pytest.raises(ValueError, match="each row of input_ids must hold eos_token_id=2"):
        model(none, mask)
    with pytest.raises(ValueError, match=r"decoder inputs must be as long as input_ids \(9\), not 4"):
        model(ids, mask, ids[:, :4])
    with pytest.raises(ValueError, match="pass input_ids, not inputs_embeds"):
        model(inputs_embeds=np.zeros((2, 9, 32), np.float32), decoder_input_ids=ids)


@pytest.mark.parametrize("name", ["mbart-seqcls", "t5-qa"])
def test_inside_a_users_jit_the_heads_give_the_same_numbers(name, checkpoints):
    """Traced inputs: the checks that need values are skipped, the pooling and the derived decoder inputs are
    traced (mBART's wrap included), and the outputs equal a checked call's."""
    from conftest import jitted

    model = jf.from_pretrained(checkpoints(name))
    ids, mask = eos_batch(model.config)
    for key, got in head_outputs(jitted(model)(ids, mask)).items():
        np.testing.assert_allclose(got, head_outputs(model(ids, mask))[key], atol=1e-6, rtol=0, err_msg=key)


def test_decoder_inputs_are_derived_only_where_they_can_be(checkpoints):
    t5 = jf.from_pretrained(checkpoints("t5-qa"))
    ids, mask = eos_batch(t5.config)
    no_start = jf.build(t5.config.replace(decoder_start_token_id=None))
    with pytest.raises(ValueError, match="decoder_start_token_id=None"):  # transformers' T5 refuses it too
        no_start(ids, mask)
    assert no_start(ids, mask, np.asarray(shifted_right(t5.config, ids))).start_logits.shape == (2, 9)
    lm = jf.build(t5.config.replace(head="lm"))
    with pytest.raises(ValueError, match="needs decoder_input_ids"):  # an LM head derives nothing
        lm(ids, mask)
    mbart = jf.from_pretrained(checkpoints("mbart-qa"))
    with pytest.raises(ValueError, match=r"rows \[1\] of input_ids hold only pad_token_id=1"):
        mbart(np.stack([ids[0], np.full(9, 1)]), mask)


def test_head_settings_are_validated():
    bart = jf.config("bart-base").replace(vocab_size=97, d_model=32, num_heads=4, d_ff=48, encoder_layers=1,
                                          decoder_layers=1, logits_bias=False)
    with pytest.raises(ValueError, match="set pooler=True"):
        bart.replace(head="sequence_classification")
    with pytest.raises(ValueError, match=r"it needs one id, not \(2, 3\)"):
        bart.replace(head="sequence_classification", pooler=True, eos_token_id=(2, 3))
    with pytest.raises(ValueError, match="does not fit family='encoder_decoder'"):
        bart.replace(head="token_classification")
    with pytest.raises(ValueError, match="wrap_decoder_start=True .* needs one of those heads"):
        bart.replace(wrap_decoder_start=True)
    with pytest.raises(ValueError, match="pooler=True needs family='encoder'"):
        bart.replace(pooler=True)


def test_a_bart_classifier_built_here_exports_to_transformers(tmp_path):
    """No HF config to copy from: BART's classifier and mBART's span head (pre-norm, derived decoder inputs
    behind the last non-pad token) are written as their classes, with the labels' names."""
    base = jf.config("bart-base").replace(vocab_size=97, d_model=32, num_heads=4, d_ff=48, encoder_layers=2,
                                          decoder_layers=2, max_positions=40, init_std=0.2, dropout_rate=0.0,
                                          logits_bias=False, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    for name, cfg in {"BartForSequenceClassification": base.replace(head="sequence_classification", pooler=True,
                                                                    num_labels=2, label_names=("no", "yes")),
                      "MBartForQuestionAnswering": base.replace(head="question_answering", norm_position="pre",
                                                                final_norm=True, wrap_decoder_start=True)}.items():
        model = jf.build(cfg, seed=5)
        model.save_pretrained(tmp_path / name)
        written = json.loads((tmp_path / name / "config.json").read_text())
        assert written["architectures"] == [name]
        reference = reference_model(tmp_path / name)
        ids, mask = eos_batch(cfg)
        with torch.no_grad():
            theirs = reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
        for key, got in head_outputs(model(ids, mask)).items():
            np.testing.assert_allclose(got, getattr(theirs, key).numpy(), atol=TOLERANCE, rtol=0, err_msg=key)
    assert reference_model(tmp_path / "BartForSequenceClassification").config.id2label == {0: "no", 1: "yes"}


def test_train_py_trains_an_encoder_decoder_classifier(tmp_path):
    """configs/bert_classification.yaml on a fresh tiny T5: the rows' closing [SEP] becomes its EOS, where
    the classifier pools; the held-out loss falls well below chance's and the accuracy rises above it."""
    from jaxformer.train import run_config
    from jaxformer.train.data import make_tokenizer
    from jaxformer.train.predict import classify
    from jaxformer.train.run import train

    cfg = run_config.load("configs/bert_classification.yaml", [
        "model.preset=tiny-t5", "model.overrides.vocab_size=360", "train.steps=30", "eval.every=15", "train.log_every=15", f"run.dir={tmp_path}",
        "train.sample_tokens=0", "checkpoint.every=0"])
    result = train(cfg, progress=False)
    evals = [h for h in result["history"] if "eval_loss" in h]
    assert evals[-1]["eval_loss"] < min(evals[0]["eval_loss"], 0.5 * np.log(2))  # chance: log 2 (two classes)
    assert evals[-1]["eval_accuracy"] > 0.8
    model = result["model"]
    assert (model.config.family, model.config.head, model.config.tokens.eos) == (
        "encoder_decoder", "sequence_classification", model.config.tokens.decoder_start)
    # jaxformer predict's classifier reads it (no token types: the decoder reads the row shifted right)
    predicted = classify(model, make_tokenizer("bytes"), 48, "the parser was clear and fast", None)
    assert set(predicted["probabilities"]) == {"negative", "positive"}


def zero_shot(model, tokenizer, text: str, labels: list[str], template: str = "This example is {}.",
              multi_label: bool = False) -> dict[str, float]:
    """The zero-shot recipe of docs (transformers' zero-shot-classification pipeline, written out): each label's
    hypothesis read with the text as one NLI pair; single-label, a softmax of the entailment logits over the
    labels; multi-label (or one label), each label's own softmax over contradiction and entailment."""
    names = [name.lower() for name in model.config.head_options.label_names]
    entail = next(i for i, name in enumerate(names) if name.startswith("entail"))
    logits = np.stack([np.asarray(model([tokenizer.encode(text, template.format(label)).ids]).logits[0])
                       for label in labels])
    chosen = logits[:, [-1 if entail == 0 else 0, entail]] if multi_label or len(labels) == 1 else logits[:, entail]
    scores = np.exp(chosen - chosen.max(-1, keepdims=True))
    scores = scores / scores.sum(-1, keepdims=True)
    return dict(zip(labels, (scores[:, 1] if chosen.ndim == 2 else scores).tolist()))


def test_the_zero_shot_recipe_equals_transformers_pipeline(tmp_path):
    """bart-large-mnli's config on tiny random weights, a word-level tokenizer with BART's pair template: the
    recipe's scores are the pipeline's, single- and multi-label."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = "<s> <pad> </s> <unk> one day i will see the world this example is travel cooking dancing .".split()
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    save_checkpoint("bart-seqcls", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(BART_LARGE_MNLI))
    model = jf.from_pretrained(tmp_path)
    classifier = transformers.pipeline(
        "zero-shot-classification", model=reference_model(tmp_path),
        tokenizer=transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                                       pad_token="<pad>", unk_token="<unk>"))
    text, labels = "one day i will see the world", ["travel", "cooking", "dancing"]
    for multi_label in (False, True):
        theirs = classifier(text, labels, multi_label=multi_label)
        ours = zero_shot(model, tokenizer, text, labels, multi_label=multi_label)
        np.testing.assert_allclose([ours[label] for label in theirs["labels"]], theirs["scores"], atol=1e-6, rtol=0)


def test_an_encoder_decoder_head_no_hugging_face_class_holds_is_not_exported_without_it():
    """T5Gemma's classes here are the base model and the LM: a classifier on its layout has no export
    target, rather than one that drops the head."""
    from jaxformer.interop.registry import hf_target

    cfg = jf.config("tiny-t5gemma")
    assert hf_target(cfg)[0] == "t5gemma"
    with pytest.raises(ValueError, match="has no Hugging Face architecture"):
        hf_target(cfg.replace(head="sequence_classification", pooler=True, num_labels=2, eos_token_id=1,
                              logits_softcap=None))
