"""Shared math of the three families, one concern a file:

    core         parameters with logical axes, dense projections, dropout, norms, activations
    feedforward  the MLP (plain or gated) and the mixture of experts
    positions    the embedding front end, absolute positions, rotary angles, T5's relative bias, DeBERTa's
                 relative-position table and its log buckets
    attention    visibility masks from positions, grouped-query attention, the attention layers (standard,
                 latent with DeepSeek-V3.2's indexer, Transformer-XL's relative, DeBERTa's disentangled)
    convolution  DeBERTa v2's convolution beside the first layer
    audio        an encoder's audio front end (Whisper): log-mel frames through two convolutions, stored positions
    stack        the block, the scanned stack, and what a stack call is told (Tokens, caches)

Modules here hold parameters only. Randomness (dropout) arrives as explicit PRNG keys, and caches
arrive and leave as values (``jaxformer.cache``), so every forward pass is a pure function of
(params, inputs).
"""

from jaxformer.layers.attention import (Attention, Indexer, IndexerParam, LatentAttention, dot_product_attention,
                                        layer_patterns, left_padded_positions, memory_visibility_mask, softmax,
                                        visibility_mask)
from jaxformer.layers.core import (Buffer, Dense, Norm, activate, dropout, dtype_of, logical_axes, normalize,
                                   param, split_key)
from jaxformer.layers.feedforward import (MLP, ExpertWeights, MoE, RouterBias, Routing, Unit, dense_experts,
                                          grouped_experts, load_balancing_loss, ragged_experts, route,
                                          router_statistics)
from jaxformer.layers.positions import (Embed, Embeddings, Positions, RelativeBias, apply_rope, embedding_width,
                                        rope_angles, rope_frequencies, rope_tables, sinusoids)
from jaxformer.layers.stack import (REMAT_POLICIES, Block, EncoderOutput, LayerOutput, Stack, StackOutput, Tokens,
                                    packed_validity, run_layers)

__all__ = ["Attention", "Indexer", "IndexerParam", "LatentAttention", "dot_product_attention", "softmax",
           "visibility_mask", "layer_patterns", "memory_visibility_mask", "left_padded_positions", "Buffer", "Dense",
           "Norm", "activate", "dropout", "dtype_of", "logical_axes", "normalize", "param", "split_key", "MLP", "MoE",
           "RouterBias", "Routing", "ExpertWeights", "Unit", "dense_experts", "grouped_experts", "load_balancing_loss",
           "ragged_experts", "route", "router_statistics", "Embed", "embedding_width",
           "Embeddings", "Positions", "RelativeBias", "apply_rope", "rope_angles", "rope_frequencies", "rope_tables",
           "sinusoids",
           "REMAT_POLICIES", "Block", "EncoderOutput", "Stack", "StackOutput", "Tokens", "packed_validity",
           "LayerOutput", "run_layers"]
