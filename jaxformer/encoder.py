"""Encoder-only family (BERT and its relatives): embeddings, bidirectional blocks, task heads."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.checks import check_inputs, public_call
from jaxformer.config import ModelConfig
from jaxformer.layers import (Dense, Embed, Embeddings, Norm, Stack, Tokens, activate, dropout, embedding_width, param,
                              split_key)
from jaxformer.outputs import ModelOutput

Array = jax.Array


class MaskedLMHead(nnx.Module):
    """BERT/RoBERTa: dense -> activation -> norm -> vocabulary projection (tied) + bias. With factorised
    embeddings (ALBERT, ELECTRA's generator) the dense layer narrows to ``embedding_size`` first."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        width, axis = embedding_width(cfg)
        self.activation = cfg.activation
        self.transform = Dense(cfg, cfg.d_model, width, ("embed", "embed_out" if axis == "embed" else axis), rngs=rngs)
        self.norm = Norm(cfg, rngs=rngs, width=width, axis=axis)
        self.decoder = (None if cfg.tie_embeddings else
                        Dense(cfg, width, cfg.vocab_size, (axis, "vocab"), rngs=rngs, bias=False))
        self.bias = param(rngs, (cfg.vocab_size,), ("vocab",), cfg, init="zeros")

    def __call__(self, x: Array, embed: Embed) -> Array:
        h = self.norm(activate(self.activation, self.transform(x)))
        logits = embed.attend(h) if self.decoder is None else self.decoder(h)
        return logits + self.bias[...].astype(logits.dtype)


class DiscriminatorHead(nnx.Module):
    """ELECTRA's replaced-token detection: dense -> activation -> one logit per token [B, T] (> 0: replaced)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.activation = cfg.activation
        self.dense = Dense(cfg, cfg.d_model, cfg.d_model, ("embed", "embed_out"), rngs=rngs)
        self.prediction = Dense(cfg, cfg.d_model, 1, ("embed", "labels"), rngs=rngs)

    def __call__(self, x: Array) -> Array:
        return self.prediction(activate(self.activation, self.dense(x)))[..., 0]


class Encoder(nnx.Module):
    """The encoder-only model: embeddings, a bidirectional stack, and the head named by ``config.head``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        width, axis = embedding_width(cfg)
        self.embed = Embed(cfg.vocab_size, cfg, rngs=rngs, axes=("vocab", axis), width=width)
        self.embeddings = Embeddings(cfg, rngs=rngs, token_types=True)
        self.encoder = Stack(cfg, cfg.encoder_layers, pattern="bidirectional", rngs=rngs)
        self.pooler = Dense(cfg, cfg.d_model, cfg.d_model, ("embed", "embed_out"), rngs=rngs) if cfg.pooler else None
        self.mlm = MaskedLMHead(cfg, rngs=rngs) if cfg.head in ("mlm", "pretraining") else None
        self.nsp = Dense(cfg, cfg.d_model, 2, ("embed", "labels"), rngs=rngs) if cfg.head == "pretraining" else None
        self.discriminator = DiscriminatorHead(cfg, rngs=rngs) if cfg.head == "discriminator" else None
        label_count = {"sequence_classification": cfg.num_labels, "token_classification": cfg.num_labels,
                       "question_answering": 2}.get(cfg.head)
        self.classifier = (Dense(cfg, cfg.d_model, label_count, ("embed", "labels"), rngs=rngs)
                           if label_count else None)
        self.generator = self._generator(cfg, rngs) if cfg.generator_width else None

    def _generator(self, cfg: ModelConfig, rngs: nnx.Rngs) -> Encoder:
        """ELECTRA's generator: an MLM encoder reading this model's token, position and type embeddings and
        their norm (the same variables, so both losses train them), with its own projection to its width."""
        generator = Encoder(cfg.generator_config(), rngs=rngs)
        generator.embed = self.embed
        shared = generator.embeddings
        shared.positions, shared.token_types, shared.norm = (self.embeddings.positions, self.embeddings.token_types,
                                                             self.embeddings.norm)
        return generator

    def validate(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, *,
                 inputs_embeds=None, **_) -> None:
        check_inputs(self.config, input_ids, inputs_embeds, attention_mask, position_ids, token_type_ids)

    @public_call
    def __call__(self, input_ids: Array | None = None, attention_mask: Array | None = None,
                 token_type_ids: Array | None = None, position_ids: Array | None = None, *,
                 inputs_embeds: Array | None = None, output_hidden_states: bool = False,
                 output_attentions: bool = False, dropout_key: Array | None = None) -> ModelOutput:
        cfg = self.config
        keys = split_key(dropout_key, 3)
        x, positions = self.embeddings(self.embed, input_ids, inputs_embeds=inputs_embeds, positions=position_ids,
                                       token_type_ids=token_type_ids, key=keys[0])
        indexed = position_ids is None and not cfg.pad_aware_positions
        encoded = self.encoder(x, Tokens(positions, attention_mask, indexed=indexed),
                               collect_hidden=output_hidden_states, collect_attentions=output_attentions, key=keys[1])
        h, hidden = encoded.hidden, encoded.hidden_states
        pooled = None
        if self.pooler is not None:  # BERT's tanh, DistilBERT's relu (its pre_classifier), ELECTRA's gelu
            pooled = self.pooler(h[:, 0])
            pooled = jnp.tanh(pooled) if cfg.pooler_activation == "tanh" else activate(cfg.pooler_activation, pooled)
        out = dict(last_hidden_state=h, hidden_states=hidden, attentions=encoded.attentions, pooler_output=pooled)
        if self.mlm is not None:
            out["logits"] = self.mlm(h, self.embed)
        if self.nsp is not None:  # next-sentence (BERT) or sentence-order (ALBERT) prediction
            out["nsp_logits"] = self.nsp(pooled)
        if self.discriminator is not None:
            out["logits"] = self.discriminator(h)
        if cfg.head == "sequence_classification":
            out["logits"] = self.classifier(dropout(pooled, cfg.dropout_rate, keys[2]))
        elif cfg.head == "token_classification":
            out["logits"] = self.classifier(dropout(h, cfg.dropout_rate, keys[2]))
        elif cfg.head == "question_answering":
            span = self.classifier(h)
            out["start_logits"], out["end_logits"] = span[..., 0], span[..., 1]
        return ModelOutput(**out)
