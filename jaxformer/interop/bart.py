"""BART (``bart``: BartModel, BartForConditionalGeneration) and mBART (``mbart``: MBartModel,
MBartForConditionalGeneration): encoder-decoders with learned positions offset by 2 and embedding norms; BART's
layers post-norm, mBART's pre-norm with a final LayerNorm per stack (``layer_norm``) and, in mBART-50, embeddings
scaled by sqrt(d_model). Config and tensor rules, both directions; ``layer_rules`` is the layer every BART
relative shares (M2M-100's too). The ForSequenceClassification classes (bart-large-mnli) pool the decoder state
at the last EOS through classification_head (dense, tanh, out_proj: the family's pooler and classifier), the
ForQuestionAnswering classes read qa_outputs at every decoder position; both shift input_ids right when given
no decoder inputs, mBART's behind each row's last non-pad token (``wrap_decoder_start``)."""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, attention, copy, dense,
                                     labels_from_hf, labels_to_hf, linear, lm_head, norm, refuse)

HEADS = {"Model": "none", "ForConditionalGeneration": "lm", "ForSequenceClassification": "sequence_classification",
         "ForQuestionAnswering": "question_answering"}
CLASSES = {"bart": tuple(f"Bart{suffix}" for suffix in HEADS), "mbart": tuple(f"MBart{suffix}" for suffix in HEADS)}
# BartConfig's and MBartConfig's, for the keys a file may leave out
DEFAULTS = {"bart": dict(max_position_embeddings=1024, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                         decoder_start_token_id=2),
            "mbart": dict(max_position_embeddings=1024, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                          decoder_start_token_id=None, activation_function="gelu", scale_embedding=False,
                          dropout=0.1, attention_dropout=0.0, tie_word_embeddings=True)}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(hf["encoder_attention_heads"] != hf["decoder_attention_heads"] or
           hf["encoder_ffn_dim"] != hf["decoder_ffn_dim"],
           "bart: different encoder and decoder widths or head counts are not supported")
    refuse(hf.get("encoder_layerdrop", 0.0) > 0 or hf.get("decoder_layerdrop", 0.0) > 0,
           f"{model_type}: layerdrop > 0 is not supported")
    mbart = model_type == "mbart"
    if not mbart:  # (BART's own pre-norm switches; mBART's config has none: it is pre-norm)
        refuse(hf.get("normalize_before", False) or hf.get("add_final_layer_norm", False),
               "bart: pre-norm variants (normalize_before / add_final_layer_norm) are not supported")
    head = HEADS[arch.removeprefix("MBart" if mbart else "Bart")]
    lm = head == "lm"
    # BartConfig's num_labels is 3 where a file names no labels (MBartConfig keeps PretrainedConfig's 2)
    labels = ((labels_from_hf(hf) if hf.get("id2label") or "num_labels" in hf or mbart else (3, ()))
              if head == "sequence_classification" else (2, ()))
    return dict(family="encoder_decoder", d_model=hf["d_model"], num_heads=hf["encoder_attention_heads"],
                d_ff=hf["encoder_ffn_dim"], encoder_layers=hf["encoder_layers"], decoder_layers=hf["decoder_layers"],
                norm_position="pre" if mbart else "post", norm_eps=1e-5, embedding_norm=True, final_norm=mbart,
                activation=activation(hf.get("activation_function", "gelu"), False, "bart"), position="learned",
                max_positions=hf["max_position_embeddings"], position_offset=2,
                scale_embeddings=bool(hf.get("scale_embedding", False)),
                tie_embeddings=hf.get("tie_word_embeddings", True), head=head, logits_bias=lm,
                pooler=head == "sequence_classification", num_labels=labels[0], label_names=labels[1],
                wrap_decoder_start=mbart and head in ("sequence_classification", "question_answering"),
                dropout_rate=hf.get("dropout", 0.1), attention_dropout_rate=hf.get("attention_dropout", 0.0))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(d_model=cfg.d_model, encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers,
               encoder_attention_heads=cfg.num_heads, decoder_attention_heads=cfg.num_heads,
               encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function=INVERSE_ACTIVATIONS[cfg.activation],
               max_position_embeddings=cfg.max_positions, scale_embedding=cfg.embeddings.scale,
               dropout=cfg.dropout_rate, attention_dropout=cfg.attention_dropout_rate,
               tie_word_embeddings=cfg.embeddings.tie, is_encoder_decoder=True)
    labels_to_hf(cfg, out)


def layer_rules(cfg: ModelConfig, side: str, layer: str) -> list[Rule]:
    """One BART-style layer's tensors under ``layer`` (holding ``{i}``): self-attention, fc1/fc2 and their norms,
    and a decoder's cross-attention (M2M-100's, mBART's, Pegasus' and Marian's layers too)."""
    L = (side, "blocks")

    def projections(path, name):
        return attention(cfg, path, *(f"{name}.{n}_proj.weight" for n in "qkv"), f"{name}.out_proj.weight",
                         *(f"{name}.{n}_proj.bias" for n in "qkv"), f"{name}.out_proj.bias")

    out = [*projections(L + ("attn",), f"{layer}.self_attn"),
           *norm(L + ("attn_norm",), f"{layer}.self_attn_layer_norm", True),
           linear(L + ("mlp", "wi"), f"{layer}.fc1.weight"), copy(L + ("mlp", "bi"), f"{layer}.fc1.bias"),
           linear(L + ("mlp", "wo"), f"{layer}.fc2.weight"), copy(L + ("mlp", "bo"), f"{layer}.fc2.bias"),
           *norm(L + ("mlp_norm",), f"{layer}.final_layer_norm", True)]
    if side == "decoder":
        out += [*projections(L + ("cross_attn",), f"{layer}.encoder_attn"),
                *norm(L + ("cross_norm",), f"{layer}.encoder_attn_layer_norm", True)]
    return out


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    out = [copy(("embed", "table"), f"{p}shared.weight")]
    aliases = {f"{p}encoder.embed_tokens.weight": f"{p}shared.weight",
               f"{p}decoder.embed_tokens.weight": f"{p}shared.weight"}
    for side in ("encoder", "decoder"):
        out += [copy((f"{side}_embeddings", "positions", "table"), f"{p}{side}.embed_positions.weight"),
                *norm((f"{side}_embeddings", "norm"), f"{p}{side}.layernorm_embedding", True),
                *layer_rules(cfg, side, f"{p}{side}.layers.{{i}}")]
        if cfg.norms.final:  # mBART
            out += norm((side, "final_norm"), f"{p}{side}.layer_norm", True)
    head, head_aliases = lm_head(cfg, f"{p}shared.weight")
    out += head
    aliases.update(head_aliases)
    if cfg.head == "sequence_classification":
        out += dense(("pooler",), "classification_head.dense") + dense(("classifier",), "classification_head.out_proj")
    if cfg.head == "question_answering":
        out += dense(("classifier",), "qa_outputs")
    if cfg.logits.fixed_bias:
        out.append(Rule((("logits_bias",),), ("final_logits_bias",), lambda t: [t[0].reshape(-1)],
                        lambda ps: [ps[0].reshape(1, -1)]))
    return out, aliases


ARCHITECTURE = Architecture(CLASSES, {"bart": "model.", "mbart": "model."}, ("BartModel", "MBartModel"), config_from_hf,
                            config_to_hf, rules,
                            harmless={**dict.fromkeys(("is_decoder", "is_encoder_decoder"),
                                                      "the class decides which stack is which"),
                                      **dict.fromkeys(("add_bias_logits", "normalize_embedding",
                                                       "static_position_embeddings", "extra_pos_embeddings",
                                                       "force_bos_token_to_be_generated", "classif_dropout",
                                                       "num_hidden_layers"),
                                                      "older files' settings, which transformers 5's BART "
                                                      "never reads"),
                                      # (BART reads these two and refuses them true; mBART's files say true)
                                      **dict.fromkeys(("normalize_before", "add_final_layer_norm"),
                                                      "mBART is pre-norm with final norms whatever older files "
                                                      "say; transformers 5's mBART never reads them")},
                            defaults=DEFAULTS)
