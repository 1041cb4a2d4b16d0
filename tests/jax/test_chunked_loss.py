"""Chunked cross-entropy gives the unchunked loss and gradients (with a ragged last chunk)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax_helpers import TINY_SHAPE

import jax
from accelbench.jaxmodels import Transformer
from accelbench.jaxmodels.config import config_from_hf
from accelbench.workers.finetune.jax_worker.step import chunked_ce_sum
from accelbench.workers.testing import tiny_config


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_chunked_loss_and_grads_equal_unchunked(family: str) -> None:
    raw = tiny_config(family, **TINY_SHAPE)
    cfg = config_from_hf(raw.to_dict() if hasattr(raw, "to_dict") else raw)
    model = Transformer(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.float32, dtype=jnp.float32)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 64, size=(2, 13)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(13, dtype=jnp.int32), (2, 13))
    segments = jnp.ones((2, 13), jnp.int32)
    targets = jnp.roll(ids, -1, axis=1)
    mask = jnp.asarray(rng.random((2, 13)) > 0.3, jnp.float32)
    graphdef, params = nnx.split(model)

    def loss(params: nnx.State, chunk: int) -> jax.Array:
        m = nnx.merge(graphdef, params)
        ce, count = chunked_ce_sum(m, m.hidden_states(ids, positions, segments), targets, mask, chunk)
        return ce / count

    whole, g_whole = jax.value_and_grad(loss)(params, 0)
    parts, g_parts = jax.value_and_grad(loss)(params, 4)  # 13 tokens -> 4 chunks, the last padded
    np.testing.assert_allclose(float(parts), float(whole), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_parts), jax.tree.leaves(g_whole), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_the_worker_takes_the_chunk_from_its_run_options(tiny_models, chat_dataset) -> None:
    """ACCELBENCH_LOSS_CHUNK as the pod's env hands it over (RunOptions.env, not this process's
    environment): same losses as the whole-logits run, and the report says what ran."""
    from jax_helpers import manifest, run

    spec = manifest(
        tiny_models["gemma3"], chat_dataset, "gemma3", "jax",
        method={"type": "full"}, training={"maxSteps": 3, "learningRate": 3e-3},
    )  # fmt: skip
    whole = run(spec)
    chunked = run(spec, {"ACCELBENCH_LOSS_CHUNK": "48"})
    np.testing.assert_allclose(chunked.finetune.loss_history, whole.finetune.loss_history, rtol=1e-5)
    assert chunked.finetune.eval_loss == pytest.approx(whole.finetune.eval_loss, rel=1e-5)
    assert "chunks of 48 tokens" in chunked.versions["loss"] and "loss" not in whole.versions
