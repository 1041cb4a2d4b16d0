"""What a checkpointed block saves for its backward pass (ACCELBENCH_REMAT): "dots" keeps the
projections' outputs, so the backward pass runs fewer matmuls than under "full" recomputation, with
the same loss and gradients; and the worker takes the policy from its run options."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax_helpers import TINY_SHAPE, manifest, run

import jax
from accelbench.jaxmodels import Transformer
from accelbench.jaxmodels.config import config_from_hf
from accelbench.workers.testing import tiny_config


def _grad_program(policy: str) -> tuple[jax.Array, object, str]:
    raw = tiny_config("llama", **TINY_SHAPE)
    cfg = config_from_hf(raw.to_dict())
    model = Transformer(
        cfg, rngs=nnx.Rngs(0), param_dtype=jnp.float32, dtype=jnp.float32, remat=True, remat_policy=policy
    )
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 64, size=(2, 16)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (2, 16))
    segments = jnp.ones((2, 16), jnp.int32)
    graphdef, params = nnx.split(model)

    def loss(p: nnx.State) -> jax.Array:
        return nnx.merge(graphdef, p)(ids, positions, segments).astype(jnp.float32).mean()

    grad = jax.jit(jax.value_and_grad(loss))
    value, grads = grad(params)
    return value, grads, grad.lower(params).compile().as_text()


def test_saving_the_projections_runs_fewer_matmuls_for_the_same_gradients() -> None:
    full_value, full_grads, full_hlo = _grad_program("full")
    dots_value, dots_grads, dots_hlo = _grad_program("dots")
    np.testing.assert_allclose(float(dots_value), float(full_value), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(dots_grads), jax.tree.leaves(full_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # Each block's 7 projections run again under "full"; "dots" keeps their outputs instead.
    assert dots_hlo.count(" dot(") < full_hlo.count(" dot("), (
        dots_hlo.count(" dot("),
        full_hlo.count(" dot("),
    )


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="remat_policy 'some'"):
        Transformer(
            config_from_hf(tiny_config("llama", **TINY_SHAPE).to_dict()),
            rngs=nnx.Rngs(0),
            remat_policy="some",
        )


def test_the_worker_takes_the_policy_from_its_run_options(tiny_models, chat_dataset) -> None:
    spec = manifest(
        tiny_models["llama"], chat_dataset, "llama", "jax", method={"type": "lora", "rank": 8},
        training={"maxSteps": 3, "learningRate": 1e-2, "gradientCheckpointing": True},
    )  # fmt: skip
    full = run(spec)
    dots = run(spec, {"ACCELBENCH_REMAT": "dots"})
    np.testing.assert_allclose(dots.finetune.loss_history, full.finetune.loss_history, rtol=1e-5)
    assert dots.versions["remat"].startswith("jax.checkpoint saves dots") and "remat" not in full.versions
