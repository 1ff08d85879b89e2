"""M2M-100 and NLLB (``m2m_100``: M2M100Model, M2M100ForConditionalGeneration): config and tensor rules, both
directions.

BART's layers (``bart.layer_rules``) run pre-norm, each stack closing with its own LayerNorm (``layer_norm``),
with no embedding norm; token embeddings scaled by sqrt(d_model) (``scale_embedding``); fairseq's sinusoidal
positions (``sinusoids='fairseq'``: all sines, then all cosines) at rows counted as RoBERTa counts them, from
the pad id + 1 over the real tokens, the pad's row zero (``pad_aware_positions``, ``position_offset = pad + 1``).
Translation generates from ``decoder_start_token_id`` (EOS) with the target language's token forced first
(``forced_bos_token_id``, from generation_config.json or an argument). NLLB-200 is this model_type too.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.bart import layer_rules
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, copy, lm_head, norm,
                                     refuse)

CLASSES = {"m2m_100": ("M2M100Model", "M2M100ForConditionalGeneration")}
# M2M100Config's defaults, for the keys a file may leave out
DEFAULTS = {"m2m_100": dict(vocab_size=128112, max_position_embeddings=1024, encoder_layers=12, encoder_ffn_dim=4096,
                            encoder_attention_heads=16, decoder_layers=12, decoder_ffn_dim=4096,
                            decoder_attention_heads=16, activation_function="relu", d_model=1024, dropout=0.1,
                            attention_dropout=0.1, decoder_start_token_id=2, scale_embedding=True, pad_token_id=1,
                            bos_token_id=0, eos_token_id=2, tie_word_embeddings=True)}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(hf["encoder_attention_heads"] != hf["decoder_attention_heads"] or
           hf["encoder_ffn_dim"] != hf["decoder_ffn_dim"],
           f"{model_type}: different encoder and decoder widths or head counts are not supported")
    pad = hf["pad_token_id"]
    refuse(pad is None, f"{model_type}: pad_token_id is None; its positions count from the pad id")
    lm = arch == "M2M100ForConditionalGeneration"
    return dict(family="encoder_decoder", d_model=hf["d_model"], num_heads=hf["encoder_attention_heads"],
                d_ff=hf["encoder_ffn_dim"], encoder_layers=hf["encoder_layers"], decoder_layers=hf["decoder_layers"],
                norm_position="pre", norm_eps=1e-5, embedding_norm=False, final_norm=True,
                activation=activation(hf["activation_function"], False, model_type), position="sinusoidal",
                sinusoids="fairseq", pad_aware_positions=True, position_offset=pad + 1,
                max_positions=hf["max_position_embeddings"], scale_embeddings=bool(hf["scale_embedding"]),
                tie_embeddings=hf["tie_word_embeddings"], head="lm" if lm else "none",
                dropout_rate=hf["dropout"], attention_dropout_rate=hf["attention_dropout"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(d_model=cfg.d_model, encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers,
               encoder_attention_heads=cfg.num_heads, decoder_attention_heads=cfg.num_heads,
               encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
               activation_function=INVERSE_ACTIVATIONS[cfg.activation], max_position_embeddings=cfg.max_positions,
               scale_embedding=cfg.embeddings.scale, dropout=cfg.dropout_rate,
               attention_dropout=cfg.attention_dropout_rate, tie_word_embeddings=cfg.embeddings.tie,
               is_encoder_decoder=True)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    out = [copy(("embed", "table"), f"{p}shared.weight")]
    aliases = {f"{p}encoder.embed_tokens.weight": f"{p}shared.weight",
               f"{p}decoder.embed_tokens.weight": f"{p}shared.weight"}
    for side in ("encoder", "decoder"):
        out += [*layer_rules(cfg, side, f"{p}{side}.layers.{{i}}"),
                *norm((side, "final_norm"), f"{p}{side}.layer_norm", True)]
    head, head_aliases = lm_head(cfg, f"{p}shared.weight")
    aliases.update(head_aliases)
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, {"m2m_100": "model."}, ("M2M100Model",), config_from_hf, config_to_hf,
                            rules, defaults=DEFAULTS, harmless={
                                **dict.fromkeys(("encoder_layerdrop", "decoder_layerdrop"),
                                                "training-time layer dropping, not modelled (no effect in "
                                                "evaluation)"),
                                "is_decoder": "the class decides which stack is which",
                                "num_hidden_layers": "an alias older files carry; encoder_layers and decoder_layers "
                                                     "are read"})
