"""Building blocks of the decoder: norm, rotary embedding, attention with packing masks, gated MLP.

Weights use Gemma's einsum layout, so sharding rules can name axes ("heads", "embed", "ffw"):
  q_einsum.w        [heads, embed, head_dim]
  kv_einsum.w       [2, kv_heads, embed, head_dim]     (k, v); [1, ...] (k only) where values are keys
  attn_vec_einsum.w [heads, head_dim, embed]
  gating_einsum.w   [2, ffw, embed]                    (gate, up)
  linear.w          [ffw, embed]                       (down)
Parameters are stored in `param_dtype` and cast to the compute `dtype` where they are used; norms,
softmax and rotary angles run in float32 whatever the compute dtype, as in transformers.

Attention is project (q, k, v) → attend → output. Generation reuses the pieces: `prefill` also
returns k/v (the KV cache), `decode` projects one token per row, writes its k/v into the cache and
attends over it with the einsum path's math.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax

from ..api.contract import ENV_JAX_ATTENTION
from .config import FULL, SLIDING, ModelConfig, RopeSpec
from .lora import LoRA

# Large negative instead of -inf, so a fully masked row could never turn into NaN.
_MASKED = -1e30


class Weight(nnx.Module):
    """One einsum weight; a module so that its path reads `q_einsum.w` like Gemma's checkpoints."""

    def __init__(self, shape: tuple[int, ...], *, rngs: nnx.Rngs, param_dtype: jnp.dtype, std: float) -> None:
        self.w = nnx.Param(jax.random.normal(rngs.params(), shape, param_dtype) * std)


class Buffer(nnx.Variable):
    """A stored, never-trained value (transformers' persistent buffers, e.g. Gemma 4's layer_scalar).

    Not an `nnx.Param`, so full fine-tuning leaves it alone as PyTorch does; the bridge loads and
    exports it like a weight.
    """


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
    """RMSNorm without a learned scale (Gemma 4's value norm), in float32 like transformers."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, *, eps: float, offset: float, param_dtype: jnp.dtype) -> None:
        # Gemma 3's zero-centred scale starts at 0 (identity); Llama's and Gemma 4's multiplier at 1.
        self.scale = nnx.Param(jnp.full((dim,), 1.0 - offset, param_dtype))
        self.eps = eps
        self.offset = offset

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * (self.offset + self.scale[...].astype(jnp.float32))).astype(x.dtype)


def inverse_frequencies(spec: RopeSpec, head_dim: int) -> np.ndarray:
    """Per-pair rotation speeds in float32, with linear or Llama 3 frequency scaling applied."""
    if spec.rope_type == "proportional":
        return _proportional(spec, head_dim)
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv = (1.0 / (np.float32(spec.theta) ** exponents)).astype(np.float32)
    if spec.rope_type == "linear":
        return (inv / np.float32(spec.factor)).astype(np.float32)
    if spec.rope_type == "llama3":
        return _llama3_scaling(inv, spec)
    return inv


def _proportional(spec: RopeSpec, head_dim: int) -> np.ndarray:
    """Gemma 4's partial rotation: the first `partial_rotary_factor` of the pairs rotate at the speeds
    a full head would give them (exponents over the whole head_dim); the other pairs get speed 0
    (cos 1, sin 0: passed through unrotated). transformers' `_compute_proportional_rope_parameters`.
    """
    rotated = int(spec.partial_rotary_factor * head_dim // 2)
    exponents = np.arange(0, 2 * rotated, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv = (1.0 / (np.float32(spec.theta) ** exponents)).astype(np.float32)
    inv = np.concatenate([inv, np.zeros(head_dim // 2 - rotated, np.float32)])
    return (inv / np.float32(spec.factor)).astype(np.float32)


def _llama3_scaling(inv: np.ndarray, spec: RopeSpec) -> np.ndarray:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    old = spec.original_max_positions
    low_wavelen = old / spec.low_freq_factor
    high_wavelen = old / spec.high_freq_factor
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / spec.factor, inv)
    smooth = (old / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor)
    smoothed = (1 - smooth) * scaled / spec.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate x [B, T, heads, head_dim] by positions [B, T]; halves layout (transformers' rotate_half)."""
    angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def attention_mask(segment_ids: jax.Array, sliding_window: int | None) -> jax.Array:
    """[B, 1, 1, T, T] boolean: the attention rule of workers.data (causal, same segment, window).

    Index-based like transformers: within a segment, index distance equals position distance.
    """
    t = segment_ids.shape[1]
    q_idx = jnp.arange(t)[:, None]
    k_idx = jnp.arange(t)[None, :]
    allowed = k_idx <= q_idx
    if sliding_window is not None:
        allowed &= k_idx > q_idx - sliding_window
    # Padding (segment 0) attends only padding: it sits at the end of a row, so no real token sees it.
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (allowed[None] & same)[:, None, None]


def causal_mask(t: int, sliding_window: int | None) -> jax.Array:
    """[1, 1, 1, T, T] boolean: causal (and windowed) attention for rows holding one sequence."""
    return attention_mask(jnp.ones((1, t), jnp.int32), sliding_window)


# ACCELBENCH_JAX_ATTENTION: "auto" (jax.nn.dot_product_attention: cuDNN's fused kernel on GPU for
# causal rows when it takes the shapes, XLA otherwise), "cudnn" (insist on it), "xla"
# (dot_product_attention's XLA path) or "einsum" (the plain path). jax's own default
# (implementation None) is XLA, never cuDNN (jax 0.10-0.11), hence the choice made here.
ATTENTION_IMPL = os.environ.get(ENV_JAX_ATTENTION, "auto")


def _implementation() -> str | None:
    return {"auto": None, "cudnn": "cudnn", "xla": "xla"}.get(ATTENTION_IMPL)


def _causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, scale: float, window: tuple[int, int] | None
) -> jax.Array:
    """Causal (and windowed) attention by flags; "auto" tries cuDNN on GPU and falls back to XLA.

    cuDNN refuses what it cannot run (float32, some head sizes) with an exception at trace time.
    """
    flags = {"scale": scale, "is_causal": True, "local_window_size": window}
    if ATTENTION_IMPL == "auto" and jax.default_backend() == "gpu":
        try:
            return jax.nn.dot_product_attention(q, k, v, implementation="cudnn", **flags)
        except (ValueError, NotImplementedError, RuntimeError, TypeError):
            pass
    return jax.nn.dot_product_attention(q, k, v, implementation=_implementation(), **flags)


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
    return x if cap is None else jnp.tanh(x / cap) * cap


class Attention(nnx.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        layer_type: str,
        *,
        rngs: nnx.Rngs,
        param_dtype: jnp.dtype,
        dtype: jnp.dtype,
    ) -> None:
        n, d = cfg.heads, cfg.hidden
        k, h = cfg.layer_kv_heads(layer_type), cfg.layer_head_dim(layer_type)
        std = d**-0.5
        # Values equal to keys (Gemma 4 global layers with attention_k_eq_v): no V weight at all.
        self.k_eq_v = cfg.shares_kv(layer_type)
        self.q_einsum = Weight((n, d, h), rngs=rngs, param_dtype=param_dtype, std=std)
        self.kv_einsum = Weight(
            (1 if self.k_eq_v else 2, k, d, h), rngs=rngs, param_dtype=param_dtype, std=std
        )
        self.attn_vec_einsum = Weight((n, h, d), rngs=rngs, param_dtype=param_dtype, std=(n * h) ** -0.5)
        norm = {"eps": cfg.norm_eps, "offset": cfg.norm_offset, "param_dtype": param_dtype}
        self.query_norm = RMSNorm(h, **norm) if cfg.is_gemma else None
        self.key_norm = RMSNorm(h, **norm) if cfg.is_gemma else None
        self.value_norm_eps = cfg.norm_eps if cfg.value_norm else None
        self.q_lora: LoRA | None = nnx.data(None)  # data: a LoRA may replace it
        self.k_lora: LoRA | None = nnx.data(None)  # data: a LoRA may replace it
        self.v_lora: LoRA | None = nnx.data(None)  # data: a LoRA may replace it
        self.o_lora: LoRA | None = nnx.data(None)  # data: a LoRA may replace it
        self.rope = cfg.rope[layer_type]  # a frozen dataclass: static, not a pytree leaf
        self.window = cfg.sliding_window if layer_type == SLIDING else None
        self.scale = cfg.attn_scale
        self.softcap = cfg.attn_softcap
        self.dtype = dtype

    def add_lora(
        self, targets: tuple[str, ...], rank: int, alpha: float, rngs: nnx.Rngs, dtype: jnp.dtype
    ) -> None:
        n, d, h = self.q_einsum.w.shape
        k = self.kv_einsum.w.shape[1]
        shapes = {"q_proj": ((d,), (n, h)), "k_proj": ((d,), (k, h)), "v_proj": ((d,), (k, h))}
        shapes["o_proj"] = ((n, h), (d,))
        if self.k_eq_v:
            del shapes["v_proj"]  # no v_proj module here for PEFT to adapt either
        for target in targets:
            if target in shapes:
                lora = LoRA(*shapes[target], rank=rank, alpha=alpha, rngs=rngs, param_dtype=dtype)
                setattr(self, f"{target[0]}_lora", lora)

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array | None) -> jax.Array:
        q, k, v = self.project(x, positions)
        return self.output(self._attend(q, k, v, mask))

    def prefill(
        self, x: jax.Array, positions: jax.Array, mask: jax.Array | None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """`__call__` that also returns k and v [B, T, kv_heads, H]: the KV cache of these tokens."""
        q, k, v = self.project(x, positions)
        return self.output(self._attend(q, k, v, mask)), k, v

    def project(self, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(q [B, T, heads, H], k, v [B, T, kv_heads, H]): projections, adapters, norms and rope.

        k and v are what the KV cache holds: the decode path (`decode`) projects one token with this
        same function and attends to them.
        """
        q = jnp.einsum("btd,ndh->btnh", x, self.q_einsum.w[...].astype(self.dtype))
        kv = self.kv_einsum.w[...].astype(self.dtype)
        k = _plus(jnp.einsum("btd,kdh->btkh", x, kv[0]), self.k_lora, x)
        # Shared k/v: the values are the keys' projection (k_proj's adapter included), before k's norm/rope.
        v = k if self.k_eq_v else _plus(jnp.einsum("btd,kdh->btkh", x, kv[1]), self.v_lora, x)
        q = _plus(q, self.q_lora, x)
        if self.query_norm is not None and self.key_norm is not None:
            q, k = self.query_norm(q), self.key_norm(k)
        if self.value_norm_eps is not None:
            v = rms_normalize(v, self.value_norm_eps)
        inv_freq = inverse_frequencies(self.rope, q.shape[-1])  # a trace-time constant
        q = apply_rope(q, positions, inv_freq)
        k = apply_rope(k, positions, inv_freq)
        return q, k, v

    def output(self, out: jax.Array) -> jax.Array:
        """The attention output [B, T, heads, H] projected back to [B, T, embed] (o_proj + adapter)."""
        y = jnp.einsum("btnh,nhd->btd", out, self.attn_vec_einsum.w[...].astype(self.dtype))
        return _plus(y, self.o_lora, out)

    def decode(
        self, x: jax.Array, positions: jax.Array, cache_k: jax.Array, cache_v: jax.Array, at: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One new token per row against the KV cache: (y [B, 1, embed], cache_k, cache_v).

        x [B, 1, embed] at positions [B, 1]; cache_k, cache_v [B, T, kv_heads, H]. The token's k/v are
        written at index `at` [B] of each row, then it attends to cache indices j <= at (and
        j > at - window on sliding layers): the einsum path of `_attend` for one query row.
        """
        q, k, v = self.project(x, positions)
        rows = jnp.arange(x.shape[0])
        cache_k = cache_k.at[rows, at].set(k[:, 0].astype(cache_k.dtype))
        cache_v = cache_v.at[rows, at].set(v[:, 0].astype(cache_v.dtype))
        index = jnp.arange(cache_k.shape[1])[None, :]
        allowed = index <= at[:, None]
        if self.window is not None:
            allowed &= index > at[:, None] - self.window
        # Grouped-query attention without repeating k/v: query head n = kv head n // groups.
        b, _, n, h = q.shape
        kv_heads = cache_k.shape[2]
        q = q.reshape(b, kv_heads, n // kv_heads, h)
        logits = jnp.einsum("bkgh,bskh->bkgs", q, cache_k).astype(jnp.float32) * self.scale
        logits = softcap(logits, self.softcap)
        logits = jnp.where(allowed[:, None, None, :], logits, _MASKED)
        probs = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
        out = jnp.einsum("bkgs,bskh->bkgh", probs, cache_v).reshape(b, 1, n, h)
        return self.output(out), cache_k, cache_v

    def _attend(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None) -> jax.Array:
        """Attention under the data.py rule; `mask` None means plain causal (one sequence per row).

        With mask None, jax.nn.dot_product_attention gets is_causal and the sliding window as
        flags, which cuDNN's fused kernel handles itself, skipping the blocks the mask would zero.
        An explicit [T, T] mask means a dense bias. Measured on an H200 (B 8, T 2048, 4 heads ×
        256, fwd+bwd, benchmarks/finetune/attn_probe.py): 1.84 ms with the mask (XLA), 0.85 ms
        causal and 0.56 ms with the 512 window as cuDNN flags.
        """
        if ATTENTION_IMPL != "einsum" and self.softcap is None:
            # Soft-capped logits (Gemma 2) have no fused kernel, so they keep the einsum path.
            if mask is None:
                window = None if self.window is None else (self.window - 1, 0)
                return _causal_attention(q, k, v, self.scale, window)
            # cuDNN with a dense mask measured slower than XLA (2.43 vs 1.84 ms): XLA it is.
            return jax.nn.dot_product_attention(
                q, k, v, mask=mask[:, 0], scale=self.scale, implementation=_implementation()
            )
        if mask is None:
            mask = causal_mask(q.shape[1], self.window)
        # Grouped-query attention without repeating k/v: query head n = kv head n // groups.
        b, t, n, h = q.shape
        groups = n // k.shape[2]
        q = q.reshape(b, t, k.shape[2], groups, h)
        logits = jnp.einsum("btkgh,bskh->bkgts", q, k).astype(jnp.float32) * self.scale
        logits = softcap(logits, self.softcap)
        logits = jnp.where(mask, logits, _MASKED)
        probs = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
        out = jnp.einsum("bkgts,bskh->btkgh", probs, v)
        return out.reshape(b, t, n, h)


def _plus(y: jax.Array, lora: LoRA | None, x: jax.Array) -> jax.Array:
    return y if lora is None else y + lora(x)


class MLP(nnx.Module):
    """Gated MLP: down(act(gate·x) * up·x); gelu-tanh for Gemma, SiLU (SwiGLU) for Llama."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, param_dtype: jnp.dtype, dtype: jnp.dtype) -> None:
        d, f = cfg.hidden, cfg.intermediate
        self.gating_einsum = Weight((2, f, d), rngs=rngs, param_dtype=param_dtype, std=d**-0.5)
        self.linear = Weight((f, d), rngs=rngs, param_dtype=param_dtype, std=f**-0.5)
        self.gate_lora: LoRA | None = nnx.data(None)  # data: a LoRA may replace it
        self.up_lora: LoRA | None = nnx.data(None)  # data: a LoRA may replace it
        self.down_lora: LoRA | None = nnx.data(None)  # data: a LoRA may replace it
        self.activation = cfg.activation
        self.dtype = dtype

    def add_lora(
        self, targets: tuple[str, ...], rank: int, alpha: float, rngs: nnx.Rngs, dtype: jnp.dtype
    ) -> None:
        f, d = self.linear.w.shape
        shapes = {"gate_proj": ((d,), (f,)), "up_proj": ((d,), (f,)), "down_proj": ((f,), (d,))}
        for target in targets:
            if target in shapes:
                lora = LoRA(*shapes[target], rank=rank, alpha=alpha, rngs=rngs, param_dtype=dtype)
                setattr(self, f"{target.removesuffix('_proj')}_lora", lora)

    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.gating_einsum.w[...].astype(self.dtype)
        gate = _plus(jnp.einsum("btd,fd->btf", x, w[0]), self.gate_lora, x)
        up = _plus(jnp.einsum("btd,fd->btf", x, w[1]), self.up_lora, x)
        act = jax.nn.gelu(gate, approximate=True) if self.activation == "gelu_tanh" else jax.nn.silu(gate)
        hidden = act * up
        y = jnp.einsum("btf,fd->btd", hidden, self.linear.w[...].astype(self.dtype))
        return _plus(y, self.down_lora, hidden)


class Block(nnx.Module):
    """Pre-norm residual block; Gemma adds post-norms on both branches (its "sandwich" norms), and
    Gemma 4 multiplies the block's output (residual included) by a stored per-layer scalar."""

    def __init__(
        self, cfg: ModelConfig, layer_type: str, *, rngs: nnx.Rngs, param_dtype: jnp.dtype, dtype: jnp.dtype
    ) -> None:
        norm = {"eps": cfg.norm_eps, "offset": cfg.norm_offset, "param_dtype": param_dtype}
        d = cfg.hidden
        self.pre_attention_norm = RMSNorm(d, **norm)
        self.attn = Attention(cfg, layer_type, rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.post_attention_norm = RMSNorm(d, **norm) if cfg.is_gemma else None
        self.pre_ffw_norm = RMSNorm(d, **norm)
        self.mlp = MLP(cfg, rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.post_ffw_norm = RMSNorm(d, **norm) if cfg.is_gemma else None
        self.layer_scalar = Buffer(jnp.ones((1,), param_dtype)) if cfg.layer_scalar else None
        self.is_global = layer_type == FULL

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array | None) -> jax.Array:
        return self._rest(x, self.attn(self.pre_attention_norm(x), positions, mask))

    def decode(
        self, x: jax.Array, positions: jax.Array, cache_k: jax.Array, cache_v: jax.Array, at: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """`__call__` for one token per row against the layer's KV cache (see Attention.decode)."""
        y, cache_k, cache_v = self.attn.decode(self.pre_attention_norm(x), positions, cache_k, cache_v, at)
        return self._rest(x, y), cache_k, cache_v

    def prefill(
        self, x: jax.Array, positions: jax.Array, mask: jax.Array | None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """`__call__` that also returns the layer's k and v [B, T, kv_heads, H] (a filled KV cache)."""
        y, k, v = self.attn.prefill(self.pre_attention_norm(x), positions, mask)
        return self._rest(x, y), k, v

    def _rest(self, x: jax.Array, y: jax.Array) -> jax.Array:
        """Everything after attention: post-attention norm, residual, MLP branch, layer scalar."""
        if self.post_attention_norm is not None:
            y = self.post_attention_norm(y)
        x = x + y
        y = self.mlp(self.pre_ffw_norm(x))
        if self.post_ffw_norm is not None:
            y = self.post_ffw_norm(y)
        if self.layer_scalar is not None:
            return (x + y) * self.layer_scalar[...].astype(x.dtype)
        return x + y
