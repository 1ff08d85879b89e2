"""T5 v1.0 and v1.1 (``t5``: T5Model, T5ForConditionalGeneration, T5EncoderModel) and mT5 (``mt5``, the same
classes prefixed MT5): relative position bias, RMSNorm, plain or gated feed-forward; config and tensor rules,
both directions. mT5 is T5 v1.1 over a 250K-token vocabulary with its own model_type: its modeling never
scales the decoder output before the head (T5 v1.0 does when tied), its config class ties the embeddings
whatever the file says (the file's own lm_head tensor is then loaded as the head), and a model loaded from an
mT5 file is written back as one. T5ForSequenceClassification (its base model nested under ``transformer.``) pools
the decoder state at the last EOS through classification_head (dense, tanh, out_proj: the family's pooler and
classifier); T5ForQuestionAnswering reads qa_outputs at every decoder position; both shift input_ids right
behind decoder_start_token_id when given no decoder inputs."""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (GATED, Architecture, Rule, activation, attention, copy, dense, labels_from_hf,
                                     labels_to_hf, linear, lm_head, refuse)

HEADS = {"T5Model": "none", "T5ForConditionalGeneration": "lm", "T5EncoderModel": "none",
         "T5ForSequenceClassification": "sequence_classification", "T5ForQuestionAnswering": "question_answering"}
CLASSES = {"t5": tuple(HEADS), "mt5": tuple(f"M{name}" for name in HEADS)}
# T5Config's and MT5Config's, for a file that leaves them out
DEFAULTS = {"t5": dict(pad_token_id=0, eos_token_id=1),
            "mt5": dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, feed_forward_proj="gated-gelu")}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    proj = hf.get("feed_forward_proj", "relu")
    # The config class derives these two from feed_forward_proj, then lets the file's own (which it also
    # writes) win.
    gated = bool(hf.get("is_gated_act", proj.startswith("gated-")))
    act = hf.get("dense_act_fn", "gelu_new" if proj == "gated-gelu" else proj.removeprefix("gated-"))
    refuse(gated and act not in GATED, f"t5: feed_forward_proj={proj!r} (dense_act_fn={act!r}, gated) is not supported")
    # transformers 5 always ties in the config and records the v1.0 output scaling separately;
    # an lm_head tensor in the file means the head is untied (v1.1).
    mt5 = model_type == "mt5"
    scale = False if mt5 else hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
    # (mT5's config says nothing here: MT5Config ties whatever it is told, and every published mT5 holds its own head)
    tied = ("lm_head.weight" not in tensor_names if tensor_names else
            not mt5 and hf.get("tie_word_embeddings", True))
    encoder_only = arch.endswith("T5EncoderModel")
    head = HEADS[arch[arch.index("T5"):]]  # (mT5's and UMT5's classes are T5's with a prefix)
    num_labels, label_names = labels_from_hf(hf) if head == "sequence_classification" else (2, ())
    both_stacks = hf.get("is_encoder_decoder", True)  # False in T5EncoderModel's files, as it should be
    refuse(not encoder_only and both_stacks is False,
           f"{model_type}: is_encoder_decoder=false on {arch}, an encoder-decoder, is not supported")
    return dict(family="encoder" if encoder_only else "encoder_decoder", d_model=hf["d_model"],
                num_heads=hf["num_heads"], head_dim=hf["d_kv"], d_ff=hf["d_ff"], encoder_layers=hf["num_layers"],
                decoder_layers=0 if encoder_only else (hf.get("num_decoder_layers") or hf["num_layers"]),
                norm="rmsnorm", norm_eps=hf.get("layer_norm_epsilon", 1e-6), norm_bias=False,
                activation=activation(act, gated, "t5"), position="relative",
                max_positions=hf.get("n_positions", 512),
                relative_buckets=hf.get("relative_attention_num_buckets", 32),
                relative_max_distance=hf.get("relative_attention_max_distance", 128), attention_scale=1.0,
                attention="bidirectional" if encoder_only else "causal", qkv_bias=False, out_bias=False,
                mlp_bias=False, tie_embeddings=tied,
                scale_tied_logits=bool(scale and tied and arch == "T5ForConditionalGeneration"),
                clamp_float16=True,
                head=head, pooler=head == "sequence_classification", num_labels=num_labels, label_names=label_names,
                dropout_rate=hf.get("dropout_rate", 0.1))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    act = {"relu": "relu", "gelu": "gelu", "geglu": "gated-gelu", "swiglu": "gated-silu"}[cfg.activation]
    out.update(d_model=cfg.d_model, num_heads=cfg.num_heads, d_kv=cfg.head_dim_, d_ff=cfg.d_ff,
               num_layers=cfg.encoder_layers, num_decoder_layers=cfg.decoder_layers or cfg.encoder_layers,
               layer_norm_epsilon=cfg.norms.eps, feed_forward_proj=act,
               relative_attention_num_buckets=cfg.relative_bias.buckets,
               relative_attention_max_distance=cfg.relative_bias.max_distance, dropout_rate=cfg.dropout_rate,
               tie_word_embeddings=cfg.embeddings.tie, is_encoder_decoder=cfg.family == "encoder_decoder")
    if model_type == "t5":  # (mT5 never scales: its config has no such key)
        out["scale_decoder_outputs"] = cfg.logits.scale_tied
    labels_to_hf(cfg, out)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = "transformer." if arch.endswith("ForSequenceClassification") else prefix  # (its T5Model is nested)
    out = [copy(("embed", "table"), f"{p}shared.weight")]
    aliases = {f"{p}encoder.embed_tokens.weight": f"{p}shared.weight",
               f"{p}decoder.embed_tokens.weight": f"{p}shared.weight"}
    ff = "wi_1" if cfg.gated else "wi"

    def stack(side: str, cross: bool) -> list[Rule]:
        L, block = (side, "blocks"), f"{p}{side}.block.{{i}}.layer"
        att = f"{block}.0.SelfAttention"
        rules = [*attention(cfg, L + ("attn",), f"{att}.q.weight", f"{att}.k.weight", f"{att}.v.weight",
                            f"{att}.o.weight"),
                 copy(L + ("attn_norm", "scale"), f"{block}.0.layer_norm.weight"),
                 copy((side, "relative_bias", "table"),
                      f"{p}{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
                 copy((side, "final_norm", "scale"), f"{p}{side}.final_layer_norm.weight")]
        f = 2 if cross else 1
        if cross:
            x = f"{block}.1.EncDecAttention"
            rules += [*attention(cfg, L + ("cross_attn",), f"{x}.q.weight", f"{x}.k.weight", f"{x}.v.weight",
                                 f"{x}.o.weight"),
                      copy(L + ("cross_norm", "scale"), f"{block}.1.layer_norm.weight")]
        rules += [linear(L + ("mlp", "wi"), f"{block}.{f}.DenseReluDense.{ff}.weight"),
                  linear(L + ("mlp", "wo"), f"{block}.{f}.DenseReluDense.wo.weight"),
                  copy(L + ("mlp_norm", "scale"), f"{block}.{f}.layer_norm.weight")]
        if cfg.gated:
            rules.append(linear(L + ("mlp", "wi_gate"), f"{block}.{f}.DenseReluDense.wi_0.weight"))
        return rules

    out += stack("encoder", False)
    if cfg.family == "encoder_decoder":
        out += stack("decoder", True)
        head, head_aliases = lm_head(cfg, "shared.weight")
        out += head
        aliases.update(head_aliases)
    else:
        aliases.pop("decoder.embed_tokens.weight")
    if cfg.head == "sequence_classification":
        out += dense(("pooler",), "classification_head.dense") + dense(("classifier",), "classification_head.out_proj")
    if cfg.head == "question_answering":
        out += dense(("classifier",), "qa_outputs")
    return out, aliases


# T5 names its tensors the same with or without a head: nothing is nested (but T5ForSequenceClassification's,
# under transformer.: ``rules`` adds it).
ARCHITECTURE = Architecture(CLASSES, {"t5": "", "mt5": ""}, CLASSES["t5"] + CLASSES["mt5"], config_from_hf,
                            config_to_hf, rules, only_as_loaded=("mt5",), harmless={
    "is_decoder": "the class decides which stack is which",
    "num_decoder_layers": "read for models with a decoder; T5EncoderModel has none",
    # (T5 reads it: it decides T5 v1.0's output scaling)
    "tie_word_embeddings": "MT5Config ties whatever the file says; the file's own lm_head tensor, when it has one, "
                           "is the head (a file read without its tensors: mT5's own head, as every published one)"},
                            defaults=DEFAULTS)
