"""ViT (``vit``: ViTModel with or without its pooler, ViTForImageClassification): config and tensor rules, both
directions. A pre-norm encoder over a class token and 16x16 (or other) patches of the image, a final LayerNorm
whose output is last_hidden_state (hidden_states end before it, as transformers returns them), then BERT's tanh
pooler (ViTModel) or a classifier on the first token (ViTForImageClassification, labels named by id2label).

transformers 5 runs ViT with renamed modules (q_proj, o_proj, mlp.fc1, ...) but reads and writes its files in the
published layout (``encoder.layer.{i}.attention.attention.query``, ...), which is what the rules below name; the
config it writes adds encoder_stride, pooler_act and pooler_output_size to the published keys (their defaults).
``interpolate_pos_encoding`` is a call argument, here as there. ViTForMaskedImageModeling (its mask token and
pixel-shuffle decoder) is not read.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import POOLER_ACTIVATIONS, ModelConfig
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, attention, copy, dense, labels_from_hf,
                                     labels_to_hf, linear, norm, refuse)
from jaxformer.interop.rules import activation as activation_of
from jaxformer.interop.vision_towers import patch_rule, tower_from_hf, tower_to_hf

DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12,
                image_size=224, patch_size=16, num_channels=3, qkv_bias=True, pooler_output_size=None,
                pooler_act="tanh")


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    head = "sequence_classification" if arch == "ViTForImageClassification" else "none"
    # a base model has the pooler its file has (add_pooling_layer is a constructor argument, not a config key)
    pooler = head == "none" and (not tensor_names or any(n.endswith("pooler.dense.weight") for n in tensor_names))
    width = hf["pooler_output_size"]
    # (transformers takes any falsy width as hidden_size)
    refuse(pooler and bool(width) and width != hf["hidden_size"], f"vit: pooler_output_size={width} differs from "
           f"hidden_size={hf['hidden_size']}; jaxformer's pooler keeps the model's width")
    act = hf["pooler_act"]
    refuse(pooler and act not in POOLER_ACTIVATIONS,  # (transformers' ACT2FN names of the ones jaxformer has)
           f"vit: pooler_act={act!r} is not supported; supported: {sorted(POOLER_ACTIVATIONS)}")
    num_labels, label_names = labels_from_hf(hf)
    return {**tower_from_hf(hf, model_type, class_token=True), "head": head, "pooler": pooler,
            "pooler_activation": act if pooler else "tanh",
            "num_labels": num_labels, "label_names": label_names,
            "activation": activation_of(hf["hidden_act"], False, model_type), "qkv_bias": bool(hf["qkv_bias"]),
            "dropout_rate": hf["hidden_dropout_prob"], "attention_dropout_rate": hf["attention_probs_dropout_prob"]}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    options = cfg.head_options
    biases = cfg.biases
    refuse(cfg.norms.embedding or not cfg.norms.final or options.image_pooler is not None or not cfg.patches.bias
           or not cfg.patches.class_token or not biases.out or not biases.mlp or (biases.qkv and not biases.key),
           "vit: the model has a part ViT's files cannot say (an embedding norm, no final norm, an image pooler, "
           "a patch projection without bias or no class token, or biases ViT does not split that way)")
    refuse(cfg.head == "sequence_classification" and options.pooler,
           "vit: ViTForImageClassification's classifier reads the first token, not a pooler")
    tower_to_hf(cfg, out)
    out.update(hidden_act=INVERSE_ACTIVATIONS[cfg.activation], qkv_bias=cfg.biases.qkv,
               hidden_dropout_prob=cfg.dropout_rate, attention_probs_dropout_prob=cfg.attention_dropout_rate,
               pooler_output_size=cfg.d_model, pooler_act=options.pooler_activation)
    labels_to_hf(cfg, out)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, stack = prefix, ("encoder", "blocks")
    layer = f"{p}encoder.layer.{{i}}"
    a = f"{layer}.attention.attention."
    out = [Rule((("patches", "class_token"),), (f"{p}embeddings.cls_token",), lambda t: [t[0].reshape(-1)],
                lambda ps: [ps[0].reshape(1, 1, -1)]),
           patch_rule(("patches", "projection", "kernel"), f"{p}embeddings.patch_embeddings.projection.weight", cfg),
           copy(("patches", "projection", "bias"), f"{p}embeddings.patch_embeddings.projection.bias"),
           Rule((("embeddings", "positions", "table"),), (f"{p}embeddings.position_embeddings",),
                lambda t: [t[0][0]], lambda ps: [ps[0][None]]),
           *attention(cfg, stack + ("attn",), *(f"{a}{n}.weight" for n in ("query", "key", "value")),
                      f"{layer}.attention.output.dense.weight", *(f"{a}{n}.bias" for n in ("query", "key", "value")),
                      f"{layer}.attention.output.dense.bias"),
           *norm(stack + ("attn_norm",), f"{layer}.layernorm_before", True),
           *norm(stack + ("mlp_norm",), f"{layer}.layernorm_after", True),
           linear(stack + ("mlp", "wi"), f"{layer}.intermediate.dense.weight"),
           copy(stack + ("mlp", "bi"), f"{layer}.intermediate.dense.bias"),
           linear(stack + ("mlp", "wo"), f"{layer}.output.dense.weight"),
           copy(stack + ("mlp", "bo"), f"{layer}.output.dense.bias"),
           *norm(("encoder", "final_norm"), f"{p}layernorm", True)]
    if cfg.head_options.pooler:
        out += dense(("pooler",), f"{p}pooler.dense")
    if cfg.head == "sequence_classification":
        out += dense(("classifier",), "classifier")
    return out, {}


ARCHITECTURE = Architecture(
    {"vit": ("ViTModel", "ViTForImageClassification")}, {"vit": "vit."}, ("ViTModel",), config_from_hf,
    config_to_hf, rules,
    harmless={"encoder_stride": "sizes ViTForMaskedImageModeling's decoder, which jaxformer does not load"},
    defaults={"vit": DEFAULTS})
