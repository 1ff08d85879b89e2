"""ModernBERT (``modernbert``): config and tensor rules, both directions.

A pre-norm encoder without biases (``attention_bias``, ``mlp_bias``, ``norm_bias`` false as published): token
embeddings and a LayerNorm (no positions: rotary inside attention), layers that alternate global attention
(every ``global_attn_every_n_layers``-th, from layer 0; rotary base ``global_rope_theta``) with local attention
over the keys within ``local_attention / 2`` either side (base ``local_rope_theta``; transformers-5 files say both
as ``layer_types`` and ``rope_parameters`` by layer type), GeGLU with the exact gelu whose fused ``Wi`` holds the
activated half first (``act(first) * second``), a final norm. The first layer's attention reads its input
unnormed (``first_attn_norm=False``: no ``layers.0.attn_norm``; jaxformer holds that layer in a stack of its own,
``Stack.first_block``). Every head reads ModernBERT's prediction head (dense, ``classifier_activation``,
norm): the MLM head before its tied decoder (bias ``decoder_bias``), the classifiers before ``classifier``
(``prediction_head``); the sequence classifier pools the first token or the real tokens' mean
(``classifier_pooling``).
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.bert import mlm_head_rules
from jaxformer.interop.rules import (INVERSE_GATED, Architecture, Rule, copy, dense, fused_heads_in, fused_linear,
                                     heads_out, labels_from_hf, labels_to_hf, linear, norm, refuse, rope_spec,
                                     rope_to_hf)

_HEADS = {"Model": "none", "ForMaskedLM": "mlm", "ForSequenceClassification": "sequence_classification",
          "ForTokenClassification": "token_classification", "ForQuestionAnswering": "question_answering"}
CLASSES = {"modernbert": tuple(f"ModernBert{suffix}" for suffix in _HEADS)}
# ModernBertConfig's defaults, for the keys a file may leave out
DEFAULTS = {"modernbert": dict(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
                               num_attention_heads=12, hidden_activation="gelu", max_position_embeddings=8192,
                               norm_eps=1e-5, norm_bias=False, pad_token_id=50283, eos_token_id=50282,
                               bos_token_id=50281, cls_token_id=50281, sep_token_id=50282, attention_bias=False,
                               attention_dropout=0.0, local_attention=128, embedding_dropout=0.0, mlp_bias=False,
                               mlp_dropout=0.0, decoder_bias=True, classifier_pooling="cls", classifier_bias=False,
                               classifier_activation="gelu", tie_word_embeddings=True)}
# hidden_activation -> the gated activation of its GeGLU-style MLP (the gate's function)
_GATED = {"gelu": "geglu_erf", "gelu_new": "geglu", "gelu_pytorch_tanh": "geglu", "silu": "swiglu"}
DEFAULT_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}


def _layer_types(hf: dict) -> list[str]:
    """'full' or 'sliding' per layer: ``layer_types``, or what the config class derives from
    ``global_attn_every_n_layers`` (default 3): layers 0, n, 2n, ... global."""
    every = hf.get("global_attn_every_n_layers", 3)  # read in any case, as transformers does
    types = hf.get("layer_types") or ["sliding_attention" if i % every else "full_attention"
                                      for i in range(hf["num_hidden_layers"])]
    kinds = {"full_attention": "full", "sliding_attention": "sliding"}
    refuse(any(t not in kinds for t in types), f"modernbert: layer_types {sorted(set(types))} are not supported")
    return [kinds[t] for t in types]


def _rotary(hf: dict) -> tuple[float, Any, float]:
    """(global theta, global scaling, local theta), as ModernBertConfig resolves them: ``rope_parameters`` by
    layer type, a ``rope_scaling`` entry updating both, the bases from ``global_rope_theta`` and
    ``local_rope_theta`` where the dicts have none."""
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling")
    resolved = {}
    for kind, top in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
        params = dict(rope.get(kind) or {"rope_type": "default"})
        params.update(scaling or {})
        params.setdefault("rope_theta", hf.get(top, DEFAULT_THETA[kind]))
        resolved[kind] = rope_spec(params, hf.get("max_position_embeddings"))
    (theta, scaling), (local_theta, local_scaling) = resolved["full_attention"], resolved["sliding_attention"]
    refuse(local_scaling is not None, "modernbert: rope scaling of the local layers is not supported (jaxformer's "
           "local layers rotate by their own unscaled base)")
    return theta, scaling, local_theta


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    for key in ("attention_bias", "mlp_bias"):
        refuse(bool(hf[key]), f"modernbert: {key}=true is not supported (every published ModernBERT has none)")
    refuse(hf["embedding_dropout"] != hf["mlp_dropout"], f"modernbert: embedding_dropout={hf['embedding_dropout']} "
           f"and mlp_dropout={hf['mlp_dropout']} differ; jaxformer has one dropout rate for both")
    act = _GATED.get(hf["hidden_activation"])
    refuse(act is None, f"modernbert: hidden_activation={hf['hidden_activation']!r} is not supported; supported: "
           f"{sorted(_GATED)}")
    refuse(hf["classifier_activation"] != INVERSE_GATED[act], f"modernbert: classifier_activation="
           f"{hf['classifier_activation']!r} differs from hidden_activation={hf['hidden_activation']!r}; jaxformer's "
           "heads apply the MLP's activation")
    head = _HEADS[arch.removeprefix("ModernBert")]
    kinds = _layer_types(hf)
    theta, scaling, local_theta = _rotary(hf)
    window = hf["local_attention"] // 2  # keys within local_attention / 2 either side (the mask's bounds)
    num_labels, label_names = labels_from_hf(hf)
    return dict(family="encoder", d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                norm_position="pre", norm_eps=hf["norm_eps"], norm_bias=hf["norm_bias"], embedding_norm=True,
                final_norm=True, first_attn_norm=False, activation=act, position="rope", rope_theta=theta,
                rope_scaling=scaling, local_rope_theta=local_theta, max_positions=hf["max_position_embeddings"],
                type_vocab_size=0, attention="alternating", window_size=window, layer_types=tuple(kinds),
                qkv_bias=False, out_bias=False, mlp_bias=False, head=head, pooler=False,
                prediction_head=head in ("sequence_classification", "token_classification", "question_answering"),
                classifier_pooling=hf["classifier_pooling"], head_bias=hf["classifier_bias"],
                mlm_bias=hf["decoder_bias"], num_labels=num_labels, label_names=label_names,
                dropout_rate=hf["mlp_dropout"], attention_dropout_rate=hf["attention_dropout"],
                tie_embeddings=hf["tie_word_embeddings"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    kinds = cfg.layer_types or ("full",) * cfg.encoder_layers
    local = cfg.rotary.local_theta if cfg.rotary.local_theta is not None else cfg.rotary.theta
    full = rope_to_hf(cfg)
    out.update(hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.encoder_layers,
               num_attention_heads=cfg.num_heads, hidden_activation=INVERSE_GATED[cfg.activation],
               classifier_activation=INVERSE_GATED[cfg.activation], max_position_embeddings=cfg.max_positions,
               norm_eps=cfg.norms.eps, norm_bias=cfg.norms.bias, attention_bias=False, mlp_bias=False,
               attention_dropout=cfg.attention_dropout_rate, embedding_dropout=cfg.dropout_rate,
               mlp_dropout=cfg.dropout_rate, local_attention=2 * (cfg.window_size or 64),
               layer_types=[f"{kind}_attention" for kind in kinds],
               rope_parameters={"full_attention": full,
                                "sliding_attention": {"rope_type": "default", "rope_theta": local}},
               classifier_pooling=cfg.head_options.classifier_pooling, classifier_bias=cfg.head_options.dense_bias,
               decoder_bias=cfg.head_options.mlm_bias,
               tie_word_embeddings=cfg.embeddings.tie)
    labels_to_hf(cfg, out)


def _layer_rules(cfg: ModelConfig, stack: tuple[str, ...], layers, attn_norm: bool, prefix: str) -> list[Rule]:
    """The rules of one stack of layers (``layers``: the HF indices it holds)."""
    N, H, layer = cfg.num_heads, cfg.head_dim_, f"{prefix}layers.{{i}}"
    out = [fused_heads_in([stack + ("attn", "q"), stack + ("attn", "k"), stack + ("attn", "v")],
                          f"{layer}.attn.Wqkv.weight", (N, N, N), H),
           heads_out(stack + ("attn", "o"), f"{layer}.attn.Wo.weight", N, H),
           *(norm(stack + ("attn_norm",), f"{layer}.attn_norm", cfg.norms.bias) if attn_norm else []),
           *norm(stack + ("mlp_norm",), f"{layer}.mlp_norm", cfg.norms.bias),
           fused_linear([stack + ("mlp", "wi_gate"), stack + ("mlp", "wi")], f"{layer}.mlp.Wi.weight"),
           linear(stack + ("mlp", "wo"), f"{layer}.mlp.Wo.weight")]
    return [rule.at_layers(layers) for rule in out]


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    out = [copy(("embed", "table"), f"{p}embeddings.tok_embeddings.weight"),
           *norm(("embeddings", "norm"), f"{p}embeddings.norm", cfg.norms.bias),
           # layer 0 has no attention norm: its own stack (jaxformer's ``Stack.first_block``)
           *_layer_rules(cfg, ("encoder", "first_block"), (0,), False, p),
           *_layer_rules(cfg, ("encoder", "blocks"), range(1, cfg.encoder_layers), True, p),
           *norm(("encoder", "final_norm"), f"{p}final_norm", cfg.norms.bias)]
    aliases = {}
    if cfg.head == "mlm":
        output_bias = "decoder.bias" if cfg.head_options.mlm_bias else None
        head_rules, aliases = mlm_head_rules(cfg, "head.dense", "head.norm", output_bias,
                                             "decoder.weight", f"{p}embeddings.tok_embeddings.weight")
        out += head_rules
    if cfg.head_options.prediction_head:
        out += [*dense(("prediction", "transform"), "head.dense", cfg.head_options.dense_bias),
                *norm(("prediction", "norm"), "head.norm", cfg.norms.bias), *dense(("classifier",), "classifier")]
    return out, aliases


ARCHITECTURE = Architecture(CLASSES, {"modernbert": "model."}, ("ModernBertModel",), config_from_hf,
                            config_to_hf, rules, defaults=DEFAULTS, harmless={
                                "classifier_dropout": "the heads' training-time dropout, not modelled (no effect in "
                                                      "evaluation)",
                                "initializer_cutoff_factor": "initialisation only",
                                "deterministic_flash_attn": "a flash-attention kernel setting",
                                "reference_compile": "a torch.compile setting of older transformers",
                                "repad_logits_with_grad": "an unpadding detail of older transformers' training path",
                                **dict.fromkeys(("sparse_prediction", "sparse_pred_ignore_index"),
                                                "which positions the MLM loss reads when labels are given; the "
                                                "logits of every position are the same"),
                                "layer_norm_eps": "an older spelling transformers' ModernBERT never reads (norm_eps "
                                                  "is its eps)",
                                "cls_token_id": "a tokenizer id, not read by the model",
                                "sep_token_id": "a tokenizer id, not read by the model",
                                "position_embedding_type": "an older setting transformers' ModernBERT never reads "
                                                           "(rotary positions always)"})
