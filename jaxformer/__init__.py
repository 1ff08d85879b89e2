"""jaxformer: the three Transformer families (encoder, decoder, encoder-decoder) in JAX/Flax NNX.

Shape legend, used in every einsum and docstring:
    B batch    T query (new) tokens    S key tokens (cache slots, source)    D d_model
    N query heads    K kv heads    G query heads per kv head    M = G * T query rows per kv head
    H head dim    F feed-forward width (any projection's output)    V vocabulary    L layers
    E experts    k experts chosen per token

    import jaxformer as jf
    model = jf.build("tiny-gpt")
    out = model(input_ids)
    graphdef, state = jf.split(model)      # pure-function use under jax.jit / jax.grad

Layers: this face -> the edges (interop, checkpoint, compare, train, cli) -> the families
(encoder, decoder, encoder_decoder, built through ``models``) -> generate (the decode loop) -> layers, kernels,
cache, model_config.
"""

from __future__ import annotations

from flax import nnx

from jaxformer.adapt import adapt
from jaxformer.model_config import ModelConfig, RopeScaling
from jaxformer.decoder import Decoder
from jaxformer.embedder import Embedder, ImageTextEmbedder
from jaxformer.encoder import Encoder
from jaxformer.encoder_decoder import EncoderDecoder
from jaxformer.interop.hf import from_pretrained, save_pretrained
from jaxformer.interop.peft import save_adapter
from jaxformer.interop.tokenizer import load_tokenizer
from jaxformer.lora import merge_adapter, quantized, with_lora
from jaxformer.models import abstract_params, build, param_count
from jaxformer.outputs import ModelOutput
from jaxformer.presets import config, presets

__all__ = ["ModelConfig", "RopeScaling", "ModelOutput", "Encoder", "Decoder", "EncoderDecoder", "build",
           "config", "presets", "split", "merge", "abstract_params", "param_count", "from_pretrained",
           "load_tokenizer", "adapt", "with_lora", "quantized", "Embedder", "ImageTextEmbedder", "save_pretrained",
           "save_adapter", "merge_adapter"]

split = nnx.split
merge = nnx.merge
