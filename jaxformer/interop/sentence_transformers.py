"""sentence-transformers folders: ``modules.json`` and each module's config, read into one plain description.

A folder is a pipeline: a Transformer (the Hugging Face encoder, its tokenizer, and how text is cut), a
Pooling, then any number of Dense and Normalize steps. Every option is checked here, without torch; an
option jaxformer would have to ignore is refused with a ValueError naming the file, the field and the value,
since ignoring it would give vectors that differ from sentence-transformers' without saying so.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxformer.interop.files import TensorFiles, read_json

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# Pooling's pre-v5 booleans, in the order sentence-transformers concatenates them.
_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
# Dense activations by the torch class path sentence-transformers writes; it builds only ``torch.`` paths
# without trust_remote_code, so those are the ones a folder can mean.
ACTIVATIONS = {"torch.nn.modules.activation.Tanh": "tanh", "torch.nn.modules.linear.Identity": "identity",
               "torch.nn.modules.activation.ReLU": "relu", "torch.nn.modules.activation.Sigmoid": "sigmoid",
               "torch.nn.modules.activation.GELU": "gelu"}
_MODULE_KINDS = ("Transformer", "Pooling", "Dense", "Normalize")
# sentence_bert_config.json fields that change nothing in encode (bookkeeping, speed, the default task).
_HARMLESS = {"transformer_task": "feature-extraction", "module_output_name": "token_embeddings"}
_TEXT_FORWARD = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}


@dataclass(frozen=True)
class DenseStep:
    weight: np.ndarray            # [out, in], as torch.nn.Linear holds it
    bias: np.ndarray | None
    activation: str               # a value of ACTIVATIONS
    residual: np.ndarray | None   # use_residual with in != out: a bias-free [out, in] projection of the input
    use_residual: bool


@dataclass(frozen=True)
class Pipeline:
    """What a sentence-transformers folder asks encode to do."""

    transformer_dir: Path
    max_seq_length: int | None    # None: the tokenizer's own limit (capped by the model's positions)
    do_lower_case: bool
    pooling: tuple[str, ...]
    embedding_dimension: int
    steps: tuple[DenseStep | str, ...]   # after pooling, in order: DenseStep or "normalize"
    prompt: str                   # the default prompt, prepended to every text ("" for none)
    prompts: dict[str, str]       # the named prompts an encode call may choose (EmbeddingGemma's query, document, ...)
    include_prompt: bool          # False: pooling skips the prompt's tokens
    similarity_fn_name: str
    truncate_dim: int | None = None  # the width encode keeps by default (a Matryoshka model saved truncated)


def _refuse(file: Path, field: str, value, valid: str) -> None:
    raise ValueError(f"{file}: {field}={json.dumps(value)} is not supported; {valid}")


def _json(file: Path) -> dict:
    return read_json(file)  # a ValueError naming the file when it is not a readable JSON object


def _json_list(file: Path) -> list:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file} is not readable JSON: {err}") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"{file} must hold a non-empty list of modules")
    return data


def read_folder(path: str | os.PathLike, allow_pickle: bool = False) -> Pipeline:
    folder = Path(path)
    modules_file = folder / "modules.json"
    if not modules_file.exists():
        raise ValueError(f"{folder} has no modules.json; expected a folder saved by sentence-transformers "
                         "(SentenceTransformer.save)")
    modules = _json_list(modules_file)
    kinds = []
    for i, entry in enumerate(modules):
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise ValueError(f"{modules_file}: entry {i} has no 'type' string")
        kind = entry["type"].rsplit(".", 1)[-1]
        if not entry["type"].startswith("sentence_transformers.") or kind not in _MODULE_KINDS:
            _refuse(modules_file, f"[{i}].type", entry["type"],
                    "jaxformer reads sentence_transformers Transformer, Pooling, Dense and Normalize modules")
        if entry.get("kwargs"):
            _refuse(modules_file, f"[{i}].kwargs", entry["kwargs"], "per-call module kwargs are not supported")
        kinds.append(kind)
    if kinds[:2] != ["Transformer", "Pooling"] or any(k not in ("Dense", "Normalize") for k in kinds[2:]):
        _refuse(modules_file, "types", kinds, "expected Transformer, Pooling, then any Dense and Normalize modules")

    def module_dir(i: int) -> Path:
        sub = modules[i].get("path", "")
        if not isinstance(sub, str) or Path(sub).is_absolute() or ".." in Path(sub).parts:
            _refuse(modules_file, f"[{i}].path", sub, "module paths are folders inside the model folder")
        return folder / sub

    transformer_dir = module_dir(0)
    max_seq_length, do_lower_case = _read_transformer(transformer_dir)
    pooling, dim, include_prompt = _read_pooling(module_dir(1) / "config.json")
    steps = tuple(_read_dense(module_dir(i), allow_pickle) if kind == "Dense" else _read_normalize(module_dir(i))
                  for i, kind in enumerate(kinds) if i >= 2)
    width = dim * len(pooling)
    for i, step in enumerate(steps, start=2):  # each Dense must take the width the step before it gives
        if isinstance(step, DenseStep):
            if step.weight.shape[1] != width:
                raise ValueError(f"{module_dir(i)}: Dense takes {step.weight.shape[1]} features but receives {width}")
            width = step.weight.shape[0]
    prompts, prompt, similarity, truncate_dim = _read_model_config(folder / "config_sentence_transformers.json")
    return Pipeline(transformer_dir, max_seq_length, do_lower_case, pooling, dim, steps, prompt, prompts,
                    include_prompt, similarity, truncate_dim)


def plain_pipeline(path: str | os.PathLike, pooling: str) -> Pipeline:
    """What ``SentenceTransformer(path)`` builds over a Hugging Face folder without modules.json: the model's last
    hidden states pooled (its width, 0 here, is the model's), no Dense, no Normalize, no prompt."""
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling={pooling!r}; valid: {list(POOLING_MODES)}")
    return Pipeline(Path(path), None, False, (pooling,), 0, (), "", {}, True, "cosine")


def _read_transformer(folder: Path) -> tuple[int | None, bool]:
    """(max_seq_length, do_lower_case): v6 keeps the length in tokenizer_config.json; older versions here."""
    file = next((folder / f"sentence_{n}_config.json" for n in ("bert", "roberta", "distilbert", "camembert",
                                                                  "albert", "xlm-roberta", "xlnet")
                 if (folder / f"sentence_{n}_config.json").exists()), folder / "sentence_bert_config.json")
    config = _json(file) if file.exists() else {}
    max_seq_length = config.get("max_seq_length")
    do_lower_case = config.get("do_lower_case", False)
    for field, value in config.items():
        if field in ("max_seq_length", "do_lower_case", "unpad_inputs"):
            continue
        if field in _HARMLESS:
            if value != _HARMLESS[field]:
                _refuse(file, field, value, f"only {json.dumps(_HARMLESS[field])} is supported")
        elif field == "modality_config":
            if value != _TEXT_FORWARD:
                _refuse(file, field, value, f"only the text forward pass is supported: {json.dumps(_TEXT_FORWARD)}")
        elif field in ("processor_kwargs", "tokenizer_args"):
            if not isinstance(value, dict):
                _refuse(file, field, value, "expected an object")
            for key, setting in value.items():
                if key == "model_max_length" and max_seq_length is None:
                    max_seq_length = setting
                elif key != "trust_remote_code":  # jaxformer runs no code from a folder anyway
                    _refuse(file, f"{field}.{key}", setting, "only model_max_length is read from tokenizer kwargs")
        elif field in ("model_kwargs", "model_args", "config_kwargs", "config_args"):
            odd = {k: v for k, v in (value or {}).items() if k not in ("trust_remote_code", "torch_dtype", "dtype")}
            if odd:
                _refuse(file, field, odd, "model and config kwargs other than the dtype are not supported")
        elif value not in (None, {}, []):
            _refuse(file, field, value, "the field is not one jaxformer knows (max_seq_length, do_lower_case, "
                                        "transformer_task, modality_config, processor_kwargs)")
    if max_seq_length is not None and (not isinstance(max_seq_length, int) or isinstance(max_seq_length, bool)
                                       or max_seq_length < 2):
        _refuse(file, "max_seq_length", max_seq_length, "expected an integer of at least 2")
    if not isinstance(do_lower_case, bool):
        _refuse(file, "do_lower_case", do_lower_case, "expected true or false")
    return max_seq_length, do_lower_case


def _read_pooling(file: Path) -> tuple[tuple[str, ...], int, bool]:
    config = _json(file)
    known = {"embedding_dimension", "word_embedding_dimension", "pooling_mode", "include_prompt", *_LEGACY_POOLING}
    for field, value in config.items():
        if field not in known:
            _refuse(file, field, value, f"Pooling fields jaxformer knows: {sorted(known)}")
    mode = config.get("pooling_mode")
    if mode is None:  # the pre-v5 booleans; none set means mean, as sentence-transformers reads them
        mode = tuple(m for key, m in _LEGACY_POOLING.items() if config.get(key)) or ("mean",)
    modes = (mode,) if isinstance(mode, str) else tuple(mode) if isinstance(mode, list) else mode
    if not isinstance(modes, tuple) or not modes or any(m not in POOLING_MODES for m in modes):
        _refuse(file, "pooling_mode", mode, f"valid modes: {list(POOLING_MODES)}, or a list of them")
    dim = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        _refuse(file, "embedding_dimension", dim, "expected a positive integer")
    include_prompt = config.get("include_prompt", True)
    if not isinstance(include_prompt, bool):
        _refuse(file, "include_prompt", include_prompt, "expected true or false")
    return modes, dim, include_prompt


def _read_dense(folder: Path, allow_pickle: bool) -> DenseStep:
    file = folder / "config.json"
    config = _json(file)
    for field in ("module_input_name", "module_output_name"):
        if config.get(field, "sentence_embedding") not in (None, "sentence_embedding"):
            _refuse(file, field, config[field], "Dense must read and write sentence_embedding")
    known = {"in_features", "out_features", "bias", "activation_function", "use_residual",
             "module_input_name", "module_output_name"}
    for field, value in config.items():
        if field not in known:
            _refuse(file, field, value, f"Dense fields jaxformer knows: {sorted(known)}")
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    if activation not in ACTIVATIONS:
        _refuse(file, "activation_function", activation, f"supported: {sorted(ACTIVATIONS)}")
    d_in, d_out = config.get("in_features"), config.get("out_features")
    tensors = TensorFiles(folder, allow_pickle)  # a pickled pytorch_model.bin only when asked for
    names = set(tensors.names)
    use_residual = bool(config.get("use_residual", False))
    expected = {"linear.weight"} | ({"linear.bias"} if config.get("bias", True) else set())
    expected |= {"residual.weight"} if use_residual and d_in != d_out else set()
    if names != expected:
        raise ValueError(f"{folder}: Dense tensors {sorted(names)} do not match its config.json, which needs "
                         f"{sorted(expected)}")
    weight = np.asarray(tensors.get("linear.weight"), np.float32)
    if weight.shape != (d_out, d_in):
        raise ValueError(f"{folder}: linear.weight has shape {weight.shape}, config.json says ({d_out}, {d_in})")
    bias = np.asarray(tensors.get("linear.bias"), np.float32) if "linear.bias" in names else None
    residual = np.asarray(tensors.get("residual.weight"), np.float32) if "residual.weight" in names else None
    return DenseStep(weight, bias, ACTIVATIONS[activation], residual, use_residual)


def _read_normalize(folder: Path) -> str:
    file = folder / "config.json"
    config = _json(file) if file.exists() else {}
    for field, value in config.items():
        if field not in ("module_input_name", "module_output_name") or value not in (None, "sentence_embedding"):
            _refuse(file, field, value, "Normalize must read and write sentence_embedding")
    return "normalize"


def _read_model_config(file: Path) -> tuple[dict[str, str], str, str, int | None]:
    """(named prompts, default prompt, similarity function name, truncate_dim) from config_sentence_transformers.json
    (sentence-transformers saves the truncate_dim a model was built with, and its encode keeps that width)."""
    config = _json(file) if file.exists() else {}
    kind = config.get("model_type", "SentenceTransformer")
    if kind != "SentenceTransformer":
        _refuse(file, "model_type", kind, "jaxformer embeds with SentenceTransformer folders only")
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        _refuse(file, "prompts", prompts, "expected an object of prompt names to prompt strings")
    name = config.get("default_prompt_name")
    if name is not None and name not in prompts:
        _refuse(file, "default_prompt_name", name, f"it must name one of the prompts {sorted(prompts)}")
    similarity = config.get("similarity_fn_name") or "cosine"
    if similarity not in ("cosine", "dot", "euclidean", "manhattan"):
        _refuse(file, "similarity_fn_name", similarity, "valid: cosine, dot, euclidean, manhattan")
    truncate_dim = config.get("truncate_dim")
    if truncate_dim is not None and (isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int)
                                     or truncate_dim < 1):
        _refuse(file, "truncate_dim", truncate_dim, "expected a positive integer")
    return dict(prompts), (prompts.get(name) or "") if name is not None else "", similarity, truncate_dim
