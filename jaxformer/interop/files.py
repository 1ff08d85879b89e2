"""Checkpoint files on disk: safetensors (single or sharded) and, only when asked, pickle.

The safetensors library validates headers, offsets and byte counts; every failure it reports becomes
one ValueError naming the file. Pickle (``pytorch_model.bin``) can run code when unpickled, so it is
refused unless the caller passes ``allow_pickle=True``, and then read with ``weights_only=True``.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Iterator

import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE = "pytorch_model.bin"


class TensorFiles:
    """Read-only view over a checkpoint folder's tensors: ``names`` and ``get(name)``."""

    def __init__(self, folder: str | os.PathLike, allow_pickle: bool = False):
        folder = Path(folder)
        self._handles: dict[str, object] = {}
        self._where: dict[str, str] = {}
        self._pickled: dict[str, np.ndarray] | None = None
        if (folder / SAFETENSORS_INDEX).exists():
            index = read_json(folder / SAFETENSORS_INDEX)
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{folder / SAFETENSORS_INDEX} has no 'weight_map' object")
            odd = [f"{name!r}: {shard!r}" for name, shard in weight_map.items() if not isinstance(shard, str)]
            if odd:
                raise ValueError(f"{folder / SAFETENSORS_INDEX}: weight_map entries must name shard files (strings); "
                                 f"found {', '.join(odd[:5])}")
            for shard in sorted(set(weight_map.values())):
                if Path(shard).name != shard:
                    raise ValueError(f"{folder / SAFETENSORS_INDEX} names shard {shard!r} outside the folder")
                self._open(folder / shard)
            missing = sorted(set(weight_map) - set(self._where))
            if missing:
                raise ValueError(f"{folder / SAFETENSORS_INDEX} lists tensors that no shard holds: {missing[:10]}")
        elif (folder / SAFETENSORS).exists():
            self._open(folder / SAFETENSORS)
        elif (folder / PICKLE).exists():
            if not allow_pickle:
                raise ValueError(
                    f"{folder / PICKLE} is a pickle file, which can execute code when loaded; it is refused. "
                    "Convert it to safetensors, or pass allow_pickle=True to read it with torch.load(weights_only=True)")
            self._pickled = _load_pickle(folder / PICKLE)
        else:
            raise ValueError(f"{folder} holds no {SAFETENSORS}, {SAFETENSORS_INDEX} or {PICKLE}")

    def _open(self, path: Path) -> None:
        if not path.exists():
            raise ValueError(f"checkpoint shard {path} does not exist")
        try:  # the library validates header, offsets, coverage and byte counts
            names = list(safetensors.safe_open(str(path), framework="np").keys())
        except Exception as err:  # SafetensorError is not importable under a stable name
            raise ValueError(f"{path} is not a valid safetensors file: {err}") from None
        for name in names:
            if name in self._where:
                raise ValueError(f"tensor {name!r} appears in both {self._where[name]} and {path}")
            self._where[name] = str(path)
        self._handles[str(path)] = _MappedSafetensors(path)

    @property
    def names(self) -> list[str]:
        return sorted(self._pickled) if self._pickled is not None else sorted(self._where)

    def get(self, name: str) -> np.ndarray:
        if self._pickled is not None:
            return self._pickled[name]
        return self._handles[self._where[name]].get(name)


class _MappedSafetensors:
    """Zero-copy, read-only numpy views of a safetensors file that the library has validated.

    Mapping instead of reading means a tensor costs nothing until it is laid out as a parameter,
    and no byte is copied twice on the way.
    """

    _DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
               "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
               # FP8 checkpoints' weights and UE8M0 scales (interop/fp8.py decodes them)
               "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
               "F8_E8M0": ml_dtypes.float8_e8m0fnu}

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            header_len = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(header_len))
        header.pop("__metadata__", None)
        self._header = header
        self._data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len) if header else None
        self.path = path

    def get(self, name: str) -> np.ndarray:
        entry = self._header[name]
        if entry["dtype"] not in self._DTYPES:
            raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        return self._data[begin:end].view(self._DTYPES[entry["dtype"]]).reshape(entry["shape"])


def read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start}); JSON files must be UTF-8") from None
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not readable JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def _load_pickle(path: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise ValueError(f"reading {path} needs torch (pip install torch); safetensors files need nothing") from None
    try:  # weights_only: the unpickler accepts tensors and plain containers, never arbitrary objects
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"{path} could not be read as a plain state dict (weights_only=True): {err}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a state dict")
    out = {}
    for name, tensor in state.items():
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16; go through float32 (exact)
            out[name] = tensor.float().numpy().astype(ml_dtypes.bfloat16)
        else:
            out[name] = tensor.numpy()
    return out


def contiguous(tensor) -> np.ndarray:
    """``tensor`` as a C-contiguous array of its own shape (np.ascontiguousarray alone makes a 0-d tensor, CLIP's
    logit_scale, 1-d)."""
    return np.ascontiguousarray(tensor).reshape(np.shape(tensor))


def write_safetensors(tensors: dict[str, np.ndarray], path: str | os.PathLike) -> None:
    """Write atomically (temp file + rename) with the metadata transformers expects."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    safetensors.numpy.save_file({k: contiguous(v) for k, v in tensors.items()}, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)


def iter_json(folder: Path, *names: str) -> Iterator[dict]:
    for name in names:
        if (folder / name).exists():
            yield read_json(folder / name)


# What a checkpoint folder consists of: the files an --overwrite replaces, and no others.
CHECKPOINT_FILES = ("config.json", "generation_config.json", SAFETENSORS, SAFETENSORS_INDEX, PICKLE,
                    "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "jaxformer.json", "params")
CHECKPOINT_PATTERNS = ("model-*-of-*.safetensors", "pytorch_model-*-of-*.bin")


def checkpoint_files(folder: Path) -> list[Path]:
    """The checkpoint files and folders present in ``folder``."""
    found = [folder / name for name in CHECKPOINT_FILES if (folder / name).exists()]
    return found + sorted(p for pattern in CHECKPOINT_PATTERNS for p in folder.glob(pattern))


def write_checkpoint_folder(output: str | os.PathLike, write, overwrite: bool = False) -> None:
    """Run ``write(folder)`` into a fresh temporary folder beside ``output``, then move the result into place.

    A non-empty ``output`` is refused unless ``overwrite``; then exactly the checkpoint files it holds
    (``CHECKPOINT_FILES``: a stale index or generation config would shadow or change the new model) are
    removed before the new ones move in, and anything else in it is left alone. A failed write leaves
    ``output`` as it was.
    """
    import shutil
    import tempfile

    output = Path(output)
    if output.exists() and not output.is_dir():
        raise ValueError(f"{output} is a file; the output of convert is a folder")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        held = sorted(p.name for p in output.iterdir())
        raise ValueError(f"{output} is not empty (it holds {', '.join(held[:8])}{', ...' if len(held) > 8 else ''}); "
                         "choose an empty folder, or pass --overwrite to replace the checkpoint files in it")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))  # same filesystem: renames
    try:
        write(staging / "out")
        if not output.exists():
            os.replace(staging / "out", output)
            return
        for stale in checkpoint_files(output):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        for new in (staging / "out").iterdir():
            os.replace(new, output / new.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
