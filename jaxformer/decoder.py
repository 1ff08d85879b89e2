"""Decoder-only family (GPT-2, GPT-3, LLaMA, Mistral, Qwen2, Mixtral): embeddings, causal blocks, LM head."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.boundary import (ModelOutput, PretrainedMixin, check_inputs, check_prefix_lengths,
                                compiled_when_concrete, embed_inputs)
from jaxformer.config import ModelConfig
from jaxformer.layers import Buffer, Dense, Embed, Embeddings, Stack, dtype_of, load_balancing_loss, split_key

Array = jax.Array


def lm_logits(x: Array, model: nnx.Module) -> Array:
    """Next-token logits from the tied embedding or a separate [D, V] projection (+ a fixed bias)."""
    cfg: ModelConfig = model.config
    if model.lm_head is not None:
        logits = model.lm_head(x)
    else:
        if cfg.scale_tied_logits:  # T5 v1.0 rescales before reusing the input embedding
            x = x * jnp.asarray(cfg.d_model ** -0.5, x.dtype)
        logits = model.embed.attend(x)
    if model.logits_bias is not None:
        logits = logits + model.logits_bias[...].astype(logits.dtype)
    return logits


def make_lm_head(cfg: ModelConfig, rngs: nnx.Rngs) -> tuple[Dense | None, Buffer | None]:
    lm_head = (Dense(cfg, cfg.d_model, cfg.vocab_size, ("embed", "vocab"), rngs=rngs, bias=False)
               if cfg.head == "lm" and not cfg.tie_embeddings else None)
    bias = Buffer(jnp.zeros((cfg.vocab_size,), dtype_of(cfg.param_dtype)), axes=("vocab",)) if cfg.logits_bias else None
    return lm_head, bias


class Decoder(PretrainedMixin, nnx.Module):
    """The decoder-only model: token (+ position) embeddings, a causal stack, an LM head."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embed = Embed(cfg.vocab_size, cfg, rngs=rngs)
        self.embeddings = Embeddings(cfg, rngs=rngs)
        self.decoder = Stack(cfg, cfg.decoder_layers, pattern=cfg.attention, rngs=rngs)
        self.lm_head, self.logits_bias = make_lm_head(cfg, rngs)

    def validate(self, input_ids=None, attention_mask=None, position_ids=None, *, prefix_lengths=None,
                 inputs_embeds=None, **_) -> None:
        shape = check_inputs(self.config, input_ids, inputs_embeds, attention_mask, position_ids)
        check_prefix_lengths(prefix_lengths, self.config, *shape)

    @compiled_when_concrete
    def __call__(self, input_ids: Array | None = None, attention_mask: Array | None = None,
                 position_ids: Array | None = None, *, prefix_lengths: Array | None = None,
                 inputs_embeds: Array | None = None, output_hidden_states: bool = False,
                 dropout_key: Array | None = None) -> ModelOutput:
        cfg = self.config
        self.validate(input_ids, attention_mask, position_ids, prefix_lengths=prefix_lengths,
                      inputs_embeds=inputs_embeds)
        keys = split_key(dropout_key, 2)
        x, positions, key_valid = embed_inputs(self, self.embeddings, input_ids, inputs_embeds, attention_mask,
                                               position_ids, key=keys[0])
        h, hidden, _, stats = self.decoder(x, positions, key_valid=key_valid, prefix_lengths=prefix_lengths,
                                           collect_hidden=output_hidden_states, key=keys[1],
                                           index_positions=position_ids is None and not cfg.pad_aware_positions)
        logits = lm_logits(h, self) if cfg.head == "lm" else None
        aux = (cfg.router_aux_loss_coef * load_balancing_loss(stats, cfg.num_experts)
               if stats is not None else None)
        return ModelOutput(logits=logits, last_hidden_state=h, hidden_states=hidden, aux_loss=aux)
