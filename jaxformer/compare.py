"""Per-layer parity against the PyTorch reference (transformers), on the same checkpoint and input.

Needs the ``compare`` extra (torch + transformers). Both sides run the checkpoint as stored; rows are
the embeddings, every layer's hidden state, the final hidden state, each head's outputs and every
layer's attention probabilities (self, and for encoder-decoders the encoder's and cross-attention).
Positions whose attention_mask is 0 are excluded: what a model computes for padding is not defined
by either library (RoBERTa even gives pads their own position), and no caller may read it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from jaxformer import checks
from jaxformer.interop.files import read_json
from jaxformer.interop.hf import from_pretrained
from jaxformer.interop.longformer import global_attentions
from jaxformer.interop.registry import architecture_of


@dataclasses.dataclass
class Row:
    name: str
    max_abs: float
    max_rel: float
    worst: str  # the position (batch, token, feature) of the largest absolute difference


def _row(name: str, ref: np.ndarray, ours: np.ndarray, valid: np.ndarray | None) -> Row:
    ref, ours = np.asarray(ref, np.float64), np.asarray(ours, np.float64)
    if ref.shape != ours.shape:
        raise ValueError(f"{name}: reference shape {ref.shape} differs from jaxformer shape {ours.shape}")
    diff = np.abs(ref - ours)
    rel = diff / np.maximum(np.abs(ref), 1e-6)
    if valid is not None and diff.ndim >= 2 and diff.shape[:2] == valid.shape:
        keep = valid.reshape(valid.shape + (1,) * (diff.ndim - 2))
        diff, rel = diff * keep, rel * keep
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
    return Row(name, float(diff.max(initial=0.0)), float(rel.max(initial=0.0)), str(tuple(int(i) for i in worst)))


def reference_model(path: str | Path, dtype: str = "float32"):
    """The transformers model named by the checkpoint's ``architectures``, eager attention, eval mode."""
    import torch
    import transformers

    hf = read_json(Path(path) / "config.json")
    _, arch = architecture_of(hf)
    model = getattr(transformers, arch).from_pretrained(str(path), dtype=getattr(torch, dtype),
                                                        attn_implementation="eager")
    return model.eval()


def compare(path: str | Path, input_ids: np.ndarray | None, attention_mask: np.ndarray | None = None,
            decoder_input_ids: np.ndarray | None = None, token_type_ids: np.ndarray | None = None,
            dtype: str = "float32", model=None, reference=None, global_attention_mask: np.ndarray | None = None,
            pixel_values: np.ndarray | None = None, pixel_attention_mask: np.ndarray | None = None,
            spatial_shapes: np.ndarray | None = None, image_inputs: dict | None = None,
            input_features: np.ndarray | None = None) -> list[Row]:
    """Run both implementations and return one Row per compared tensor (``global_attention_mask``: Longformer's
    global tokens, given to both; ``pixel_values`` [B, C, H, W]: an image tower's input, in place of ids; a NaFlex
    tower's (SigLIP2) [B, N, p * p * C] with ``pixel_attention_mask`` [B, N] and ``spatial_shapes`` [B, 2]). A
    decoder reading images (LLaVA) takes ``pixel_values`` beside input_ids, and ``image_inputs``: the other inputs
    its processor gives (``image_grid_thw``, ``aspect_ratio_ids``, ...), named as transformers names them, given
    to both sides as they are. An encoder-decoder reading audio (Whisper) takes ``input_features`` [B, mel bins,
    frames] in place of ids, and ``decoder_input_ids`` (default: the decoder start token alone)."""
    naflex = {} if spatial_shapes is None else dict(pixel_attention_mask=pixel_attention_mask,
                                                    spatial_shapes=spatial_shapes)
    import torch

    model = model if model is not None else from_pretrained(path, dtype=dtype)  # first: it names a missing config.json
    cfg = model.config
    if cfg.family == "dual_encoder":  # both towers, then what joins them
        reference = reference if reference is not None else reference_model(path, dtype)
        return _dual_encoder_rows(model, reference, input_ids, attention_mask, pixel_values, naflex)
    t = lambda x: None if x is None else torch.as_tensor(np.asarray(x))  # noqa: E731
    reads_images = cfg.vision is not None and cfg.family == "decoder"  # ids with image placeholders, and pixels
    if cfg.audio is not None:  # log-mel frames, every one real
        if input_features is None or input_ids is not None:
            raise ValueError(f"model {cfg.name!r} reads audio: give input_features [batch, {cfg.audio.mel_bins}, "
                             f"{cfg.audio.frames}] in place of input_ids (jaxformer compare --audio FILE)")
        input_features = np.asarray(input_features, np.float32)
        if decoder_input_ids is None:
            decoder_input_ids = np.full((input_features.shape[0], 1), cfg.tokens.decoder_start)
        model.validate(decoder_input_ids=np.asarray(decoder_input_ids), input_features=input_features)
        mask = None
        kwargs = dict(input_features=t(input_features), output_hidden_states=True, output_attentions=True)
        ours_kwargs = dict(input_features=input_features, output_hidden_states=True, output_attentions=True)
    elif cfg.patches is not None or (pixel_values is not None and not reads_images):  # a tower: pixels, tokens real
        pixel_values = None if pixel_values is None else np.asarray(pixel_values, np.float32)
        model.validate(input_ids, attention_mask, token_type_ids, pixel_values=pixel_values, **naflex)
        mask = None
        kwargs = dict(pixel_values=t(pixel_values), output_hidden_states=True, output_attentions=True,
                      **{key: t(value) for key, value in naflex.items()})
        ours_kwargs = dict(pixel_values=pixel_values, output_hidden_states=True, output_attentions=True, **naflex)
    else:
        input_ids = np.asarray(input_ids)
        checks.check_ids(input_ids, cfg.token_rows)  # before torch's embedding lookup raises an IndexError on one
        mask = np.ones_like(input_ids) if attention_mask is None else np.asarray(attention_mask)
        # no padding, no mask: the same for every reference, and transformers' causal XLNet fails on any mask
        kwargs = dict(input_ids=t(input_ids), attention_mask=None if mask.all() else t(mask),
                      output_hidden_states=True, output_attentions=True)
        ours_kwargs = dict(attention_mask=mask, output_hidden_states=True, output_attentions=True)
        if reads_images and pixel_values is not None:
            images = dict(pixel_values=np.asarray(pixel_values, np.float32), **(image_inputs or {}))
            kwargs.update({key: t(value) for key, value in images.items()})
            ours_kwargs.update({key: np.asarray(value) for key, value in images.items()})
    reference = reference if reference is not None else reference_model(path, dtype)
    if cfg.family == "encoder_decoder":
        if decoder_input_ids is None:
            start = cfg.tokens.decoder_start if cfg.tokens.decoder_start is not None else 0
            decoder_input_ids = np.concatenate([np.full((input_ids.shape[0], 1), start), input_ids[:, :-1]], 1)
        kwargs["decoder_input_ids"] = t(decoder_input_ids)
        # every decoder token is real: said explicitly, since T5Gemma would otherwise mask ids equal to its pad
        kwargs["decoder_attention_mask"] = t(np.ones_like(decoder_input_ids))
        ours_kwargs["decoder_input_ids"] = np.asarray(decoder_input_ids)
    if token_type_ids is not None:
        kwargs["token_type_ids"] = t(token_type_ids)
        ours_kwargs["token_type_ids"] = np.asarray(token_type_ids)
    if global_attention_mask is not None:
        kwargs["global_attention_mask"] = t(global_attention_mask)
        ours_kwargs["global_attention_mask"] = np.asarray(global_attention_mask)
    with torch.no_grad():
        ref = reference(**kwargs)
    if cfg.scores.sparse_block_size is not None:  # BigBird: transformers' padding to a multiple of its block cut off
        _cut_block_padding(ref, input_ids.shape[1])
    out = model(input_ids, **ours_kwargs)

    def f(x):
        return x.float().numpy() if hasattr(x, "float") else np.asarray(x, np.float32)

    rows: list[Row] = []
    if cfg.family == "encoder_decoder":
        enc_valid = mask
        for i, (r, o) in enumerate(zip(ref.encoder_hidden_states, out.encoder_hidden_states)):
            rows.append(_row("encoder embeddings" if i == 0 else f"encoder layer {i}", f(r), o, enc_valid))
        rows.append(_row("encoder output", f(ref.encoder_last_hidden_state), out.encoder_last_hidden_state, enc_valid))
        rows += _attention_rows("encoder attention", ref.encoder_attentions, out.encoder_attentions, enc_valid)
        rows += _attention_rows("decoder attention", ref.decoder_attentions, out.attentions, None)
        rows += _attention_rows("cross attention", ref.cross_attentions, out.cross_attentions, None)
        hidden, label = ref.decoder_hidden_states, "decoder"
    else:
        ref_attentions = ref.attentions
        if cfg.scores.global_tokens:  # Longformer's come banded, its global tokens' apart: made [B, N, T, T]
            is_global = model.global_token_mask(input_ids, global_attention_mask, mask)
            is_global = np.zeros(input_ids.shape, bool) if is_global is None else np.asarray(is_global)
            global_probs = ref.global_attentions or (None,) * len(ref_attentions)
            ref_attentions = [global_attentions(f(local), None if probs is None else f(probs), is_global,
                                                cfg.window_size) for local, probs in zip(ref_attentions, global_probs)]
        # Llama 3.2 Vision's: ours are its self layers' (not over the images); transformers gives one per layer where
        # images were read, and skips its cross layers (returning nothing of them) on text alone
        if cfg.scores.cross_attention_layers and len(ref_attentions) == cfg.decoder_layers:
            ref_attentions = [a for i, a in enumerate(ref_attentions) if i not in cfg.scores.cross_attention_layers]
        rows += _attention_rows("attention", ref_attentions, out.attentions, mask)
        hidden, label = ref.hidden_states, "layer"
    if len(hidden) != len(out.hidden_states):
        raise ValueError(f"reference has {len(hidden)} hidden states, jaxformer {len(out.hidden_states)}")
    valid = mask if cfg.family != "encoder_decoder" else None
    for i, (r, o) in enumerate(zip(hidden, out.hidden_states)):
        name = ("decoder embeddings" if label == "decoder" else "embeddings") if i == 0 else f"{label} {i}"
        rows.append(_row(name, f(r), o, valid))
    if getattr(ref, "last_hidden_state", None) is not None:
        rows.append(_row("last hidden state", f(ref.last_hidden_state), out.last_hidden_state, valid))
    if getattr(ref, "pooler_output", None) is not None:
        rows.append(_row("pooler", f(ref.pooler_output), out.pooler_output, None))
    if getattr(ref, "text_embeds", None) is not None:  # CLIPTextModelWithProjection's projected pooled output
        rows.append(_row("text embeds", f(ref.text_embeds), out.pooler_output, None))
    ref_logits = getattr(ref, "logits", None)
    if ref_logits is None:
        ref_logits = getattr(ref, "prediction_logits", None)
    if ref_logits is not None:
        per_token = cfg.head != "sequence_classification"
        rows.append(_row("logits", f(ref_logits), out.logits, valid if per_token else None))
    if getattr(ref, "seq_relationship_logits", None) is not None:
        rows.append(_row("nsp logits", f(ref.seq_relationship_logits), out.nsp_logits, None))
    if getattr(ref, "sop_logits", None) is not None:  # ALBERT's sentence-order head
        rows.append(_row("sop logits", f(ref.sop_logits), out.nsp_logits, None))
    if getattr(ref, "start_logits", None) is not None:
        rows.append(_row("start logits", f(ref.start_logits)[..., None], np.asarray(out.start_logits)[..., None], valid))
        rows.append(_row("end logits", f(ref.end_logits)[..., None], np.asarray(out.end_logits)[..., None], valid))
    return rows


def audio_features(path: str | Path, audio_file: str | Path) -> tuple[np.ndarray, Row]:
    """``audio_file`` read and resampled (``read_audio``) and turned into input_features [1, mel bins, frames] by the
    folder's preprocessor_config.json (``jaxformer.audio.FeatureExtractor``), with their row against transformers'
    WhisperFeatureExtractor of the same waveform: the first step of an audio model's parity. The reference runs its
    numpy (float64) STFT, the path jaxformer.audio reproduces; with torch installed transformers takes a float32 STFT
    of its own, up to 6e-5 from its numpy path on tones. Both models then read jaxformer's features."""
    from unittest import mock

    from transformers.models.whisper import feature_extraction_whisper

    from jaxformer.audio import FeatureExtractor, read_audio

    extractor = FeatureExtractor.from_pretrained(path)
    waveform = read_audio(audio_file, extractor.sampling_rate)
    ours = extractor(waveform, sampling_rate=extractor.sampling_rate)["input_features"]
    reference = feature_extraction_whisper.WhisperFeatureExtractor.from_pretrained(str(path))
    with mock.patch.object(feature_extraction_whisper, "is_torch_available", lambda: False):
        ref = reference(waveform, sampling_rate=extractor.sampling_rate, return_tensors="np")["input_features"]
    return ours, _row("input features (numpy path)", ref, ours, None)


def _dual_encoder_rows(model, reference, input_ids, attention_mask, pixel_values, naflex: dict) -> list[Row]:
    """A dual encoder's rows: each tower's (``text ...``, ``vision ...``: the embeddings, every layer and its
    attention, the last hidden state, the pooled output as get_text_features / get_image_features answer it), then
    the unit-length embeddings and the logits of every image against every text (``naflex``: SigLIP2's
    pixel_attention_mask and spatial_shapes)."""
    import torch

    input_ids, pixel_values = np.asarray(input_ids), np.asarray(pixel_values, np.float32)
    checks.check_ids(input_ids, model.config.vocab_size)
    mask = np.ones_like(input_ids) if attention_mask is None else np.asarray(attention_mask)
    with torch.no_grad():
        ref = reference(input_ids=torch.as_tensor(input_ids), pixel_values=torch.as_tensor(pixel_values),
                        attention_mask=None if mask.all() else torch.as_tensor(mask), output_hidden_states=True,
                        output_attentions=True, **{key: torch.as_tensor(value) for key, value in naflex.items()})
    out = model(input_ids, pixel_values, mask, output_hidden_states=True, output_attentions=True, **naflex)
    f = lambda x: x.float().numpy()  # noqa: E731
    rows: list[Row] = []
    for label, r, o, valid in (("text", ref.text_model_output, out.text_model_output, mask),
                               ("vision", ref.vision_model_output, out.vision_model_output, None)):
        if len(r.hidden_states) != len(o.hidden_states):
            raise ValueError(f"{label}: reference has {len(r.hidden_states)} hidden states, jaxformer "
                             f"{len(o.hidden_states)}")
        rows += _attention_rows(f"{label} attention", r.attentions, o.attentions, valid)
        rows += [_row(f"{label} embeddings" if i == 0 else f"{label} layer {i}", f(a), b, valid)
                 for i, (a, b) in enumerate(zip(r.hidden_states, o.hidden_states))]
        rows += [_row(f"{label} last hidden state", f(r.last_hidden_state), o.last_hidden_state, valid),
                 _row(f"{label} pooler", f(r.pooler_output), o.pooler_output, None)]
    return rows + [_row("text embeds", f(ref.text_embeds), out.text_embeds, None),
                   _row("image embeds", f(ref.image_embeds), out.image_embeds, None),
                   _row("logits per image", f(ref.logits_per_image), out.logits_per_image, None)]


def _cut_block_padding(ref, length: int) -> None:
    """BigBird's (encoder's) hidden states and attentions as long as the input: transformers pads a block-sparse
    input to a multiple of its block and returns those per-layer outputs padded."""
    for name in ("hidden_states", "attentions", "encoder_hidden_states", "encoder_attentions"):
        states = getattr(ref, name, None)
        if states is not None and (name.startswith("encoder") or not hasattr(ref, "encoder_last_hidden_state")):
            ref[name] = tuple(s[:, :length] if s.dim() == 3 else s[:, :, :length, :length] for s in states)


def _attention_rows(name: str, reference, ours, valid: np.ndarray | None) -> list[Row]:
    """One row per layer of attention probabilities [B, N, T, S], compared as [B, T, N, S] so that padded
    query rows are left out (padded keys get probability 0 on both sides). None where the reference
    returns none (BigBird's dense fallback for short inputs returns an empty tuple)."""
    if not reference or ours is None:
        return []
    if len(reference) != len(ours):
        raise ValueError(f"{name}: reference has {len(reference)} layers, jaxformer {len(ours)}")
    as_rows = lambda x: np.swapaxes(x.float().numpy() if hasattr(x, "float") else np.asarray(x), 1, 2)  # noqa: E731
    return [_row(f"{name} {i}", as_rows(r), as_rows(o), valid) for i, (r, o) in enumerate(zip(reference, ours), 1)]


def format_table(rows: list[Row], tolerance: float) -> str:
    width = max(len(r.name) for r in rows)
    lines = [f"{'tensor':<{width}}  {'max abs':>10}  {'max rel':>10}  {'worst at':<16} ok",
             "-" * (width + 46)]
    for r in rows:
        ok = "yes" if r.max_abs <= tolerance else "NO"
        lines.append(f"{r.name:<{width}}  {r.max_abs:>10.3e}  {r.max_rel:>10.3e}  {r.worst:<16} {ok}")
    worst = max(rows, key=lambda r: r.max_abs)
    lines.append(f"worst row: {worst.name} ({worst.max_abs:.3e}); tolerance {tolerance:.0e}")
    return "\n".join(lines)
