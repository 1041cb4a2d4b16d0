"""FLOPs per token and MFU, hand-checked, and the docs/anchors.md figures reproduced."""

from __future__ import annotations

import pytest

from accelbench.catalog import ModelShape, hf_config, model_shape
from accelbench.plan.memory import lora_adapter_parameters
from accelbench.workers.flops import (
    flops_per_token,
    lora_parameters,
    matmul_parameters,
    mfu,
    shape_from_hf_config,
)

ALL_PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _shape(**kw) -> ModelShape:
    base = dict(
        family="llama",
        size="t",
        reference="test",
        layers=2,
        hidden=8,
        heads=2,
        kv_heads=1,
        head_dim=4,
        intermediate=16,
        vocab=10,
        tied_embeddings=False,
        parameters=1,
    )
    return ModelShape(**(base | kw))


def test_hand_checked_tiny_shape() -> None:
    shape = _shape()
    # per layer: q 8·8, k 8·4, v 8·4, o 8·8, gate/up/down 3·8·16 = 64+32+32+64+384 = 576; ×2 layers;
    # plus the LM head 10·8 (the untied input embedding is a lookup and does not count)
    assert matmul_parameters(shape) == 2 * 576 + 80
    full = flops_per_token(shape, seq_length=32)
    attention = 6 * 2 * 2 * 4 * 32  # 6·L·H·Q·T
    assert full.attention == attention
    assert full.total == 6 * 1232 + attention
    lora = flops_per_token(shape, 32, lora_rank=2, lora_targets=["q_proj", "down_proj"])
    n_lora = 2 * 2 * ((8 + 8) + (16 + 8))  # r·(in+out) per adapted projection, 2 layers
    assert lora.lora_parameters == n_lora
    assert lora.total == 4 * 1232 + 6 * n_lora + attention
    assert "4N" in lora.formula and "6N" in full.formula


def test_anchors_gemma3_1b_full_reproduces_24_1_percent() -> None:
    shape = model_shape("gemma3", "1b")
    f = flops_per_token(shape, 2048)
    assert f.attention == 6 * 26 * 4 * 256 * 2048
    assert mfu(37_686, f.total, 1, 989) == pytest.approx(0.241, abs=5e-4)
    assert mfu(62_414, f.total, 1, 989) == pytest.approx(0.399, abs=5e-4)
    assert mfu(51_726, flops_per_token(shape, 4096).total, 1, 989) == pytest.approx(0.348, abs=5e-4)


def test_anchors_lora_rows_match_without_the_adapter_term() -> None:
    # ANCHORS' LoRA rows use 4N + attention; we add the adapters' own 6·N_lora on top (documented).
    shape = model_shape("gemma3", "1b")
    f = flops_per_token(shape, 2048, 64, ALL_PROJ)
    assert mfu(25_450, f.total - 6 * f.lora_parameters, 1, 989) == pytest.approx(0.111, abs=5e-4)
    assert mfu(25_450, f.total, 1, 989) == pytest.approx(0.119, abs=5e-4)


def test_shape_from_hf_config_matches_catalog_gemma3_1b() -> None:
    config = {
        "model_type": "gemma3_text",
        "hidden_size": 1152,
        "num_hidden_layers": 26,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "intermediate_size": 6912,
        "vocab_size": 262144,
        "sliding_window": 512,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 4 + ["sliding_attention"] * 2,
    }
    shape = shape_from_hf_config(config, "gemma3")
    assert matmul_parameters(shape) == matmul_parameters(model_shape("gemma3", "1b"))


def test_mfu_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        mfu(1.0, 1.0, 0, 989)


def _gemma4_31b_text(**override: object) -> dict:
    return {
        "model_type": "gemma4_text",
        "hidden_size": 5376,
        "num_hidden_layers": 60,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "intermediate_size": 21504,
        "vocab_size": 262144,
        "sliding_window": 1024,
        "attention_k_eq_v": True,
        "tie_word_embeddings": True,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
        **override,
    }


@pytest.mark.parametrize(
    "text",
    [
        # as published (multimodal wrapper, global_head_dim / num_global_key_value_heads)
        _gemma4_31b_text(global_head_dim=512, num_global_key_value_heads=4),
        # as transformers 5.17+ saves it: per-layer overrides of the full-attention layers
        _gemma4_31b_text(per_layer_config={str(i): {"head_dim": 512, "num_key_value_heads": 4}
                                           for i in range(5, 60, 6)}),
    ],
)  # fmt: skip
def test_shape_from_hf_config_matches_catalog_gemma4_31b(text: dict) -> None:
    shape = shape_from_hf_config({"model_type": "gemma4", "text_config": text}, "gemma4")
    assert (shape.global_head_dim, shape.global_kv_heads, shape.local_per_global) == (512, 4, 5)
    catalog = model_shape("gemma4", "31b")
    assert matmul_parameters(shape) == matmul_parameters(catalog)
    assert flops_per_token(shape, 4096).attention == flops_per_token(catalog, 4096).attention


@pytest.mark.parametrize(("family", "size"), [("gemma3", "1b"), ("gemma4", "31b"), ("llama", "8b")])
def test_all_linear_counts_every_projection_as_the_planner_does(family: str, size: str) -> None:
    # Gemma 4 31B's global layers have no v_proj (K = V): all-linear adapts what each layer has.
    shape = model_shape(family, size)
    all_linear = flops_per_token(shape, 2048, 16, ["all-linear"])
    named = flops_per_token(shape, 2048, 16, ALL_PROJ)
    assert all_linear.lora_parameters == named.lora_parameters > 0
    assert all_linear.total == named.total
    planner, unmatched = lora_adapter_parameters(shape, 16, ["all-linear"])
    assert all_linear.lora_parameters == planner and unmatched == []
    assert lora_parameters(shape, 16, ["all-linear", "q_proj"]) == planner


def test_unknown_lora_target_is_refused_not_counted_as_zero() -> None:
    with pytest.raises(ValueError, match="all-linear"):
        lora_parameters(_shape(), 2, ["qkv_proj"])


def test_shape_from_hf_config_is_the_catalog_reader() -> None:
    assert shape_from_hf_config is hf_config.shape_from_hf_config
