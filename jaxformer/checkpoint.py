"""jaxformer's own model checkpoint: the ModelConfig as JSON plus the parameters as an Orbax checkpoint.

This is the native format of ``jaxformer convert`` (and of training runs). It restores onto whatever
devices are present, and refuses a parameter tree that does not match the config.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
from flax import nnx

from jaxformer.model_config import ModelConfig
from jaxformer.models import HF_FILES, abstract_model

CONFIG_FILE = "jaxformer.json"
PARAMS_DIR = "params"


def is_checkpoint(path: str | os.PathLike) -> bool:
    return (Path(path) / CONFIG_FILE).exists()


def save_model(model, path: str | os.PathLike) -> None:
    import orbax.checkpoint as ocp

    folder = Path(path).absolute()
    if (folder / PARAMS_DIR).exists():
        raise ValueError(f"{folder / PARAMS_DIR} exists already; choose an empty output folder")
    folder.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(folder / PARAMS_DIR, nnx.state(model))
        checkpointer.wait_until_finished()
    meta = {"config": model.config.to_dict(), **{name: getattr(model, name, None) for name in HF_FILES}}
    tmp = folder / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, folder / CONFIG_FILE)  # written last: its presence marks a complete checkpoint


def load_model(path: str | os.PathLike):
    import orbax.checkpoint as ocp

    folder = Path(path).absolute()
    if not is_checkpoint(folder):
        raise ValueError(f"{folder} is not a jaxformer checkpoint (no {CONFIG_FILE})")
    meta = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    cfg = ModelConfig.from_dict(meta["config"])
    abstract = abstract_model(cfg)
    graphdef, target = nnx.split(abstract)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), target)
    with ocp.StandardCheckpointer() as checkpointer:
        try:
            state = checkpointer.restore(folder / PARAMS_DIR, target)
        except ValueError as err:
            raise ValueError(f"{folder / PARAMS_DIR} does not match the config in {CONFIG_FILE}: {err}") from None
    model = nnx.merge(graphdef, state)
    for name in HF_FILES:
        if meta.get(name):
            setattr(model, name, meta[name])
    return model
