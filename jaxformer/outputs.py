"""What a model call returns: Hugging Face's output conventions, as a pytree that can leave a jit."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct


@struct.dataclass
class ModelOutput:
    """``hidden_states`` holds the embedding output plus one entry per layer, as in transformers."""

    logits: jax.Array | None = None
    last_hidden_state: jax.Array | None = None
    hidden_states: tuple[jax.Array, ...] | None = None
    encoder_last_hidden_state: jax.Array | None = None
    encoder_hidden_states: tuple[jax.Array, ...] | None = None
    # output_attentions=True: per layer [B, N, T, S] float32 softmax probabilities, as transformers returns them.
    # Encoder-decoders: ``attentions`` is the decoder's self-attention (transformers: decoder_attentions).
    attentions: tuple[jax.Array, ...] | None = None
    encoder_attentions: tuple[jax.Array, ...] | None = None
    cross_attentions: tuple[jax.Array, ...] | None = None
    pooler_output: jax.Array | None = None
    nsp_logits: jax.Array | None = None  # BERT pretraining head: next-sentence prediction
    start_logits: jax.Array | None = None  # extractive question answering
    end_logits: jax.Array | None = None
    aux_loss: jax.Array | None = None  # MoE load-balancing loss (times router_aux_loss_coef)
    router_load: jax.Array | None = None  # MoE [L_moe, E]: each expert's share of the routed tokens, per layer
    memory: Any = None  # Transformer-XL: the ``cache.Memory`` to pass with the next segment


@struct.dataclass
class ContrastiveOutput:
    """A dual encoder's answer (transformers' CLIPOutput): the scaled similarities of every image to every text
    (``logits_per_image`` [B_image, B_text], its transpose ``logits_per_text``), the unit-length embeddings both
    were computed from, and each tower's output as ``get_text_features`` and ``get_image_features`` answer it (its
    ``pooler_output`` projected where the model projects)."""

    logits_per_image: jax.Array | None = None
    logits_per_text: jax.Array | None = None
    text_embeds: jax.Array | None = None
    image_embeds: jax.Array | None = None
    text_model_output: ModelOutput | None = None
    vision_model_output: ModelOutput | None = None
