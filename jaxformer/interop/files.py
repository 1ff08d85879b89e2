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
               "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}

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


def write_safetensors(tensors: dict[str, np.ndarray], path: str | os.PathLike) -> None:
    """Write atomically (temp file + rename) with the metadata transformers expects."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp),
                                metadata={"format": "pt"})
    os.replace(tmp, path)


def iter_json(folder: Path, *names: str) -> Iterator[dict]:
    for name in names:
        if (folder / name).exists():
            yield read_json(folder / name)
