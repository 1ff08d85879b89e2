"""Run checkpoints (Orbax): params, optimizer state, progress (step, skipped, key), the data position
(with the Grain loader's iterator state) and, for a model with segment memory, the batch rows' memory (the rows' context at that position, so a
resumed run computes what an uninterrupted one would), saved asynchronously and restored onto whatever
mesh the state has now.

A LoRA fine-tune's checkpoint holds what trains (the adapters and any head), their optimizer state and
progress, and ``base``: a reference to the frozen base (``model.init_from``, or the preset it was
initialised from) with a fingerprint of its tensors, never a second copy of them. Resuming (or eval,
convert) loads the base again from the reference and refuses one whose fingerprint differs."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import shutil
from pathlib import Path

import jax
import numpy as np
from flax import nnx


def checkpoint_manager(run_dir: Path, keep: int, read_only: bool = False):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=not read_only,
                                           read_only=read_only, create=not read_only)
    return ocp.CheckpointManager(run_dir.absolute() / "checkpoints", options=options)


def _abstract(tree):
    """The restore target: shapes, dtypes and the shardings the arrays have now (so a checkpoint saved
    under one mesh restores onto another)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def fingerprint(weights: nnx.State) -> str:
    """sha256 over a model state's tensors (path, dtype, shape and bytes, in path order): the same for the
    same values whatever the mesh they lie on. Costs one read of every tensor (about 2 s per GB on CPU)."""
    from jax.experimental import multihost_utils

    digest = hashlib.sha256()
    for path, variable in sorted(nnx.to_flat_state(weights), key=lambda item: tuple(map(str, item[0]))):
        value = variable[...]
        whole = value if value.is_fully_addressable else multihost_utils.process_allgather(value, tiled=True)
        array = np.ascontiguousarray(jax.device_get(whole))
        digest.update(f"{'/'.join(map(str, path))}|{array.dtype}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def check_base(stored: dict | None, base: dict, where: str) -> None:
    """A LoRA checkpoint's base reference against the base loaded now: a different fingerprint is a
    ValueError (the adapters were trained on other weights), as is a checkpoint without a reference."""
    if stored is None:
        raise ValueError(f"{where} holds no reference to a frozen base (not a LoRA checkpoint); it cannot be restored "
                         "into a LoRA fine-tune. Use a new run.dir, or finetune.lora.rank=0")
    if stored.get("fingerprint") != base["fingerprint"]:
        raise ValueError(f"{where} was trained on the base {stored.get('source')!r} with fingerprint "
                         f"{stored.get('fingerprint')}, but {base['source']!r} now loads a base with fingerprint "
                         f"{base['fingerprint']}: the base weights changed, so these adapters do not belong to them. "
                         "Restore the original base (model.init_from), or start a new run.dir")


def save_checkpoint(manager, state: dict, data_position: dict, base: dict | None = None) -> None:
    """Start an asynchronous save of ``state`` at the data position's step. A disk without room for it
    is found out first (an ENOSPC OSError naming the bytes): Orbax's writer threads would otherwise fail
    one by one, each with its own traceback."""
    import orbax.checkpoint as ocp

    manager.wait_until_finished()  # the previous save's bytes are on disk (Orbax would wait here anyway)
    needed = sum(x.nbytes for x in jax.tree.leaves((state["params"], state["opt_state"], state.get("memory"))))
    free = shutil.disk_usage(manager.directory).free
    if free < needed:
        raise OSError(errno.ENOSPC, f"a checkpoint of this run needs about {needed:,} bytes, {free:,} are free",
                      str(manager.directory))
    progress = {k: state[k] for k in ("step", "skipped", "key")}
    optional = {"memory": ocp.args.StandardSave(_fields(state["memory"]))} if "memory" in state else {}
    optional |= {"base": ocp.args.JsonSave(base)} if base is not None else {}  # a reference, not the base
    manager.save(int(data_position["step"]), args=ocp.args.Composite(
        params=ocp.args.StandardSave(state["params"]), opt_state=ocp.args.StandardSave(state["opt_state"]),
        progress=ocp.args.StandardSave(progress), data=ocp.args.JsonSave(data_position), **optional))


def _fields(memory) -> dict:
    """A segment memory as the plain dict Orbax stores (its own metadata knows no dataclasses)."""
    return {field.name: getattr(memory, field.name) for field in dataclasses.fields(memory)}


def restore(manager, state: dict, step: int | None = None, params_only: bool = False, base: dict | None = None):
    """The checkpoint at ``step`` (default: the newest finalized one; Orbax never lists a half-written
    one) restored with the shardings of ``state``; a tree that does not match the model is a ValueError.
    With ``base`` (a LoRA run's reference to the base it loaded) the checkpoint's own reference must
    match it (``check_base``); ``state["frozen"]`` (that base) is carried over as it is. Returns (state, step,
    the data position saved with it: step, seed, objective, batch size and the data loader's state)."""
    import orbax.checkpoint as ocp

    step = manager.latest_step() if step is None else step
    if step is None:
        return None
    if step not in manager.all_steps():
        raise ValueError(f"no checkpoint of step {step} in {manager.directory}; there are {manager.all_steps()}")
    if base is not None:
        where = f"the checkpoint at step {step} in {manager.directory}"
        saved = (Path(manager.directory) / str(step) / "base").exists()
        stored = manager.restore(step, args=ocp.args.Composite(base=ocp.args.JsonRestore()))["base"] if saved else None
        check_base(stored, base, where)
    items = {"params": ocp.args.StandardRestore(_abstract(state["params"]))}
    if not params_only:
        progress = {k: state[k] for k in ("step", "skipped", "key")}
        items |= {"opt_state": ocp.args.StandardRestore(_abstract(state["opt_state"])),
                  "progress": ocp.args.StandardRestore(_abstract(progress)), "data": ocp.args.JsonRestore()}
        if "memory" in state:
            items["memory"] = ocp.args.StandardRestore(_abstract(_fields(state["memory"])))
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**items))
    except (ValueError, KeyError) as err:
        raise ValueError(f"the checkpoint at step {step} in {manager.directory} cannot be restored into this model "
                         f"and optimizer: it was written by another config, or it is damaged ({err}). Start a new "
                         f"run.dir, restore the original config, or move step {step} aside to resume from an earlier "
                         f"one (there are {manager.all_steps()})") from None
    if params_only:
        return restored["params"], step
    if restored["data"]["step"] != step or int(restored["progress"]["step"]) != step:
        raise ValueError(f"the checkpoint at step {step} in {manager.directory} is inconsistent: "
                         f"data position {restored['data']}, train step {int(restored['progress']['step'])}")
    carried = {"memory": dataclasses.replace(state["memory"], **restored["memory"])} if "memory" in state else {}
    carried |= {"frozen": state["frozen"]} if "frozen" in state else {}  # the base, loaded from its reference
    return ({"params": restored["params"], "opt_state": restored["opt_state"], **restored["progress"], **carried},
            step, restored["data"])
