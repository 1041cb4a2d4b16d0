"""Attention kernels for the Gemma-3-1B shape: explicit mask vs causal/window flags, cuDNN vs XLA.

    python3 benchmarks/finetune/attn_probe.py

One layer's attention, B 8 × T 2048, 4 query heads and 1 kv head of 256, bf16, forward+backward,
median of 20 calls. Also checks that the cuDNN causal+window result equals the masked XLA one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax.numpy as jnp

import jax

B, T, N, K, H = 8, 2048, 4, 1, 256


def mask_of(window: int | None) -> jax.Array:
    idx = jnp.arange(T)
    allowed = idx[None, :] <= idx[:, None]
    if window:
        allowed &= idx[None, :] > idx[:, None] - window
    return jnp.broadcast_to(allowed[None, None], (B, 1, T, T))


def bench(name: str, attend: Callable[..., jax.Array], q: jax.Array, k: jax.Array) -> None:
    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return attend(q, k, v).astype(jnp.float32).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    try:
        jax.block_until_ready(grad(q, k, k))
        tick = time.perf_counter()
        for _ in range(20):
            out = grad(q, k, k)
        jax.block_until_ready(out)
        print(f"{name:32s} fwd+bwd {(time.perf_counter() - tick) / 20 * 1e3:7.3f} ms")
    except Exception as exc:  # a kernel that does not apply: say so and go on
        print(f"{name:32s} FAILED {type(exc).__name__}: {str(exc)[:300]}")


def main() -> None:
    print("jax", jax.__version__, jax.devices())
    key = jax.random.PRNGKey(0)
    q = jax.random.normal(key, (B, T, N, H), jnp.bfloat16)
    k = jax.random.normal(key, (B, T, K, H), jnp.bfloat16)
    dpa = jax.nn.dot_product_attention
    for window in (None, 512):
        mask = mask_of(window)
        flags = None if window is None else (window - 1, 0)
        for impl in (None, "cudnn"):
            bench(
                f"mask w={window} {impl or 'auto'}",
                lambda q, k, v, m=mask, i=impl: dpa(q, k, v, mask=m, implementation=i),
                q,
                k,
            )
        for impl in ("cudnn", "xla", None):
            bench(
                f"causal w={window} {impl or 'auto'}",
                lambda q, k, v, f=flags, i=impl: dpa(
                    q, k, v, is_causal=True, local_window_size=f, implementation=i
                ),
                q,
                k,
            )
    masked = dpa(q, k, k, mask=mask_of(512), implementation="xla").astype(jnp.float32)
    flagged = dpa(q, k, k, is_causal=True, local_window_size=(511, 0), implementation="cudnn")
    print("max |difference|, window 512:", float(jnp.abs(masked - flagged.astype(jnp.float32)).max()))
    try:  # the model's own choice under ACCELBENCH_JAX_ATTENTION=auto (when run with operator/ on the path)
        from accelbench.jaxmodels.layers import _causal_attention

        hlo = jax.jit(lambda q, k: _causal_attention(q, k, k, 1.0, (511, 0))).lower(q, k).as_text()
        print("accelbench auto causal attention uses cuDNN:", "cudnn" in hlo.lower())
    except ImportError:
        pass


if __name__ == "__main__":
    main()
