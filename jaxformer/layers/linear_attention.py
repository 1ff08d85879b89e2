"""Linear attention by the gated delta rule (Gated DeltaNet, Yang, Kautz and Hatamizadeh 2024): the token mixer of
Qwen3-Next's and Qwen3.5's linear layers.

Each value head keeps a state matrix S [Dk, Dv]. A token decays it by exp(g), then writes its value where its key
points, correcting what S already holds there (the delta rule): S <- exp(g) S + beta k (v - (exp(g) S)^T k)^T,
and its query reads o = S^T q. Queries, keys and values first pass a short causal depthwise convolution.

One layer serves every mode. A full pass and a prefill run the chunked parallel form (``chunked_delta_rule``):
inside a chunk the updates are condensed into triangular solves and matmuls, and a scan carries S from chunk to
chunk. A cached decode step runs the recurrent form (``recurrent_delta_rule``), one token. What carries over
between calls is S and the convolution's last inputs, whatever the length (``cache.LinearState``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.model_config import ModelConfig
from jaxformer.layers.core import activate, dtype_of, normalize, param, split_key
from jaxformer.layers.weights import project, projection

Array = jax.Array


def _l2_normed(x: Array, eps: float = 1e-6) -> Array:
    """x / sqrt(sum(x^2) + eps) over the last axis (queries and keys, in float32)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def causal_convolution(x: Array, window: Array, kernel: Array, segments: Array | None = None
                       ) -> tuple[Array, Array]:
    """A causal depthwise convolution of x [B, T, C] over time, ``window`` [B, K - 1, C] holding the inputs
    before x (zeros at the start), ``kernel`` [K, C]; returns the output [B, T, C] and the next window (the
    last K - 1 inputs). ``segments`` [B, T]: documents packed into a row, where a token reads only its own
    document's inputs (as if each started the row)."""
    K, T = kernel.shape[0], x.shape[1]
    joined = jnp.concatenate([window.astype(x.dtype), x], axis=1)
    if segments is None:
        out = sum(joined[:, j:j + T] * kernel[j] for j in range(K))
    else:  # the input j - (K - 1) steps back counts only inside the token's own document
        ids = jnp.concatenate([jnp.full((segments.shape[0], K - 1), -1, segments.dtype), segments], axis=1)
        out = sum(joined[:, j:j + T] * kernel[j] * (ids[:, j:j + T] == segments)[..., None].astype(x.dtype)
                  for j in range(K))
    return out, joined[:, T:]


def recurrent_delta_rule(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> tuple[Array, Array]:
    """The delta rule token by token. q, k [B, T, H, Dk] (normed; q scaled), v [B, T, H, Dv], the log decay g
    and the write strength beta [B, T, H], state [B, H, Dk, Dv]; all float32. Returns o [B, T, H, Dv] and the
    state after the last token."""
    def step(s, token):
        q_t, k_t, v_t, g_t, beta_t = token
        s = s * jnp.exp(g_t)[..., None, None]
        delta = (v_t - jnp.einsum("bhkv,bhk->bhv", s, k_t)) * beta_t[..., None]
        s = s + k_t[..., :, None] * delta[..., None, :]
        return s, jnp.einsum("bhkv,bhk->bhv", s, q_t)

    time_major = lambda a: jnp.moveaxis(a, 1, 0)  # noqa: E731
    state, out = jax.lax.scan(step, state, tuple(map(time_major, (q, k, v, g, beta))))
    return jnp.moveaxis(out, 0, 1), state


def _unit_lower_inverse(strict: Array) -> Array:
    """(I + N)^-1 of a strictly lower-triangular N [.., C, C], which is nilpotent (N^C = 0): the sum of (-N)^k for
    k < C, as the product (I - N)(I + N^2)(I + N^4)... of log2(C) factors, all matmuls. (A triangular solve is
    what transformers calls; on XLA's CPU backend its gradient beside the grouped expert dispatch never returned,
    and accelerators run matmuls best.)"""
    eye = jnp.eye(strict.shape[-1], dtype=strict.dtype)
    power, inverse = -strict, eye - strict
    for _ in range(max(0, (strict.shape[-1] - 1).bit_length() - 1)):
        power = power @ power
        inverse = inverse @ (eye + power)
    return inverse


def chunked_delta_rule(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array, chunk: int,
                       segments: Array | None = None) -> tuple[Array, Array]:
    """The delta rule over chunks of ``chunk`` tokens (the same arguments and results as
    ``recurrent_delta_rule``). Inside a chunk, the token-by-token corrections are one unit lower-triangular
    system (I + strictly_lower(beta k k^T * decay)), whose inverse gives the corrected values and the decayed keys
    that read the state carried in; a scan over chunks then reads and updates the state with matmuls. The sequence is
    padded to whole chunks with tokens that change nothing (g = 0, beta = 0, k = 0).

    ``segments`` [B, T]: documents packed into a row, each starting from a zero state. Two tokens of a chunk
    interact only inside one document, a token reads the state carried into its chunk only if its document
    was already running before the chunk, and the state leaving a chunk keeps only its last document's part."""
    B, T, H, Dk = k.shape
    pad = -T % chunk
    if pad:
        padded = lambda a: jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))  # noqa: E731
        q, k, v, g, beta = map(padded, (q, k, v, g, beta))
        if segments is not None:  # the padding continues the last document (it changes nothing there)
            segments = jnp.pad(segments, [(0, 0), (0, pad)], mode="edge")
    n = (T + pad) // chunk
    # [B, H, n, C, ...]: heads first, then chunks, then the position inside one
    chunks = lambda a: jnp.moveaxis(a.reshape(B, n, chunk, H, *a.shape[3:]), 3, 1)  # noqa: E731
    q, k, v, g, beta = map(chunks, (q, k, v, g, beta))
    decay = jnp.cumsum(g, axis=-1)  # log of the decay from the chunk's start to each token
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    carried = last_document = None
    if segments is not None:
        ids = segments.reshape(B, 1, n, chunk)
        before = jnp.concatenate([ids[..., :1, :1], ids[..., :-1, -1:]], axis=2)  # the token before each chunk
        lower = lower & (ids[..., :, None] == ids[..., None, :])
        carried = (ids == before).astype(q.dtype)[..., None]  # [B, 1, n, C, 1]: reads the state carried in
        last_document = (ids == ids[..., -1:]).astype(q.dtype)[..., None]  # in the chunk's last document
    # exp(decay_i - decay_j) for j <= i: the decay between two tokens of a chunk (no exp of a positive number)
    between = jnp.exp(jnp.where(lower, decay[..., :, None] - decay[..., None, :], -jnp.inf))
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    system = jnp.einsum("...ik,...jk->...ij", k_beta, k) * between
    inverse = _unit_lower_inverse(jnp.where(jnp.tril(jnp.ones((chunk, chunk), bool), -1), system, 0.0))
    solve = lambda b: inverse @ b  # noqa: E731
    reading = k_beta * jnp.exp(decay)[..., None]
    q_decayed = q * jnp.exp(decay)[..., None]
    k_to_end = k * jnp.exp(decay[..., -1:] - decay)[..., None]
    chunk_decay = jnp.exp(decay[..., -1])[..., None, None]
    if segments is not None:
        reading, q_decayed, k_to_end = reading * carried, q_decayed * carried, k_to_end * last_document
        chunk_decay = chunk_decay * carried[..., -1:, :]
    values, keys_read = solve(v_beta), solve(reading)
    within = jnp.einsum("...ik,...jk->...ij", q, k) * between

    def one_chunk(s, c):
        values_c, keys_read_c, within_c, q_c, k_c, decay_c = c
        corrected = values_c - keys_read_c @ s
        out = q_c @ s + within_c @ corrected
        return s * decay_c + jnp.swapaxes(k_c, -1, -2) @ corrected, out

    chunk_major = lambda a: jnp.moveaxis(a, 2, 0)  # noqa: E731
    state, out = jax.lax.scan(one_chunk, state, tuple(map(chunk_major, (
        values, keys_read, within, q_decayed, k_to_end, chunk_decay))))
    out = jnp.moveaxis(out, 0, 2).reshape(B, H, n * chunk, -1)[:, :, :T]
    return jnp.moveaxis(out, 1, 2), state


class GatedDeltaNet(nnx.Module):
    """Qwen3-Next's linear layer: projections q, k [D, Hk, Dk], v and the output gate z [D, Hv, Dv], the write
    strength b and decay input a [D, Hv]; the convolution's kernel [K, C] over q, k and v side by side; each
    value head's decay rate (A = exp(A_log)) and its time-step bias; a gated RMSNorm of each head's output (its
    scale [Dv], times silu(z)); the output projection o [Hv, Dv, D]. Each key head serves Hv / Hk value heads.

    ``__call__(x, valid, cache, segments)`` returns (output, the state after this call {"conv", "state"} when
    ``cache`` is given, None); ``valid`` [B, T] zeroes the padded tokens' inputs, so they leave the state as it
    is; ``segments`` [B, T] (a full pass over packed documents) starts each document from a zero state."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        linear = cfg.linear_attention
        D, Hk, Hv = cfg.d_model, linear.key_heads, linear.value_heads
        Dk, Dv = linear.key_head_dim, linear.value_head_dim
        self.dtype, self.eps, self.chunk = dtype_of(cfg.dtype), cfg.norms.eps, linear.chunk
        self.kernel_width, self.activation = linear.conv_kernel, cfg.activation
        self.key_heads, self.value_heads, self.key_head_dim, self.value_head_dim = Hk, Hv, Dk, Dv
        projection(self, "q", cfg, rngs, (D, Hk, Dk), ("embed", "kv_heads", "head_dim"), role="attn")
        projection(self, "k", cfg, rngs, (D, Hk, Dk), ("embed", "kv_heads", "head_dim"), role="attn")
        projection(self, "v", cfg, rngs, (D, Hv, Dv), ("embed", "heads", "head_dim"), role="attn")
        projection(self, "z", cfg, rngs, (D, Hv, Dv), ("embed", "heads", "head_dim"), role="attn")
        projection(self, "b", cfg, rngs, (D, Hv), ("embed", "heads"), role="attn")
        projection(self, "a", cfg, rngs, (D, Hv), ("embed", "heads"), role="attn")
        projection(self, "o", cfg, rngs, (Hv, Dv, D), ("heads", "head_dim", "embed"), inputs=2, role="attn")
        self.conv = param(rngs, (linear.conv_kernel, linear.conv_width), ("conv_width", "conv_channels"), cfg)
        self.dt_bias = param(rngs, (Hv,), ("heads",), cfg, init="ones")
        # decay rates A in [1, 16), as transformers initialises them (a rate near 0 would never forget)
        rates = jax.random.uniform(rngs.params(), (Hv,), jnp.float32, 1.0, 16.0)
        self.A_log = nnx.Param(jnp.log(rates).astype(dtype_of(cfg.param_dtype)), axes=("heads",))
        self.norm_scale = param(rngs, (Dv,), ("head_dim",), cfg, init="ones")

    def empty_state(self, batch: int) -> dict[str, Array]:
        """What a layer's state starts as: a zero convolution window and a zero state matrix."""
        return {"conv": jnp.zeros((batch, self.kernel_width - 1, self.conv.shape[1]), self.dtype),
                "state": jnp.zeros((batch, self.value_heads, self.key_head_dim, self.value_head_dim), jnp.float32)}

    def __call__(self, x: Array, *, valid: Array | None = None, cache: dict | None = None,
                 segments: Array | None = None, key: Array | None = None) -> tuple[Array, dict | None, None]:
        B, T, _ = x.shape
        if valid is not None:  # a padded token's inputs are zero: it changes neither the state nor the window
            x = x * valid[..., None].astype(x.dtype)
        keys = dict(zip("qkvzbao", split_key(key, 7)))  # LoRA dropout on each adapter's input
        proj = lambda name, eq: project(self, name, x, eq, self.dtype, key=keys[name])  # noqa: E731
        q, k, v, z = (proj(name, "BTD,DNH->BTNH") for name in "qkvz")
        b, a = proj("b", "BTD,DN->BTN"), proj("a", "BTD,DN->BTN")
        state = self.empty_state(B) if cache is None else cache
        mixed = jnp.concatenate([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], axis=-1)
        mixed, window = causal_convolution(mixed, state["conv"], self.conv[...].astype(self.dtype), segments)
        mixed = activate(self.activation, mixed)
        q_width = q.shape[2] * q.shape[3]
        q, k = (mixed[..., i * q_width:(i + 1) * q_width].reshape(q.shape) for i in (0, 1))
        v = mixed[..., 2 * q_width:].reshape(v.shape)
        group = self.value_heads // self.key_heads  # each key head serves this many consecutive value heads
        q, k = (jnp.repeat(_l2_normed(t.astype(jnp.float32)), group, axis=2) for t in (q, k))
        q = q * q.shape[-1] ** -0.5
        beta = jax.nn.sigmoid(b.astype(jnp.float32))
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
            a.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32))
        v = v.astype(jnp.float32)
        if cache is not None and T == 1:  # a decode step: the recurrent form
            out, new_state = recurrent_delta_rule(q, k, v, g, beta, state["state"])
        else:
            out, new_state = chunked_delta_rule(q, k, v, g, beta, state["state"], self.chunk, segments)
        # each head's output RMS-normed (scaled in the compute dtype, as transformers does), gated by silu(z)
        normed = normalize(out, jnp.ones(out.shape[-1], jnp.float32), None, "rmsnorm", self.eps).astype(self.dtype)
        gated = (self.norm_scale[...].astype(self.dtype) * normed).astype(jnp.float32) * jax.nn.silu(
            z.astype(jnp.float32))
        y = project(self, "o", gated.astype(self.dtype), "BTNH,NHD->BTD", self.dtype, key=keys["o"])
        return y, None if cache is None else {"conv": window.astype(state["conv"].dtype), "state": new_state}, None
