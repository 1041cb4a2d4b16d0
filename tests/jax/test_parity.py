"""The JAX model computes what transformers computes, for the same weights (float32, CPU)."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from jax_helpers import FAMILIES, hf_logits, packed_inputs

from accelbench.bridge import load_hf


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_on_a_packed_batch(tiny_models: dict[str, Path], family: str) -> None:
    """Each packed segment gives the logits transformers gives for that segment run on its own."""
    model_dir = tiny_models[family]
    loaded = load_hf(model_dir, param_dtype=jnp.float32, dtype=jnp.float32)
    batch = packed_inputs()
    logits = np.asarray(
        loaded.model(
            jnp.asarray(batch["input_ids"]),
            jnp.asarray(batch["positions"]),
            jnp.asarray(batch["segment_ids"]),
        )
    )
    for row in range(2):
        for seg in (1, 2):
            where = batch["segment_ids"][row] == seg
            if not where.any():
                continue
            expected = hf_logits(model_dir, batch["input_ids"][row][where][None])[0]
            np.testing.assert_allclose(logits[row][where], expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_on_unpacked_rows(tiny_models: dict[str, Path], family: str) -> None:
    """One sequence per row (segment_masks off: causal and window by kernel flags), padding after it."""
    model_dir = tiny_models[family]
    loaded = load_hf(model_dir, param_dtype=jnp.float32, dtype=jnp.float32)
    loaded.model.segment_masks = False
    ids = packed_inputs(seed=7)["input_ids"]
    lengths = (24, 19)  # both past the tiny Gemmas' 16-token window
    segments = np.array([[1] * n + [0] * (24 - n) for n in lengths], dtype=np.int32)
    positions = np.tile(np.arange(24, dtype=np.int32), (2, 1))
    logits = np.asarray(loaded.model(jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(segments)))
    for row, n in enumerate(lengths):
        expected = hf_logits(model_dir, ids[row, :n][None])[0]
        np.testing.assert_allclose(logits[row, :n], expected, atol=1e-4, rtol=1e-4)
