"""Marian (``marian``: MarianModel, MarianMTModel) and Pegasus (``pegasus``: PegasusModel,
PegasusForConditionalGeneration): config and tensor rules, both directions.

Both are BART's layers (``bart.layer_rules``) with no embedding norm, token embeddings scaled by sqrt(d_model)
(``scale_embedding``) and a frozen sinusoidal table counted from 0 (``sinusoids='marian'``: the sines of the even
columns' angles, then the cosines of the odd columns', computed in float64). Marian (the OPUS-MT models) runs
them post-norm, with swish, and may give the decoder a token table of its own
(``share_encoder_decoder_embeddings: false``); it generates from its pad id with the pad itself a bad word.
Pegasus runs them pre-norm, each stack closing with its own LayerNorm.

The sinusoid table is not a parameter here: a file that holds it (MarianModel's, Pegasus') must hold exactly
transformers' table, which is checked on load and written back on export where transformers writes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.bart import layer_rules
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, copy, lm_head, norm,
                                     refuse)
from jaxformer.layers.positions import marian_sinusoids

CLASSES = {"marian": ("MarianModel", "MarianMTModel"),
           "pegasus": ("PegasusModel", "PegasusForConditionalGeneration")}
# MarianConfig's and PegasusConfig's defaults, for the keys a file may leave out
_COMMON = dict(max_position_embeddings=1024, encoder_layers=12, encoder_ffn_dim=4096, encoder_attention_heads=16,
               decoder_layers=12, decoder_ffn_dim=4096, decoder_attention_heads=16, activation_function="gelu",
               d_model=1024, dropout=0.1, attention_dropout=0.0, scale_embedding=False, tie_word_embeddings=True)
DEFAULTS = {"marian": dict(_COMMON, vocab_size=58101, decoder_vocab_size=None, decoder_start_token_id=58100,
                           pad_token_id=58100, eos_token_id=0, bos_token_id=None, forced_eos_token_id=0,
                           share_encoder_decoder_embeddings=True),
            "pegasus": dict(_COMMON, vocab_size=50265, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                            forced_eos_token_id=1)}
# The transformers classes whose save_pretrained writes the sinusoid tables (MarianMTModel leaves them out)
WRITES_TABLES = ("MarianModel", "PegasusModel", "PegasusForConditionalGeneration")
# A file's table may differ from the one computed here by a float32 rounding of another platform's sin, no more
TABLE_TOLERANCE = 1e-6


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(hf["encoder_attention_heads"] != hf["decoder_attention_heads"] or
           hf["encoder_ffn_dim"] != hf["decoder_ffn_dim"],
           f"{model_type}: different encoder and decoder widths or head counts are not supported")
    marian, lm = model_type == "marian", arch in ("MarianMTModel", "PegasusForConditionalGeneration")
    shared = True
    if marian:
        decoder_vocab = hf["decoder_vocab_size"] or hf["vocab_size"]
        refuse(decoder_vocab != hf["vocab_size"],
               f"marian: a decoder vocabulary of its own size (decoder_vocab_size={decoder_vocab}, vocab_size="
               f"{hf['vocab_size']}) is not supported")
        shared = bool(hf["share_encoder_decoder_embeddings"])
    # final_logits_bias: a buffer transformers fills with zeros when a file leaves it out
    bias = lm and (not tensor_names or "final_logits_bias" in tensor_names)
    return dict(family="encoder_decoder", d_model=hf["d_model"], num_heads=hf["encoder_attention_heads"],
                d_ff=hf["encoder_ffn_dim"], encoder_layers=hf["encoder_layers"], decoder_layers=hf["decoder_layers"],
                norm_position="post" if marian else "pre", final_norm=not marian, norm_eps=1e-5,
                embedding_norm=False, activation=activation(hf["activation_function"], False, model_type),
                position="sinusoidal", sinusoids="marian", position_offset=0,
                max_positions=hf["max_position_embeddings"], scale_embeddings=bool(hf["scale_embedding"]),
                shared_embeddings=shared, tie_embeddings=hf["tie_word_embeddings"], head="lm" if lm else "none",
                logits_bias=bias, dropout_rate=hf["dropout"], attention_dropout_rate=hf["attention_dropout"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    name = INVERSE_ACTIVATIONS[cfg.activation]
    out.update(d_model=cfg.d_model, encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers,
               encoder_attention_heads=cfg.num_heads, decoder_attention_heads=cfg.num_heads,
               encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
               activation_function="swish" if model_type == "marian" and name == "silu" else name,
               max_position_embeddings=cfg.max_positions, scale_embedding=cfg.embeddings.scale,
               dropout=cfg.dropout_rate, attention_dropout=cfg.attention_dropout_rate,
               tie_word_embeddings=cfg.embeddings.tie, is_encoder_decoder=True)
    if model_type == "marian":
        out.update(share_encoder_decoder_embeddings=cfg.embeddings.shared, decoder_vocab_size=cfg.vocab_size)


def sinusoid_table(cfg: ModelConfig, name: str, written: bool) -> Rule:
    """A file's ``embed_positions.weight``: no parameter, but it must be the table this config computes (a file may
    leave it out, as MarianMTModel's do); written on export when ``written``."""
    expected = marian_sinusoids(cfg.max_positions, cfg.d_model)

    def check(tensors: list[np.ndarray]) -> list[np.ndarray]:
        table = np.asarray(tensors[0], np.float32)
        refuse(table.shape != expected.shape,
               f"{name} has shape {table.shape}; max_position_embeddings and d_model give {expected.shape}")
        worst = float(np.abs(table - expected).max())
        refuse(not worst <= TABLE_TOLERANCE,
               f"{name} differs from the sinusoids transformers computes by up to {worst:.3g}; a file whose "
               "position table was changed is not supported (jaxformer computes the table, it holds no copy)")
        return []

    return Rule((), (name,), check, lambda _: [expected] if written else [], optional=True)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    if cfg.embeddings.shared:
        table = f"{p}shared.weight"
        out = [copy(("embed", "table"), table)]
        aliases = {f"{p}encoder.embed_tokens.weight": table, f"{p}decoder.embed_tokens.weight": table}
    else:  # Marian's separate tables; its head is tied to the decoder's
        table = f"{p}decoder.embed_tokens.weight"
        out = [copy(("encoder_embed", "table"), f"{p}encoder.embed_tokens.weight"), copy(("embed", "table"), table)]
        aliases = {}
    for side in ("encoder", "decoder"):
        out += [sinusoid_table(cfg, f"{p}{side}.embed_positions.weight", arch in WRITES_TABLES),
                *layer_rules(cfg, side, f"{p}{side}.layers.{{i}}")]
        if cfg.norms.final:  # Pegasus
            out += norm((side, "final_norm"), f"{p}{side}.layer_norm", True)
    head, head_aliases = lm_head(cfg, table)
    aliases.update(head_aliases)
    if cfg.logits.fixed_bias:
        out.append(Rule((("logits_bias",),), ("final_logits_bias",), lambda t: [t[0].reshape(-1)],
                        lambda ps: [ps[0].reshape(1, -1)]))
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, {"marian": "model.", "pegasus": "model."}, ("MarianModel", "PegasusModel"),
                            config_from_hf, config_to_hf, rules, defaults=DEFAULTS, harmless={
                                **dict.fromkeys(("encoder_layerdrop", "decoder_layerdrop"),
                                                "training-time layer dropping, not modelled (no effect in "
                                                "evaluation)"),
                                "is_decoder": "the class decides which stack is which",
                                **dict.fromkeys(("num_hidden_layers", "extra_pos_embeddings",
                                                 "static_position_embeddings", "add_bias_logits",
                                                 "normalize_embedding", "normalize_before", "add_final_layer_norm",
                                                 "classif_dropout", "force_bos_token_to_be_generated"),
                                                "older files' settings (their BART-era converters wrote them), "
                                                "which transformers 5's Marian and Pegasus never read")})
