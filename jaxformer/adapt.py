"""One family into another, keeping the weights: a decoder-only model into an encoder-decoder (T5Gemma,
Zhang et al. 2025) or into a prefix-LM.

    ed = jf.adapt(decoder_model, "encoder_decoder")   # encoder and decoder both start from its layers
    plm = jf.adapt(decoder_model, "prefix_lm")          # the same weights, a bidirectional prefix

The encoder-decoder's encoder and decoder layers are copies of the decoder-only layers (the same
tensors), its cross-attention starts as a copy of each layer's self-attention (norms included), and the
token embedding (one table per side, as T5Gemma has), positions and final norm are copied to both sides. A
Gemma 2 model adapts into exactly T5Gemma's architecture and saves in its format. Only what the new family adds
(nothing, for these blocks) would be freshly initialised, and a tensor without a source is an error.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from jaxformer.model_config import ModelConfig
from jaxformer.models import Model, build

KINDS = ("encoder_decoder", "prefix_lm")

# An encoder-decoder decoder layer's cross-attention sublayer starts from its self-attention sublayer.
_CROSS_SOURCES = {"cross_attn": "attn", "cross_norm": "attn_norm", "cross_post_norm": "attn_post_norm"}


def adapted_config(cfg: ModelConfig, kind: str) -> ModelConfig:
    """The config of ``jf.adapt``'s result, or a ValueError naming what does not carry over."""
    if kind not in KINDS:
        raise ValueError(f"adapt(kind={kind!r}) is not valid; expected one of {KINDS}")
    if cfg.family != "decoder":
        raise ValueError(f"adapt() takes a decoder-only model; {cfg.name!r} is a {cfg.family} model")
    if kind == "prefix_lm":
        if cfg.attention not in ("causal", "prefix") or cfg.position == "xl":
            raise ValueError(f"adapt(kind='prefix_lm') needs a causal decoder; {cfg.name!r} has attention="
                             f"{cfg.attention!r} and position={cfg.position!r}, whose windows or memory a prefix "
                             "mask would drop")
        return cfg.replace(attention="prefix")
    unsupported = {"num_experts": cfg.experts is not None, "kv_lora_rank": cfg.mla,
                   "position='xl'": cfg.position == "xl",
                   "type_vocab_size": cfg.embeddings.types > 0, "lm_head_bias": cfg.logits.trained_bias}
    named = [name for name, present in unsupported.items() if present]
    if named:
        raise ValueError(f"adapt(kind='encoder_decoder'): {cfg.name!r} has {', '.join(named)}, which the "
                         "encoder-decoder family does not build; adaptable decoders are dense, with multi-head, "
                         "grouped or multi-query attention (GPT-2, LLaMA, Qwen2, Mistral, Gemma)")
    start = cfg.tokens.decoder_start
    if start is None:  # T5Gemma's decoder starts from <bos>, as the decoder-only model began its documents
        start = cfg.tokens.bos if cfg.tokens.bos is not None else cfg.tokens.pad
    # T5Gemma keeps one token table per side, both starting as the decoder-only model's
    return cfg.replace(family="encoder_decoder", name=f"{cfg.name}-encoder-decoder", encoder_layers=cfg.decoder_layers,
                       attention="causal" if cfg.attention == "prefix" else cfg.attention, head="lm",
                       decoder_start_token_id=start, shared_embeddings=False)


def _source_path(path: tuple) -> tuple:
    """Where an encoder-decoder variable's initial value lies in the decoder-only model."""
    head, *rest = path
    if head == "encoder":
        return ("decoder", *rest)
    if head in ("encoder_embeddings", "decoder_embeddings"):
        return ("embeddings", *rest)
    if head == "encoder_embed":  # separate encoder and decoder token tables (T5Gemma): both from the one
        return ("embed", *rest)
    if head == "decoder" and len(rest) > 1 and rest[1] in _CROSS_SOURCES:
        return ("decoder", rest[0], _CROSS_SOURCES[rest[1]], *rest[2:])
    return path


def adapt(model: Model, kind: str, *, seed: int = 0) -> Model:
    """``model`` (decoder-only) as an encoder-decoder or prefix-LM whose every tensor is copied from it.

    ``seed`` seeds the new model's construction, whose every value is then overwritten (a tensor without a
    source raises instead). The result is a new model; ``model`` is unchanged.
    """
    cfg = adapted_config(model.config, kind)
    adapted = build(cfg, seed=seed)
    source = dict(nnx.to_flat_state(nnx.state(model)))
    target = nnx.state(adapted)
    used, missing, mismatched = set(), [], []
    for path, variable in nnx.to_flat_state(target):
        origin = path if kind == "prefix_lm" else _source_path(path)
        if origin not in source:
            missing.append(".".join(map(str, path)))
        elif source[origin].shape != variable.shape:
            mismatched.append(f"{'.'.join(map(str, path))} {variable.shape} from {'.'.join(map(str, origin))} "
                              f"{source[origin].shape}")
        else:
            # a copy per destination: encoder and decoder share no buffer, so a train step may donate both
            variable[...] = jnp.array(source[origin][...], dtype=variable.dtype, copy=True)
            used.add(origin)
    unused = [".".join(map(str, p)) for p in source if p not in used]
    if missing or mismatched or unused:
        raise ValueError(f"adapt(kind={kind!r}) cannot copy {cfg.name!r} whole: "
                         + "; ".join(f"{what}: {', '.join(items)}" for what, items in
                                     (("no source for", missing), ("shapes differ", mismatched),
                                      ("left behind", unused)) if items))
    nnx.update(adapted, target)
    return adapted
