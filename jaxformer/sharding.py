"""Sharding: one table from logical axes to mesh axes, the mesh from a config, parameters created already
sharded, the activation constraint at block boundaries, and multi-process start-up.

A strategy is a mesh shape, not a second table: mesh axes of size 1 shard nothing, so the same rules give
data parallelism (``data=N``), FSDP (``fsdp=N``: matrices split along ``embed``, the batch split too),
tensor parallelism (``tensor=N``: heads, MLP width and vocabulary split, Megatron-style), both at once,
expert parallelism (``expert=N``: each device holds a slice of the experts and other rows of the batch; the
MoE layer sends each token to the devices holding its experts with an all-to-all), context parallelism
(``sequence=N``: every activation split along the sequence; attention passes keys and values around the
ring of devices, ``kernels.ring_attention``) and pipeline parallelism (``stage=N``: each stack's stacked
layers split into N stages that microbatches flow through, ``layers/pipeline.py``).
"""

from __future__ import annotations

import functools
import math
import os
import re

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

# ``stage`` is outermost: pipeline stages pass one activation a step, the link a pod's slowest can serve
MESH_AXES = ("stage", "data", "fsdp", "tensor", "expert", "sequence")
# The batch dimension is split over all three: FSDP is data parallelism too, and outside the MoE layers
# the expert-parallel devices are data-parallel (each holds other rows; the MoE layer exchanges them).
BATCH_AXES = ("data", "fsdp", "expert")

# The leading axis of stacked layers: ``layers`` for a stack's main run of identical layers, which pipeline
# stages split, ``unstaged_layers`` for the few that run apart from it (DeepSeek's dense first layers,
# ModernBERT's first layer), which every stage keeps whole.
LAYER_AXES = ("layers", "unstaged_layers")

# Logical axis -> mesh axis. Unlisted axes (unstaged_layers, head_dim, embed_out, positions, relative, types,
# buckets, conv_*, labels) are never split. Vectors (norm scales, biases: one axis besides the layers') stay replicated:
# they are tiny, and gathering them would cost a collective per use.
# A mesh axis splits at most one dimension of a parameter, the first that asks for it: MLA's latent
# width takes FSDP where no `embed` axis does (its up-projections [latent, heads, head_dim]).
# DeepSeek-V4: its grouped output projection splits by groups of heads over `tensor` (o_group [G, I, R], then the
# rows of o [G * R, D], Megatron's row-parallel half), FSDP taking the group's input width; its compressors'
# positional bias takes FSDP along the entry width, and the hyper-connections' maps along their input (n copies of
# the hidden state).
RULES = {"layers": "stage", "embed": "fsdp", "heads": "tensor", "kv_heads": "tensor", "mlp": "tensor",
         "vocab": "tensor", "experts": "expert", "latent": "fsdp", "index_heads": "tensor",
         "out_groups": "tensor", "grouped_out": "tensor", "group_in": "fsdp", "compressed_width": "fsdp",
         "hc_in": "fsdp"}

# Mesh shapes of the named strategies on ``n`` devices; ``tensor`` (and ``expert``) take the largest
# size that divides both ``n`` and what they split, the rest of the devices do data parallelism.
STRATEGIES = ("dp", "fsdp", "tp", "fsdp_tp", "ep", "cp", "pp")


def mesh_sizes(sizes: dict[str, int], device_count: int) -> dict[str, int]:
    """Resolve -1 (the devices left over) and check that the mesh holds exactly the devices present."""
    sizes = {axis: int(sizes.get(axis, 1)) for axis in MESH_AXES}
    rest = [axis for axis, size in sizes.items() if size == -1]
    if len(rest) > 1:
        raise ValueError(f"only one mesh axis may be -1; got {', '.join('mesh.' + a for a in rest)}")
    for axis, size in sizes.items():
        if size == 0 or size < -1:
            raise ValueError(f"mesh.{axis}={size} must be a positive size or -1 (the devices left over)")
    known = math.prod(size for size in sizes.values() if size != -1)
    if rest:
        if device_count % known:
            raise ValueError(f"mesh sizes {sizes} leave no whole size for mesh.{rest[0]} on {device_count} devices")
        sizes[rest[0]] = device_count // known
    if math.prod(sizes.values()) != device_count:
        raise ValueError(f"mesh {sizes} holds {math.prod(sizes.values())} devices; there are {device_count}")
    return sizes


def make_mesh(sizes: dict[str, int], devices=None) -> jax.sharding.Mesh:
    devices = jax.devices() if devices is None else devices
    sizes = mesh_sizes(sizes, len(devices))
    # Auto axes: the compiler propagates shardings from the jit boundary and the block-boundary constraints.
    return jax.make_mesh(tuple(sizes.values()), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
                         devices=devices)


def data_parallel_size(mesh) -> int:
    return math.prod(mesh.shape[axis] for axis in BATCH_AXES)


def check_batch(batch_size: int, mesh, what: str = "the batch") -> None:
    size = data_parallel_size(mesh)
    if batch_size % size:
        raise ValueError(f"{what} of {batch_size} rows does not divide over the data-parallel size mesh.data x "
                         f"mesh.fsdp x mesh.expert = {' x '.join(str(mesh.shape[a]) for a in BATCH_AXES)} = {size}")


def spec_for(axes: tuple[str, ...], shape: tuple[int, ...], mesh, name: str = "a parameter") -> P:
    """The PartitionSpec of a parameter with logical ``axes``; a mesh axis that does not divide the
    dimension it would split is a ValueError naming both."""
    if len([a for a in axes if a not in LAYER_AXES]) <= 1:
        return P()
    spec = []
    for axis, dim in zip(axes, shape):
        mesh_axis = RULES.get(axis)
        if mesh_axis is None or mesh.shape[mesh_axis] == 1 or mesh_axis in spec:
            spec.append(None)
            continue
        if dim % mesh.shape[mesh_axis]:
            raise ValueError(f"{name}: logical axis {axis!r} of size {dim} does not divide over mesh axis "
                             f"{mesh_axis!r} of size {mesh.shape[mesh_axis]}")
        spec.append(mesh_axis)
    return P(*spec) if any(spec) else P()


def state_shardings(state: nnx.State, mesh) -> nnx.State:
    """NamedShardings for a model state: parameters, and every other variable that names its logical axes
    (int8 kernels and their scales), by the rules; the rest replicated."""

    def one(path, variable):
        axes = variable.get_metadata().get("axes")
        spec = spec_for(axes, variable.shape, mesh, ".".join(map(str, path))) if axes else P()
        return variable.replace(NamedSharding(mesh, spec))

    return nnx.map_state(one, state)


def sharded_build(build, mesh):
    """``build()`` (a function returning a model) run under jit with the rules' out_shardings: every
    parameter is created in place on its devices, never whole on one device."""
    abstract = nnx.eval_shape(build)
    graphdef, abstract_state = nnx.split(abstract)
    shardings = state_shardings(abstract_state, mesh)
    state = jax.jit(lambda: nnx.split(build())[1], out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def shard_model(model, mesh):
    """An existing model (loaded from a checkpoint) moved onto the mesh by the rules."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.device_put(state, state_shardings(state, mesh)))


def shardings_of(tree):
    return jax.tree.map(lambda x: x.sharding, tree)


def sharded_optimizer_state(optimizer, params):
    """``optimizer.init(params)`` created in place: each moment takes its parameter's sharding (so FSDP
    splits the optimizer state too), the rest (Adam's step count) is replicated. A parameter the
    optimizer leaves out (``optax.multi_transform`` with ``set_to_zero``: DeepSeek-V3's router bias)
    has an empty ``MaskedNode`` in its place, which stays as it is."""
    import optax

    def masked(x) -> bool:
        return isinstance(x, optax.MaskedNode)

    mesh = jax.tree.leaves(params)[0].sharding.mesh
    replicated = NamedSharding(mesh, P())
    def sharding_of(value, param_sharding):
        return value if masked(value) else param_sharding

    shardings = optax.tree_map_params(optimizer, sharding_of, jax.eval_shape(optimizer.init, params),
                                      shardings_of(params), transform_non_params=lambda _: replicated,
                                      is_leaf=masked)
    return jax.jit(optimizer.init, out_shardings=shardings)(params)


def under_mesh(step, mesh):
    """``step`` traced with the mesh in context, so block boundaries get their sharding constraints
    (and Pallas kernels their shard_map)."""

    def traced(*args):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return step(*args)

    return traced


def axis_size(axis: str) -> int:
    """The size of mesh axis ``axis`` in the mesh in context (1: none, or no mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else dict(mesh.shape).get(axis, 1)


def sequence_parallel_size() -> int:
    return axis_size("sequence")


def constrain_activations(x: jax.Array) -> jax.Array:
    """At block boundaries under a mesh (``jax.set_mesh``): rows split over data x fsdp, tokens over
    ``sequence`` (context parallelism; when they divide), the rest replicated (tensor parallelism gathers
    its partial sums here, as Megatron does). No mesh: unchanged."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
        return x
    sequence = sequence_parallel_size()
    tokens = "sequence" if sequence > 1 and x.ndim >= 3 and x.shape[1] % sequence == 0 else None
    return jax.lax.with_sharding_constraint(x, P(BATCH_AXES, tokens, *([None] * (x.ndim - 2))))


_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


def communicated_bytes(hlo: str) -> dict[str, int]:
    """Bytes each device sends per run of a compiled program (``compiled.as_text()``), by collective kind.

    Per op, from its result shape s bytes and its group of g devices, as ring algorithms move them: an
    all-gather sends s (g-1)/g, a reduce-scatter s (g-1), an all-reduce 2 s (g-1)/g, an all-to-all
    s (g-1)/g, a collective permute s. An op inside a loop counts once per iteration (XLA's known trip
    count: the layer scan's), so a scanned layer's collectives count once per layer; every branch of a
    conditional counts (an upper bound: one runs)."""
    computations, name = {}, None
    for line in hlo.splitlines():
        header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header:
            name = header.group(1)
            computations[name] = {"entry": line.startswith("ENTRY"), "lines": []}
        elif name and line.strip() and line.strip() != "}":
            computations[name]["lines"].append(line)

    def shape_bytes(text: str, asynchronous: bool) -> int:
        arrays = [_DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
                  for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", text)]
        # an async start's tuple holds its operand and result (and context words): the result is the largest
        return max(arrays, default=0) if asynchronous else sum(arrays)

    def group_size(line: str) -> int:  # the three spellings of replica_groups
        named = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
        if named:
            sizes = dict(re.findall(r"'([^']+)'=(\d+)", named.group(1)))
            return math.prod(int(sizes[axis]) for axis in re.findall(r"'([^']+)'", named.group(2)))
        iota = re.search(r"replica_groups=\[\d+,(\d+)\]<=", line)
        if iota:
            return int(iota.group(1))
        listed = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
        return len(listed.group(1).split(",")) if listed else 1

    @functools.cache
    def total(name: str) -> tuple[tuple[str, int], ...]:
        sums: dict[str, int] = {}
        for line in computations[name]["lines"]:
            op = re.search(r"= (.*?) ([a-z\-]+)\(", line)
            if op and op.group(2).removesuffix("-start") in _COLLECTIVES and not op.group(2).endswith("-done"):
                kind, g = op.group(2).removesuffix("-start"), group_size(line)
                size = shape_bytes(op.group(1), op.group(2).endswith("-start"))
                moved = {"all-gather": size * (g - 1) / g, "reduce-scatter": size * (g - 1),
                         "all-reduce": 2 * size * (g - 1) / g, "collective-permute": size}.get(kind, size * (g - 1) / g)
                sums[kind] = sums.get(kind, 0) + int(moved)
            trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
            body = re.search(r"body=%?([\w.\-]+)", line)
            callees = re.findall(r"(?:body|condition|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)",
                                 line)
            for branches in re.findall(r"branch_computations=\{([^}]*)\}", line):
                callees += re.findall(r"[\w.\-]+", branches.replace("%", ""))
            for callee in filter(computations.__contains__, callees):
                times = int(trips.group(1)) if trips and body and callee == body.group(1) else 1
                for kind, size in total(callee):
                    sums[kind] = sums.get(kind, 0) + times * size
        return tuple(sums.items())

    entry = next(name for name, c in computations.items() if c["entry"])
    return dict(total(entry))


def bytes_per_device(tree) -> int:
    """Bytes of a tree's arrays held by the first device (every device holds as much under these rules)."""
    device = jax.devices()[0]
    total = 0
    for leaf in jax.tree.leaves(tree):
        total += sum(shard.data.nbytes for shard in leaf.addressable_shards if shard.device == device)
    return total


def initialize_distributed(coordinator: str = "", num_processes: int = 0, process_id: int = -1) -> bool:
    """Start JAX's multi-controller runtime when asked: by the arguments (from ``mesh.coordinator``
    etc.), else by the environment (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID), and
    ``coordinator="auto"`` lets JAX detect the cluster (Cloud TPU pods, SLURM). Returns whether it ran."""
    coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS", "")
    if not coordinator or jax.distributed.is_initialized():
        return False
    if coordinator == "auto":
        jax.distributed.initialize()
        return True
    num_processes = num_processes or int(os.environ.get("JAX_NUM_PROCESSES", "0"))
    process_id = process_id if process_id >= 0 else int(os.environ.get("JAX_PROCESS_ID", "-1"))
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(f"a multi-process run at {coordinator} needs mesh.num_processes >= 1 and mesh.process_id "
                         f"in [0, num_processes); got {num_processes} and {process_id}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes talk over gloo
    jax.distributed.initialize(coordinator, num_processes, process_id)
    return True


def process_rows(batch_size: int) -> range:
    """The rows of a global batch of ``batch_size`` that this process feeds (all of them in a one-process run)."""
    count, index = jax.process_count(), jax.process_index()
    return range(index * batch_size // count, (index + 1) * batch_size // count)


def local_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """This process's rows of a global batch (``process_rows``)."""
    rows = process_rows(len(next(iter(batch.values()))))
    return {k: v[rows.start:rows.stop] for k, v in batch.items()}


def to_device(batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """A global batch assembled from each process's own rows of it."""
    return from_process_rows(local_rows(batch), sharding)


def from_process_rows(rows: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """A global batch assembled from the rows each process built (``process_rows``)."""
    return {k: jax.make_array_from_process_local_data(sharding, v, (len(v) * jax.process_count(), *v.shape[1:]))
            for k, v in rows.items()}
