"""Every Hugging Face architecture jaxformer reads and writes: one file each, one line here.

The loader and the exporter both read this table; adding an architecture is a new file under
``interop`` that defines an ``Architecture``, and its line below. The lookups that every reader of
Hugging Face folders shares (model weights in ``hf``, PEFT adapters in ``peft``) live here too.
"""

from __future__ import annotations

from typing import Callable

from jaxformer.config import ModelConfig
from jaxformer.interop import (albert, bart, bert, deberta, deepseek, distilbert, electra, gemma, gpt2, gpt_neo,
                               gpt_neox, gpt_oss, llama, llama4, m2m_100, marian, modernbert, mpnet, t5, t5gemma, umt5,
                               xlnet)
from jaxformer.interop.rules import Architecture, Rule

ARCHITECTURES: tuple[Architecture, ...] = (
    bert.ARCHITECTURE,
    distilbert.ARCHITECTURE,
    albert.ARCHITECTURE,
    electra.ARCHITECTURE,
    modernbert.ARCHITECTURE,
    deberta.ARCHITECTURE,
    gpt2.ARCHITECTURE,
    gpt_neo.ARCHITECTURE,
    gpt_neox.ARCHITECTURE,
    deepseek.ARCHITECTURE,
    gemma.ARCHITECTURE,
    gpt_oss.ARCHITECTURE,
    llama4.ARCHITECTURE,
    llama.ARCHITECTURE,
    t5.ARCHITECTURE,
    umt5.ARCHITECTURE,
    mpnet.ARCHITECTURE,
    t5gemma.ARCHITECTURE,
    bart.ARCHITECTURE,
    m2m_100.ARCHITECTURE,
    marian.ARCHITECTURE,
    xlnet.ARCHITECTURE,
)

BY_MODEL_TYPE: dict[str, Architecture] = {model_type: arch for arch in ARCHITECTURES for model_type in arch.classes}
SUPPORTED: dict[str, tuple[str, ...]] = {model_type: arch.classes[model_type] for model_type, arch in BY_MODEL_TYPE.items()}


def architecture_of(hf: dict) -> tuple[str, str]:
    """(model_type, transformers class) of a config.json, refusing what no architecture file supports."""
    model_type = hf.get("model_type")
    if model_type is None and hf.get("architectures"):  # older files (google/umt5-small) name only the class
        model_type = next((m for m, classes in SUPPORTED.items() if hf["architectures"][0] in classes), None)
    if model_type not in SUPPORTED:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: {sorted(SUPPORTED)}")
    archs = hf.get("architectures") or [SUPPORTED[model_type][0]]
    arch = archs[0]
    if arch not in SUPPORTED[model_type]:
        raise ValueError(f"architecture {arch!r} is not supported for model_type {model_type!r}; "
                         f"supported: {list(SUPPORTED[model_type])}")
    return model_type, arch


# Ideas only some model types' files can say (each with the test that the config uses it): a config that uses
# one goes to one of those types or nowhere, whatever another architecture's ``target`` (written before the idea
# existed) would claim.
HELD_ONLY_BY: dict[str, tuple[tuple[str, ...], Callable[[ModelConfig], bool]]] = {
    "inverse_layer_scale": (("gpt2",), lambda c: c.inverse_layer_scale),
    **{field: (("gpt_oss",), lambda c, f=field: bool(getattr(c, f)))
       for field in ("attention_sinks", "swiglu_limit", "expert_bias", "router_logit_bias")},
    "swiglu_alpha": (("gpt_oss",), lambda c: c.swiglu_alpha != 1.0),
    **{field: (("llama4_text",), lambda c, f=field: bool(getattr(c, f)))
       for field in ("attention_chunk_size", "nope_layers", "temperature_floor_scale", "router_weights_on_input")},
    "qk_norm_scale": (("llama4_text",), lambda c: not c.qk_norm_scale),
    "pooler_activation=relu": (("distilbert", "deberta", "deberta-v2"), lambda c: c.pooler_activation == "relu"),
    "pooler_activation=gelu": (("electra", "deberta", "deberta-v2"), lambda c: c.pooler_activation == "gelu"),
    "key_bias": (("deberta",), lambda c: not c.key_bias),
    "mlm_head_legacy": (("deberta", "deberta-v2"), lambda c: not c.mlm_head_legacy),
    "conv_kernel_size": (("deberta-v2",), lambda c: bool(c.conv_kernel_size)),
    "sinusoids=fairseq": (("m2m_100",), lambda c: c.sinusoids == "fairseq"),
    "sinusoids=marian": (("marian", "pegasus"), lambda c: c.sinusoids == "marian"),
    "index_heads": (("deepseek_v32",), lambda c: bool(c.index_heads)),
    "moe_layer_step": (("llama4_text",), lambda c: c.moe_layer_step > 1),
    "relative_bias_per_layer": (("umt5",), lambda c: c.relative_bias_per_layer),
    "index_relative_bias": (("mpnet",), lambda c: c.index_relative_bias),
    "embedding_size": (("albert", "electra"), lambda c: c.embedding_size is not None),
    "shared_layers": (("albert",), lambda c: c.shared_layers),
    "head=discriminator": (("electra",), lambda c: c.head == "discriminator"),
    "generator_width": (("electra",), lambda c: bool(c.generator_width)),
    **{field: (("modernbert",), used) for field, used in (
        ("first_attn_norm", lambda c: not c.first_attn_norm), ("prediction_head", lambda c: c.prediction_head),
        ("classifier_pooling", lambda c: c.classifier_pooling != "cls"), ("head_bias", lambda c: not c.head_bias),
        ("mlm_bias", lambda c: not c.mlm_bias), ("activation=geglu_erf", lambda c: c.activation == "geglu_erf"))},
}


def _holds(model_type: str, cfg: ModelConfig) -> bool:
    return all(model_type in owners for owners, used in HELD_ONLY_BY.values() if used(cfg))


def hf_target(cfg: ModelConfig, prefer: str | None = None) -> tuple[str, str]:
    """The transformers model_type and class that hold exactly this configuration: ``prefer`` (the
    model_type a model was loaded from) when it can, else the first architecture that claims it."""
    if prefer in BY_MODEL_TYPE and BY_MODEL_TYPE[prefer].target_as is not None:
        found = BY_MODEL_TYPE[prefer].target_as(cfg, prefer)
        if found is not None and _holds(found[0], cfg):
            return found
    for architecture in ARCHITECTURES:
        found = architecture.target(cfg)
        if found is not None and _holds(found[0], cfg):
            return found
    raise ValueError(f"{cfg.name!r} ({cfg.family}, {cfg.position} positions) has no Hugging Face architecture; "
                     "the 2017 Transformer maps to torch.nn.Transformer (jaxformer.interop.nn_transformer)")


def rules_for(cfg: ModelConfig, model_type: str, arch: str, names: set[str] | None = None
              ) -> tuple[list[Rule], dict[str, str]]:
    """The tensor rules and aliases of ``arch``. Head classes nest the base model's tensors under a
    prefix; a file is read with the prefix its tensors have (``names``), and written as the class does."""
    architecture = BY_MODEL_TYPE[model_type]
    prefix = architecture.prefix[model_type]
    if names is None:
        prefix = "" if arch in architecture.base_classes else prefix
    elif not any(n.startswith(prefix) for n in names):
        prefix = ""
    return architecture.rules(cfg, model_type, arch, prefix)
