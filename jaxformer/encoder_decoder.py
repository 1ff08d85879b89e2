"""Encoder-decoder family (the 2017 Transformer, T5, BART): a bidirectional encoder, a causal decoder
that cross-attends to it, and the head named by ``config.head``: an LM head, or BART's and T5's classifier
(dense -> tanh -> out_proj of the decoder state at each row's last EOS of input_ids) and span head (start and
end logits per decoder position); these two read the source shifted right when no decoder_input_ids are
given, as transformers does. One token embedding is shared by both sides (T5Gemma: one each); Whisper's encoder
reads log-mel frames through its audio front end instead (``audio``: ``input_features`` in place of input_ids).

The decoder's one forward pass (``decode``) serves whole sequences (``__call__``) and cached steps
(``step``, over a ``DecodeState`` holding every layer's cross-attention keys and values, computed once
per source by ``init_cache``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.cache import DecodeState, EncoderKV, KVCache, empty_cache
from jaxformer import generate as generation  # the decode loop: model code, it calls .step
from jaxformer import speech_generation  # Whisper's generate: prompts, timestamps, windows over long audio
from jaxformer.checks import check_inputs, check_segments, public_call
from jaxformer.edges import EdgeMethods
from jaxformer.model_config import ModelConfig
from jaxformer.decoder import decoding_copy, step_logits, lm_logits, make_lm_head, unstacked_decoder
from jaxformer.layers.audio import AudioFrontEnd, check_input_features
from jaxformer.layers import (Dense, Embed, Embeddings, EncoderOutput, Stack, StackOutput, Tokens, activate, dropout,
                              dtype_of, packed_validity, split_key)
from jaxformer.outputs import ModelOutput

Array = jax.Array
# the heads that read the source shifted right when no decoder inputs are given
TASK_HEADS = ("sequence_classification", "question_answering")


class EncoderDecoder(EdgeMethods, nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embed = Embed(cfg.vocab_size, cfg, rngs=rngs)  # the decoder's (and the tied head's), and the encoder's
        self.encoder_embed = None if cfg.embeddings.shared else Embed(cfg.vocab_size, cfg, rngs=rngs)  # T5Gemma's own
        # Whisper's encoder reads log-mel frames through its audio front end (with its own positions), not tokens
        self.audio = AudioFrontEnd(cfg, rngs=rngs) if cfg.audio is not None else None
        self.encoder_embeddings = Embeddings(cfg, rngs=rngs) if cfg.audio is None else None
        self.encoder = Stack(cfg, cfg.encoder_layers, pattern="bidirectional", rngs=rngs)
        self.decoder_embeddings = Embeddings(cfg, rngs=rngs)
        self.decoder = Stack(cfg, cfg.decoder_layers, pattern=cfg.attention, cross_attention=True, rngs=rngs)
        self.lm_head, self.logits_bias = make_lm_head(cfg, rngs)
        # BART's and T5's classification_head (dense, tanh, out_proj) as the encoder family's pooler and
        # classifier; their span head (qa_outputs) as its one-layer classifier of two outputs
        self.pooler = (Dense(cfg, cfg.d_model, cfg.d_model, ("embed", "embed_out"), rngs=rngs)
                       if cfg.head == "sequence_classification" else None)
        outputs = {"sequence_classification": cfg.head_options.num_labels, "question_answering": 2}.get(cfg.head)
        self.classifier = Dense(cfg, cfg.d_model, outputs, ("embed", "labels"), rngs=rngs) if outputs else None

    def encode(self, input_ids: Array | None = None, attention_mask: Array | None = None, *,
               inputs_embeds: Array | None = None, input_features: Array | None = None) -> EncoderOutput:
        """The source's encoding, checked like a model call: what ``init_cache`` (and cross-attention)
        reads. Generation encodes once per source with it. An audio model (Whisper) reads ``input_features``
        [B, mel_bins, frames] alone: every frame is real."""
        if self.audio is not None:
            self.check_audio_inputs(input_ids, attention_mask, inputs_embeds, input_features)
            return EncoderOutput(self.encoder_pass(None, input_features=input_features).hidden, None)
        check_inputs(self.config, input_ids, inputs_embeds, attention_mask)
        hidden = self.encoder_pass(input_ids, attention_mask, inputs_embeds=inputs_embeds).hidden
        return EncoderOutput(hidden, attention_mask)

    def check_audio_inputs(self, input_ids, attention_mask, inputs_embeds, input_features) -> tuple[int, int]:
        """An audio encoder's input: input_features of the right shape, and no token stream beside them; returns
        the (batch, length) the encoder's stack sees."""
        given = [name for name, value in (("input_ids", input_ids), ("inputs_embeds", inputs_embeds),
                                          ("attention_mask", attention_mask)) if value is not None]
        if given or input_features is None:
            raise ValueError(f"{self.config.name!r} reads audio: pass input_features [batch, "
                             f"{self.config.audio.mel_bins}, {self.config.audio.frames}] alone, not "
                             f"{', '.join(given) or 'nothing'} (transformers' Whisper reads no mask: the "
                             "padding is silence the features already hold)")
        check_input_features(self.config.audio, input_features)
        return np.shape(input_features)[0], self.config.audio.source_positions

    def encoder_pass(self, input_ids: Array | None, attention_mask: Array | None = None, *,
                     inputs_embeds: Array | None = None, collect_hidden: bool = False,
                     collect_attentions: bool = False, key: Array | None = None,
                     segments: Array | None = None, input_features: Array | None = None) -> StackOutput:
        """The encoder's one forward pass, on inputs already checked (by ``__call__`` or ``encode``);
        ``segments``: packed documents, each at its own positions; ``input_features``: an audio model's frames."""
        keys = split_key(key, 2)
        if self.audio is not None:
            x = self.audio(input_features, key=keys[0])
            positions = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape[:2])
            return self.encoder(x, Tokens(positions, None, indexed=True), collect_hidden=collect_hidden,
                                collect_attentions=collect_attentions, key=keys[1])
        table = self.embed if self.encoder_embed is None else self.encoder_embed
        positions = None if segments is None else self.encoder_embeddings.document_positions(segments)
        x, positions = self.encoder_embeddings(table, input_ids, inputs_embeds=inputs_embeds, positions=positions,
                                               key=keys[0])
        tokens = Tokens(positions, packed_validity(attention_mask, segments), indexed=True, segments=segments)
        return self.encoder(x, tokens, collect_hidden=collect_hidden,
                            collect_attentions=collect_attentions, key=keys[1])

    def decode(self, decoder_input_ids: Array | None, source: EncoderOutput | EncoderKV, *,
               inputs_embeds: Array | None = None, valid: Array | None = None, positions: Array | None = None,
               cache: KVCache | None = None, collect_hidden: bool = False, collect_attentions: bool = False,
               key: Array | None = None, segments: Array | None = None) -> StackOutput:
        """The one decoder pass: embeddings, then the causal stack cross-attending to ``source`` (an
        encoder output, or its precomputed keys and values), over ``cache`` (if any). ``segments``: packed
        target documents, each at its own positions, reading its own document of the source."""
        keys = split_key(key, 2)
        indexed = positions is None and cache is None
        if segments is not None and positions is None:
            positions = self.decoder_embeddings.document_positions(segments)
        x, at = self.decoder_embeddings(self.embed, decoder_input_ids, inputs_embeds=inputs_embeds,
                                        positions=positions, key=keys[0])
        # (M2M-100) causal visibility goes by index
        if positions is None and self.config.embeddings.pad_aware_positions:
            at = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape[:2])
        tokens = Tokens(at, packed_validity(valid, segments), indexed=indexed, segments=segments)
        return self.decoder(x, tokens, cache=cache, cross=source, collect_hidden=collect_hidden,
                            collect_attentions=collect_attentions, key=keys[1])

    def validate(self, input_ids=None, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None, *,
                 inputs_embeds=None, decoder_inputs_embeds=None, segment_ids=None, decoder_segment_ids=None,
                 input_features=None, **_) -> None:
        """Both streams are checked before either runs: a bad decoder input fails before the encoder."""
        cfg = self.config
        derived = decoder_input_ids is None and decoder_inputs_embeds is None
        audio = self.audio is not None
        if derived and (cfg.head not in TASK_HEADS or audio):
            raise ValueError("an encoder-decoder model needs decoder_input_ids (or decoder_inputs_embeds); "
                             "for generation use model.generate")
        if audio and segment_ids is not None:
            raise ValueError(f"{cfg.name!r} reads audio: its input_features are not packed, so it takes no segment_ids")
        if input_features is not None and not audio:
            raise ValueError(f"input_features given to {cfg.name!r}, which reads no audio (num_mel_bins is unset)")
        if input_ids is None and not audio and (derived or cfg.head == "sequence_classification"):
            raise ValueError(f"head={cfg.head!r} reads input_ids (to pool at their EOS tokens, or shifted right as "
                             "the decoder's inputs when none are given); pass input_ids, not inputs_embeds")
        encoder_shape = (self.check_audio_inputs(input_ids, attention_mask, inputs_embeds, input_features) if audio
                         else check_inputs(cfg, input_ids, inputs_embeds, attention_mask))
        if derived:
            check_derivable(cfg, input_ids)
            decoder_shape = check_inputs(cfg, input_ids, None, decoder_attention_mask,
                                         names=("input_ids", "decoder_attention_mask"))
        else:
            decoder_shape = check_inputs(cfg, decoder_input_ids, decoder_inputs_embeds, decoder_attention_mask,
                                         names=("decoder_input_ids", "decoder_attention_mask"))
        if encoder_shape[0] != decoder_shape[0]:
            raise ValueError(f"decoder batch {decoder_shape[0]} differs from encoder batch {encoder_shape[0]}")
        if (segment_ids is None) != (decoder_segment_ids is None):
            raise ValueError("packed documents need segment_ids (the inputs') and decoder_segment_ids (the targets') "
                             "together: a target reads only its own document's input")
        check_segments(segment_ids, encoder_shape, cfg)
        check_segments(decoder_segment_ids, decoder_shape, cfg, "decoder_segment_ids")
        if segment_ids is not None and derived:
            raise ValueError("segment_ids pack documents for given decoder inputs; without decoder_input_ids the "
                             f"head={cfg.head!r} shifts input_ids right across documents. Pass decoder_input_ids")
        if cfg.head == "sequence_classification":
            check_eos_pooling(cfg, input_ids, decoder_shape[1])

    def generate(self, input_ids=None, attention_mask=None, **kwargs):
        """Hugging Face's ``generate`` (greedy, sampling, beams, drafting): ``jaxformer.generate.generate``; an audio
        model's (Whisper: ``input_features`` first, language, task, timestamps, long-form audio) is
        ``jaxformer.speech_generation.generate``."""
        if self.audio is not None:
            features = kwargs.pop("input_features", None) if input_ids is None else input_ids
            return speech_generation.generate(self, features, attention_mask=attention_mask, **kwargs)
        return generation.generate(self, input_ids, attention_mask, **kwargs)

    @public_call
    def __call__(self, input_ids: Array | None = None, attention_mask: Array | None = None,
                 decoder_input_ids: Array | None = None, decoder_attention_mask: Array | None = None, *,
                 inputs_embeds: Array | None = None, decoder_inputs_embeds: Array | None = None,
                 output_hidden_states: bool = False, output_attentions: bool = False,
                 dropout_key: Array | None = None, segment_ids: Array | None = None,
                 decoder_segment_ids: Array | None = None, input_features: Array | None = None) -> ModelOutput:
        """Decoder logits; ``attentions`` are the decoder's self-attention probabilities (transformers:
        decoder_attentions), with ``encoder_attentions`` and ``cross_attentions``. ``segment_ids`` and
        ``decoder_segment_ids`` [B, S], [B, T]: inputs and targets of several examples packed into one row each
        (as t5x packs them: 1, 2, ... per example on both sides, 0 on padding); example i's targets read
        only example i's inputs. An audio model (Whisper) reads ``input_features`` [B, mel_bins, frames] in place of
        input_ids, with no attention_mask."""
        cfg = self.config
        keys = split_key(dropout_key, 3 if cfg.head == "sequence_classification" else 2)  # (the classifier's dropout)
        if decoder_input_ids is None and decoder_inputs_embeds is None:  # (a task head: validate allowed it)
            decoder_input_ids = shifted_right(cfg, input_ids)
        encoded = self.encoder_pass(input_ids, attention_mask, inputs_embeds=inputs_embeds,
                                    collect_hidden=output_hidden_states, collect_attentions=output_attentions,
                                    key=keys[0], segments=segment_ids, input_features=input_features)
        source = EncoderOutput(encoded.hidden, packed_validity(attention_mask, segment_ids), segment_ids)
        decoded = self.decode(decoder_input_ids, source, inputs_embeds=decoder_inputs_embeds,
                              valid=decoder_attention_mask, collect_hidden=output_hidden_states,
                              collect_attentions=output_attentions, key=keys[1], segments=decoder_segment_ids)
        h, heads = decoded.hidden, {}
        if cfg.head == "lm":
            heads["logits"] = lm_logits(self, h)
        elif cfg.head == "sequence_classification":
            pooled = self.pooler(last_eos_state(cfg, h, input_ids))
            act = cfg.head_options.pooler_activation
            pooled = jnp.tanh(pooled) if act == "tanh" else activate(act, pooled)
            heads["logits"] = self.classifier(dropout(pooled, cfg.dropout_rate, keys[2]))
        elif cfg.head == "question_answering":
            span = self.classifier(h)
            heads["start_logits"], heads["end_logits"] = span[..., 0], span[..., 1]
        return ModelOutput(**heads, last_hidden_state=h, hidden_states=decoded.hidden_states,
                           encoder_last_hidden_state=encoded.hidden, encoder_hidden_states=encoded.hidden_states,
                           attentions=decoded.attentions, encoder_attentions=encoded.attentions,
                           cross_attentions=decoded.cross_attentions)

    def encoder_difference(self, other: EncoderDecoder) -> str | None:
        """What would make ``other`` encode a source otherwise than this model (None: nothing, so an assistant may
        read this model's encoding): its config beyond the decoder's depth and name, or a weight of the parts that
        encode (the token table too where the encoder reads it)."""
        cfg = self.config
        if dataclasses.replace(other.config, decoder_layers=cfg.decoder_layers, name=cfg.name) != cfg:
            return "config fields " + ", ".join(f.name for f in dataclasses.fields(cfg) if f.name not in (
                "decoder_layers", "name") and getattr(cfg, f.name) != getattr(other.config, f.name))
        parts = ("audio", "encoder_embeddings", "encoder_embed", "encoder")
        for part in parts + (("embed",) if cfg.audio is None and cfg.embeddings.shared else ()):
            ours, theirs = (nnx.state(getattr(m, part), nnx.Param) if getattr(m, part) is not None else {}
                            for m in (self, other))
            for (path, a), (_, b) in zip(*(jax.tree_util.tree_leaves_with_path(w) for w in (ours, theirs))):
                if a.shape != b.shape or not bool(jnp.array_equal(a, b)):
                    return f"encoder weights ({part}{jax.tree_util.keystr(path)})"
        return None

    def init_cache(self, source: EncoderOutput, length: int, rewind: int = 0) -> DecodeState:
        """An empty state for ``length`` decoder tokens per row, holding every decoder layer's
        cross-attention keys and values of ``source`` (``encode``'s output; computed here, once). Windowed
        decoder layers keep a ring of window + ``rewind`` slots (``cache.empty_cache``)."""
        cfg = self.config
        batch = source.hidden.shape[0]
        kv = empty_cache(cfg, cfg.decoder_layers, batch, length, dtype_of(cfg.dtype), rewind)
        return DecodeState(kv, encoder=self.decoder.cross_key_values(source))

    def step(self, ids: Array, positions: Array, valid: Array, state: DecodeState, every_position: bool = False
             ) -> tuple[Array, DecodeState]:
        """Run decoder ``ids`` [B, T] at ``positions`` over the cache: float32 logits of the last
        position [B, V] (of every position [B, T, V] with ``every_position``) and the state with these
        tokens written."""
        state.kv.check_room(ids.shape[1])
        out = self.decode(ids, state.encoder, valid=valid, positions=positions, cache=state.kv)
        return step_logits(self, out.hidden, every_position), dataclasses.replace(state, kv=out.cache)

    def for_decode_loop(self) -> EncoderDecoder:
        return unstacked_decoder(self)

    def decoding_copy(self) -> EncoderDecoder:
        """This model laid out once for many generations on CPU (``decoder.decoding_copy``)."""
        return decoding_copy(self)


def shifted_right(cfg: ModelConfig, input_ids: Array) -> Array:
    """The decoder inputs the classification and span heads read when given none, as transformers derives
    them: input_ids shifted one to the right behind decoder_start_token_id (BART, T5), or (mBART) behind
    each row's last non-pad token, its language code."""
    input_ids = jnp.asarray(input_ids)
    if cfg.tokens.wrap_decoder_start:
        last = jnp.sum(input_ids != cfg.tokens.pad, axis=1) - 1
        start = jnp.take_along_axis(input_ids, last[:, None], axis=1)
    else:
        start = jnp.full((input_ids.shape[0], 1), cfg.tokens.decoder_start, input_ids.dtype)
    return jnp.concatenate([start, input_ids[:, :-1]], axis=1)


def last_eos_state(cfg: ModelConfig, hidden: Array, input_ids: Array) -> Array:
    """[B, D]: each row's decoder state at the position of its last eos_token_id in input_ids (what BART's
    and T5's classifiers read; ``check_eos_pooling`` makes sure every row has one)."""
    is_eos = input_ids == cfg.tokens.eos
    last = is_eos.shape[1] - 1 - jnp.argmax(is_eos[:, ::-1], axis=1)
    return jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]


def check_derivable(cfg: ModelConfig, input_ids) -> None:
    """Deriving decoder inputs from input_ids needs the ids transformers' shift needs."""
    if cfg.tokens.pad is None or (cfg.tokens.decoder_start is None and not cfg.tokens.wrap_decoder_start):
        raise ValueError(f"without decoder_input_ids, head={cfg.head!r} shifts input_ids right behind "
                         f"decoder_start_token_id, and needs a pad_token_id (as transformers does); the config has "
                         f"decoder_start_token_id={cfg.tokens.decoder_start}, pad_token_id={cfg.tokens.pad}: "
                         "set them, or pass decoder_input_ids")
    if cfg.tokens.wrap_decoder_start and not isinstance(input_ids, jax.core.Tracer):
        empty = np.flatnonzero((np.asarray(input_ids) != cfg.tokens.pad).sum(axis=1) == 0)
        if empty.size:
            raise ValueError(f"rows {empty.tolist()} of input_ids hold only pad_token_id={cfg.tokens.pad}: without "
                             "decoder_input_ids, mBART's decoder starts from each row's last non-pad token")


def check_eos_pooling(cfg: ModelConfig, input_ids, decoder_length: int) -> None:
    """The classifier reads the decoder state where input_ids hold their last EOS: the decoder must be as long
    as the source, and (on concrete ids) every row must hold the same number of EOS tokens, at least one
    (transformers refuses otherwise)."""
    if decoder_length != input_ids.shape[1]:
        raise ValueError(f"head='sequence_classification' reads the decoder state at the EOS positions of input_ids, "
                         f"so the decoder inputs must be as long as input_ids ({input_ids.shape[1]}), not "
                         f"{decoder_length}")
    if isinstance(input_ids, jax.core.Tracer):
        return
    counts = (np.asarray(input_ids) == cfg.tokens.eos).sum(axis=1)
    if len(set(counts.tolist())) > 1:
        raise ValueError(f"all rows of input_ids must hold the same number of eos_token_id={cfg.tokens.eos} "
                         f"tokens (transformers' BART and T5 classifiers refuse otherwise); their counts are "
                         f"{counts.tolist()}")
    if counts.size and counts[0] == 0:
        raise ValueError(f"each row of input_ids must hold eos_token_id={cfg.tokens.eos}: the classifier reads "
                         "the decoder state at the last one, and these rows hold none")
