"""BigBird-Pegasus (``bigbird_pegasus``: BigBirdPegasusModel, BigBirdPegasusForConditionalGeneration): config and
tensor rules, both directions.

Pegasus' pre-norm encoder-decoder (embeddings scaled by sqrt(d_model), each stack closing with its own LayerNorm,
here named ``layernorm_embedding``) with learned positions counted from 0, biases on the attention projections only
where ``use_bias`` says (the published models have none), and an encoder whose self-attention is BigBird's
block-sparse attention on long inputs (``big_bird``'s module docstring: the same evaluation pattern, the same dense
fallback at (5 + 2 r) blocks or fewer, the same training caveat). The decoder attends in full. The encoder's layers
name their attention ``self_attn.self.{query,key,value}`` and ``self_attn.output``, the decoder's BART's way.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop import bart
from jaxformer.interop.big_bird import sparse_from_hf, sparse_to_hf
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, attention, copy, lm_head,
                                     norm, refuse)

CLASSES = {"bigbird_pegasus": ("BigBirdPegasusModel", "BigBirdPegasusForConditionalGeneration")}
# BigBirdPegasusConfig's defaults, for the keys a file may leave out
DEFAULTS = {"bigbird_pegasus": dict(vocab_size=96103, max_position_embeddings=4096, encoder_layers=16,
                                    encoder_ffn_dim=4096, encoder_attention_heads=16, decoder_layers=16,
                                    decoder_ffn_dim=4096, decoder_attention_heads=16, activation_function="gelu_new",
                                    d_model=1024, dropout=0.1, attention_dropout=0.0, decoder_start_token_id=2,
                                    scale_embedding=True, pad_token_id=0, bos_token_id=2, eos_token_id=1,
                                    attention_type="block_sparse", block_size=64, num_random_blocks=3, use_bias=False,
                                    is_decoder=False, tie_word_embeddings=True)}

# BigBirdPegasusConfig's attribute_map: another name for a key, which a file may write beside it (the published files
# write num_hidden_layers beside encoder_layers)
ALIASES = {"num_hidden_layers": "encoder_layers", "hidden_size": "d_model", "num_attention_heads":
           "encoder_attention_heads", "attention_probs_dropout_prob": "attention_dropout"}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    # an alias a file writes sets its key, over the key's own value (transformers sets it after the fields)
    aliased = {key: hf.get(alias, hf[key]) for alias, key in ALIASES.items()}
    refuse(aliased["encoder_attention_heads"] != hf["decoder_attention_heads"] or
           hf["encoder_ffn_dim"] != hf["decoder_ffn_dim"],
           "bigbird_pegasus: different encoder and decoder widths or head counts are not supported")
    refuse(hf["is_decoder"], "bigbird_pegasus: is_decoder=True (BigBirdPegasusForCausalLM) is not supported")
    lm = arch == "BigBirdPegasusForConditionalGeneration"
    # final_logits_bias: a buffer transformers fills with zeros when a file leaves it out
    bias = lm and (not tensor_names or "final_logits_bias" in tensor_names)
    return dict(family="encoder_decoder", d_model=aliased["d_model"], num_heads=aliased["encoder_attention_heads"],
                d_ff=hf["encoder_ffn_dim"], encoder_layers=aliased["encoder_layers"],
                decoder_layers=hf["decoder_layers"],
                norm_position="pre", final_norm=True, norm_eps=1e-5, embedding_norm=False,
                activation=activation(hf["activation_function"], False, model_type), position="learned",
                position_offset=0, max_positions=hf["max_position_embeddings"],
                scale_embeddings=bool(hf["scale_embedding"]), tie_embeddings=hf["tie_word_embeddings"],
                qkv_bias=bool(hf["use_bias"]), out_bias=bool(hf["use_bias"]), **sparse_from_hf(hf, model_type),
                head="lm" if lm else "none", logits_bias=bias, dropout_rate=hf["dropout"],
                attention_dropout_rate=aliased["attention_dropout"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(d_model=cfg.d_model, encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers,
               encoder_attention_heads=cfg.num_heads, decoder_attention_heads=cfg.num_heads,
               encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
               activation_function=INVERSE_ACTIVATIONS[cfg.activation],
               max_position_embeddings=cfg.max_positions, scale_embedding=cfg.embeddings.scale,
               use_bias=cfg.biases.qkv, dropout=cfg.dropout_rate, attention_dropout=cfg.attention_dropout_rate,
               tie_word_embeddings=cfg.embeddings.tie, is_encoder_decoder=True, is_decoder=False)
    sparse_to_hf(cfg, out)


def _layer_rules(cfg: ModelConfig, side: str, layer: str) -> list[Rule]:
    """One layer's tensors: BART's (the decoder's as they are), the encoder's self-attention under BigBird's names."""
    out = bart.layer_rules(cfg, side, layer)
    if side == "encoder":
        out = [r for r in out if not r.names[0].startswith(f"{layer}.self_attn.")]
        qkv, output = [f"{layer}.self_attn.self.{n}" for n in ("query", "key", "value")], f"{layer}.self_attn.output"
        out += attention(cfg, ("encoder", "blocks", "attn"), *(f"{n}.weight" for n in qkv), f"{output}.weight",
                         *(f"{n}.bias" for n in qkv), f"{output}.bias")
    return out


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    table = f"{p}shared.weight"
    out = [copy(("embed", "table"), table)]
    aliases = {f"{p}encoder.embed_tokens.weight": table, f"{p}decoder.embed_tokens.weight": table}
    for side in ("encoder", "decoder"):
        out += [copy((f"{side}_embeddings", "positions", "table"), f"{p}{side}.embed_positions.weight"),
                *_layer_rules(cfg, side, f"{p}{side}.layers.{{i}}"),
                *norm((side, "final_norm"), f"{p}{side}.layernorm_embedding", True)]
    head, head_aliases = lm_head(cfg, table)
    aliases.update(head_aliases)
    if cfg.logits.fixed_bias:
        out.append(Rule((("logits_bias",),), ("final_logits_bias",), lambda t: [t[0].reshape(-1)],
                        lambda ps: [ps[0].reshape(1, -1)]))
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, {"bigbird_pegasus": "model."}, ("BigBirdPegasusModel",), config_from_hf,
                            config_to_hf, rules, defaults=DEFAULTS, harmless={
                                **dict.fromkeys(("encoder_layerdrop", "decoder_layerdrop"),
                                                "training-time layer dropping, not modelled (no effect in "
                                                "evaluation)"),
                                "is_encoder_decoder": "the class decides which stack is which"})
