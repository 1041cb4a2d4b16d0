"""LoRA adapters for the NNX decoder: one adapter per Hugging Face projection, like PEFT.

Choice (evaluated 2026-12): google `qwix` 0.1.8 installs here (it needs only jax, flax, numpy,
opt_einsum, absl) and its `LoraProvider` adds adapters by intercepting `jnp.einsum` calls inside
matching modules. We do not use it because an intercepted einsum gets one A/B pair per *weight*: our
fused `kv_einsum` [2, K, D, H] and `gating_einsum` [2, F, D] would give k/v and gate/up one shared
A matrix, so the adapter would not be the one PEFT trains on the PyTorch side (different trainable
parameter count and update rule) and `targetModules: [q_proj, v_proj]` could not be expressed. The
whole point of accelbench is that both frameworks train the same thing. `google-tunix` 0.1.7 is a
full trainer (it pulls tensorflow_datasets, grain, kagglehub, datasets ...) that would replace the
shared numpy data path rather than plug into it, and uses qwix for LoRA with the same limitation.

So this module is a small LoRA of our own with PEFT's exact semantics:
  y = W·x + (alpha / r) · B·(A·x),  A [in..., r] ~ U(±1/sqrt(fan_in)) (PEFT's kaiming-uniform, a=√5),
  B [r, out...] = 0, so training starts from the base model's function.
Adapters are `nnx.LoRAParam` variables; the base weights are `nnx.Param`. Filtering on the
variable type (`nnx.LoRAParam`) gives gradients and optimizer state for the adapters only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
from flax import nnx

import jax

from ..api.finetune import LORA_PROJECTIONS, LoraTarget, expand_lora_targets

# Hugging Face projection names: FinetuneJob.spec.method.targetModules' vocabulary (api.LoraTarget).
ALL_TARGETS = LORA_PROJECTIONS
MLP_TARGETS = tuple(t.value for t in (LoraTarget.GATE_PROJ, LoraTarget.UP_PROJ, LoraTarget.DOWN_PROJ))
ATTENTION_TARGETS = tuple(t for t in ALL_TARGETS if t not in MLP_TARGETS)


class LoRA(nnx.Module):
    """A low-rank update for a projection from `in_shape` to `out_shape` (both excluding batch)."""

    def __init__(
        self,
        in_shape: Sequence[int],
        out_shape: Sequence[int],
        *,
        rank: int,
        alpha: float,
        rngs: nnx.Rngs,
        param_dtype: jnp.dtype = jnp.float32,
    ) -> None:
        bound = 1.0 / math.sqrt(math.prod(in_shape))
        a = jax.random.uniform(rngs.params(), (*in_shape, rank), param_dtype, -bound, bound)
        self.a = nnx.LoRAParam(a)
        self.b = nnx.LoRAParam(jnp.zeros((rank, *out_shape), param_dtype))
        self.in_ndim = len(in_shape)
        self.scale = alpha / rank

    def __call__(self, x: jax.Array) -> jax.Array:
        """The update for input x [..., *in]; add it to the base projection's output."""
        a = self.a[...].astype(x.dtype)
        b = self.b[...].astype(x.dtype)
        low = jnp.tensordot(x, a, axes=self.in_ndim)
        return jnp.tensordot(low, b, axes=1) * jnp.asarray(self.scale, x.dtype)

    def delta(self) -> jax.Array:
        """scale·A·B as a dense [*in, *out] float32 matrix (for merging into the base weight)."""
        a = self.a[...].astype(jnp.float32)
        b = self.b[...].astype(jnp.float32)
        return jnp.tensordot(a, b, axes=1) * self.scale


def validate_targets(targets: Sequence[str]) -> tuple[str, ...]:
    """The projections to adapt, in Hugging Face order: all-linear expands as in the PyTorch worker,
    and an unknown name raises ValueError listing the allowed ones."""
    return expand_lora_targets(targets)


def lora_parameter_count(model: nnx.Module) -> int:
    state = nnx.state(model, nnx.LoRAParam)
    return sum(x.size for x in jax.tree.leaves(state))


# Filters for nnx.state / nnx.split / optimizer `wrt`.
TRAINABLE_LORA = nnx.LoRAParam
BASE_PARAMS = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))
