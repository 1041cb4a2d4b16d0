"""The fused-attention path (jax.nn.dot_product_attention) equals the plain einsum path."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax_helpers import TINY_SHAPE

import jax
from accelbench.jaxmodels import layers
from accelbench.jaxmodels.config import FULL, SLIDING, config_from_hf
from accelbench.workers.testing import tiny_config


@pytest.mark.parametrize(
    ("family", "layer_type"), [("llama", FULL), ("gemma3", SLIDING), ("gemma4", SLIDING), ("gemma4", FULL)]
)
def test_dot_product_attention_matches_einsum(
    family: str, layer_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = tiny_config(family, **TINY_SHAPE)
    cfg = config_from_hf(raw.to_dict() if hasattr(raw, "to_dict") else raw)
    attn = layers.Attention(cfg, layer_type, rngs=nnx.Rngs(0), param_dtype=jnp.float32, dtype=jnp.float32)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 12, cfg.hidden)), jnp.float32)
    positions = jnp.asarray(np.concatenate([np.arange(7), np.arange(5)])[None].repeat(2, 0), jnp.int32)
    segments = jnp.asarray([[1] * 7 + [2] * 5, [1] * 10 + [0] * 2], jnp.int32)  # packing + padding
    mask = layers.attention_mask(segments, attn.window)
    monkeypatch.setattr(layers, "ATTENTION_IMPL", "einsum")
    plain = attn(x, positions, mask)
    monkeypatch.setattr(layers, "ATTENTION_IMPL", "xla")
    fused = attn(x, positions, mask)
    np.testing.assert_allclose(np.asarray(fused), np.asarray(plain), atol=1e-5, rtol=1e-5)
    assert jax.numpy.isfinite(fused).all()


@pytest.mark.parametrize("impl", ["xla", "einsum"])
@pytest.mark.parametrize("family", ["llama", "gemma3", "gemma4"])
def test_causal_flags_equal_the_mask_on_one_sequence_rows(
    family: str, impl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mask None (is_causal + window flags) = the data.py mask, on every real token of a row."""
    raw = tiny_config(family, **TINY_SHAPE)
    raw.sliding_window = 4  # shorter than the rows, so the window is exercised
    cfg = config_from_hf(raw.to_dict() if hasattr(raw, "to_dict") else raw)
    layer_type = SLIDING if SLIDING in cfg.rope else FULL
    attn = layers.Attention(cfg, layer_type, rngs=nnx.Rngs(1), param_dtype=jnp.float32, dtype=jnp.float32)
    if family.startswith("gemma"):
        assert attn.window == 4  # the window is exercised: rows are longer than it
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, 12, cfg.hidden)), jnp.float32)
    positions = jnp.asarray(np.arange(12)[None].repeat(2, 0), jnp.int32)
    segments = jnp.asarray([[1] * 12, [1] * 9 + [0] * 3], jnp.int32)  # one sequence, then padding
    monkeypatch.setattr(layers, "ATTENTION_IMPL", impl)
    masked = np.asarray(attn(x, positions, layers.attention_mask(segments, attn.window)))
    flagged = np.asarray(attn(x, positions, None))
    real = np.asarray(segments) > 0  # padding outputs differ and carry no loss
    np.testing.assert_allclose(flagged[real], masked[real], atol=1e-5, rtol=1e-5)


def test_model_without_segment_masks_equals_with_them_on_one_sequence_rows() -> None:
    from accelbench.jaxmodels import Transformer

    raw = tiny_config("gemma3", **TINY_SHAPE)
    raw.sliding_window = 4
    cfg = config_from_hf(raw.to_dict())
    model = Transformer(cfg, rngs=nnx.Rngs(2), dtype=jnp.float32)
    ids = jnp.asarray(np.random.default_rng(2).integers(0, 64, size=(2, 12)), jnp.int32)
    positions = jnp.asarray(np.arange(12)[None].repeat(2, 0), jnp.int32)
    segments = jnp.asarray([[1] * 12, [1] * 8 + [0] * 4], jnp.int32)
    masked = np.asarray(model(ids, positions, segments))
    model.segment_masks = False
    flagged = np.asarray(model(ids, positions, segments))
    real = np.asarray(segments) > 0
    np.testing.assert_allclose(flagged[real], masked[real], atol=1e-5, rtol=1e-5)
