"""Encoder-decoder family (the 2017 Transformer, T5, BART): a bidirectional encoder, a causal decoder
that cross-attends to it, and an LM head. One token embedding is shared by both sides."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import kernels
from jaxformer.boundary import ModelOutput, PretrainedMixin, check_inputs, compiled_when_concrete, embed_inputs
from jaxformer.config import ModelConfig
from jaxformer.decoder import lm_logits, make_lm_head
from jaxformer.layers import Embed, Embeddings, Stack, split_key, visibility_mask

Array = jax.Array


class EncoderDecoder(PretrainedMixin, nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embed = Embed(cfg.vocab_size, cfg, rngs=rngs)
        self.encoder_embeddings = Embeddings(cfg, rngs=rngs)
        self.encoder = Stack(cfg, cfg.encoder_layers, pattern="bidirectional", rngs=rngs)
        self.decoder_embeddings = Embeddings(cfg, rngs=rngs)
        self.decoder = Stack(cfg, cfg.decoder_layers, pattern=cfg.attention, cross_attention=True, rngs=rngs)
        self.lm_head, self.logits_bias = make_lm_head(cfg, rngs)

    def encode(self, input_ids: Array | None = None, attention_mask: Array | None = None, *,
               inputs_embeds: Array | None = None, output_hidden_states: bool = False,
               dropout_key: Array | None = None) -> tuple[Array, tuple[Array, ...] | None]:
        keys = split_key(dropout_key, 2)
        x, positions, key_valid = embed_inputs(self, self.encoder_embeddings, input_ids, inputs_embeds,
                                               attention_mask, None, key=keys[0])
        h, hidden, _, _ = self.encoder(x, positions, key_valid=key_valid, collect_hidden=output_hidden_states,
                                       key=keys[1], index_positions=True)
        return h, hidden

    def decode(self, decoder_input_ids: Array | None, encoder_out: Array, attention_mask: Array | None = None,
               decoder_attention_mask: Array | None = None, *, decoder_inputs_embeds: Array | None = None,
               output_hidden_states: bool = False, dropout_key: Array | None = None
               ) -> tuple[Array, tuple[Array, ...] | None]:
        keys = split_key(dropout_key, 2)
        x, positions, key_valid = embed_inputs(self, self.decoder_embeddings, decoder_input_ids,
                                               decoder_inputs_embeds, decoder_attention_mask, None, key=keys[0],
                                               names=("decoder_input_ids", "decoder_attention_mask"))
        if encoder_out.shape[0] != x.shape[0]:
            raise ValueError(f"decoder batch {x.shape[0]} differs from encoder batch {encoder_out.shape[0]}")
        B, S = encoder_out.shape[:2]
        enc_positions = jnp.broadcast_to(jnp.arange(S), (B, S))
        cross_mask = kernels.fused_mask(self.config, visibility_mask("bidirectional", positions, enc_positions,
                                                                     attention_mask),
                                        "bidirectional", key_valid=attention_mask)
        h, hidden, _, _ = self.decoder(x, positions, key_valid=key_valid, encoder_out=encoder_out,
                                       cross_mask=cross_mask, collect_hidden=output_hidden_states, key=keys[1],
                                       index_positions=True)
        return h, hidden

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

    @compiled_when_concrete
    def __call__(self, input_ids: Array | None = None, attention_mask: Array | None = None,
                 decoder_input_ids: Array | None = None, decoder_attention_mask: Array | None = None, *,
                 inputs_embeds: Array | None = None, decoder_inputs_embeds: Array | None = None,
                 output_hidden_states: bool = False, dropout_key: Array | None = None) -> ModelOutput:
        cfg = self.config
        self.validate(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask,
                      inputs_embeds=inputs_embeds, decoder_inputs_embeds=decoder_inputs_embeds)
        keys = split_key(dropout_key, 2)
        enc, enc_hidden = self.encode(input_ids, attention_mask, inputs_embeds=inputs_embeds,
                                      output_hidden_states=output_hidden_states, dropout_key=keys[0])
        h, hidden = self.decode(decoder_input_ids, enc, attention_mask, decoder_attention_mask,
                                decoder_inputs_embeds=decoder_inputs_embeds,
                                output_hidden_states=output_hidden_states, dropout_key=keys[1])
        logits = lm_logits(h, self) if cfg.head == "lm" else None
        return ModelOutput(logits=logits, last_hidden_state=h, hidden_states=hidden,
                           encoder_last_hidden_state=enc, encoder_hidden_states=enc_hidden)
