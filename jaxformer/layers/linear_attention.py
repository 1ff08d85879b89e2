"""Linear attention by the gated delta rule (Gated DeltaNet, Yang, Kautz and Hatamizadeh 2024): the token mixer of
Qwen3-Next's and Qwen3.5's linear layers.

Each value head keeps a state matrix S [Dk, Dv]. A token decays it by exp(g), then writes its value where its key
points, correcting what S already holds there (the delta rule): S <- exp(g) S + beta k (v - (exp(g) S)^T k)^T,
and its query reads o = S^T q. Queries, keys and values first pass a short causal depthwise convolution.

One layer serves every mode. A full pass and a prefill run the chunked parallel form (``chunked_delta_rule``):
inside a chunk the updates are condensed into triangular solves and matmuls, and a scan carries S from chunk to
chunk. A cached decode step runs the recurrent form (``recurrent_delta_rule``), one token. What carries over
between calls is S and the convolution's last inputs, whatever the length (``cache.LinearState``).

Kimi Delta Attention (Kimi Linear's linear layers, ``linear_decay='channel'``) is the same rule with one decay
per key channel: S's rows decay each by their own exp(g_k), so g is [B, T, H, Dk] instead of [B, T, H].
"""

from __future__ import annotations

import math

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
    [B, T, H] (or per key channel [B, T, H, Dk]) and the write strength beta [B, T, H], state [B, H, Dk, Dv]; all
    float32. Returns o [B, T, H, Dv] and the state after the last token."""
    def step(s, token):
        q_t, k_t, v_t, g_t, beta_t = token
        s = s * jnp.exp(g_t)[..., None, None] if g_t.ndim == 2 else s * jnp.exp(g_t)[..., :, None]
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


def _blocked_unit_lower_inverse(strict: Array, block: int) -> Array:
    """(I + N)^-1 as the reference's kernels build it for Kimi Delta Attention: each diagonal block of ``block`` rows
    by ``_unit_lower_inverse`` (whose products of powers lose precision past a few dozen rows when keys are alike:
    ~1e-6 at 64 where this keeps ~1e-8), the blocks below by block forward substitution,
    X_ij = -X_ii sum_{j <= k < i} N_ik X_kj: all matmuls still."""
    n = strict.shape[-1] // block
    if n <= 1:
        return _unit_lower_inverse(strict)
    part = lambda i, j: strict[..., i * block:(i + 1) * block, j * block:(j + 1) * block]  # noqa: E731
    inverse = {(i, i): _unit_lower_inverse(part(i, i)) for i in range(n)}
    for i in range(n):
        for j in range(i - 1, -1, -1):
            inverse[i, j] = -inverse[i, i] @ sum(part(i, k) @ inverse[k, j] for k in range(j, i))
    zeros = jnp.zeros_like(inverse[0, 0])
    return jnp.concatenate([jnp.concatenate([inverse.get((i, j), zeros) for j in range(n)], axis=-1)
                            for i in range(n)], axis=-2)


def _channel_decayed_scores(x: Array, y: Array, decay: Array, sub: int) -> Array:
    """sum_k x_ik y_jk exp(decay_ik - decay_jk) for j <= i of one chunk (x, y, decay [.., C, K]; zero for j > i),
    never taking exp of a positive number, as the reference's kernels keep it bounded: across sub-chunks of
    ``sub`` tokens the decay goes through the one at the key's sub-chunk's last token r, exp(d_i - d_r) exp(d_r -
    d_j), both factors <= 1, so each is a matmul; inside a sub-chunk the pairs are taken one by one."""
    *lead, C, K = x.shape
    n = C // sub
    ref = decay[..., sub - 1::sub, :]  # [.., n, K]: the decay at each sub-chunk's last token
    past = jnp.arange(C)[None, :] > (jnp.arange(n) * sub + sub - 1)[:, None]  # [n, C]: query i lies past sub-chunk b
    x_ref = x[..., None, :, :] * jnp.exp(jnp.where(past[..., None], decay[..., None, :, :] - ref[..., :, None, :],
                                                   -jnp.inf))  # [.., n, C, K]
    by_sub = lambda a: a.reshape(*lead, n, sub, K)  # noqa: E731
    y_ref = by_sub(y) * jnp.exp(ref[..., :, None, :] - by_sub(decay))  # [.., n, sub, K]
    across = jnp.einsum("...bik,...bjk->...ibj", x_ref, y_ref).reshape(*lead, C, C)
    d = by_sub(decay)
    pairs = jnp.exp(jnp.where(jnp.tril(jnp.ones((sub, sub), bool))[..., None], d[..., :, None, :] - d[..., None, :, :],
                              -jnp.inf))  # [.., n, sub, sub, K]
    inside = jnp.einsum("...bik,...bjk,...bijk->...bij", by_sub(x), by_sub(y), pairs)
    return across + jnp.einsum("...bij,bc->...bicj", inside, jnp.eye(n, dtype=x.dtype)).reshape(*lead, C, C)


def chunked_delta_rule(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array, chunk: int,
                       segments: Array | None = None) -> tuple[Array, Array]:
    """The delta rule over chunks of ``chunk`` tokens (the same arguments and results as
    ``recurrent_delta_rule``; g per head or per key channel). Inside a chunk, the token-by-token corrections are
    one unit lower-triangular system (I + strictly_lower(beta k k^T * decay)), whose inverse gives the corrected
    values and the decayed keys that read the state carried in; a scan over chunks then reads and updates the state
    with matmuls. The sequence is padded to whole chunks with tokens that change nothing (g = 0, beta = 0, k = 0).

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
    channels = g.ndim == 5  # [B, H, n, C, Dk]: a decay per key channel (Kimi Delta Attention)
    decay = jnp.cumsum(g, axis=3)  # log of the decay from the chunk's start to each token
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    carried = last_document = None
    if segments is not None:
        ids = segments.reshape(B, 1, n, chunk)
        before = jnp.concatenate([ids[..., :1, :1], ids[..., :-1, -1:]], axis=2)  # the token before each chunk
        lower = lower & (ids[..., :, None] == ids[..., None, :])
        carried = (ids == before).astype(q.dtype)[..., None]  # [B, 1, n, C, 1]: reads the state carried in
        last_document = (ids == ids[..., -1:]).astype(q.dtype)[..., None]  # in the chunk's last document
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    sub = math.gcd(chunk, 16)
    if channels:  # the decay between two tokens differs by channel: it weighs each product of the scores
        system = _channel_decayed_scores(k_beta, k, decay, sub) * lower
        within = _channel_decayed_scores(q, k, decay, sub) * lower
        per_token = decay  # [.., C, Dk]
    else:
        # exp(decay_i - decay_j) for j <= i: the decay between two tokens of a chunk (no exp of a positive number)
        between = jnp.exp(jnp.where(lower, decay[..., :, None] - decay[..., None, :], -jnp.inf))
        system = jnp.einsum("...ik,...jk->...ij", k_beta, k) * between
        within = jnp.einsum("...ik,...jk->...ij", q, k) * between
        per_token = decay[..., None]  # [.., C, 1]
    strict = jnp.where(jnp.tril(jnp.ones((chunk, chunk), bool), -1), system, 0.0)
    inverse = _blocked_unit_lower_inverse(strict, sub) if channels else _unit_lower_inverse(strict)
    solve = lambda b: inverse @ b  # noqa: E731
    reading = k_beta * jnp.exp(per_token)
    q_decayed = q * jnp.exp(per_token)
    k_to_end = k * jnp.exp(per_token[..., -1:, :] - per_token)
    chunk_decay = jnp.exp(per_token[..., -1, :])[..., :, None]  # [.., 1 or Dk, 1]: the rows of the state
    if segments is not None:
        reading, q_decayed, k_to_end = reading * carried, q_decayed * carried, k_to_end * last_document
        chunk_decay = chunk_decay * carried[..., -1:, :]
    values, keys_read = solve(v_beta), solve(reading)

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
    is; ``segments`` [B, T] (a full pass over packed documents) starts each document from a zero state.

    Kimi Delta Attention (``decay='channel'``) decays each key channel by its own rate: its decay input comes through
    f_down [D, Dk] and f_up [Dk, Hv, Dk] (each value head's time-step bias [Hv, Dk] per channel), and its output
    gate through gate_down [D, Dv] and gate_up [Dv, Hv, Dv], applied as sigmoid, not silu (no z, no a)."""

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
        self.channels = linear.decay == "channel"
        if self.channels:  # the decay input and the output gate each through a head-wide bottleneck
            projection(self, "f_down", cfg, rngs, (D, Dk), ("embed", "latent"), role="attn")
            projection(self, "f_up", cfg, rngs, (Dk, Hv, Dk), ("latent", "heads", "head_dim"), role="attn")
            projection(self, "gate_down", cfg, rngs, (D, Dv), ("embed", "latent"), role="attn")
            projection(self, "gate_up", cfg, rngs, (Dv, Hv, Dv), ("latent", "heads", "head_dim"), role="attn")
        else:
            projection(self, "z", cfg, rngs, (D, Hv, Dv), ("embed", "heads", "head_dim"), role="attn")
            projection(self, "a", cfg, rngs, (D, Hv), ("embed", "heads"), role="attn")
        projection(self, "b", cfg, rngs, (D, Hv), ("embed", "heads"), role="attn")
        projection(self, "o", cfg, rngs, (Hv, Dv, D), ("heads", "head_dim", "embed"), inputs=2, role="attn")
        self.conv = param(rngs, (linear.conv_kernel, linear.conv_width), ("conv_width", "conv_channels"), cfg)
        self.dt_bias = (param(rngs, (Hv, Dk), ("heads", "head_dim"), cfg, init="ones") if self.channels else
                        param(rngs, (Hv,), ("heads",), cfg, init="ones"))
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
        names = (("q", "k", "v", "b", "o", "f_down", "f_up", "gate_down", "gate_up") if self.channels else
                 tuple("qkvzbao"))
        keys = dict(zip(names, split_key(key, len(names))))  # LoRA dropout on each adapter's input
        proj = lambda name, eq, h=x: project(self, name, h, eq, self.dtype, key=keys[name])  # noqa: E731
        q, k, v = (proj(name, "BTD,DNH->BTNH") for name in "qkv")
        b = proj("b", "BTD,DN->BTN")
        if self.channels:
            a = proj("f_up", "BTC,CNH->BTNH", proj("f_down", "BTD,DC->BTC"))  # [B, T, Hv, Dk]: one per key channel
            z = proj("gate_up", "BTC,CNH->BTNH", proj("gate_down", "BTD,DC->BTC"))
        else:
            z, a = proj("z", "BTD,DNH->BTNH"), proj("a", "BTD,DN->BTN")
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
        rate = jnp.exp(self.A_log[...].astype(jnp.float32))  # each value head's, over its channels' decays too
        g = -(rate[:, None] if self.channels else rate) * jax.nn.softplus(
            a.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32))
        v = v.astype(jnp.float32)
        if cache is not None and T == 1:  # a decode step: the recurrent form
            out, new_state = recurrent_delta_rule(q, k, v, g, beta, state["state"])
        else:
            out, new_state = chunked_delta_rule(q, k, v, g, beta, state["state"], self.chunk, segments)
        normed = normalize(out, jnp.ones(out.shape[-1], jnp.float32), None, "rmsnorm", self.eps)
        if self.channels:  # Kimi: the norm scaled and gated by sigmoid(z) in float32
            gated = self.norm_scale[...].astype(jnp.float32) * normed * jax.nn.sigmoid(z.astype(jnp.float32))
        else:  # each head's output RMS-normed (scaled in the compute dtype, as transformers does), gated by silu(z)
            gated = (self.norm_scale[...].astype(self.dtype) * normed.astype(self.dtype)).astype(jnp.float32) * \
                jax.nn.silu(z.astype(jnp.float32))
        y = project(self, "o", gated.astype(self.dtype), "BTNH,NHD->BTD", self.dtype, key=keys["o"])
        return y, None if cache is None else {"conv": window.astype(state["conv"].dtype), "state": new_state}, None
