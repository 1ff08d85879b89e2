"""``torch.nn.Transformer`` <-> the jaxformer encoder-decoder (the 2017 architecture).

torch's module holds only the two stacks: post-norm layers (``norm_first=False``), fused q/k/v
projections (``in_proj_weight`` [3D, D]) and a final LayerNorm on each side. It has no embeddings,
so the token table (and the sinusoids, scale and tied output that the paper adds) stay jaxformer's:
pass ``embedding`` to reuse a table you have. ``batch_first`` changes how torch is called, not its
state dict, so both layouts map the same way.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from jaxformer.model_config import Embeddings, ModelConfig, Norms
from jaxformer.models import build
from jaxformer.interop.rules import Rule, build_from_tensors, copy, export_with_rules, linear


def config_for(d_model: int, nhead: int, num_encoder_layers: int, num_decoder_layers: int,
               dim_feedforward: int, vocab_size: int, *, max_positions: int = 1024, layer_norm_eps: float = 1e-5,
               activation: str = "relu", name: str = "nn.Transformer") -> ModelConfig:
    """The ModelConfig matching a ``torch.nn.Transformer`` built with these arguments."""
    return ModelConfig(name=name, family="encoder_decoder", vocab_size=vocab_size, d_model=d_model, num_heads=nhead,
                       d_ff=dim_feedforward, encoder_layers=num_encoder_layers, decoder_layers=num_decoder_layers,
                       norms=Norms(kind="layernorm", position="post", eps=layer_norm_eps, final=True),
                       activation=activation, position="sinusoidal", max_positions=max_positions,
                       embeddings=Embeddings(scale=True, tie=True))


def _attention_rules(cfg: ModelConfig, path: tuple[str, ...], name: str) -> list[Rule]:
    D, N, H = cfg.d_model, cfg.num_heads, cfg.head_dim_
    return [
        Rule(tuple(path + (n,) for n in "qkv"), (f"{name}.in_proj_weight",),
             lambda t: [w.T.reshape(D, N, H) for w in np.split(t[0], 3, axis=0)],
             lambda ps: [np.concatenate([w.reshape(D, N * H).T for w in ps], axis=0)]),
        Rule(tuple(path + (f"{n}_bias",) for n in "qkv"), (f"{name}.in_proj_bias",),
             lambda t: [b.reshape(N, H) for b in np.split(t[0], 3)],
             lambda ps: [np.concatenate([b.reshape(-1) for b in ps])]),
        Rule((path + ("o",),), (f"{name}.out_proj.weight",), lambda t: [t[0].T.reshape(N, H, D)],
             lambda ps: [ps[0].reshape(N * H, D).T]),
        copy(path + ("o_bias",), f"{name}.out_proj.bias"),
    ]


def rules(cfg: ModelConfig) -> list[Rule]:
    out: list[Rule] = []
    for side in ("encoder", "decoder"):
        L, layer = (side, "blocks"), f"{side}.layers.{{i}}"
        norms = ["attn_norm", "cross_norm", "mlp_norm"] if side == "decoder" else ["attn_norm", "mlp_norm"]
        out += _attention_rules(cfg, L + ("attn",), f"{layer}.self_attn")
        if side == "decoder":
            out += _attention_rules(cfg, L + ("cross_attn",), f"{layer}.multihead_attn")
        out += [linear(L + ("mlp", "wi"), f"{layer}.linear1.weight"), copy(L + ("mlp", "bi"), f"{layer}.linear1.bias"),
                linear(L + ("mlp", "wo"), f"{layer}.linear2.weight"), copy(L + ("mlp", "bo"), f"{layer}.linear2.bias")]
        for k, norm in enumerate(norms, start=1):
            out += [copy(L + (norm, "scale"), f"{layer}.norm{k}.weight"), copy(L + (norm, "bias"), f"{layer}.norm{k}.bias")]
        out += [copy((side, "final_norm", "scale"), f"{side}.norm.weight"),
                copy((side, "final_norm", "bias"), f"{side}.norm.bias")]
    return out


def _numpy_state(state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {k: (v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)) for k, v in state_dict.items()}


def from_state_dict(state_dict: Mapping[str, Any], cfg: ModelConfig, embedding: np.ndarray | None = None,
                    seed: int = 0):
    """A jaxformer EncoderDecoder holding the weights of a ``torch.nn.Transformer`` state dict.

    The token embedding is ``embedding`` [vocab, d_model] if given, else freshly initialised from
    ``seed``. Missing, unexpected and mis-shaped tensors are reported together; nothing partial loads.
    """
    if cfg.family != "encoder_decoder" or cfg.norms.position != "post" or not cfg.norms.final:
        raise ValueError("torch.nn.Transformer maps to a post-norm encoder-decoder with final norms; "
                         "build the config with jaxformer.interop.nn_transformer.config_for")
    tensors = _numpy_state(state_dict)
    if embedding is None:
        embedding = np.asarray(build(cfg, seed=seed).embed.table[...])
    tensors["embedding"] = np.asarray(embedding)
    table = [copy(("embed", "table"), "embedding"), *rules(cfg)]
    return build_from_tensors(cfg, table, {}, set(tensors), tensors.__getitem__,
                              "state dict does not match torch.nn.Transformer with this config")


def to_state_dict(model) -> dict[str, np.ndarray]:
    """The inverse: a state dict (numpy arrays) that ``torch.nn.Transformer.load_state_dict`` accepts
    after ``torch.from_numpy``; the embedding table is not part of it (torch's module has none)."""
    return export_with_rules(model, rules(model.config))
