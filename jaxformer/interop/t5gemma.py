"""T5Gemma (``t5gemma``: T5GemmaModel, T5GemmaForConditionalGeneration): Gemma 2 blocks on both sides, a
bidirectional encoder (its sliding layers see keys within the window on either side), a decoder whose
layers add cross-attention with its own pre- and post-norms, one token table per side; config and tensor
rules, both directions. Encoder and decoder must have the same shape (T5Gemma's balanced checkpoints)."""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.gemma import DEFAULTS, block_config, block_rules, block_to_hf
from jaxformer.interop.rules import Architecture, Rule, copy, linear, refuse, sub_config, with_defaults

CLASSES = {"t5gemma": ("T5GemmaForConditionalGeneration", "T5GemmaModel")}
_NORMS = {"attn_norm": "pre_self_attn_layernorm", "attn_post_norm": "post_self_attn_layernorm",
          "mlp_norm": "pre_feedforward_layernorm", "mlp_post_norm": "post_feedforward_layernorm"}
_CROSS_NORMS = {"cross_norm": "pre_cross_attn_layernorm", "cross_post_norm": "post_cross_attn_layernorm"}
# T5GemmaModuleConfig's token ids: T5GemmaConfig takes each id its file leaves out from the decoder's
_DECODER_IDS = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    encoder, decoder = sub_config(hf, "encoder"), sub_config(hf, "decoder")
    ids = {key: with_defaults(decoder, _DECODER_IDS)[key] for key in _DECODER_IDS}  # (the top level's win)
    block = block_config(decoder, model_type)
    cross = decoder.get("cross_attention_hidden_size")
    refuse(cross not in (None, encoder["hidden_size"]), f"t5gemma: decoder.cross_attention_hidden_size={cross} "
           f"differs from the encoder's hidden_size={encoder['hidden_size']}; jaxformer's cross-attention reads the "
           "encoder's width")
    refuse(block_config(encoder, model_type) != block or encoder.get("layer_types") != decoder.get("layer_types"),
           "t5gemma: an encoder and a decoder of different shapes or layer types (e.g. 9B-2B) are not supported; "
           "jaxformer builds both stacks from one block configuration")
    refuse(encoder.get("final_logit_softcapping") != decoder.get("final_logit_softcapping"),
           "t5gemma: encoder and decoder disagree on final_logit_softcapping")
    if block["attention"] == "sliding":  # the encoder's windows need the per-layer form: every layer sliding
        block.update(attention="alternating", layer_types=("sliding",) * decoder["num_hidden_layers"])
    return dict(family="encoder_decoder", encoder_layers=encoder["num_hidden_layers"],
                decoder_layers=decoder["num_hidden_layers"], **block,
                logits_softcap=with_defaults(decoder, DEFAULTS[model_type])["final_logit_softcapping"],
                shared_embeddings=False,
                tie_embeddings=hf.get("tie_word_embeddings", True), decoder_start_token_id=ids["bos_token_id"], **ids,
                dropout_rate=float(hf.get("dropout_rate") or 0.0),
                head="lm" if arch == "T5GemmaForConditionalGeneration" else "none")


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    halves = {}
    for side, layers in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        half = dict(out.get(side) or {})
        block_to_hf(cfg, model_type, half, layers)
        half.update(vocab_size=cfg.vocab_size, final_logit_softcapping=cfg.logits.softcap,
                    pad_token_id=cfg.tokens.pad, eos_token_id=out.get("eos_token_id"), bos_token_id=cfg.tokens.bos,
                    dropout_rate=cfg.dropout_rate, tie_word_embeddings=cfg.embeddings.tie)
        halves[side] = half
    # T5Gemma starts decoding from its decoder's bos_token_id
    halves["decoder"]["bos_token_id"] = cfg.tokens.decoder_start
    out.update(halves, tie_word_embeddings=cfg.embeddings.tie, dropout_rate=cfg.dropout_rate,
               attention_dropout=cfg.attention_dropout_rate, is_encoder_decoder=True)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    decoder_table = f"{p}decoder.embed_tokens.weight"
    out = [copy(("encoder_embed", "table"), f"{p}encoder.embed_tokens.weight"), copy(("embed", "table"), decoder_table),
           *block_rules(cfg, ("encoder", "blocks"), f"{p}encoder.layers.{{i}}", _NORMS),
           *block_rules(cfg, ("decoder", "blocks"), f"{p}decoder.layers.{{i}}", {**_NORMS, **_CROSS_NORMS}, cross=True),
           copy(("encoder", "final_norm", "scale"), f"{p}encoder.norm.weight"),
           copy(("decoder", "final_norm", "scale"), f"{p}decoder.norm.weight")]
    if cfg.head != "lm":
        return out, {}
    if cfg.embeddings.tie:
        return out, {"lm_head.out_proj.weight": decoder_table}
    return out + [linear(("lm_head", "kernel"), "lm_head.out_proj.weight")], {}


ARCHITECTURE = Architecture(CLASSES, {"t5gemma": "model."}, ("T5GemmaModel",), config_from_hf, config_to_hf,
                            rules, harmless={
                                "is_encoder_decoder": "the class decides", "attention_dropout": "training-time dropout",
                                **{f"{half}.{key}": why for half in ("encoder", "decoder") for key, why in (
                                    ("is_decoder", "the class decides which half is which"),
                                    ("dropout_rate", "training-time dropout (the top-level dropout_rate is read)"),
                                    ("tie_word_embeddings", "the top-level tie_word_embeddings is read"),
                                    ("vocab_size", "each token table's shape is checked against its tensor"),
                                    ("bos_token_id", "token ids: the top level's and generation_config's are read"),
                                    ("eos_token_id", "token ids: the top level's and generation_config's are read"),
                                    ("pad_token_id", "token ids: the top level's and generation_config's are read"))}})
