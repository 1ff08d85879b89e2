"""How a projection holds and applies its weight: a float kernel, or an int8 kernel with per-output-channel
scales (``quantize``), and in either case an optional LoRA adapter beside it (``lora_rank``).

A module creates each projection with ``projection(self, "q", ...)``, which sets ``self.q`` and, where the
config asks, ``self.q_scale`` (int8) and ``self.q_lora`` (the adapter), and applies it with
``project(self, "q", x, "BTD,DNH->BTNH")``. The kernel keeps its name, shape and logical axes whatever its
form, so the Hugging Face tensor rules, sharding and checkpoints see the same parameter tree. The one exception
is a decoding copy (``output_major``): its float kernels are stored outputs first for CPU decoding, and it is
never saved, exported or rebuilt (``refuse_decoding_copy``).

LoRA (Hu et al. 2021) adds scale * (dropout(x) A) B to the projection's output: A [in.., R] and
B [R, out..] (R the rank) carry the kernel's own input and output axes, so they shard with it, and are
stacked along ``layers`` like every block parameter. The update is applied factored, never merged into the
kernel, so backpropagation computes gradients for A and B only (R x (in + out) per kernel) and the frozen
kernel needs none. Initialisation is PEFT's: A Kaiming-uniform (bound 1/sqrt(fan_in)), B zeros.

int8 kernels are symmetric per output channel: w = q * scale, q in [-127, 127], one scale per output unit
(every index of the kernel's non-input axes). ``quantize='int8'`` multiplies in the compute dtype with the
kernel converted there (weight-only; on GPU and TPU XLA fuses the conversion into the matmul).
``'int8_dynamic'`` also rounds each row of activations to int8 with its own scale and multiplies int8 by
int8 into int32, as PyTorch's dynamic quantization does on CPU: XLA's CPU backend does not fuse the
conversion, so the weight-only form there reads the kernel as float anyway and runs slower than float32
(benchmarks/generate.py measures both).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.model_config import ModelConfig
from jaxformer.layers.core import dropout, dtype_of, param

Array = jax.Array


class LoraParam(nnx.Param):
    """A LoRA factor (A or B): the only parameters a LoRA fine-tune trains (with any the config lists in
    ``lora_trainable``); the base kernels stay frozen."""


class OutputMajor(nnx.Param):
    """A float projection kernel stored outputs first, [outputs.., inputs..] (its ``inputs`` metadata says
    how many trailing axes are contracted), in a decoding copy (``output_major``): each output is one
    contiguous dot product, which XLA's CPU matrix-vector product streams faster (26.5 against 19.3 GB/s for
    a loop of gpt2's MLP kernels at batch 1)."""


class Quantized(nnx.Variable):
    """An int8 kernel or its float scales: stored, sharded (by its ``axes``) and checkpointed like a
    parameter, never trained."""


def lora_scaling(cfg: ModelConfig) -> float:
    """alpha / rank, or alpha / sqrt(rank) with rsLoRA (Kalajdzievski 2023), as PEFT scales."""
    return cfg.lora.alpha / (math.sqrt(cfg.lora.rank) if cfg.lora.rslora else cfg.lora.rank)


def targeted(cfg: ModelConfig, role: str, name: str) -> bool:
    """Does ``lora_targets`` name this projection: by its name alone ('q') or with its sublayer ('attn.q')?"""
    return cfg.lora is not None and (name in cfg.lora.targets or f"{role}.{name}" in cfg.lora.targets)


class LoRA(nnx.Module):
    """The low-rank update of one kernel of shape batch + inputs + outputs (batch: the experts axis of an
    expert kernel, each expert its own adapter): A [batch.., in.., R], B [batch.., R, out..]."""

    def __init__(self, cfg: ModelConfig, shape: tuple[int, ...], axes: tuple[str, ...], batch: int, inputs: int,
                 *, rngs: nnx.Rngs):
        R, dtype = cfg.lora.rank, dtype_of(cfg.param_dtype)
        lead, ins, outs = shape[:batch], shape[batch:batch + inputs], shape[batch + inputs:]
        lead_axes, in_axes, out_axes = axes[:batch], axes[batch:batch + inputs], axes[batch + inputs:]
        bound = 1.0 / math.sqrt(math.prod(ins))  # kaiming_uniform_(a=sqrt(5)) over fan_in, as PEFT
        a = jax.random.uniform(rngs.params(), (*lead, *ins, R), jnp.float32, -bound, bound)
        self.a = LoraParam(a.astype(dtype), axes=(*lead_axes, *in_axes, "lora_rank"))
        self.b = LoraParam(jnp.zeros((*lead, R, *outs), dtype), axes=(*lead_axes, "lora_rank", *out_axes))
        self.scaling, self.dropout_rate = lora_scaling(cfg), cfg.lora.dropout

    def __call__(self, x: Array, equation: str, dtype, key: Array | None) -> Array:
        """scaling * (dropout(x) A) B for a projection written as ``equation`` ('BTD,DNH->BTNH')."""
        x_spec, w_spec, y_spec = _parse(equation)
        r = next(c for c in "RZYXW" if c not in equation)
        ins = "".join(c for c in w_spec if c in x_spec)
        outs = w_spec[len(ins):] if w_spec.startswith(ins) else None
        if outs is None:
            raise ValueError(f"LoRA needs the kernel's input axes first in {equation!r}")
        rows = "".join(c for c in x_spec if c not in ins)
        h = jnp.einsum(f"{x_spec},{ins}{r}->{rows}{r}", dropout(x, self.dropout_rate, key), self.a[...].astype(dtype))
        y = jnp.einsum(f"{rows}{r},{r}{outs}->{y_spec}", h, self.b[...].astype(dtype))
        return y * jnp.asarray(self.scaling, dtype)

    def delta(self, batch: int) -> Array:
        """The dense update scaling * A B in float32 and the kernel's shape (merging, expert kernels); the
        first ``batch`` axes (experts; also layers, for a stacked adapter) pair A with B one to one."""
        a, b = self.a[...].astype(jnp.float32), self.b[...].astype(jnp.float32)
        product = jnp.matmul(a.reshape(*a.shape[:batch], -1, a.shape[-1]), b.reshape(*b.shape[:batch + 1], -1))
        return (product * self.scaling).reshape(*a.shape[:-1], *b.shape[batch + 1:])


def _parse(equation: str) -> tuple[str, str, str]:
    operands, y_spec = equation.split("->")
    x_spec, w_spec = operands.split(",")
    return x_spec, w_spec, y_spec


def projection(module: nnx.Module, name: str, cfg: ModelConfig, rngs: nnx.Rngs, shape: tuple[int, ...],
               axes: tuple[str, ...], *, inputs: int = 1, batch: int = 0, role: str = "",
               read_whole: bool = False) -> None:
    """Create ``module.<name>``: a kernel of ``shape`` = batch + inputs + outputs dims (float, or int8 with
    ``<name>_scale`` over batch + outputs) and, when ``lora_targets`` names it, ``<name>_lora``. A kernel
    some step reads whole (``kernel``: ``read_whole``, or an experts axis) is never turned by ``output_major``,
    which would make that step turn it back every time."""
    kernel = param(rngs, shape, axes, cfg)
    if cfg.quantization is None:
        if batch == 0 and not read_whole:  # how ``output_major`` can turn it
            kernel.set_metadata(inputs=inputs)
        setattr(module, name, kernel)
    else:
        q, scale = quantize_kernel(kernel[...], batch, inputs)
        setattr(module, name, Quantized(q, axes=axes, dynamic=cfg.quantization.kind == "int8_dynamic"))
        setattr(module, f"{name}_scale", Quantized(scale.astype(dtype_of(cfg.param_dtype)),
                                                   axes=axes[:batch] + axes[batch + inputs:]))
    setattr(module, f"{name}_lora", LoRA(cfg, shape, axes, batch, inputs, rngs=rngs)
            if targeted(cfg, role, name) else None)


def quantize_kernel(w: Array, batch: int, inputs: int) -> tuple[Array, Array]:
    """Symmetric per-output-channel int8: (q int8 of w's shape, scale of w's batch + output dims)."""
    w = w.astype(jnp.float32)
    reduce = tuple(range(batch, batch + inputs))
    scale = jnp.max(jnp.abs(w), axis=reduce, keepdims=True) / 127.0
    scale = jnp.where(scale == 0, 1.0, scale)
    q = jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8)
    return q, jnp.squeeze(scale, axis=reduce)


def kernel(module: nnx.Module, name: str, dtype, inputs: int = 1, batch: int = 0) -> Array:
    """``module.<name>`` as a dense array in ``dtype``: dequantized if int8, with its LoRA update merged. For
    the uses that need the whole kernel (expert dispatch, latent attention's absorbed form, merging)."""
    w = getattr(module, name)
    if isinstance(w, OutputMajor):  # layers never read one whole (``read_whole``); other readers get it back
        inputs = w.get_metadata()["inputs"]
        w = jnp.moveaxis(w[...], tuple(range(w.ndim - inputs, w.ndim)), tuple(range(inputs)))
    elif isinstance(w, Quantized):
        scale = getattr(module, f"{name}_scale")[...].astype(jnp.float32)
        w = w[...].astype(jnp.float32) * jnp.expand_dims(scale, tuple(range(batch, batch + inputs)))
    else:
        w = w[...]
    lora = getattr(module, f"{name}_lora", None)
    if lora is not None:
        w = w.astype(jnp.float32) + lora.delta(batch)
    return w.astype(dtype)


def layout(module: nnx.Module, name: str) -> tuple[int, int] | None:
    """(input axes, leading batch axes) of the kernel ``module.<name>`` as stored (outside a scan: stacked
    layers count as batch), read from its scale or adapter; None for a plain float kernel."""
    w = getattr(module, name)
    lora = getattr(module, f"{name}_lora", None)
    if lora is not None:
        axes_a, axes_b = lora.a.get_metadata()["axes"], lora.b.get_metadata()["axes"]
        batch = axes_b.index("lora_rank")
        return len(axes_a) - 1 - batch, batch
    if isinstance(w, Quantized):
        axes, scale_axes = w.get_metadata()["axes"], getattr(module, f"{name}_scale").get_metadata()["axes"]
        batch = next(i for i, a in enumerate(axes) if i >= len(scale_axes) or a != scale_axes[i])
        return len(axes) - len(scale_axes), batch
    return None


def project(module: nnx.Module, name: str, x: Array, equation: str, dtype, *, key: Array | None = None,
            dense=None) -> Array:
    """x through the kernel ``module.<name>`` as ``equation`` (its operands: x, then the kernel, inputs
    first), in ``dtype``, plus its LoRA update. ``dense(x, w)`` replaces the einsum for a float kernel
    (the MLP's ``linear``, whose weight gradient is faster on CPU)."""
    w = getattr(module, name)
    if isinstance(w, Quantized):
        flat_x, flat_q, flat_equation = _merged_contraction(x, w[...], equation)
        y = _int8_matmul(flat_x, flat_q, getattr(module, f"{name}_scale")[...], flat_equation, dtype,
                         w.get_metadata().get("dynamic", False))
    elif isinstance(w, OutputMajor):  # a decode loop's copy: the same product over the turned kernel
        y = _output_major_product(x, w, equation, dtype)
    elif dense is not None:
        y = dense(x, w[...].astype(dtype))
    else:
        flat_x, flat_w, flat_equation = _merged_contraction(x, w[...], equation)
        y = jnp.einsum(flat_equation, flat_x, flat_w.astype(dtype))
    lora = getattr(module, f"{name}_lora", None)
    return y if lora is None else y + lora(x, equation, dtype, key)


def _merged_contraction(x: Array, w: Array, equation: str) -> tuple[Array, Array, str]:
    """x, the kernel w and the equation with the contracted axes merged into one where they are x's trailing
    axes and w's leading ones in the same order ("BTNH,NHD->BTD" as "BTC,CD->BTD", both reshapes free): one
    plain GEMM. Given the head axes apart, XLA CPU transposed the [N, H, D] output kernel into a new array at
    every decode step instead of the [1, N*H] activation (gpt2's batch-1 step timed alone: 36 ms with the
    copies, 26 ms without)."""
    x_spec, w_spec, y_spec = _parse(equation)
    contracted = "".join(c for c in x_spec if c in w_spec and c not in y_spec)
    if len(contracted) < 2 or not x_spec.endswith(contracted) or not w_spec.startswith(contracted):
        return x, w, equation
    merged = min(set("ABCDEFGHIJKLMNOPQRSTUVWXYZ") - set(equation))
    kept, inputs = len(x_spec) - len(contracted), len(contracted)
    return (x.reshape(*x.shape[:kept], -1), w.reshape(-1, *w.shape[inputs:]),
            f"{x_spec[:kept]}{merged},{merged}{w_spec[inputs:]}->{y_spec}")


def _output_major_product(x: Array, w: OutputMajor, equation: str, dtype) -> Array:
    """x through an ``OutputMajor`` kernel as ``equation`` (written for the kernel inputs first): as one
    matrix product [rows, inputs] x [outputs, inputs]^T where x's trailing axes are the inputs and y is x's
    other axes then the outputs (every projection's form), the two reshapes free. Left with several output
    axes ([N, H, D]), XLA's CPU dot lowering copied the kernel back inputs first at every step."""
    x_spec, w_spec, y_spec = _parse(equation)
    inputs = w.get_metadata()["inputs"]
    ins, outs = w_spec[:inputs], w_spec[inputs:]
    kept = x_spec[:len(x_spec) - inputs]
    value = w[...].astype(dtype)
    if not x_spec.endswith(ins) or y_spec != kept + outs:
        return jnp.einsum(f"{x_spec},{outs}{ins}->{y_spec}", x, value)
    out_shape = value.shape[:len(outs)]
    flat = value.reshape(math.prod(out_shape), -1)
    y = jnp.einsum("...K,NK->...N", x.reshape(*x.shape[:len(kept)], -1), flat)
    return y.reshape(*y.shape[:-1], *out_shape)


def output_major(model: nnx.Module) -> None:
    """Every float projection kernel of ``model``'s separate layers and heads (made by ``projection``; no
    experts axis; a stack's stacked kernels are left as they are) replaced in place by its ``OutputMajor``
    copy. Run it eagerly (``decoder.decoding_copy``): traced, XLA made each transpose a relabelling and
    copied the kernel back at every step of the loop that read it."""
    for _, module in list(nnx.iter_modules(model)):
        for name, w in list(vars(module).items()):
            metadata = w.get_metadata() if type(w) is nnx.Param else {}
            if "inputs" not in metadata or (len(metadata["axes"]) == w.ndim and metadata["axes"][0] == "layers"):
                continue
            axes = metadata["axes"][-w.ndim:]  # a layer sliced out of a stack keeps the stack's names
            order = (*range(metadata["inputs"], w.ndim), *range(metadata["inputs"]))
            setattr(module, name, OutputMajor(jnp.transpose(w[...], order),
                                              **dict(metadata, axes=tuple(axes[i] for i in order))))


def refuse_decoding_copy(model: nnx.Module, action: str) -> None:
    """A ``ValueError`` for writing out or rebuilding a decoding copy (its kernels are turned and its layers
    separate): ``action`` is what was asked, said of the model ('export or save', 'quantize')."""
    if nnx.state(model, OutputMajor):
        raise ValueError(f"this model is a decoding copy (model.decoding_copy()), laid out for generation only: "
                         f"{action} the model it was made from instead")


def _aligned(a: Array, a_spec: str, y_spec: str) -> Array:
    """``a`` with axes ``a_spec`` (a subset of ``y_spec``'s) transposed and reshaped to broadcast against y."""
    order = [c for c in y_spec if c in a_spec]
    a = jnp.transpose(a, [a_spec.index(c) for c in order])
    return a.reshape([a.shape[order.index(c)] if c in a_spec else 1 for c in y_spec])


LIMB_ROWS = 64  # weight-only int8 with at most this many rows of x multiplies in int8 (``_int8_matmul``)


def _int8_matmul(x: Array, q: Array, scale: Array, equation: str, dtype, dynamic: bool) -> Array:
    """x times the int8 kernel q (its per-output-channel ``scale``) as ``equation``.

    Dynamic: each row of x (every index of its non-contracted axes) rounded to int8 with its own scale, one
    int8 GEMM. Weight-only, few rows (a decode step): XLA CPU would convert the whole kernel to float before
    the matmul (inside generate's loop, once, keeping a float copy alive and reading it: float32's speed), so
    x goes through the int8 GEMM in two limbs (``_limb_product``). Weight-only, many rows (a prefill,
    training): the kernel converted, one float GEMM."""
    x_spec, w_spec, y_spec = _parse(equation)
    scale = _aligned(scale.astype(jnp.float32), "".join(c for c in w_spec if c in y_spec), y_spec)
    row_spec = "".join(c for c in x_spec if c not in w_spec)
    rows = math.prod(x.shape[i] for i, c in enumerate(x_spec) if c in row_spec)
    if not dynamic:
        y = (_limb_product(x, q, equation) if rows <= LIMB_ROWS
             else jnp.einsum(equation, x, q.astype(dtype)).astype(jnp.float32))
        return (y * scale).astype(dtype)
    x32 = x.astype(jnp.float32)
    row_scale = _row_scale(x32, x_spec, w_spec)
    xq = jnp.round(x32 / _aligned(row_scale, row_spec, x_spec))
    # XLA CPU multiplies an int8 matrix by a single int8 row with a slow generic loop; two rows take its int8
    # GEMM (measured 3-6x faster), so a lone row (one decode step at batch 1) is padded to two.
    limbs = [xq] if rows > 1 else [xq, jnp.zeros_like(xq)]
    y = _stacked_int8_product(limbs, q, equation)[0]
    return (y * _aligned(row_scale, row_spec, y_spec) * scale).astype(dtype)


def _row_scale(x32: Array, x_spec: str, w_spec: str) -> Array:
    """Each row's max |x| / 127 (1 for an all-zero row): the scale that maps the row into int8."""
    row_scale = jnp.max(jnp.abs(x32), axis=tuple(i for i, c in enumerate(x_spec) if c in w_spec)) / 127.0
    return jnp.where(row_scale == 0, 1.0, row_scale)


def _stacked_int8_product(limbs: list[Array], q: Array, equation: str) -> list[Array]:
    """Each of ``limbs`` (whole numbers within int8, x's shape) times q, as float32: stacked along x's first
    axis (a row axis, as y's), one int8 x int8 -> int32 GEMM for all of them."""
    y = jnp.einsum(equation, jnp.concatenate(limbs, axis=0).astype(jnp.int8), q, preferred_element_type=jnp.int32)
    return jnp.split(y.astype(jnp.float32), len(limbs), axis=0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _limb_product(x: Array, q: Array, equation: str) -> Array:
    """x times the int8 matrix q, as float32, through the int8 GEMM: each row of x split into two int8 limbs,
    x = s * (high + low / 127) with s = max|x| / 127, so one GEMM reads each weight byte once and x keeps 15
    bits a row, far finer than the int8 weights' own rounding. Differentiated as the float product it stands
    for (rounding has no useful derivative: a QLoRA adapter below it still gets its gradient)."""
    x_spec, w_spec, y_spec = _parse(equation)
    row_spec = "".join(c for c in x_spec if c not in w_spec)
    x32 = x.astype(jnp.float32)
    row_scale = _row_scale(x32, x_spec, w_spec)
    units = x32 / _aligned(row_scale, row_spec, x_spec)
    high = jnp.round(units)
    y_high, y_low = _stacked_int8_product([high, jnp.round((units - high) * 127.0)], q, equation)
    return (y_high + y_low / 127.0) * _aligned(row_scale, row_spec, y_spec)


@_limb_product.defjvp
def _limb_product_jvp(equation: str, primals, tangents):
    x, q = primals
    return _limb_product(x, q, equation), jnp.einsum(equation, tangents[0].astype(jnp.float32),
                                                     q.astype(jnp.float32))
