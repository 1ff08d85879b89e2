"""Hugging Face checkpoints <-> jaxformer, without torch.

Each architecture lives in its own file (``interop/bert.py``, ``gpt2.py``, ``llama.py``, ``deepseek.py``,
``t5.py``, ``bart.py``): how its ``config.json`` maps to a ModelConfig and how each tensor maps to a parameter, in
both directions. ``interop.registry`` lists them; this module reads and writes checkpoint folders
through that table. Loading checks every tensor before anything is built (nothing partial loads);
saving runs the same rules backwards, so HF -> jaxformer -> HF returns the same bytes per tensor.
"""

from __future__ import annotations

import json
import os
import re
import typing
import warnings
from pathlib import Path

import numpy as np

from jaxformer import edges, speech_generation
from jaxformer.model_config import QUANTIZATIONS, ModelConfig, flat_type_hints
from jaxformer.interop import fp8, mxfp4, peft
from jaxformer.interop.files import TensorFiles, iter_json, read_json, write_safetensors
from jaxformer.interop.reference_keys import class_default
from jaxformer.interop.registry import BY_MODEL_TYPE, architecture_of, hf_target, rules_for
from jaxformer.interop.rules import (GENERATION_KEYS, ConfigReader, account_for_every_key, build_from_tensors,
                                     export_with_rules, with_defaults)
from jaxformer.lora import quantized


def _special_ids(hf: dict, extra: list[dict], vocab: int) -> dict:
    """Token ids for generation from config.json, then generation_config.json; out-of-vocabulary ids
    (common in tiny test configs) are dropped with a warning, since they could never be emitted."""
    out = {}
    for field in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = hf.get(field)
        for source in extra:
            if value is None:
                value = source.get(field)
        if isinstance(value, list):
            value = tuple(value)
        ids = value if isinstance(value, tuple) else (value,)
        if value is not None and any(not 0 <= i < vocab for i in ids):
            warnings.warn(f"{field}={value} lies outside the vocabulary [0, {vocab}); ignored", stacklevel=3)
            value = None
        out[field] = value
    return out


def config_from_hf(hf: dict, tensor_names: set[str] | None = None, extra: list[dict] | None = None,
                   dtype: str | None = None) -> ModelConfig:
    """Map a transformers config (as a dict) to a ModelConfig, refusing options jaxformer cannot honour."""
    model_type, arch = architecture_of(hf)
    defaults = BY_MODEL_TYPE[model_type].defaults.get(model_type, {})
    filled = {key: value for key, value in defaults.items() if key not in hf}  # what the file leaves out
    hf = with_defaults(ConfigReader(hf), defaults)
    if fp8.holds_fp8(hf):  # block-wise FP8 weights, decoded on load (interop/fp8.py); its settings checked here
        fp8.weight_block(hf["quantization_config"])
    file_dtype = str(hf.get("dtype") or hf.get("torch_dtype") or "float32")
    dtype = dtype or (file_dtype if file_dtype in ("float32", "bfloat16", "float16") else "float32")
    try:
        common = dict(name=hf.get("_name_or_path") or model_type, dtype=dtype, param_dtype=dtype,
                      init_std=float(hf.get("initializer_range", 0.02)))
        fields = BY_MODEL_TYPE[model_type].config_from_hf(hf, model_type, arch, tensor_names or set())
        # the vocabulary: the file's, or its text model's (Llama 4's multimodal files keep it in text_config)
        vocab = fields.get("vocab_size")  # (0: an image tower's)
        fields = {**common, "vocab_size": hf["vocab_size"] if vocab is None else vocab, **fields}
        _check_field_types(fields, arch)
        # ids the file gives win; where it has none, the architecture may derive one (T5Gemma's decoder start)
        special = {k: v for k, v in _special_ids(hf, extra or [], fields["vocab_size"]).items()
                   if v is not None or k not in fields}
    except KeyError as err:
        raise ValueError(f"config.json has no {err.args[0]!r} field, which {arch} ({model_type}) needs") from None
    except (TypeError, AttributeError) as err:
        raise ValueError(f"config.json of {arch} ({model_type}) holds a field of the wrong type: {err}") from None
    except ValueError as err:
        _name_class_defaults(err, filled, {}, model_type)
        raise
    account_for_every_key(hf, BY_MODEL_TYPE[model_type], model_type, f"{arch} ({model_type})")
    try:
        return ModelConfig.from_dict({**fields, **special})
    except ValueError as err:
        _name_class_defaults(err, filled, fields, model_type)
        raise


def _name_class_defaults(err: ValueError, filled: dict, fields: dict, model_type: str) -> None:
    """Refuse a value that came from the config class's default for a key config.json leaves out by saying so:
    the file lacks the key (Qwen3 without num_key_value_heads gets the class's 32). A value is blamed on the
    default when the message names the key, or a ModelConfig field holding the same value, as ``name=value``."""
    message = str(err)

    def named(name: str, value) -> bool:
        return any(re.search(rf"(?<!\w){re.escape(name)}={re.escape(shown)}(?!\w|\.\d)", message)
                   for shown in {str(value), repr(value)})

    blamed = [(key, value) for key, value in filled.items() if isinstance(value, (int, float, str))
              and (named(key, value) or any(named(field, value) for field, held in fields.items()
                                            if held == value and type(held) is type(value)))]
    if blamed:
        keys = ", ".join(f"{key}={value!r}" for key, value in blamed)
        wanted = ", ".join(f'"{key}"' for key, _ in blamed)
        raise ValueError(f"{message}\n{keys}: not in config.json, so transformers' {model_type} config class fills in "
                         f"its default; add {wanted} with the model's own value to config.json") from None


_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _check_field_types(fields: dict, arch: str) -> None:
    """Values read from config.json must have their ModelConfig field's type (a string where a width
    belongs would otherwise fail later, far from its cause)."""
    hints = flat_type_hints()
    for name, value in fields.items():
        allowed = typing.get_args(hints[name]) or (hints[name],)
        if any(k not in _KINDS and k is not type(None) for k in allowed) or (value is None and type(None) in allowed):
            continue  # structured fields (rope scaling, id tuples) are built by the interop code itself
        ok = any(isinstance(value, k) and not (k in (int, float) and isinstance(value, bool))
                 or (k is float and isinstance(value, int) and not isinstance(value, bool)) for k in allowed)
        if not ok:
            wanted = " or ".join(_KINDS[k] for k in allowed if k in _KINDS)
            raise ValueError(f"config.json of {arch}: the value behind ModelConfig.{name} must be {wanted}, "
                             f"not {json.dumps(value)}")


def config_to_hf(cfg: ModelConfig, base: dict | None = None) -> dict:
    """A transformers config dict for ``cfg``; fields jaxformer does not model are kept from ``base``."""
    model_type, arch = hf_target(cfg, (base or {}).get("model_type"))
    out = dict(base or {})
    out.update(model_type=model_type, architectures=[arch], vocab_size=cfg.vocab_size, dtype=cfg.param_dtype,
               initializer_range=cfg.init_std)
    tokens = cfg.tokens
    ids = {"pad_token_id": tokens.pad, "bos_token_id": tokens.bos, "eos_token_id": tokens.eos,
           "decoder_start_token_id": tokens.decoder_start}
    for key, value in ids.items():
        if value is not None:
            out[key] = list(value) if isinstance(value, tuple) else value
        elif key not in out and class_default(model_type, key) is not None:
            out[key] = None  # left out, transformers' class would fill in its own id (GPT-2's 50256)
    BY_MODEL_TYPE[model_type].config_to_hf(cfg, model_type, out)
    return out


def from_pretrained(path: str | os.PathLike, dtype: str | None = None, allow_pickle: bool = False,
                    adapter: str | os.PathLike | None = None, quantize: str | None = None):
    """Load a Hugging Face checkpoint folder (config.json + safetensors) as a jaxformer model; with ``adapter``,
    a PEFT LoRA adapter folder on top (``interop/peft.py``); with ``quantize`` ('int8' or 'int8_dynamic'),
    int8 projection kernels under it (QLoRA's arrangement: the adapter stays float)."""
    folder = Path(path)
    if not (folder / "config.json").exists():
        raise ValueError(f"{folder} has no config.json; expected a Hugging Face checkpoint folder")
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize={quantize!r} is not supported; use None or one of {QUANTIZATIONS}")
    hf = read_json(folder / "config.json")
    model_type, arch = architecture_of(hf)  # refuse unsupported types before touching any tensor file
    adapter_config = peft.read_config(adapter) if adapter is not None else None  # refuse its options early too
    files = TensorFiles(folder, allow_pickle=allow_pickle)
    if mxfp4.holds_mxfp4(hf):  # gpt-oss's published experts: read decoded (the architecture checks the config)
        files = mxfp4.Decoded(files)
    if fp8.holds_fp8(hf):  # DeepSeek-V3's, Qwen3-*-FP8's, ...: each float8 weight read times its block's scale
        files = fp8.Decoded(files, hf)
    names = set(files.names)
    if BY_MODEL_TYPE[model_type].ignored is not None:
        skipped, note = BY_MODEL_TYPE[model_type].ignored(hf, names)
        if skipped:
            warnings.warn(note, stacklevel=2)
            names -= skipped
    generation = list(iter_json(folder, "generation_config.json"))
    cfg = config_from_hf(hf, names, generation, dtype)
    rules, aliases = rules_for(cfg, model_type, arch, names)
    model = build_from_tensors(cfg, rules, aliases, names, files.get, f"{folder} does not match {arch} ({model_type})")
    model.hf_config = json.dumps(hf, sort_keys=True)  # kept so save_pretrained writes the fields we do not model
    # transformers' generate() takes its defaults from this file when there is one (jaxformer.generate)
    model.generation_config = json.dumps(generation[0], sort_keys=True) if generation else None
    if generation:  # (Whisper's generate applies its suppression lists and max_length itself)
        applied = speech_generation.APPLIED_SETTINGS if model.config.audio is not None else ()
        _name_generation_settings({k: v for k, v in generation[0].items() if k not in applied}, folder)
    if adapter is not None:
        model = peft.load_adapter(model, adapter, names, adapter_config)
    if quantize is not None:
        model = quantized(model, quantize)
    return model


# --------------------------------------------------------------------------------------------------
# Saving


def to_hf_tensors(model) -> tuple[dict[str, np.ndarray], dict]:
    """The model's parameters as HF-named numpy arrays, plus the HF config dict."""
    cfg: ModelConfig = model.config
    base = json.loads(getattr(model, "hf_config", None) or "{}")
    if fp8.holds_fp8(base):  # the weights are written as floats, so the file no longer says FP8
        base.pop("quantization_config")
    # a multimodal file's text model is written as its text type (a wrapper is never written back)
    prefer = (base.get("text_config") or {}).get("model_type") or base.get("model_type")
    model_type, arch = hf_target(cfg, prefer)
    if base and (base.get("model_type"), (base.get("architectures") or [arch])[0]) == (model_type, arch):
        hf = config_to_hf(cfg, base)
    else:  # a fresh file, of the type found above (a wrapper's text type)
        hf = config_to_hf(cfg, {"model_type": model_type})
    rules, _ = rules_for(cfg, model_type, arch)
    tensors = export_with_rules(model, rules)
    if cfg.generator_width:
        warnings.warn(f"{cfg.name!r}: the ELECTRA discriminator is written without the generator it trained beside "
                      "(transformers' ElectraForPreTraining holds none); write that with model.generator.save_pretrained",
                      stacklevel=3)
    return tensors, hf


def save_pretrained(model, path: str | os.PathLike) -> None:
    """Write config.json + model.safetensors that transformers' from_pretrained loads, and the loaded
    checkpoint's generation_config.json when it had one (its stopping and forcing ids)."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tensors, hf = to_hf_tensors(model)
    write_safetensors(tensors, folder / "model.safetensors")
    files = {"config.json": hf}
    if getattr(model, "generation_config", None):
        files["generation_config.json"] = json.loads(model.generation_config)
    for name, content in files.items():
        tmp = folder / (name + ".tmp")
        tmp.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, folder / name)


edges.provide("save_pretrained", save_pretrained)


def _name_generation_settings(generation: dict, folder: Path) -> None:
    """generation_config.json's sampling and search settings are generate() arguments here, not defaults:
    named in a warning so that a comparison with transformers' generate() does not mislead."""
    unused = {k: v for k, v in generation.items() if k in GENERATION_KEYS and v != GENERATION_KEYS[k]}
    if unused:
        settings = ", ".join(f"{k}={v!r}" for k, v in unused.items())
        warnings.warn(f"{folder / 'generation_config.json'} sets {settings}, which transformers' generate() applies "
                      "by default; jaxformer's generate takes them as arguments (its token ids and forcing are "
                      "applied)", stacklevel=3)
