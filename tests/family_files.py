"""What the test files of single decoder families share (test_olmo2.py, test_starcoder2.py, test_cohere.py,
test_granite_smollm3_stablelm.py, test_olmoe_granitemoe_ernie.py, ...): a tiny checkpoint under another
config.json, parity with transformers on a padded batch, a config.json read quietly and as transformers writes it,
greedy or beam generation against transformers' with left padding, and the QLoRA run of test_family_tree.py
started from a file."""

from __future__ import annotations

import copy
import json
import shutil
import warnings

import numpy as np
import torch
import transformers

import jaxformer as jf
from jaxformer.compare import compare, format_table, reference_model
from jaxformer.interop.hf import config_from_hf
from jaxformer.train import run_config
from jaxformer.train.run import train

TOLERANCE = 1e-5
# The sizes of the tiny checkpoints (tests/hf_factory.py's LLaMA-like ones), for published files made tiny
TINY = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=2, num_key_value_heads=2,
            vocab_size=97, max_position_embeddings=64, initializer_range=0.2)
# test_family_tree.py's QLoRA run: an int8 base with adapters on q, v and the MLP input, 8 steps on the bytes tokenizer
QLORA = ["train.steps=8", "train.batch_size=8", "train.seq_len=32", "train.log_every=2", "eval.every=8",
         "eval.batches=1", "optim.warmup_steps=1", "train.sample_tokens=0", "checkpoint.every=0", "optim.lr=2e-2",
         "finetune.lora.rank=4", "finetune.lora.targets=q,v,wi", "finetune.lora.base_dtype=int8",
         "model.overrides.vocab_size=227"]  # the bytes tokenizer's ids; the tiny files hold 97 rows


def rewritten(source, folder, hf: dict):
    """A copy of the checkpoint ``source`` with ``hf`` as its config.json."""
    shutil.copytree(source, folder)
    (folder / "config.json").write_text(json.dumps(hf))
    return folder


def matches_transformers(folder, length: int = 9, tolerance: float = TOLERANCE) -> None:
    """Every layer and the logits within ``tolerance`` of transformers' on two rows, the second right-padded by 3."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 97, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, length - 3:] = 0
    rows = compare(folder, ids, mask)
    assert all(r.max_abs <= tolerance for r in rows), format_table(rows, tolerance)


def read(hf: dict) -> jf.ModelConfig:
    """The ModelConfig of a config.json (the tiny files' out-of-vocabulary warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config_from_hf(copy.deepcopy(hf))


def as_transformers_writes_it(hf: dict) -> dict:
    """The config.json transformers' config class writes for ``hf``: its transformers-5 form, every key spelled out."""
    config = transformers.CONFIG_MAPPING[hf["model_type"]].from_dict(copy.deepcopy(hf))
    return json.loads(config.to_json_string(use_diff=False))


def generates_as_transformers(folder, **reference_kwargs) -> None:
    """Three prompts of 7 tokens, two left-padded, 10 new tokens: greedy search and beam search (3 beams)
    token-identical, each with an EOS that the first row writes early, so stopping is exercised (one load of
    each model for both searches). The EOS is read off transformers' search without it: ours then compiles
    once a search (the EOS ids are part of the compiled program), and equal tokens are what is asserted.
    ``reference_kwargs`` go to transformers' generate alone (use_cache=False: where its cached step departs from
    its own full forward)."""
    model, reference = jf.from_pretrained(folder), reference_model(folder)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 97, (3, 7))
    mask = np.ones_like(ids)
    mask[1, :2], mask[2, :4] = 0, 0
    ids = ids * mask

    def theirs(**kwargs):
        with torch.no_grad():
            return reference.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), **reference_kwargs,
                                      **kwargs).numpy()

    for num_beams in (1, 3):
        kwargs = dict(max_new_tokens=10, num_beams=num_beams, do_sample=False, length_penalty=1.0)
        kwargs["eos_token_id"] = int(theirs(**kwargs)[0, 7 + 2])
        np.testing.assert_array_equal(model.generate(ids, mask, **kwargs), theirs(**kwargs),
                                      err_msg=f"num_beams={num_beams}")


def qlora_loss_falls(folder, run_dir, *overrides: str) -> None:
    """The QLoRA run from ``folder`` (``overrides`` after QLORA's) keeps finite losses and lowers them by 0.2."""
    cfg = run_config.load(None, QLORA + list(overrides) + [f"model.init_from=hf:{folder}", f"run.dir={run_dir}"])
    losses = [record["loss"] for record in train(cfg, progress=False)["history"]]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.2, losses


# The image tests' inputs (test_contrastive.py, test_cli_images.py): drawn pictures and a word tokenizer
def shapes_picture(colour: tuple[int, int, int], shape: str):
    """A 44x36 RGB picture (not square, so the processor resizes and crops) of a shape on a gradient."""
    from PIL import Image, ImageDraw

    gradient = np.linspace(0, 255, 44, dtype=np.uint8)[None, :, None].repeat(36, 0).repeat(3, 2)
    image = Image.fromarray(gradient)
    draw = ImageDraw.Draw(image)
    (draw.ellipse if shape == "circle" else draw.rectangle)((8, 6, 34, 30), fill=colour)
    return image


def word_tokenizer(folder, vocab_size: int = 97):
    """A word-level tokenizer.json + tokenizer_config.json (pad 1, bos 0, eos 2: the tiny CLIP's ids) that both
    transformers and jaxformer read; every word of test_contrastive.py's captions has an id under ``vocab_size``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["<bos>", "<pad>", "<eos>", "<unk>", "a", "photo", "of", "red", "blue", "circle", "square"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A <eos>",
                                                             special_tokens=[("<bos>", 0), ("<eos>", 2)])
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                "pad_token": "<pad>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))


# Whisper's tiny checkpoints and audio (test_whisper_generation.py, test_transcribe_cli.py)
RATE = 16000
# Whisper's vocabulary layout, shrunk: text, then <|endoftext|>, <|startoftranscript|>, the languages, the tasks,
# <|startoflm|>, <|startofprev|>, <|nospeech|>, <|notimestamps|>, and 1501 timestamps (0.00 ... 30.00 s) as published
EOS = 50
SOT = EOS + 1
LANGUAGES = {f"<|{code}|>": SOT + 1 + i for i, code in enumerate(("en", "de", "fr", "es"))}
TRANSLATE, TRANSCRIBE, START_OF_LM, PREV, NO_SPEECH, NO_TIMESTAMPS = range(SOT + 5, SOT + 11)
VOCAB = NO_TIMESTAMPS + 1 + 1501
NEW = 10  # max_new_tokens per window


def tiny_whisper(folder, multilingual: bool, seed: int):
    """A tiny WhisperForConditionalGeneration saved by transformers with Whisper's generation_config.json keys."""
    torch.manual_seed(seed)
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, num_mel_bins=80, max_source_positions=1500,
        max_target_positions=64, init_std=0.2, pad_token_id=EOS, bos_token_id=EOS, eos_token_id=EOS,
        decoder_start_token_id=SOT, begin_suppress_tokens=None, suppress_tokens=None)
    model = transformers.WhisperForConditionalGeneration(config)
    with torch.no_grad():  # timestamps scaled down: without the timestamp rules text wins, so a window ends at once
        model.model.decoder.embed_tokens.weight[NO_TIMESTAMPS + 1:] *= 0.1  # (the head is tied to the embeddings)
    model.save_pretrained(folder)
    settings = dict(bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS, decoder_start_token_id=SOT, max_length=64,
                    begin_suppress_tokens=[11, EOS], no_timestamps_token_id=NO_TIMESTAMPS,
                    suppress_tokens=[1, 2, 7, SOT, TRANSLATE, TRANSCRIBE, START_OF_LM, PREV, NO_SPEECH],
                    max_initial_timestamp_index=50, prev_sot_token_id=PREV, is_multilingual=multilingual,
                    forced_decoder_ids=[[1, None], [2, TRANSCRIBE]] if multilingual else [[1, NO_TIMESTAMPS]])
    if multilingual:
        settings.update(lang_to_id=LANGUAGES, task_to_id={"translate": TRANSLATE, "transcribe": TRANSCRIBE})
    (folder / "generation_config.json").write_text(json.dumps(settings))
    return transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval(), jf.from_pretrained(folder)


def whisper_audio(seconds: float, pitch: float, seed: int) -> np.ndarray:
    """A vowel-like tone gliding in pitch, its partials shaped by two formants, over a little noise."""
    t = np.arange(int(seconds * RATE)) / RATE
    phase = 2 * np.pi * np.cumsum(pitch * (1 + 0.2 * np.sin(2 * np.pi * 0.3 * t))) / RATE
    voice = sum((np.exp(-((k * pitch - 700) / 300) ** 2) + 0.5 * np.exp(-((k * pitch - 1800) / 400) ** 2))
                * np.sin(k * phase) for k in range(1, 20))
    noise = 0.02 * np.random.default_rng(seed).standard_normal(len(t))
    return (0.3 * voice * (0.6 + 0.4 * np.sin(2 * np.pi * 0.5 * t)) + noise).astype(np.float32)
