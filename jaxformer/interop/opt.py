"""Meta's OPT (``opt``: OPT-125m to OPT-66b, and OPT-IML): config and tensor rules, both directions.

GPT-2's layout in torch Linear tensors under fairseq's names: LayerNorms with biases (eps 1e-5), biases on every
projection (``enable_bias``), a ReLU MLP (``fc1``, ``fc2``; ``activation_function``), a head tied to the token
embeddings, and learned positions whose table keeps two rows before position 0 (``position_offset=2``). A call
without position ids counts each row's positions from its attention mask (cumsum - 1), so a left-padded row
sits where an unpadded one does (``positions_from_mask``). ``do_layer_norm_before`` picks pre-norm, with a final
LayerNorm unless ``_remove_final_layer_norm``, or post-norm without one (OPT-350m's blocks).

Refused by name: ``word_embed_proj_dim`` other than ``hidden_size`` (OPT-350m: a 512-wide token table projected
in and out around the 1024-wide stack, positions added after the projection, no biases; jaxformer's factorised
embeddings are ALBERT's, which add positions before a biased projection and have no projection out),
``layer_norm_elementwise_affine=False`` (LayerNorms without scale or bias) and ``layerdrop`` > 0.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.llama import architecture
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Rule, activation, attention, copy, linear, lm_head, norm,
                                     refuse)

STEMS = {"opt": "OPT"}  # OPTModel, OPTForCausalLM (its tensors under model.)
# OPTConfig's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"opt": dict(max_position_embeddings=2048, do_layer_norm_before=True, _remove_final_layer_norm=False,
                        word_embed_proj_dim=None, dropout=0.1, attention_dropout=0.0, activation_function="relu",
                        layerdrop=0.0, enable_bias=True, layer_norm_elementwise_affine=True, tie_word_embeddings=True,
                        pad_token_id=1, bos_token_id=2, eos_token_id=2)}
LAYER_NORM_EPS = 1e-5  # torch's nn.LayerNorm default; OPT's file has no key for it
POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: rows 0 and 1 before position 0


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    width, hidden = hf["word_embed_proj_dim"], hf["hidden_size"]
    refuse(width not in (None, hidden), f"opt: word_embed_proj_dim={width} with hidden_size={hidden} (OPT-350m's "
           "layout: a narrower token table projected in before the positions and out after the stack, both without "
           "bias) is not supported: jaxformer's factorised embeddings (embedding_size) are ALBERT's, positions "
           "added before a biased projection in and no projection out")
    refuse(not hf["layer_norm_elementwise_affine"], "opt: layer_norm_elementwise_affine=False (LayerNorms without "
           "scale or bias) is not supported")
    refuse(hf["layerdrop"] > 0, f"opt: layerdrop={hf['layerdrop']} (skipping whole layers in training) is not "
           "supported")
    pre, bias = bool(hf["do_layer_norm_before"]), bool(hf["enable_bias"])
    # transformers builds the final norm only after a pre-norm stack, and not when the file removes it
    final = not hf["_remove_final_layer_norm"] and pre
    return dict(family="decoder", d_model=hidden, num_heads=hf["num_attention_heads"], d_ff=hf["ffn_dim"],
                decoder_layers=hf["num_hidden_layers"], norm="layernorm", norm_eps=LAYER_NORM_EPS, norm_bias=True,
                norm_position="pre" if pre else "post", final_norm=final,
                activation=activation(hf["activation_function"], False, model_type), position="learned",
                max_positions=hf["max_position_embeddings"], position_offset=POSITION_OFFSET,
                positions_from_mask=True, attention="causal", qkv_bias=bias, out_bias=bias, mlp_bias=bias,
                tie_embeddings=hf["tie_word_embeddings"], head="none" if arch.endswith("Model") else "lm",
                dropout_rate=float(hf["dropout"]), attention_dropout_rate=float(hf["attention_dropout"]))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    pre = cfg.norms.position == "pre"
    out.update(hidden_size=cfg.d_model, word_embed_proj_dim=cfg.d_model, num_attention_heads=cfg.num_heads,
               ffn_dim=cfg.d_ff, num_hidden_layers=cfg.decoder_layers, max_position_embeddings=cfg.max_positions,
               do_layer_norm_before=pre, _remove_final_layer_norm=pre and not cfg.norms.final,
               activation_function=INVERSE_ACTIVATIONS[cfg.activation], enable_bias=cfg.biases.qkv,
               layer_norm_elementwise_affine=True, layerdrop=0.0, tie_word_embeddings=cfg.embeddings.tie,
               dropout=cfg.dropout_rate, attention_dropout=cfg.attention_dropout_rate)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = f"{prefix}decoder.", ("decoder", "blocks")
    layer, M = f"{p}layers.{{i}}", L + ("mlp",)
    a = f"{layer}.self_attn"
    out = [
        copy(("embed", "table"), f"{p}embed_tokens.weight"),
        copy(("embeddings", "positions", "table"), f"{p}embed_positions.weight"),
        *attention(cfg, L + ("attn",), f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight",
                   f"{a}.out_proj.weight", f"{a}.q_proj.bias", f"{a}.k_proj.bias", f"{a}.v_proj.bias",
                   f"{a}.out_proj.bias"),
        # before (post-norm: after) attention and the MLP; a layer's "final" LayerNorm is its MLP's
        *norm(L + ("attn_norm",), f"{layer}.self_attn_layer_norm", True),
        *norm(L + ("mlp_norm",), f"{layer}.final_layer_norm", True),
        linear(M + ("wi",), f"{layer}.fc1.weight"),
        linear(M + ("wo",), f"{layer}.fc2.weight"),
        *([copy(M + ("bi",), f"{layer}.fc1.bias"), copy(M + ("bo",), f"{layer}.fc2.bias")] if cfg.biases.mlp else []),
        *(norm(("decoder", "final_norm"), f"{p}final_layer_norm", True) if cfg.norms.final else []),
    ]
    head, aliases = lm_head(cfg, f"{p}embed_tokens.weight")
    return out + head, aliases


ARCHITECTURE = architecture(STEMS, config_from_hf, config_to_hf, rules, defaults=DEFAULTS)
