"""The shared vocabulary of the per-architecture interop files: how a file's config maps to a
ModelConfig (``Architecture``), how each tensor maps to a parameter (``Rule``), and the two engines
that run rules in either direction.

Loading (``build_from_tensors``) reads every tensor a rule needs, transforms it, stacks layers, and
checks every shape against the abstract model before anything is built: missing, unexpected and
mis-shaped tensors are reported together, and nothing partial is ever loaded. Saving
(``export_with_rules``) runs the same rules backwards, so a round trip returns the same bytes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.config import ModelConfig, RopeScaling
from jaxformer.models import abstract_model


# --------------------------------------------------------------------------------------------------
# Architectures


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One Hugging Face model family as jaxformer reads and writes it; one file under ``interop``
    defines each, and ``interop.registry`` lists them.

    ``classes``: model_type -> the transformers classes supported (the first is the default).
    ``prefix``: model_type -> where head classes nest the base model's tensors ("model.", ...).
    ``base_classes``: classes whose tensors are not nested (saved alone).
    ``config_from_hf(hf, model_type, arch, tensor_names)``: ModelConfig fields of a config.json.
    ``target(cfg)``: the (model_type, class) that holds exactly this config, or None.
    ``config_to_hf(cfg, model_type, out)``: fills a config.json dict for ``cfg``.
    ``rules(cfg, model_type, arch, prefix)``: tensor rules and tied-tensor aliases.
    """

    classes: dict[str, tuple[str, ...]]
    prefix: dict[str, str]
    base_classes: tuple[str, ...]
    config_from_hf: Callable[[dict, str, str, set[str]], dict[str, Any]]
    target: Callable[[ModelConfig], tuple[str, str] | None]
    config_to_hf: Callable[[ModelConfig, str, dict], None]
    rules: Callable[[ModelConfig, str, str, str], tuple[list[Rule], dict[str, str]]]
    # ``ignored(hf, tensor_names) -> (names, note)``: tensors a file may carry that the forward pass never
    # reads (DeepSeek-V3's multi-token-prediction layers); they are skipped with the note as a warning.
    ignored: Callable[[dict, set[str]], tuple[set[str], str]] | None = None


# --------------------------------------------------------------------------------------------------
# Config helpers

ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_fast": "gelu_tanh", "silu": "silu", "swish": "silu"}
GATED = {"silu": "swiglu", "swish": "swiglu", "gelu_new": "geglu", "gelu_pytorch_tanh": "geglu"}


def refuse(condition: bool, message: str) -> None:
    if condition:
        raise ValueError(message)


def activation(name: str, gated: bool, model_type: str) -> str:
    table = GATED if gated else ACTIVATIONS
    if name not in table:
        raise ValueError(f"{model_type}: activation {name!r}{' (gated)' if gated else ''} is not supported; "
                         f"supported: {sorted(table)}")
    return table[name]


def rope_from_hf(hf: dict) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from transformers 5's ``rope_parameters`` or the older ``rope_theta``/``rope_scaling``."""
    params = hf.get("rope_parameters") or {}
    legacy = hf.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type") or legacy.get("rope_type") or legacy.get("type") or "default"
    spec = {**legacy, **params}
    if kind == "default":
        return theta, None
    if kind == "linear":
        return theta, RopeScaling("linear", float(spec["factor"]))
    if kind == "llama3":
        return theta, RopeScaling("llama3", float(spec["factor"]), float(spec["low_freq_factor"]),
                                  float(spec["high_freq_factor"]), int(spec["original_max_position_embeddings"]))
    raise ValueError(f"rope type {kind!r} is not supported; supported: 'default', 'linear', 'llama3'")


def rope_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """transformers 5's ``rope_parameters`` of ``cfg``."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope.update(rope_type=s.kind, factor=s.factor)
        if s.kind == "llama3":
            rope.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor,
                        original_max_position_embeddings=s.original_max_positions)
    return rope


# jaxformer activation -> the name transformers configs use
INVERSE_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new", "silu": "silu"}


# --------------------------------------------------------------------------------------------------
# Tensor rules


@dataclasses.dataclass(frozen=True)
class Rule:
    """jaxformer parameters ``paths`` <-> HF tensors ``names``.

    Names may hold ``{i}`` (the layer); such a rule is applied per layer and its jaxformer arrays are
    stacked on a leading layers axis: every layer of the stack, or the layers ``first <= i < end`` of
    ``layers`` (a stack whose first layers differ, as DeepSeek's dense ones). ``load`` maps the HF arrays
    to the jaxformer arrays (one per path), ``save`` is its exact inverse.
    """

    paths: tuple[tuple[str, ...], ...]
    names: tuple[str, ...]
    load: Callable[[list[np.ndarray]], list[np.ndarray]]
    save: Callable[[list[np.ndarray]], list[np.ndarray]]
    layers: tuple[int, int] | None = None

    @property
    def per_layer(self) -> bool:
        return any("{i}" in n for n in self.names)

    def layer_range(self, cfg: ModelConfig) -> range:
        """The HF layer indices this rule reads (a single pass, ``range(1)``, when not per layer)."""
        if not self.per_layer:
            return range(1)
        if self.layers is not None:
            return range(*self.layers)
        return range({"encoder": cfg.encoder_layers, "decoder": cfg.decoder_layers}[self.paths[0][0]])

    def in_layers(self, first: int, end: int) -> Rule:
        return dataclasses.replace(self, layers=(first, end))


def copy(path, name) -> Rule:
    return Rule((path,), (name,), lambda t: [t[0]], lambda p: [p[0]])


def linear(path, name) -> Rule:
    """torch Linear weight [out, in] <-> kernel [in, out]."""
    return Rule((path,), (name,), lambda t: [t[0].T], lambda p: [p[0].T])


def heads_in(path, name, heads, head_dim) -> Rule:
    """q/k/v projection [N*H, D] <-> [D, N, H]."""
    return Rule((path,), (name,), lambda t: [t[0].T.reshape(-1, heads, head_dim)],
                lambda p: [p[0].reshape(p[0].shape[0], -1).T])


def heads_out(path, name, heads, head_dim) -> Rule:
    """output projection [D, N*H] <-> [N, H, D]."""
    return Rule((path,), (name,), lambda t: [t[0].T.reshape(heads, head_dim, -1)],
                lambda p: [p[0].reshape(-1, p[0].shape[-1]).T])


def bias_heads(path, name, heads, head_dim) -> Rule:
    return Rule((path,), (name,), lambda t: [t[0].reshape(heads, head_dim)], lambda p: [p[0].reshape(-1)])


def norm(path, name, bias: bool, weight="weight", bias_name="bias") -> list[Rule]:
    rules = [copy(path + ("scale",), f"{name}.{weight}")]
    if bias:
        rules.append(copy(path + ("bias",), f"{name}.{bias_name}"))
    return rules


def dense(path, name, bias=True) -> list[Rule]:
    rules = [linear(path + ("kernel",), f"{name}.weight")]
    if bias:
        rules.append(copy(path + ("bias",), f"{name}.bias"))
    return rules


def attention(cfg: ModelConfig, path, q, k, v, o, q_bias=None, k_bias=None, v_bias=None, o_bias=None) -> list[Rule]:
    N, K, H = cfg.num_heads, cfg.kv_heads, cfg.head_dim_
    rules = [heads_in(path + ("q",), q, N, H), heads_in(path + ("k",), k, K, H),
             heads_in(path + ("v",), v, K, H), heads_out(path + ("o",), o, N, H)]
    if cfg.qkv_bias:
        rules += [bias_heads(path + ("q_bias",), q_bias, N, H), bias_heads(path + ("k_bias",), k_bias, K, H),
                  bias_heads(path + ("v_bias",), v_bias, K, H)]
    if cfg.out_bias:
        rules.append(copy(path + ("o_bias",), o_bias))
    return rules


def stacked_experts(path, names: list[str]) -> Rule:
    """One torch Linear [out, in] per expert <-> a kernel [E, in, out]."""
    return Rule((path,), tuple(names), lambda ts: [np.stack([t.T for t in ts])], lambda ps: [w.T for w in ps[0]])


def lm_head(cfg: ModelConfig, embedding: str) -> tuple[list[Rule], dict[str, str]]:
    """The LM head: an alias of the token embedding when tied (older files may still carry a
    copy, which must then equal it), else its own [V, D] tensor."""
    if cfg.head != "lm":
        return [], {}
    if cfg.tie_embeddings:
        return [], {"lm_head.weight": embedding}
    return [linear(("lm_head", "kernel"), "lm_head.weight")], {}


# --------------------------------------------------------------------------------------------------
# Running rules

# Non-parameter tensors older checkpoints carry; they hold nothing a model needs.
IGNORABLE = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq", "embeddings.position_ids")


@functools.lru_cache(maxsize=8)
def _abstract_split(cfg: ModelConfig):
    """(graphdef, abstract state) of a config; tracing the constructor is the slow part, so keep a few."""
    return nnx.split(abstract_model(cfg))


def build_from_tensors(cfg: ModelConfig, rules: list[Rule], aliases: dict[str, str], names: set[str],
                       get: Callable[[str], np.ndarray], source: str):
    """Build the model of ``cfg`` from named tensors through ``rules``, or raise one ValueError that
    lists every missing, unexpected, mis-shaped and non-float tensor. Nothing is built until all of them
    check. Weights holding NaN or Inf load, with a warning naming them."""
    graphdef, state = _abstract_split(cfg)
    expected = {tuple(map(str, p)): v for p, v in nnx.to_flat_state(state)}

    param_dtype = np.dtype(jnp.dtype(cfg.param_dtype))
    missing, mismatched, not_float, loaded, used = [], [], [], {}, set()
    copies: list[tuple[np.ndarray, Any, np.ndarray, str]] = []  # (destination, index, source view, tensor name)
    for rule in rules:
        layer_ids = rule.layer_range(cfg)
        layers = len(layer_ids)
        groups = [[n.format(i=i) for n in rule.names] for i in layer_ids]
        absent = [n for group in groups for n in group if n not in names]
        used.update(n for group in groups for n in group if n in names)  # present, so never "unexpected"
        if absent:
            missing += absent
            continue
        buffers = None
        for i, group in enumerate(groups):
            tensors = [get(n) for n in group]  # views into the mapped file where possible
            # An int8, int64 or bool tensor would load silently as floats (quantized files are refused).
            not_float += [f"{n} ({t.dtype})" for n, t in zip(group, tensors) if not jnp.issubdtype(t.dtype, jnp.floating)]
            parts = rule.load(tensors)
            shapes = [((layers,) if rule.per_layer else ()) + tuple(part.shape) for part in parts]
            bad = [f"{'/'.join(p)} from {group[0]}: file gives {shape}, config needs {tuple(expected[p].shape)}"
                   for p, shape in zip(rule.paths, shapes) if shape != tuple(expected[p].shape)]
            if bad:
                mismatched += bad
                buffers = None
                break
            if buffers is None:
                buffers = [_aligned_empty(shape, param_dtype) for shape in shapes]
            copies += [(buffer, i if rule.per_layer else ..., part, group[0]) for buffer, part in zip(buffers, parts)]
        if buffers is not None:
            loaded.update(zip(rule.paths, buffers))
    for alias, target in aliases.items():
        if alias in names:
            used.add(alias)
            if target in names and not np.array_equal(get(alias), get(target)):
                mismatched.append(f"{alias} should be tied to {target} but differs")
    unexpected = sorted(n for n in names - used if not n.endswith(IGNORABLE))
    not_covered = sorted("/".join(p) for p in expected if p not in loaded)
    if missing or unexpected or mismatched or not_float or not_covered:
        parts = []
        if missing:
            parts.append(f"missing tensors ({len(missing)}): {missing[:20]}")
        if unexpected:
            parts.append(f"unexpected tensors ({len(unexpected)}): {unexpected[:20]}")
        if mismatched:
            parts.append(f"mis-shaped tensors ({len(mismatched)}): {mismatched[:20]}")
        if not_float:
            parts.append(f"non-float tensors where float weights belong ({len(not_float)}): {not_float[:20]} "
                         "(quantized checkpoints are not supported)")
        if not_covered and not missing:
            parts.append(f"parameters with no source: {not_covered[:20]}")
        raise ValueError(f"{source}; nothing was loaded.\n  " + "\n  ".join(parts))

    def copy(task) -> str | None:
        """The one copy (and cast) per byte, then a finiteness check of what was written; numpy releases
        the GIL, so threads overlap. Returns the tensor's name when it holds NaN or Inf."""
        destination, index, source_view, name = task
        destination[index] = source_view
        return None if _finite(destination[index]) else name

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        non_finite = sorted({name for name in pool.map(copy, copies) if name is not None})
    if non_finite:
        warnings.warn(f"weights hold NaN or Inf values ({len(non_finite)} tensors): {non_finite[:20]}", stacklevel=3)
    flat = [(p, var.replace(_to_device(loaded[tuple(map(str, p))]))) for p, var in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _finite(array: np.ndarray) -> bool:
    """No NaN or Inf in ``array``: both propagate through min and max, two vectorised passes with no
    temporary array (float32, float16); other float types are checked through float32."""
    if array.size == 0:
        return True
    if array.dtype in (np.float32, np.float16, np.float64):
        return bool(np.isfinite(array.min()) and np.isfinite(array.max()))
    return bool(np.isfinite(array.astype(np.float32)).all())


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype, alignment: int = 64) -> np.ndarray:
    """An uninitialised host array whose data is 64-byte aligned, so XLA's CPU backend can adopt it."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _to_device(array: np.ndarray) -> jax.Array:
    """Hand an assembled host array to JAX: on CPU ``device_put`` adopts the aligned buffer without a copy.
    (DLPack adopted it too, but its deleter could run on an XLA thread while Python shut down, and about
    half the processes that freed a loaded model just before exiting aborted with std::terminate.)"""
    return jax.device_put(array)


def export_with_rules(model, rules: list[Rule]) -> dict[str, np.ndarray]:
    """Run ``rules`` backwards: the model's parameters as named numpy arrays (layers unstacked)."""
    cfg: ModelConfig = model.config
    flat = {tuple(map(str, p)): v for p, v in nnx.to_flat_state(nnx.state(model))}
    tensors: dict[str, np.ndarray] = {}
    for rule in rules:
        arrays = [np.asarray(jax.device_get(flat[p][...])) for p in rule.paths]
        if rule.per_layer:
            layer_ids = rule.layer_range(cfg)
            for index, i in enumerate(layer_ids):
                for name, t in zip(rule.names, rule.save([a[index] for a in arrays])):
                    tensors[name.format(i=i)] = np.ascontiguousarray(t)
        else:
            tensors.update((name, np.ascontiguousarray(t)) for name, t in zip(rule.names, rule.save(arrays)))
    return tensors
