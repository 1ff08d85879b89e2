"""The held-out published configurations, tried as a new user would (issue 50, "Measured").

For each published config.json (every key kept, sizes made tiny: widths, layers, vocabularies, experts), this builds
transformers' model from it with random weights (torch.manual_seed(0); norms and biases moved off their 1s and 0s),
saves it with save_pretrained, loads the folder with ``jf.from_pretrained(folder, dtype="float32")`` (the weights'
dtype, where the file says bfloat16) and compares every hidden state, attention map and the logits with
transformers' on a batch of 2 x 12 tokens (the second row right-padded by 3), in float32. Each file is tried in both
config formats: as published (legacy keys kept) and as transformers 5 writes it (the config.json save_pretrained
wrote). Sets (benchmarks/held_out_configs.py):

  1. every model type the library claims: tests/published_configs.py's files, and for each claimed type they do
     not hold, that type's file of set 2, set 3 or a few more;
  2. 31 published decoder configurations of 2024-2026;
  3. the newest rows of issue 50: DeepSeek V4, Qwen3.5 dense and MoE, Gemma 4 dense and MoE, Mistral Large 4, Mistral
     Small 4, GLM-5, Longformer, BigBird, BigBird-Pegasus;
  4. issue 51's image models: CLIP ViT-B/32, SigLIP base, LLaVA-1.5-7B, Llama 3.2 11B Vision, Qwen2.5-VL 7B, Gemma 3 4B;
  5. issue 52's Whisper files: whisper-tiny, whisper-large-v3, whisper-large-v3-turbo, distil-large-v3.

An image model is fed random pixels beside its ids (``model_inputs``): a dual encoder (CLIP, SigLIP) one image a row,
a decoder reading images one image a row, its placeholders written into the ids as its processor expands them.
Whisper reads random log-mel frames in place of ids (2 x max_source_positions of them), the ids its decoder's.

A multimodal wrapper file (gemma4, qwen3_5, qwen3_5_moe, mistral_large4, kimi_k25, llama4) is built as transformers'
wrapper model (its vision tower made tiny too) and jaxformer loads its text model, as a user loading it would. Kimi
K2.5's text layers are renamed to its published layout after transformers saves them (as_published_layout). A file whose
quantization_config says block-wise FP8 (DeepSeek-V3's) is stored as published, its Linear weights in FP8 blocks, and
transformers' reference reads that folder with its own FP8 loader (as_published_fp8).

    python benchmarks/held_out.py [--set 1|2|3] [NAME ...]

A row: set, name, model_type, then per format whether it loads (or the first line of the refusal), the largest
absolute difference of the logits and, in brackets, of every compared tensor; and pass: 'yes' where both formats load
with every tensor within 1e-5; 'rounding' where a hidden state is past 1e-5 but jaxformer's float32 numbers are as
close to transformers' float64 ones as transformers' own float32 numbers are (at most twice as far: the model's float32
rounding, not a mapping); 'wrong numbers' where a format loads past that; 'no' where a format is refused. The footer
counts each per set. A file whose two formats read to the same ModelConfig is compared once (the same function of the
same weights). Exit status 1 when any file loads with wrong numbers.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from held_out_configs import RESERVED, SETS, UNCOVERED  # (this folder: the script's, or the importer's path)

TOLERANCE = 1e-5
LENGTH, PADDED = 12, 3
FORMATS = ("published", "transformers 5")


def reference_model(hf: dict):
    """transformers' model of a config.json dict, read as transformers reads the file, eager attention, float32,
    random weights with norms and biases moved off their initial values (so a mapping that swaps them shows)."""
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(hf))
        config = transformers.AutoConfig.from_pretrained(folder)
    torch.manual_seed(0)
    model = model_class(hf)._from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    model.config.return_dict = True  # outputs by name (Pegasus' file says false); no number depends on it
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 or name.endswith((".q_norm.weight", ".k_norm.weight")):
                p.add_(torch.randn_like(p) * 0.1)
        for name, buffer in model.named_buffers():
            if name.endswith(("e_score_correction_bias", "final_logits_bias")):
                buffer.copy_(torch.randn_like(buffer) * 0.1)
            elif name.endswith(".layer_scalar"):
                buffer.copy_(1 + torch.randn_like(buffer) * 0.1)
    return model


def model_class(hf: dict):
    """The class ``architectures`` names; where transformers spells it otherwise (a remote-code name such as
    PhiMoEForCausalLM or KimiK25ForConditionalGeneration), the model type's class for the same task; a file naming
    none: the base model, as AutoModel gives it."""
    import transformers
    from transformers.models.auto import modeling_auto

    named = (hf.get("architectures") or [None])[0]
    if named is None:
        return getattr(transformers, modeling_auto.MODEL_MAPPING_NAMES[hf["model_type"]])
    if hasattr(transformers, named):
        return getattr(transformers, named)
    for suffix, table in (("ForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
                          ("ForConditionalGeneration", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES")):
        if named.endswith(suffix):
            return getattr(transformers, getattr(modeling_auto, table)[hf["model_type"]])
    raise ValueError(f"transformers has no class {named}")


def text_config(hf: dict) -> dict:
    return hf.get("text_config") or hf


def batch(hf: dict, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two rows of LENGTH ids away from the special ids (the lowest and the RESERVED last), the second right-padded
    with the pad id."""
    text = text_config(hf)
    vocab = text.get("vocab_size") or hf.get("vocab_size")
    ids = rng.integers(3, vocab - RESERVED, size=(2, LENGTH))
    mask = np.ones_like(ids)
    mask[1, LENGTH - PADDED:] = 0
    pad = text.get("pad_token_id", hf.get("pad_token_id"))
    ids[1, LENGTH - PADDED:] = pad if isinstance(pad, int) and 0 <= pad < vocab else 0
    return ids, mask


def model_inputs(hf: dict, ids: np.ndarray, mask: np.ndarray, rng: np.random.Generator
                 ) -> tuple[np.ndarray | None, np.ndarray | None, dict]:
    """(ids, mask, the other inputs named as transformers names them) of an image or audio model; the ids unchanged
    and nothing else for a text model. A decoder reading images gets one image a row, its placeholders (as its
    processor expands them) after the row's second token (the padded row's are real tokens too); Whisper reads
    random log-mel frames, the ids become its decoder's."""
    kind, vision, rows = hf["model_type"], hf.get("vision_config"), ids.shape[0]
    if kind == "whisper":  # log-mel frames (every one real) in place of ids; the ids are the decoder's, unpadded
        frames = 2 * hf.get("max_source_positions", 1500)
        features = rng.standard_normal((rows, hf.get("num_mel_bins", 80), frames)).astype(np.float32)
        return None, None, {"input_features": features, "decoder_input_ids": ids}
    if kind not in ("clip", "siglip", "llava", "mllama", "qwen2_5_vl", "gemma3") or vision is None:
        return ids, mask, {}
    size, patch = vision.get("image_size", 224), vision.get("patch_size", 14)
    channels = vision.get("num_channels", vision.get("in_chans", 3))

    def with_placeholders(tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
        inserted = np.tile(np.asarray(tokens), (rows, 1))
        return (np.concatenate([ids[:, :2], inserted, ids[:, 2:]], 1),
                np.concatenate([mask[:, :2], np.ones_like(inserted), mask[:, 2:]], 1))

    pixels = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    if kind in ("clip", "siglip"):
        return ids, mask, {"pixel_values": pixels(rows, channels, size, size)}
    token = hf.get("image_token_index", hf.get("image_token_id"))
    if kind == "llava":
        per_image = (size // patch) ** 2 + (hf.get("vision_feature_select_strategy") == "full")
        return *with_placeholders([token] * per_image), {"pixel_values": pixels(rows, channels, size, size)}
    if kind == "gemma3":  # boi, the pooled image tokens, eoi; the image's tokens marked for bidirectional attention
        tokens = [hf["boi_token_index"], *[token] * hf["mm_tokens_per_image"], hf["eoi_token_index"]]
        ids, mask = with_placeholders(tokens)
        return ids, mask, {"pixel_values": pixels(rows, channels, size, size),
                           "token_type_ids": (ids == token).astype(np.int64)}
    if kind == "qwen2_5_vl":  # a 4 x 6 grid of patches a picture (one frame), merged 2 x 2 into 6 image tokens
        merge, temporal = vision.get("spatial_merge_size", 2), vision.get("temporal_patch_size", 2)
        grid = np.tile([[1, 2 * merge, 3 * merge]], (rows, 1))
        flat = pixels(int(grid.prod(axis=1).sum()), channels * temporal * patch * patch)
        tokens = [hf.get("vision_start_token_id"), *[token] * 6, hf.get("vision_end_token_id")]
        ids, mask = with_placeholders(tokens)
        # the processor's token types: transformers' forward takes M-RoPE positions only where it is given them
        return ids, mask, {"pixel_values": flat, "image_grid_thw": grid, "mm_token_type_ids": (ids == token) * 1}
    # mllama: one image a row, laid out as 2 of its max_num_tiles tiles (aspect ratio 1 x 2, the second of
    # supported_aspect_ratios); every text token after the image token sees both tiles
    tiles = vision.get("max_num_tiles", 4)
    ratios = vision.get("supported_aspect_ratios") or [[1, 1], [1, 2]]
    ids, mask = with_placeholders([token])
    cross = np.zeros((rows, ids.shape[1], 1, tiles), np.int64)
    cross[:, 2:, 0, :2] = 1
    return ids, mask, {"pixel_values": pixels(rows, 1, tiles, channels, size, size),
                       "aspect_ratio_ids": np.full((rows, 1), ratios.index([1, 2]) + 1),
                       "aspect_ratio_mask": np.tile([[[1, 1] + [0] * (tiles - 2)]], (rows, 1, 1)),
                       "cross_attention_mask": cross}


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:160]


def float64_distances(reference, model, ids, mask, extra: dict) -> tuple[float, float] | None:
    """The largest distance of transformers' float32 and of jaxformer's float32 hidden states and logits to
    transformers' float64 ones (real tokens only): the float32 rounding a row's differences are judged against.
    An encoder-decoder's are its decoder's (fed the source shifted right, as compare() feeds it). None where it
    cannot be run (a model whose kernels have no float64)."""
    import torch

    double = copy.deepcopy(reference).double()
    for module in double.modules():  # the experts' grouped matmul has no float64 kernel; the loop does
        if hasattr(module, "config") and hasattr(module.config, "_experts_implementation"):
            module.config._experts_implementation = "eager"
    kwargs = dict(output_hidden_states=True, **{key: torch.as_tensor(value) for key, value in extra.items()})
    if ids is not None:
        kwargs.update(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    ours_kwargs, valid, states = dict(extra), 1 if mask is None else mask[..., None], "hidden_states"
    if "input_features" in extra:  # (Whisper: every frame and decoder token real)
        states = "decoder_hidden_states"
    elif getattr(double.config, "is_encoder_decoder", False):
        start = model.config.tokens.decoder_start if model.config.tokens.decoder_start is not None else 0
        decoder_ids = np.concatenate([np.full((ids.shape[0], 1), start), ids[:, :-1]], 1)
        kwargs.update(decoder_input_ids=torch.as_tensor(decoder_ids),
                      decoder_attention_mask=torch.ones(decoder_ids.shape, dtype=torch.long))
        ours_kwargs, valid, states = dict(decoder_input_ids=decoder_ids), 1, "decoder_hidden_states"
    if model.config.family == "dual_encoder":  # two towers, no one stack of states to judge: no arbiter
        return None
    try:
        with torch.no_grad():
            wide = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in kwargs.items()}
            theirs, truth = reference(**kwargs), double(**wide)
        ours = model(ids, mask, output_hidden_states=True, **ours_kwargs)
    except Exception:  # noqa: BLE001 - no arbiter: the row stays as measured
        return None

    def distance(out, numpy) -> float:
        mine = out.hidden_states if out is ours else getattr(out, states)
        pairs = [*zip(mine, getattr(truth, states)), (out.logits, truth.logits)]
        return max(float(np.abs((numpy(a) - b.numpy()) * valid).max()) for a, b in pairs if a is not None)

    return distance(theirs, lambda x: x.numpy().astype(np.float64)), distance(ours, lambda x: np.asarray(x, np.float64))


def try_format(folder: Path, reference, ids, mask, extra: dict, earlier=None) -> tuple[tuple, object]:
    """((loads, max abs of the logits, max abs of every compared tensor, verdict), the model) of the folder as it
    stands. The verdict: 'yes' within TOLERANCE; 'rounding' past it, with jaxformer's float32 as close to
    transformers' float64 as transformers' own float32 is (at most twice as far); else 'no'. ``earlier``: the other
    format's (result, model); a model whose config equals that one's is the same function of the same weights, so
    its comparison is not run twice."""
    import jaxformer as jf
    from jaxformer.compare import compare

    try:
        model = jf.from_pretrained(folder, dtype="float32")  # the weights' dtype: many files say bfloat16
    except Exception as err:  # noqa: BLE001 - any refusal is the row's answer
        return ("refused: " + first_line(err), None, None, None), None
    if earlier is not None and earlier[1] is not None and \
            model.config.replace(name=earlier[1].config.name) == earlier[1].config:
        return earlier[0], model
    try:
        named = ("pixel_values", "input_features", "decoder_input_ids")  # compare's own arguments; the rest an image's
        rows = compare(folder, ids, mask, model=model, reference=reference,
                       image_inputs={k: v for k, v in extra.items() if k not in named},
                       **{k: v for k, v in extra.items() if k in named})
    except Exception as err:  # noqa: BLE001 - loads but the forward or the comparison fails: a wrong load
        return ("loads, compare fails: " + first_line(err), None, None, "no"), model
    logits = [r.max_abs for r in rows if r.name == "logits"]
    worst = max(r.max_abs for r in rows)
    verdict = "yes" if worst <= TOLERANCE else "no"
    if verdict == "no":
        distances = float64_distances(reference, model, ids, mask, extra)
        hidden_worst = max(r.max_abs for r in rows if not r.name.startswith(("attention", "encoder", "cross")))
        if distances is not None and distances[1] <= 2 * distances[0] and hidden_worst == worst:
            verdict = "rounding"
    return ("yes", (logits[0] if logits else worst), worst, verdict), model


def as_published_layout(folder: Path, model_type: str) -> None:
    """Kimi K2.5's text layers renamed to the published layout: transformers 5 saves them as
    language_model.model.blocks.N (its reverse of the vision tower's blocks -> layers rename); the files users
    download say layers.N."""
    if model_type != "kimi_k25":
        return
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    save_file({n.replace("language_model.model.blocks.", "language_model.model.layers."): t
               for n, t in tensors.items()}, path, metadata={"format": "pt"})


def as_published_fp8(folder: Path, hf: dict, reference):
    """A file whose quantization_config says block-wise 'fp8' (DeepSeek-V3's) stored as its publisher stores it: each
    Linear weight (``*_proj*.weight``) float8_e4m3fn with its per-block ``weight_scale_inv`` (jaxformer/interop/fp8.py's
    quantize, transformers' arithmetic), and the reference read back from that folder by transformers' own FP8 loader
    (dequantize=True, its CPU path), so both sides compute with the weights a user's download holds."""
    quantization = hf.get("quantization_config") or {}
    if quantization.get("quant_method") != "fp8":
        return reference
    import re

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from jaxformer.interop import fp8

    block = fp8.weight_block(quantization)  # (absent: [128, 128], as FineGrainedFP8Config defaults)
    path = folder / "model.safetensors"
    tensors = load_file(path)
    for name in [n for n, t in tensors.items() if re.search(r"_proj(_with_mqa)?\.weight$", n) and t.dim() >= 2]:
        weight, scale = fp8.quantize(tensors[name].float().numpy(), block)
        tensors[name] = torch.from_numpy(weight.view(np.uint8)).view(torch.float8_e4m3fn)
        tensors[name + fp8.SCALE] = torch.from_numpy(scale)
    save_file(tensors, path, metadata={"format": "pt"})  # (the config.json transformers wrote keeps the file's setting)
    dequantizing = transformers.FineGrainedFP8Config(weight_block_size=block, dequantize=True)
    loaded = type(reference).from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                             quantization_config=dequantizing).eval()
    loaded.config.return_dict = True
    return loaded


def measure(hf: dict) -> dict:
    """Both formats of one published file: {format: (loads, logits max abs, worst max abs)}."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        folder = Path(tmp)
        try:
            reference = reference_model(copy.deepcopy(hf))
            reference.save_pretrained(folder)
        except Exception as err:  # noqa: BLE001 - the file as written here is wrong, not the library
            return {f: ("transformers fails: " + first_line(err), None, None, None) for f in FORMATS}
        as_published_layout(folder, hf["model_type"])
        reference = as_published_fp8(folder, hf, reference)
        rng = np.random.default_rng(0)
        ids, mask, extra = model_inputs(hf, *batch(hf, rng), rng)
        written = (folder / "config.json").read_text()
        out, earlier = {}, None
        for name, text in zip(FORMATS, (json.dumps(hf), written)):
            (folder / "config.json").write_text(text)
            out[name], model = try_format(folder, reference, ids, mask, extra, earlier)
            earlier = out[name], model
    return out


def verdict(result: dict) -> str:
    """The row's pass: 'yes' where both formats load within TOLERANCE, 'rounding' where both load and the worst is
    float32 rounding (try_format), 'wrong numbers' where a format loads past that, else 'no' (refused)."""
    verdicts = [v for _, _, _, v in result.values()]
    if "no" in verdicts:
        return "wrong numbers"
    if all(v == "yes" for v in verdicts):
        return "yes"
    return "rounding" if all(v in ("yes", "rounding") for v in verdicts) else "no"


def cell(loads: str, logits: float | None, worst: float | None, _) -> str:
    if loads != "yes":
        return loads
    return f"yes, {logits:.1e} ({worst:.1e})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", type=int, choices=sorted(SETS), action="append", help="only this set (repeatable)")
    parser.add_argument("names", nargs="*", help="only these files")
    args = parser.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    done: dict[int, dict] = {}  # a file shared by two sets is measured once
    start = time.perf_counter()
    print("| set | name | model_type | as published: loads, max abs logits (all tensors) "
          "| as transformers 5 writes it | pass |")
    print("|---|---|---|---|---|---|")
    totals = {}
    for number in args.set or sorted(SETS):
        files = {name: hf for name, hf in SETS[number].items() if not args.names or name in args.names}
        for name, hf in files.items():
            if id(hf) not in done:
                done[id(hf)] = measure(hf)
            result = done[id(hf)]
            row = verdict(result)
            count = totals.setdefault(number, {"yes": 0, "rounding": 0, "wrong numbers": 0, "no": 0})
            count[row] += 1
            cells = " | ".join(cell(*result[f]) for f in FORMATS)
            print(f"| {number} | {name} | {hf['model_type']} | {cells} | {row} |", flush=True)
    print()
    for number, count in totals.items():
        print(f"set {number}: loads with parity {count['yes']} of {sum(count.values())} (both formats), "
              f"{count['rounding']} more within float32 rounding; loads with wrong numbers: {count['wrong numbers']}")
    if 1 in totals and not args.names:
        print(f"model types the library claims that no file here holds: {', '.join(UNCOVERED) or 'none'}")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 1 if any(count["wrong numbers"] for count in totals.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
