"""Encoder-decoder family (the 2017 Transformer, T5, BART): a bidirectional encoder, a causal decoder
that cross-attends to it, and an LM head. One token embedding is shared by both sides (T5Gemma: one each).

The decoder's one forward pass (``decode``) serves whole sequences (``__call__``) and cached steps
(``step``, over a ``DecodeState`` holding every layer's cross-attention keys and values, computed once
per source by ``init_cache``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.cache import DecodeState, EncoderKV, KVCache, empty_cache
from jaxformer.checks import check_inputs, public_call
from jaxformer.config import ModelConfig
from jaxformer.decoder import step_logits, lm_logits, make_lm_head, unstacked_decoder
from jaxformer.layers import Embed, Embeddings, EncoderOutput, Stack, StackOutput, Tokens, dtype_of, split_key
from jaxformer.outputs import ModelOutput

Array = jax.Array


class EncoderDecoder(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embed = Embed(cfg.vocab_size, cfg, rngs=rngs)  # the decoder's (and the tied head's), and the encoder's
        self.encoder_embed = None if cfg.shared_embeddings else Embed(cfg.vocab_size, cfg, rngs=rngs)  # T5Gemma's own
        self.encoder_embeddings = Embeddings(cfg, rngs=rngs)
        self.encoder = Stack(cfg, cfg.encoder_layers, pattern="bidirectional", rngs=rngs)
        self.decoder_embeddings = Embeddings(cfg, rngs=rngs)
        self.decoder = Stack(cfg, cfg.decoder_layers, pattern=cfg.attention, cross_attention=True, rngs=rngs)
        self.lm_head, self.logits_bias = make_lm_head(cfg, rngs)

    def encode(self, input_ids: Array | None = None, attention_mask: Array | None = None, *,
               inputs_embeds: Array | None = None) -> EncoderOutput:
        """The source's encoding, checked like a model call: what ``init_cache`` (and cross-attention)
        reads. Generation encodes once per source with it."""
        check_inputs(self.config, input_ids, inputs_embeds, attention_mask)
        hidden = self.encoder_pass(input_ids, attention_mask, inputs_embeds=inputs_embeds).hidden
        return EncoderOutput(hidden, attention_mask)

    def encoder_pass(self, input_ids: Array | None, attention_mask: Array | None = None, *,
                     inputs_embeds: Array | None = None, collect_hidden: bool = False,
                     collect_attentions: bool = False, key: Array | None = None) -> StackOutput:
        """The encoder's one forward pass, on inputs already checked (by ``__call__`` or ``encode``)."""
        keys = split_key(key, 2)
        table = self.embed if self.encoder_embed is None else self.encoder_embed
        x, positions = self.encoder_embeddings(table, input_ids, inputs_embeds=inputs_embeds, key=keys[0])
        return self.encoder(x, Tokens(positions, attention_mask, indexed=True), collect_hidden=collect_hidden,
                            collect_attentions=collect_attentions, key=keys[1])

    def decode(self, decoder_input_ids: Array | None, source: EncoderOutput | EncoderKV, *,
               inputs_embeds: Array | None = None, valid: Array | None = None, positions: Array | None = None,
               cache: KVCache | None = None, collect_hidden: bool = False, collect_attentions: bool = False,
               key: Array | None = None) -> StackOutput:
        """The one decoder pass: embeddings, then the causal stack cross-attending to ``source`` (an
        encoder output, or its precomputed keys and values), over ``cache`` (if any)."""
        keys = split_key(key, 2)
        x, at = self.decoder_embeddings(self.embed, decoder_input_ids, inputs_embeds=inputs_embeds,
                                        positions=positions, key=keys[0])
        if positions is None and self.config.pad_aware_positions:  # (M2M-100) causal visibility goes by index
            at = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape[:2])
        tokens = Tokens(at, valid, indexed=positions is None and cache is None)
        return self.decoder(x, tokens, cache=cache, cross=source, collect_hidden=collect_hidden,
                            collect_attentions=collect_attentions, key=keys[1])

    def validate(self, input_ids=None, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None, *,
                 inputs_embeds=None, decoder_inputs_embeds=None, **_) -> None:
        """Both streams are checked before either runs: a bad decoder input fails before the encoder."""
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            raise ValueError("an encoder-decoder model needs decoder_input_ids (or decoder_inputs_embeds); "
                             "for generation use model.generate")
        encoder_shape = check_inputs(self.config, input_ids, inputs_embeds, attention_mask)
        decoder_shape = check_inputs(self.config, decoder_input_ids, decoder_inputs_embeds, decoder_attention_mask,
                                     names=("decoder_input_ids", "decoder_attention_mask"))
        if encoder_shape[0] != decoder_shape[0]:
            raise ValueError(f"decoder batch {decoder_shape[0]} differs from encoder batch {encoder_shape[0]}")

    @public_call
    def __call__(self, input_ids: Array | None = None, attention_mask: Array | None = None,
                 decoder_input_ids: Array | None = None, decoder_attention_mask: Array | None = None, *,
                 inputs_embeds: Array | None = None, decoder_inputs_embeds: Array | None = None,
                 output_hidden_states: bool = False, output_attentions: bool = False,
                 dropout_key: Array | None = None) -> ModelOutput:
        """Decoder logits; ``attentions`` are the decoder's self-attention probabilities (transformers:
        decoder_attentions), with ``encoder_attentions`` and ``cross_attentions``."""
        keys = split_key(dropout_key, 2)
        encoded = self.encoder_pass(input_ids, attention_mask, inputs_embeds=inputs_embeds,
                                    collect_hidden=output_hidden_states, collect_attentions=output_attentions,
                                    key=keys[0])
        decoded = self.decode(decoder_input_ids, EncoderOutput(encoded.hidden, attention_mask),
                              inputs_embeds=decoder_inputs_embeds, valid=decoder_attention_mask,
                              collect_hidden=output_hidden_states, collect_attentions=output_attentions, key=keys[1])
        logits = lm_logits(self, decoded.hidden) if self.config.head == "lm" else None
        return ModelOutput(logits=logits, last_hidden_state=decoded.hidden, hidden_states=decoded.hidden_states,
                           encoder_last_hidden_state=encoded.hidden, encoder_hidden_states=encoded.hidden_states,
                           attentions=decoded.attentions, encoder_attentions=encoded.attentions,
                           cross_attentions=decoded.cross_attentions)

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
