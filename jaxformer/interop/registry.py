"""Every Hugging Face architecture jaxformer reads and writes: one file each, one line here.

The loader and the exporter both read this table; adding an architecture is a new file under
``interop`` that defines an ``Architecture``, and its line below. The lookups that every reader of
Hugging Face folders shares (model weights in ``hf``, PEFT adapters in ``peft``) live here too.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

from jaxformer.layer_plan import local_layers
from jaxformer.model_config import ModelConfig
from jaxformer.interop import (albert, bart, bert, deberta, deepseek, distilbert, electra, gemma, gpt2, gpt_neo,
                               gpt_neox, gpt_oss, llama, llama4, m2m_100, marian, modernbert, mpnet, t5, t5gemma, umt5,
                               xlnet)
from jaxformer.interop import (cohere, ernie4_5, falcon, glm, glm4_moe, granite, mixtral, olmo2, olmoe, opt, phi3,
                               qwen, smollm3, stablelm, starcoder2)
from jaxformer.interop import longformer
from jaxformer.interop import big_bird, bigbird_pegasus
from jaxformer.interop import gemma4
from jaxformer.interop import kimi_k25, phimoe
from jaxformer.interop import qwen3_next
from jaxformer.interop import kimi_linear
from jaxformer.interop import glm_moe_dsa
from jaxformer.interop import mistral4
from jaxformer.interop import mistral3
from jaxformer.interop import mistral_large4
from jaxformer.interop import deepseek_v4
from jaxformer.interop import vision_towers, vit
from jaxformer.interop import mllama_vision
from jaxformer.interop import qwen2_5_vl_vision
from jaxformer.interop import mllama
from jaxformer.interop import clip
from jaxformer.interop import siglip
from jaxformer.interop import siglip2
from jaxformer.interop import llava
from jaxformer.interop import gemma3_vision
from jaxformer.interop import qwen2_5_vl
from jaxformer.interop import whisper
from jaxformer.interop.rules import Architecture, ConfigReader, Rule, with_defaults

ARCHITECTURES: tuple[Architecture, ...] = (
    bert.ARCHITECTURE,
    distilbert.ARCHITECTURE,
    albert.ARCHITECTURE,
    electra.ARCHITECTURE,
    modernbert.ARCHITECTURE,
    longformer.ARCHITECTURE,
    big_bird.ARCHITECTURE,
    deberta.ARCHITECTURE,
    gpt2.ARCHITECTURE,
    gpt_neo.ARCHITECTURE,
    opt.ARCHITECTURE,
    gpt_neox.ARCHITECTURE,
    starcoder2.ARCHITECTURE,
    deepseek.ARCHITECTURE,
    kimi_k25.ARCHITECTURE,  # after DeepSeek: its text model exports as deepseek_v3
    gemma.ARCHITECTURE,
    gemma4.ARCHITECTURE,
    gpt_oss.ARCHITECTURE,
    olmo2.ARCHITECTURE,
    olmoe.ARCHITECTURE,
    llama4.ARCHITECTURE,
    llama.ARCHITECTURE,
    smollm3.ARCHITECTURE,
    stablelm.ARCHITECTURE,
    cohere.ARCHITECTURE,
    mixtral.ARCHITECTURE,  # tried before the Qwen MoEs for an export target, as when one file held them
    phimoe.ARCHITECTURE,
    qwen.ARCHITECTURE,
    qwen3_next.ARCHITECTURE,
    kimi_linear.ARCHITECTURE,  # Kimi Delta Attention beside latent attention
    phi3.ARCHITECTURE,
    ernie4_5.ARCHITECTURE,  # before GLM, which also holds a whole-head interleaved rotary model
    glm.ARCHITECTURE,
    glm4_moe.ARCHITECTURE,
    glm_moe_dsa.ARCHITECTURE,  # DeepSeek-V3.2's layers with an interleaved indexer rotary
    mistral4.ARCHITECTURE,  # DeepSeek-V3's layers with position-scaled queries and a softmax router
    mistral3.ARCHITECTURE,  # Mistral Small 3.x / 4 multimodal files: their text model, written as its type
    mistral_large4.ARCHITECTURE,  # sparse latent attention with NoPE layers, LeRoPE and log-position queries
    deepseek_v4.ARCHITECTURE,  # compressed attention, hyper-connections, hash-routed experts
    vit.ARCHITECTURE,  # image towers: ViT,
    vision_towers.ARCHITECTURE,  # CLIP's and SigLIP's alone
    mllama_vision.ARCHITECTURE,  # Llama 3.2 Vision's tiled tower alone
    qwen2_5_vl_vision.ARCHITECTURE,  # Qwen2.5-VL's and Qwen2-VL's towers alone (images of any size, the merger)
    clip.ARCHITECTURE,  # CLIP: the dual encoder and its causal text tower
    siglip.ARCHITECTURE,  # SigLIP: the dual encoder with a logit bias, its text tower pooled at the last token
    siglip2.ARCHITECTURE,  # SigLIP2 NaFlex: SigLIP's towers, images of any aspect ratio as padded patches
    llava.ARCHITECTURE,  # a decoder reading images: a CLIP or SigLIP tower, the projector, a LLaMA-like decoder
    mllama.ARCHITECTURE,  # Llama 3.2 Vision: a tiled tower whose states LLaMA's cross layers attend to
    gemma3_vision.ARCHITECTURE,  # Gemma 3 reading images: a SigLIP tower, the pooled projector, bidirectional images
    qwen2_5_vl.ARCHITECTURE,  # Qwen2.5-VL: its merging tower's features in a Qwen2 decoder with M-RoPE
    falcon.ARCHITECTURE,  # after the other LayerNorm decoders: a model one of them holds exports as theirs
    granite.ARCHITECTURE,  # after LLaMA's and Mixtral's lineage: with its multipliers at 1 it holds their models too
    t5.ARCHITECTURE,
    umt5.ARCHITECTURE,
    mpnet.ARCHITECTURE,
    t5gemma.ARCHITECTURE,
    bart.ARCHITECTURE,
    m2m_100.ARCHITECTURE,
    marian.ARCHITECTURE,
    bigbird_pegasus.ARCHITECTURE,
    whisper.ARCHITECTURE,  # an encoder-decoder reading audio: log-mel frames through its convolutions
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


# ModelConfig fields that change neither what a model computes nor what its files store, with why: no file needs to
# say them, so an export target is chosen without them (``hf_target``).
NOT_IN_FILES = {
    "name": "a label",
    **dict.fromkeys(("dtype", "param_dtype", "attention_backend", "scan_layers", "remat", "pipeline_microbatches",
                     "pipeline_repeats", "moe_dispatch"), "how this runtime computes and lays out the same numbers"),
    "init_std": "initialisation of new weights only",
    **dict.fromkeys(("dropout_rate", "attention_dropout_rate", "router_aux_loss_coef"),
                    "training only (dropout, the balancing loss's weight): no effect on what the model computes"),
    **dict.fromkeys(("lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "lora_rslora", "lora_trainable"),
                    "LoRA adapters, written apart (interop/peft.py)"),
    **dict.fromkeys(("quantize", "quantize_embeddings"), "int8 kernels, how this runtime stores the same weights"),
    "generator_width": "ELECTRA's generator, written apart (model.generator.save_pretrained)",
    "clamp_float16": "a float16 overflow guard (transformers' T5 clamps whatever its file says), not a number",
}
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
_DEFAULTS = ModelConfig().to_flat()
_ROUTING = ("experts_per_token", "router_score", "router_groups", "router_topk_groups", "normalize_router_weights",
            "routed_scaling", "router_aux_loss")


def _inert(cfg: ModelConfig) -> list[str]:
    """Fields that ``cfg``'s other fields leave without effect: routing without experts, an indexer's sizes
    without its heads, rotary settings without rotary positions, labels without a classifier, tying without a
    head onto the vocabulary. (A pooler's activation stays: DistilBERT's relu tells its base model from BERT's.)"""
    inert = [] if cfg.experts is not None else list(_ROUTING)
    inert += [] if cfg.indexer is not None else ["index_head_dim", "index_topk"]
    inert += [] if cfg.position == "rope" else ["rope_theta", "rope_scaling"]
    inert += [] if cfg.position == "disentangled" else ["disentangled_terms"]
    inert += [] if cfg.head in ("sequence_classification", "token_classification") else ["num_labels", "label_names"]
    return inert + ([] if cfg.head in ("lm", "mlm", "pretraining") else ["tie_embeddings", "scale_tied_logits"])


def _computed(cfg: ModelConfig) -> dict:
    """What of ``cfg`` a file must say, each thing spelled one way: an explicit head_dim, attention scale or
    layer list equal to the one derived is the same model as None, and an inert field is at its default."""
    fields = {name: value for name, value in cfg.to_flat().items() if name not in NOT_IN_FILES}
    fields.update({name: _DEFAULTS[name] for name in _inert(cfg)}, head_dim=cfg.head_dim_, attention_scale=cfg.scale)
    if cfg.attention == "alternating" and cfg.layer_types is None:  # GPT-3's: odd layers sliding
        fields["layer_types"] = tuple("sliding" if local else "full" for local in local_layers(cfg))
    if cfg.vision is not None:  # a dual encoder: what a file says of its image tower, and what joins the two
        joins = {field.name: getattr(cfg.vision, field.name) for field in dataclasses.fields(cfg.vision)}
        fields["vision"] = (_computed(cfg.vision.tower), {**joins, "tower": None})
    return fields


def _written_names(cfg: ModelConfig, model_type: str, arch: str) -> set[str]:
    """The tensor names an export as ``arch`` writes, no tensor touched; a config reader looks only at
    tensors outside the layers (a pooler, a head), so a per-layer name stands once, for the first layer."""
    names = set()
    for rule in rules_for(cfg, model_type, arch)[0]:
        written = rule.names if rule.paths else rule.names[:len(rule.save([]))]  # (a check-only rule may write none)
        names.update(name.format(i=next(iter(rule.layer_range(cfg)), 0)) for name in written)
    return names


def _read_back(cfg: ModelConfig, model_type: str, arch: str) -> ModelConfig:
    """``cfg`` written as ``arch`` of ``model_type`` and read again, the header every type writes alike
    (vocabulary, token ids) as ``hf.config_to_hf`` and ``hf.config_from_hf`` write and read it."""
    architecture = BY_MODEL_TYPE[model_type]
    out = {"model_type": model_type, "architectures": [arch], "vocab_size": cfg.vocab_size}
    out.update({key: list(value) if isinstance(value, tuple) else value
                for key in TOKEN_IDS for value in (cfg.to_flat()[key],)})
    architecture.config_to_hf(cfg, model_type, out)
    hf = with_defaults(ConfigReader(out), architecture.defaults.get(model_type, {}))
    fields = architecture.config_from_hf(hf, model_type, arch, _written_names(cfg, model_type, arch))
    ids = {key: tuple(value) if isinstance(value, list) else value for key in TOKEN_IDS for value in (hf.get(key),)}
    return ModelConfig.from_dict({"vocab_size": hf.get("vocab_size"), **fields,
                          **{key: value for key, value in ids.items() if value is not None or key not in fields}})


def same_model(cfg: ModelConfig, back: ModelConfig) -> bool:
    """Whether ``back`` (``cfg`` written to a config.json and read again) is the model ``cfg`` is, in all a file
    must say (``_computed``). Two numbers a file says its own way: the attention scale (Gemma's
    query_pre_attn_scalar ** -0.5 for 1 / sqrt(head_dim): equal but for the last bit), and BART's
    final_logits_bias, which its LM classes always carry (transformers fills in zeros when a file leaves it
    out): a model without one reads back with a zero bias."""
    wanted, got = _computed(cfg), _computed(back)
    if math.isclose(got["attention_scale"], wanted["attention_scale"], rel_tol=1e-12):
        got["attention_scale"] = wanted["attention_scale"]
    if not wanted["logits_bias"]:
        got["logits_bias"] = False
    return got == wanted


def _holds(cfg: ModelConfig, model_type: str, arch: str) -> bool:
    """Whether ``arch`` of ``model_type`` holds ``cfg``: reading back what it would write gives the same model.
    A writer given a config its files cannot say may fail in any way (an activation it has no name for, a
    field its reader refuses); it holds nothing then."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a reader's notes on a candidate that may not be chosen
            back = _read_back(cfg, model_type, arch)
    except (ValueError, LookupError, TypeError, AttributeError, ArithmeticError):
        return False
    return same_model(cfg, back)


def hf_target(cfg: ModelConfig, prefer: str | None = None) -> tuple[str, str]:
    """The transformers model_type and class that hold exactly this configuration: the first whose
    config.json, written and read back, gives ``cfg`` again (``same_model``). ``prefer`` (the model_type a model
    was loaded from) is tried first, then every architecture's types in the order of ``ARCHITECTURES``
    (most specific first) and of its ``classes``, but for those written only for a model loaded from one
    (``Architecture.only_as_loaded``) and multimodal files (``Architecture.wrappers``, never written); the classes of
    a type in their order (the head picks one)."""
    model_types = [prefer] if prefer in BY_MODEL_TYPE and prefer not in BY_MODEL_TYPE[prefer].wrappers else []
    model_types += [model_type for architecture in ARCHITECTURES for model_type in architecture.classes
                    if model_type not in architecture.only_as_loaded + architecture.wrappers and model_type != prefer]
    for model_type in model_types:
        for arch in BY_MODEL_TYPE[model_type].classes[model_type]:
            if _holds(cfg, model_type, arch):
                return model_type, arch
    raise ValueError(f"{cfg.name!r} ({cfg.family}, {cfg.position} positions) has no Hugging Face architecture; "
                     "the 2017 Transformer maps to torch.nn.Transformer (jaxformer.interop.nn_transformer)")


def rules_for(cfg: ModelConfig, model_type: str, arch: str, names: set[str] | None = None
              ) -> tuple[list[Rule], dict[str, str]]:
    """The tensor rules and aliases of ``arch``. Head classes nest the base model's tensors under a
    prefix; a file is read with the prefix its tensors have (``names``), and written as the class does."""
    architecture = BY_MODEL_TYPE[model_type]
    # a type whose files lay their tensors out in several ways names each layout's prefix, the written one first; a
    # file is read with the longest its names start with
    prefixes = architecture.prefix[model_type]
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    if names is None:
        prefix = "" if arch in architecture.base_classes else prefixes[0]
    else:
        prefix = max((p for p in prefixes if any(n.startswith(p) for n in names)), key=len, default="")
    return architecture.rules(cfg, model_type, arch, prefix)


def model_types_table() -> str:
    """Which Hugging Face model types load, as a markdown table generated from ``ARCHITECTURES``: each type, the
    transformers classes it reads, the interop file, and whether an export may be written as it (types held only
    by what another type holds are written only for a model loaded from one; a multimodal file never is)."""
    rows = ["| model type | transformers classes | interop file | written by export |", "|---|---|---|---|"]
    for model_type in sorted(BY_MODEL_TYPE):
        arch = BY_MODEL_TYPE[model_type]
        module = arch.config_from_hf.__module__.rsplit(".", 1)[-1]
        written = ("no: its text model, as its own type" if model_type in arch.wrappers else
                   "when loaded from one" if model_type in arch.only_as_loaded else "yes")
        classes = ", ".join(f"`{name}`" for name in arch.classes[model_type])
        rows.append(f"| `{model_type}` | {classes} | `interop/{module}.py` | {written} |")
    return "\n".join(rows)


TABLE_START, TABLE_END = "<!-- model types: generated by python -m jaxformer.interop.registry -->", "<!-- end -->"


def write_table(page: str) -> None:
    """Replace the generated table between the markers of ``page`` (docs/checkpoints-and-interop.md)."""
    from pathlib import Path

    path = Path(page)
    text = path.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    path.write_text(f"{text[:start]}\n{model_types_table()}\n{text[end:]}")


if __name__ == "__main__":
    write_table("docs/checkpoints-and-interop.md")
