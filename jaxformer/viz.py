"""Pictures (PNG) of who sees whom: the visibility patterns of the three families, drawn from the mask
code the models run (``layers.attention.visibility_mask``), and a trained model's attention weights on a
text. ``jaxformer viz masks`` and ``jaxformer viz attention`` call the two commands at the bottom.

An edge module, like generate.py: it imports the package, nothing in the package imports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from jaxformer.layer_plan import local_layers
from jaxformer import checks
from jaxformer.cache import Memory
from jaxformer.layers.attention import (layer_patterns, left_padded_positions, memory_visibility_mask,
                                        visibility_mask)
from jaxformer.presets import config as preset_config
from jaxformer.vision.loading import image_tower, refuse_unprepared_images

MAX_LENGTH = 64  # tokens per picture: beyond this a cell is under a pixel wide and the tick labels collide
VISIBLE, MASKED = "#1f4e99", "#e8e8e8"
PICTURE_DPI = 100


# --------------------------------------------------------------------------------------------------
# The matrices


@dataclasses.dataclass(frozen=True)
class Panel:
    """One heatmap: ``visible`` [T, S] (may query t attend to key s?) with its axis tick labels.
    ``split``: a line before this key column (Transformer-XL: memory slots | this call's tokens)."""

    title: str
    visible: np.ndarray
    query_labels: list[str]
    key_labels: list[str]
    split: int | None = None


@dataclasses.dataclass(frozen=True)
class Picture:
    """One visibility pattern: a file name (``name``.png), a title, one or two panels, and the short
    title the overview grid uses."""

    name: str
    title: str
    panels: tuple[Panel, ...]
    short: str


def check_length(length: int) -> int:
    if not isinstance(length, int) or isinstance(length, bool) or not 2 <= length <= MAX_LENGTH:
        raise ValueError(f"--length={length!r}; valid: an int from 2 to {MAX_LENGTH} (tokens per picture)")
    return length


def indexed_positions(batch: int, length: int) -> jnp.ndarray:
    """Positions 0..T-1 in every row: what the embeddings give a full pass without position_ids."""
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))


def _rows(mask, row: int = 0) -> np.ndarray:
    return np.asarray(mask[row, 0], bool)


def _numbers(count: int, valid=None, pad: str = "pad") -> list[str]:
    """Tick labels: each position's number, or ``pad`` where ``valid`` says the token is padding."""
    return [str(i) if valid is None or valid[i] else pad for i in range(count)]


def mask_pictures(length: int = 12) -> list[Picture]:
    """Every visibility pattern of the three families at ``length`` tokens, each matrix one
    ``visibility_mask`` call with positions and validity as the stacks build them."""
    T = check_length(length)
    window = max(2, T // 4)  # small enough that the band shows inside T tokens
    prefix = max(1, T // 3)
    one = indexed_positions(1, T)
    plain = _numbers(T)
    pictures = []

    def single(name, title, short, mask, query_labels=plain, key_labels=plain):
        pictures.append(Picture(name, title, (Panel(title, _rows(mask), query_labels, key_labels),), short))

    single("encoder_bidirectional", "encoder: bidirectional", "encoder: bidirectional",
           visibility_mask("bidirectional", one, one))
    single("decoder_causal", "decoder: causal", "decoder: causal", visibility_mask("causal", one, one))
    single("prefix_lm", f"prefix-LM: prefix of {prefix} tokens", f"prefix-LM, prefix {prefix}",
           visibility_mask("prefix", one, one, prefix_lengths=jnp.array([prefix])))

    # Cross-attention: decoder queries over the encoder output, whose trailing pads are masked; the
    # source keys are numbered 0..S-1 as ``Stack._cross_attention_inputs`` numbers them.
    target, pads = max(2, (2 * T) // 3), max(1, T // 4)
    source_valid = np.arange(T) < T - pads
    cross = visibility_mask("bidirectional", indexed_positions(1, target), one, jnp.asarray(source_valid)[None])
    single("cross_attention", f"cross-attention: decoder × encoder, {pads} pads", f"cross-attention, {pads} pads",
           cross, query_labels=_numbers(target), key_labels=_numbers(T, source_valid))

    single("sliding_window", f"sliding window of {window} (Mistral)", f"sliding window {window}",
           visibility_mask("sliding", one, one, window=window))

    # GPT-3's alternating layers: which layer is banded comes from the preset (``layer_plan.local_layers``).
    gpt3 = preset_config("gpt3-175b")
    panels = []
    for layer in (0, 1):
        banded = local_layers(gpt3)[layer]
        dense_pattern, banded_pattern = layer_patterns("alternating", gpt3.attention)
        pattern = banded_pattern if banded else dense_pattern
        mask = visibility_mask(pattern, one, one, window=window)
        kind = f"banded ({pattern}, window {window})" if banded else f"dense ({pattern})"
        panels.append(Panel(f"layer {layer}: {kind}", _rows(mask), plain, plain))
    pictures.append(Picture("alternating", "GPT-3: alternating dense and banded layers", tuple(panels),
                            "GPT-3 alternating"))

    # Llama 4: its rotary layers see their own chunk of positions (the preset's chunk drawn at this length)
    llama4 = preset_config("llama-4-scout-17b-16e")
    chunk_pattern = layer_patterns("alternating", llama4.attention, llama4.layer_types)[1]
    single("chunked", f"chunks of {window} (Llama 4)", f"chunks of {window}",
           visibility_mask(chunk_pattern, one, one, chunk=window))

    t5gemma = preset_config("t5gemma-2b-2b")
    pattern = layer_patterns("bidirectional", t5gemma.attention)[1]
    single("bidirectional_sliding", f"T5Gemma encoder, sliding layer: |t - s| <= {window}",
           f"T5Gemma encoder, |t-s| <= {window}", visibility_mask(pattern, one, one, window=window))

    # Left padding: a batch of two rows, the second padded on the left, positions as generation gives them.
    pad = max(1, T // 3)
    valid = np.stack([np.ones(T, bool), np.arange(T) >= pad])
    at = left_padded_positions(jnp.asarray(valid))
    mask = visibility_mask("causal", at, at, jnp.asarray(valid))
    positions = np.asarray(at)
    panels = []
    for row, what in ((0, "no padding"), (1, f"left-padded by {pad}")):
        labels = [str(p) if v else "pad" for p, v in zip(positions[row], valid[row])]
        panels.append(Panel(f"batch row {row}: {what}", _rows(mask, row), labels, labels))
    pictures.append(Picture("left_padding", "causal decoder: a batch with a left-padded row", tuple(panels),
                            "left padding"))

    # Packed documents (data.packing=documents): one row of up to three documents, each at its own positions
    # (as ``Embeddings.document_positions`` restarts them), a token seeing only its own document, causally.
    lengths = np.diff(np.linspace(0, T, min(3, T) + 1).astype(int))
    segments = jnp.asarray(np.repeat(np.arange(1, len(lengths) + 1), lengths))[None]
    at = jnp.asarray(np.concatenate([np.arange(n) for n in lengths]))[None]
    labels = [f"{'abc'[d]}{p}" for d, n in enumerate(lengths) for p in range(n)]
    single("packed_documents", f"packed documents: {len(lengths)} in one causal row", "packed documents",
           visibility_mask("causal", at, at, segments=(segments, segments)), labels, labels)

    # Transformer-XL: an empty memory of M slots rolled forward by an earlier segment shorter than M
    # (cache.Memory's own ``extend``), so its oldest slots are still empty.
    slots = max(2, T // 2)
    earlier = max(1, slots // 2)
    memory = Memory.empty(1, 1, slots, 1, jnp.float32).extend({"hidden": jnp.zeros((1, 1, earlier, 1))},
                                                                 jnp.ones((1, earlier), bool))
    mask = memory_visibility_mask("causal", one, None, memory.valid)
    memory_valid = np.asarray(memory.valid[0])
    # a filled slot holds an earlier token: label it by its distance back from this call's first token
    memory_labels = [str(i - slots) if v else "empty" for i, v in enumerate(memory_valid)]
    title = f"Transformer-XL: {slots} memory slots ({slots - earlier} empty), then own tokens"
    pictures.append(Picture("transformer_xl_memory", title, (
        Panel(title, _rows(mask), plain, memory_labels + plain, split=slots),), "Transformer-XL memory"))
    return pictures


# --------------------------------------------------------------------------------------------------
# Drawing


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path, dpi: int) -> None:
    """PNG with a 64-colour palette: flat-coloured masks lose nothing visible, and the README's copies
    stay a few tens of KB."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    _pyplot().close(figure)
    image = Image.open(buffer).convert("RGB").quantize(colors=64)
    image.save(path, format="PNG", optimize=True)


def _tick_step(count: int) -> int:
    return max(1, math.ceil(count / 24))  # at most about 24 labels per axis


def _ticks(set_ticks, set_labels, labels: list[str], rotate: bool = False) -> None:
    step = _tick_step(len(labels))
    shown = list(range(0, len(labels), step))
    set_ticks(shown)
    set_labels([labels[i] for i in shown], rotation=90 if rotate else 0, fontsize=7)


def draw_panel(axes, panel: Panel) -> None:
    from matplotlib.colors import ListedColormap

    T, S = panel.visible.shape
    axes.imshow(panel.visible.astype(int), cmap=ListedColormap([MASKED, VISIBLE]), vmin=0, vmax=1,
                interpolation="nearest", aspect="equal")
    # thin white lines between cells, so single tokens can be counted
    axes.set_xticks(np.arange(-0.5, S, 1), minor=True)
    axes.set_yticks(np.arange(-0.5, T, 1), minor=True)
    axes.grid(which="minor", color="white", linewidth=0.5)
    axes.tick_params(which="minor", length=0)
    _ticks(axes.set_xticks, axes.set_xticklabels, panel.key_labels, rotate=True)
    _ticks(axes.set_yticks, axes.set_yticklabels, panel.query_labels)
    if panel.split is not None:
        axes.axvline(panel.split - 0.5, color="#d62728", linewidth=1.5)
    axes.set_xlabel("key position", fontsize=8)
    axes.set_ylabel("query position", fontsize=8)
    axes.set_title(panel.title, fontsize=9)


def _legend(figure) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=VISIBLE, label="visible"), Patch(facecolor=MASKED, edgecolor="#999999", label="masked")]
    figure.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False)


def picture_size(picture: Picture) -> tuple[float, float]:
    """(width, height) in inches of ``picture``'s own PNG: wide matrices (memory + own keys) get wider panels."""
    T, S = picture.panels[0].visible.shape
    return 3.6 * min(2.0, max(1.0, S / T)) * len(picture.panels), 4.0


def save_picture(picture: Picture, path: Path) -> None:
    plt = _pyplot()
    count = len(picture.panels)
    figure, axes = plt.subplots(1, count, figsize=picture_size(picture), squeeze=False)
    for ax, panel in zip(axes[0], picture.panels):
        draw_panel(ax, panel)
    if count > 1:
        figure.suptitle(picture.title, fontsize=10)
    _legend(figure)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    _save(figure, path, dpi=PICTURE_DPI)


def save_overview(pictures: list[Picture], path: Path) -> None:
    """Every panel of every picture in one grid (masks.png)."""
    plt = _pyplot()
    panels = [(picture, panel) for picture in pictures for panel in picture.panels]
    columns = 4
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3.7 * rows), squeeze=False)
    for ax, (picture, panel) in zip(axes.flat, panels):
        title = picture.short if len(picture.panels) == 1 else f"{picture.short}\n{panel.title}"
        draw_panel(ax, dataclasses.replace(panel, title=title))
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    figure.suptitle("who sees whom: jaxformer's visibility masks", fontsize=11)
    _legend(figure)
    figure.tight_layout(rect=(0, 0.03, 1, 0.98))
    _save(figure, path, dpi=80)


def write_masks(out: str | Path, length: int = 12) -> list[Path]:
    """One PNG per pattern and the overview masks.png under ``out``; returns the paths written."""
    pictures = mask_pictures(length)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for picture in pictures:
        save_picture(picture, out / f"{picture.name}.png")
        written.append(out / f"{picture.name}.png")
    save_overview(pictures, out / "masks.png")
    return written + [out / "masks.png"]


def masks_command(args: argparse.Namespace) -> int:
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a file; masks writes several PNGs: give a folder (made if missing)")
    for path in write_masks(args.out, check_length(args.length)):
        print(path)
    return 0


# --------------------------------------------------------------------------------------------------
# A model's attention weights

STACKS = ("encoder", "decoder", "cross")  # an encoder-decoder's three kinds of attention


def load_checkpoint(path: str | Path):
    """(model, tokenizer) of a Hugging Face folder (config.json + safetensors + tokenizer.json) or a
    train.py run folder (its newest checkpoint, and the tokenizer its data was read with)."""
    from jaxformer.interop.hf import from_pretrained
    from jaxformer.interop.tokenizer import load_tokenizer
    from jaxformer.train.run import CONFIG_FILE, MODEL_FILE

    folder = Path(path)
    if (folder / CONFIG_FILE).exists() and (folder / MODEL_FILE).exists():
        from jaxformer.train.evaluate import restore_run

        run, _ = restore_run(folder)
        return run.model, run.objective.tokenizer
    if (folder / "config.json").exists():
        return from_pretrained(folder), load_tokenizer(folder)
    raise ValueError(f"checkpoint {str(path)!r} is neither a Hugging Face folder (config.json, *.safetensors, "
                     f"tokenizer.json) nor a train.py run folder ({CONFIG_FILE} and {MODEL_FILE})")


def _encode(tokenizer, text: str) -> np.ndarray:
    """The text's ids [T]: a checkpoint's tokenizer adds its special tokens, a run's data tokenizer
    encodes as the training data was."""
    ids = np.asarray(tokenizer.encode(text), np.int32)
    if ids.size == 0:
        raise ValueError(f"--text={text!r} encodes to no tokens; give some text")
    return ids


def token_labels(tokenizer, ids) -> list[str]:
    """A short readable string per id: the vocabulary entry where there is one, else its decoding."""
    vocabulary = getattr(tokenizer, "tokenizer", None)  # both tokenizer kinds wrap a `tokenizers` one
    labels = []
    for i in ids:
        token = vocabulary.id_to_token(int(i)) if vocabulary is not None else None
        token = token if token is not None else tokenizer.decode([int(i)]) or f"<{int(i)}>"
        token = token.replace("$", r"\$").replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t")  # $..$ is math
        labels.append(token if len(token) <= 14 else token[:13] + "…")
    return labels


def check_choice(cfg, stack: str, layer: int | None, head: int | None) -> tuple[int, int | None]:
    """(layer, head) checked against the model before anything runs; layer None means the last.
    ``stack`` is 'self' for encoder-only and decoder-only models, one of ``STACKS`` for encoder-decoders."""
    valid = STACKS if cfg.family == "encoder_decoder" else ("self",)
    if stack not in valid:
        raise ValueError(f"--stack={stack!r}; valid for this {cfg.family} model: {', '.join(valid)}")
    layers = cfg.encoder_layers if stack == "encoder" else cfg.decoder_layers if stack != "self" else cfg.num_layers
    layer = layers - 1 if layer is None else layer
    if not 0 <= layer < layers:
        raise ValueError(f"--layer={layer}; valid: 0 to {layers - 1} (this model's {stack} attention has {layers} "
                         "layers)")
    if head is not None and not 0 <= head < cfg.num_heads:
        raise ValueError(f"--head={head}; valid: 0 to {cfg.num_heads - 1} (the model has {cfg.num_heads} heads)")
    return layer, head


def attention_maps(model, tokenizer, text: str, *, stack: str = "self", target: str | None = None):
    """The attention probabilities of every layer as numpy [N, T, S] each, with the query and key
    token labels. An encoder-decoder's encoder reads ``text``; its decoder reads its start token and
    then ``target`` (default: the text again), as in teacher-forced training."""
    cfg = model.config
    ids = _encode(tokenizer, text)
    if cfg.family != "encoder_decoder":
        out = model(jnp.asarray(ids)[None], attention_mask=jnp.ones((1, ids.size), jnp.int32), output_attentions=True)
        labels = token_labels(tokenizer, ids)
        return [np.asarray(a[0]) for a in out.attentions], labels, labels
    start = cfg.tokens.decoder_start if cfg.tokens.decoder_start is not None else 0
    decoder_ids = np.concatenate([[start], _encode(tokenizer, text if target is None else target)]).astype(np.int32)
    out = model(jnp.asarray(ids)[None], attention_mask=jnp.ones((1, ids.size), jnp.int32),
                decoder_input_ids=jnp.asarray(decoder_ids)[None], output_attentions=True)
    source, decoded = token_labels(tokenizer, ids), token_labels(tokenizer, decoder_ids)
    chosen = {"encoder": (out.encoder_attentions, source, source), "decoder": (out.attentions, decoded, decoded),
              "cross": (out.cross_attentions, decoded, source)}[stack]
    return [np.asarray(a[0]) for a in chosen[0]], chosen[1], chosen[2]


def save_attention(weights: np.ndarray, heads: list[int], query_labels: list[str], key_labels: list[str],
                   title: str, path: str | Path) -> None:
    """A grid of heatmaps, one per head in ``heads`` of ``weights`` [N, T, S], sharing one colour bar."""
    plt = _pyplot()
    T, S = weights.shape[1:]
    columns = math.ceil(math.sqrt(len(heads)))
    rows = math.ceil(len(heads) / columns)
    cell = min(7.0, max(3.0 if len(heads) > 1 else 4.0, 0.22 * max(T, S)))
    height = cell * min(2.0, max(0.5, T / S))  # cross-attention maps are not square
    figure, axes = plt.subplots(rows, columns, figsize=(cell * columns + 1.2, height * rows + 0.8), squeeze=False,
                                layout="constrained")
    top = float(weights[heads].max()) or 1.0
    for ax, head in zip(axes.flat, heads):
        image = ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=top, interpolation="nearest")
        _ticks(ax.set_xticks, ax.set_xticklabels, key_labels, rotate=True)
        _ticks(ax.set_yticks, ax.set_yticklabels, query_labels)
        ax.set_title(f"head {head}", fontsize=9)
        ax.set_xlabel("key token", fontsize=8)
        ax.set_ylabel("query token", fontsize=8)
    for ax in list(axes.flat)[len(heads):]:
        ax.axis("off")
    figure.suptitle(title, fontsize=10)
    bar = figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
    bar.set_label("attention probability")
    figure.savefig(path, dpi=90)
    plt.close(figure)


def attention_command(args: argparse.Namespace) -> int:
    """jaxformer viz attention CHECKPOINT --text T [--layer L] [--head H] --out F.png (encoder-decoders:
    [--stack encoder|decoder|cross] [--target TEXT]); with --image PATH, ``image_attention_command``."""
    checks.require_text(args.text, "--text")
    checks.require_text(args.target, "--target")
    out = png_path(args.out)
    if getattr(args, "image", None) is not None:  # (a Namespace built without the flag draws a text)
        return image_attention_command(args, out)
    if args.text is None:
        raise ValueError("viz attention reads --text (a text model's input), or --image (an image tower's or LLaVA's)")
    model, tokenizer = load_checkpoint(args.checkpoint)
    cfg = model.config
    stack = args.stack or ("encoder" if cfg.family == "encoder_decoder" else "self")
    layer, head = check_choice(cfg, stack, args.layer, args.head)
    weights, query_labels, key_labels = attention_maps(model, tokenizer, args.text, stack=stack,
                                                       target=args.target)
    layer_weights = weights[layer]
    heads = list(range(layer_weights.shape[0])) if head is None else [head]
    what = {"self": "self-attention", "encoder": "encoder self-attention", "decoder": "decoder self-attention",
            "cross": "cross-attention"}[stack]
    title = f"{Path(args.checkpoint).name}: {what}, layer {layer} (of 0-{len(weights) - 1})"
    out.parent.mkdir(parents=True, exist_ok=True)
    save_attention(layer_weights, heads, query_labels, key_labels, title, out)
    print(out)
    return 0


def png_path(out: str) -> Path:
    """--out of the attention picture, refused before the model loads unless it can be a PNG file (its folder
    is made when missing)."""
    path = Path(out)
    if path.is_dir():
        raise ValueError(f"--out {out} is a folder; give the PNG file to write, e.g. {path / 'attention.png'}")
    if path.suffix.lower() not in ("", ".png"):
        raise ValueError(f"--out {out}: the picture is a PNG; name it with .png (or no suffix)")
    return path


# --------------------------------------------------------------------------------------------------
# A model's attention over an image's patches

PANEL_PIXELS = 256  # an image panel's longer side is drawn at least this wide, in whole multiples of its pixels
IMAGE_DPI = 100


def load_image_model(path: str | Path, image: str, text: str | None):
    """(model, image processor, the image's inputs, input_ids or None) of a Hugging Face folder holding an image
    tower (ViT, CLIP's, SigLIP's, alone or in their dual encoders), LLaVA or Gemma 3, whose prompt ``text`` holds the
    image's placeholder, expanded and tokenized as transformers' processor does. Anything else is refused before the
    model runs."""
    from jaxformer.interop.hf import from_pretrained
    from jaxformer.interop.tokenizer import load_tokenizer
    from jaxformer.vision import ImagePlaceholders, ImageProcessor, read_image

    if not (Path(path) / "config.json").exists():
        raise ValueError(f"viz attention --image reads a Hugging Face folder (config.json, weights, "
                         f"preprocessor_config.json); {path} has no config.json")
    model = from_pretrained(path)
    cfg = model.config
    tower = image_tower(cfg)
    if tower.patches is None or cfg.family not in ("encoder", "dual_encoder", "decoder"):
        raise ValueError(f"--image given to {path}, whose {cfg.family} model ({cfg.name!r}) reads no images; image "
                         "towers (ViT, CLIP, SigLIP) and LLaVA do")
    if tower.patches.flexible:
        raise ValueError(f"{path}: SigLIP2's NaFlex patches (an image's own grid) are not drawn yet; fixed-size towers "
                         "(ViT, CLIP, SigLIP) and LLaVA are")
    refuse_unprepared_images(cfg, path, "viz attention --image")
    picture = read_image(image, "--image")
    if cfg.family != "decoder":
        if text is not None:
            raise ValueError(f"--text is LLaVA's prompt; {path}'s image tower ({cfg.name!r}) reads the image alone")
        processor = ImageProcessor.from_pretrained(path)
        return model, processor, processor([picture]), None
    placeholders = ImagePlaceholders.from_pretrained(path)
    if placeholders.kind not in ("llava", "gemma3"):  # where an image's tokens sit among the patches: their rules
        raise ValueError(f"viz attention --image draws LLaVA's and Gemma 3's image tokens; {path}'s processor is "
                         f"{placeholders.kind}'s")
    if text is None or text.count(placeholders.image_token) != 1:
        raise ValueError(f"{cfg.name}'s picture needs --text, a prompt holding one {placeholders.image_token} (the "
                         f"image's place) followed by text, e.g. 'USER: {placeholders.image_token} What is this? "
                         "ASSISTANT:'")
    inputs = placeholders.image_processor([picture])
    if np.any(inputs.get("num_crops", 0)):
        raise ValueError(f"{path}: Gemma 3's pan-and-scan crops (do_pan_and_scan) are not drawn; the whole image is")
    ids = load_tokenizer(path)(placeholders.expand([text], inputs))["input_ids"]
    return model, placeholders.image_processor, inputs, ids


def patch_attention(model, pixel_values, layer: int, input_ids=None) -> tuple[np.ndarray, str]:
    """Each head's attention at ``layer`` over one image's patches, [heads, rows, columns], and what attends: an
    image tower's class token, or for towers without one (SigLIP's) the mean over every query; for LLaVA
    (``input_ids`` [1, T], the image's placeholders among them) the prompt's last text token over the image
    tokens. A patch without an image token (a tower without a class token under LLaVA's 'default' strategy drops
    its first patch) is NaN. Gemma 3's image tokens are pooled windows of patches, [heads, k, k] for k * k tokens,
    its prompt's image tokens seeing each other (its processor's token_type_ids). The attention probabilities
    themselves, as transformers' output_attentions gives them."""
    cfg = model.config
    tower = image_tower(cfg)
    side = tower.patches.image_size // tower.patches.patch_size
    if cfg.family != "decoder":
        encoder = model.vision if cfg.family == "dual_encoder" else model
        weights = np.asarray(encoder(pixel_values=pixel_values, output_attentions=True).attentions[layer][0])
        if tower.patches.class_token:
            return weights[:, 0, 1:].reshape(-1, side, side), "the class token"
        return weights.mean(axis=1).reshape(-1, side, side), "the mean over every query"
    ids = np.asarray(input_ids)
    image = np.flatnonzero(ids[0] == cfg.vision.image_token_id)
    text = np.flatnonzero(ids[0] != cfg.vision.image_token_id)
    if text.size == 0 or text[-1] < image[-1]:
        raise ValueError("the prompt must hold text after its image placeholder: its last text token is the query "
                         "drawn, and under the causal mask it sees only the image tokens before it")
    types = {"token_type_ids": (ids == cfg.vision.image_token_id).astype(np.int64)} if (
        cfg.vision.bidirectional_images) else {}
    out = model(ids, np.ones_like(ids), pixel_values=pixel_values, output_attentions=True, **types)
    over_features = np.asarray(out.attentions[layer][0])[:, text[-1], image]
    if cfg.vision.pooled_tokens:
        pooled = math.isqrt(cfg.vision.pooled_tokens)
        return over_features.reshape(-1, pooled, pooled), "the last text token"
    # feature f is the tower's token f + drop_first, that is patch f + drop_first - class_token
    shift = int(cfg.vision.drop_first_token) - int(tower.patches.class_token)
    weights = np.full((len(over_features), side * side), np.nan, np.float32)
    for feature in range(over_features.shape[1]):
        if 0 <= feature + shift < side * side:
            weights[:, feature + shift] = over_features[:, feature]
    return weights.reshape(-1, side, side), "the last text token"


def seen_image(pixels: np.ndarray, settings: dict) -> np.ndarray:
    """``pixel_values`` [C, H, W] back to an RGB uint8 image [H, W, 3]: the picture as the model saw it (resized,
    cropped, padded), the processor's normalisation and rescaling undone."""
    x = np.asarray(pixels, np.float64)
    if settings.get("do_normalize"):
        x = x * np.reshape(settings["image_std"], (-1, 1, 1)) + np.reshape(settings["image_mean"], (-1, 1, 1))
    if settings.get("do_rescale"):
        x = x / settings["rescale_factor"]
    x = np.clip(np.rint(x), 0, 255).astype(np.uint8).transpose(1, 2, 0)
    return np.repeat(x, 3, axis=2) if x.shape[2] == 1 else x


def image_panel_size(height: int, width: int) -> tuple[int, int]:
    """(height, width) in pixels of one head's panel: the image scaled by a whole factor to PANEL_PIXELS or more."""
    scale = max(1, math.ceil(PANEL_PIXELS / max(height, width)))
    return height * scale, width * scale


def save_image_attention(image: np.ndarray, weights: np.ndarray, heads: list[int], patch_size: int, label: str,
                         path: str | Path) -> tuple[int, int]:
    """One panel per head in ``heads`` of ``weights`` [N, rows, columns]: the image with the head's map laid over
    it (each patch's cell over its ``patch_size`` pixels, one colour scale for all), labelled; a grid of panels for
    several heads. Returns the PNG's (width, height) in pixels."""
    plt = _pyplot()
    height, width = image.shape[:2]
    panel_height, panel_width = image_panel_size(height, width)
    columns = math.ceil(math.sqrt(len(heads)))
    rows = math.ceil(len(heads) / columns)
    size = (columns * panel_width, rows * panel_height)
    figure = plt.figure(figsize=(size[0] / IMAGE_DPI, size[1] / IMAGE_DPI), dpi=IMAGE_DPI)
    top = float(np.nanmax(weights[heads])) or 1.0
    for i, head in enumerate(heads):
        row, column = divmod(i, columns)
        ax = figure.add_axes((column / columns, 1 - (row + 1) / rows, 1 / columns, 1 / rows))
        ax.imshow(image, extent=(0, width, height, 0), interpolation="nearest")
        ax.imshow(weights[head], cmap="inferno", vmin=0.0, vmax=top, alpha=0.6, interpolation="nearest",
                  extent=(0, weights.shape[2] * patch_size, weights.shape[1] * patch_size, 0))  # (a remainder: none)
        ax.set_xlim(0, width)
        ax.set_ylim(height, 0)
        ax.axis("off")
        ax.text(0.02, 0.98, f"{label}, head {head}", transform=ax.transAxes, va="top", fontsize=7, color="white",
                bbox=dict(facecolor="black", alpha=0.5, linewidth=0, pad=1.5))
    figure.savefig(path, dpi=IMAGE_DPI)
    plt.close(figure)
    return size


def image_attention_command(args: argparse.Namespace, out: Path) -> int:
    """jaxformer viz attention CHECKPOINT --image PATH [--text PROMPT (LLaVA, Gemma 3)] [--layer L] [--head H] --out
    F.png"""
    if args.stack is not None or args.target is not None:
        raise ValueError("--stack and --target pick an encoder-decoder's attention; --image draws an image tower's "
                         "or LLaVA's self-attention")
    model, processor, inputs, ids = load_image_model(args.checkpoint, args.image, args.text)
    cfg = model.config
    attending = cfg.vision.tower if cfg.family == "dual_encoder" else cfg  # (LLaVA: its text decoder's layers)
    layer, head = check_choice(attending, "self", args.layer, args.head)
    weights, query = patch_attention(model, inputs["pixel_values"], layer, ids)
    heads = list(range(len(weights))) if head is None else [head]
    image = seen_image(inputs["pixel_values"][0], processor.settings)
    patch_size = image_tower(cfg).patches.patch_size
    if cfg.vision is not None and cfg.vision.pooled_tokens:  # (Gemma 3: a token pools a window of patches)
        patch_size *= (image_tower(cfg).patches.image_size // patch_size) // len(weights[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    save_image_attention(image, weights, heads, patch_size, f"layer {layer}", out)
    print(f"{out}: {query}'s attention over the image's patches, layer {layer} of 0-{attending.num_layers - 1}")
    return 0
