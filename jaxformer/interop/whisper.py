"""Whisper (``whisper``: WhisperModel, WhisperForConditionalGeneration): config and tensor rules, both directions.

An encoder-decoder whose encoder reads audio: ``input_features`` [B, num_mel_bins, 2 * max_source_positions]
log-mel frames through two width-3 convolutions with GELU (the second of stride 2) plus a stored position table
(sinusoids in published files, read as stored), the ``audio`` part (``layers/audio.py``). Both stacks are BART's
pre-norm layers (``bart.layer_rules``) closing with a LayerNorm, their key projections without a bias
(``biases.key``); the decoder adds learned positions (``max_target_positions``) to unscaled token embeddings and
its head ``proj_out`` is tied to them. transformers computes ``scale_embedding``'s factor but applies it nowhere,
so the key changes nothing. Generation settings (``suppress_tokens``, ``forced_decoder_ids``, ...) are
generate's, not the forward pass's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.bart import layer_rules
from jaxformer.interop.rules import INVERSE_ACTIVATIONS, Architecture, Rule, activation, copy, linear, norm, refuse

CLASSES = {"whisper": ("WhisperForConditionalGeneration", "WhisperModel")}
# WhisperConfig's defaults, for the keys a file may leave out
DEFAULTS = {"whisper": dict(vocab_size=51865, num_mel_bins=80, encoder_layers=4, encoder_attention_heads=6,
                            decoder_layers=4, decoder_attention_heads=6, decoder_ffn_dim=1536, encoder_ffn_dim=1536,
                            decoder_start_token_id=50257, activation_function="gelu", d_model=384, dropout=0.0,
                            attention_dropout=0.0, max_source_positions=1500, max_target_positions=448,
                            pad_token_id=50256, bos_token_id=50256, eos_token_id=50256, tie_word_embeddings=True)}


# WhisperConfig's attribute_map: each name sets the field it aliases, and wins over it (openai's files carry
# num_hidden_layers beside encoder_layers)
ALIASES = {"hidden_size": "d_model", "num_attention_heads": "encoder_attention_heads",
           "num_key_value_heads": "encoder_attention_heads", "num_hidden_layers": "encoder_layers"}


def _field(hf: dict, key: str):
    """``key`` as WhisperConfig resolves it: from an alias the file gives (the key itself then read and overridden,
    as there), else the key itself."""
    given = [alias for alias, field in ALIASES.items() if field == key and alias in hf]
    own = hf.get(key)
    return hf[given[-1]] if given else own


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    heads, d_model, encoder_layers = (_field(hf, key) for key in ("encoder_attention_heads", "d_model",
                                                                   "encoder_layers"))
    refuse(heads != hf["decoder_attention_heads"] or hf["encoder_ffn_dim"] != hf["decoder_ffn_dim"],
           "whisper: different encoder and decoder widths or head counts are not supported")
    return dict(family="encoder_decoder", d_model=d_model, num_heads=heads,
                d_ff=hf["encoder_ffn_dim"], encoder_layers=encoder_layers, decoder_layers=hf["decoder_layers"],
                norm_position="pre", norm_eps=1e-5, embedding_norm=False, final_norm=True,
                activation=activation(hf["activation_function"], False, model_type), position="learned",
                max_positions=hf["max_target_positions"], num_mel_bins=hf["num_mel_bins"],
                max_source_positions=hf["max_source_positions"], key_bias=False,
                tie_embeddings=bool(hf["tie_word_embeddings"]),
                head="lm" if arch == "WhisperForConditionalGeneration" else "none",
                dropout_rate=hf["dropout"], attention_dropout_rate=hf["attention_dropout"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(d_model=cfg.d_model, encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers,
               encoder_attention_heads=cfg.num_heads, decoder_attention_heads=cfg.num_heads,
               encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
               activation_function=INVERSE_ACTIVATIONS[cfg.activation], max_target_positions=cfg.max_positions,
               num_mel_bins=cfg.audio.mel_bins if cfg.audio else 0,
               max_source_positions=cfg.audio.source_positions if cfg.audio else 0, scale_embedding=False,
               dropout=cfg.dropout_rate, attention_dropout=cfg.attention_dropout_rate,
               tie_word_embeddings=cfg.embeddings.tie, is_encoder_decoder=True)


def _conv(path, name) -> Rule:
    """torch Conv1d weight [out, in, width] <-> kernel [width, in, out]."""
    return Rule((path,), (name,), lambda t: [np.transpose(t[0], (2, 1, 0))], lambda p: [np.transpose(p[0], (2, 1, 0))])


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    table = f"{p}decoder.embed_tokens.weight"
    out = [rule for n in (1, 2) for rule in (_conv(("audio", f"conv{n}"), f"{p}encoder.conv{n}.weight"),
                                             copy(("audio", f"conv{n}_bias"), f"{p}encoder.conv{n}.bias"))]
    out += [copy(("audio", "positions"), f"{p}encoder.embed_positions.weight"), copy(("embed", "table"), table),
            copy(("decoder_embeddings", "positions", "table"), f"{p}decoder.embed_positions.weight")]
    for side in ("encoder", "decoder"):
        out += [*layer_rules(cfg, side, f"{p}{side}.layers.{{i}}"),
                *norm((side, "final_norm"), f"{p}{side}.layer_norm", True)]
    if cfg.head != "lm":
        return out, {}
    if cfg.embeddings.tie:  # proj_out is the token table (a file may still carry a copy, which must equal it)
        return out, {"proj_out.weight": table}
    return out + [linear(("lm_head", "kernel"), "proj_out.weight")], {}


ARCHITECTURE = Architecture(
    CLASSES, {"whisper": "model."}, ("WhisperModel",), config_from_hf, config_to_hf, rules, defaults=DEFAULTS,
    harmless={
        **dict.fromkeys(("encoder_layerdrop", "decoder_layerdrop"),
                        "training-time layer dropping, not modelled (no effect in evaluation)"),
        **dict.fromkeys(("apply_spec_augment", "mask_time_prob", "mask_time_length", "mask_time_min_masks",
                         "mask_feature_prob", "mask_feature_length", "mask_feature_min_masks"),
                        "SpecAugment: transformers masks input_features in training only; not modelled (no effect "
                        "in evaluation)"),
        "scale_embedding": "transformers' Whisper computes its factor but multiplies nothing by it",
        **dict.fromkeys(("use_weighted_layer_sum", "classifier_proj_size"),
                        "WhisperForAudioClassification's head, which neither class read here has"),
        "median_filter_width": "smooths cross-attention for word timestamps in generate, not the forward pass",
        **dict.fromkeys(("suppress_tokens", "begin_suppress_tokens", "forced_decoder_ids"),
                        "Whisper's generation settings (generation_config.json holds them): the decode loop's, not "
                        "the forward pass's"),
    })
