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
