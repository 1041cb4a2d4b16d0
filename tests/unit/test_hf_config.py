"""catalog.hf_config: the one reader of a config.json's decoder dimensions (FLOPs and JAX share it)."""

from __future__ import annotations

from typing import Any

import pytest

from accelbench.catalog.hf_config import FULL, SLIDING, HfConfigError, shape_from_hf_config, text_config


def _gemma4(**override: Any) -> dict[str, Any]:
    return {
        "model_type": "gemma4_text",
        "hidden_size": 64,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        **override,
    }


def test_gemma4_defaults_fill_what_a_hand_written_file_leaves_out() -> None:
    t = text_config({"model_type": "gemma4", "text_config": _gemma4()})
    assert (t.kv_heads, t.head_dim, t.sliding_window, t.norm_eps) == (4, 256, 512, 1e-6)
    assert (t.global_head_dim, t.global_kv_heads, t.k_eq_v, t.tied_embeddings) == (512, None, False, True)
    # every 6th layer global, and transformers forces the last one to full attention too
    assert t.layer_types == (SLIDING,) * 5 + (FULL, SLIDING, FULL)
    assert t.fields["hidden_size_per_layer_input"] == 256  # the JAX path reads its refusals here


def test_gemma4_without_layer_types_gets_its_pattern_in_the_flops_shape() -> None:
    shape = shape_from_hf_config(_gemma4(sliding_window=32), "gemma4")
    assert (shape.local_per_global, shape.sliding_window, shape.global_head_dim) == (5, 32, 512)


def test_gemma3_legacy_period() -> None:
    raw = {**_gemma4(model_type="gemma3_text", head_dim=16), "sliding_window_pattern": 4}
    t = text_config(raw)
    assert t.layer_types == ((SLIDING,) * 3 + (FULL,)) * 2 and t.global_head_dim is None


def test_per_layer_config_gives_the_global_shape() -> None:
    per_layer = {
        "5": {"head_dim": 512, "num_key_value_heads": 1},
        "7": {"head_dim": 512, "num_key_value_heads": 1},
    }
    t = text_config(_gemma4(per_layer_config=per_layer))
    assert (t.global_head_dim, t.global_kv_heads) == (512, 1)


@pytest.mark.parametrize(
    "per_layer",
    [
        {"5": {"head_dim": 512}, "7": {"head_dim": 256}},  # global layers differ
        {"0": {"head_dim": 512}},  # a sliding layer overridden
        {"9": {"head_dim": 512}},  # no such layer
        {"5": {"sliding_window": 4}, "7": {"sliding_window": 4}},  # not a dimension this reader knows
    ],
)
def test_per_layer_config_it_cannot_represent_is_refused(per_layer: dict[str, Any]) -> None:
    with pytest.raises(HfConfigError, match="Gemma 4 per"):
        text_config(_gemma4(per_layer_config=per_layer))


def test_llama_is_all_full_attention_and_untied() -> None:
    raw = _gemma4(model_type="llama", num_key_value_heads=2)
    t = text_config(raw)
    assert t.layer_types == (FULL,) * 8 and not t.tied_embeddings and t.head_dim == 16
    assert shape_from_hf_config(raw).family == "llama"
