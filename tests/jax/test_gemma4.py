"""Gemma 4 specifics: config parsing (both config.json forms), refusals, rope, the multimodal checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax_helpers import packed_inputs

from accelbench.bridge import export_hf, load_hf
from accelbench.bridge.hf_files import TensorReader
from accelbench.jaxmodels.config import FULL, SLIDING, UnsupportedModelError, config_from_hf
from accelbench.jaxmodels.layers import inverse_frequencies

# The published gemma-4-31B text_config (as quoted by several independent projects), trimmed to what
# the decoder reads; transformers 5.17+ rewrites global_head_dim/num_global_key_value_heads as
# per_layer_config when it saves a config.
GEMMA4_31B: dict[str, Any] = {
    "model_type": "gemma4",
    "architectures": ["Gemma4ForConditionalGeneration"],
    "text_config": {
        "model_type": "gemma4_text",
        "vocab_size": 262144,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_hidden_layers": 60,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "num_global_key_value_heads": 4,
        "head_dim": 256,
        "global_head_dim": 512,
        "attention_k_eq_v": True,
        "sliding_window": 1024,
        "final_logit_softcapping": 30.0,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "enable_moe_block": False,
        "tie_word_embeddings": True,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    },
}


def test_31b_config_parses_to_its_published_shape() -> None:
    cfg = config_from_hf(GEMMA4_31B)
    assert (cfg.family, cfg.layers, cfg.hidden, cfg.heads) == ("gemma4", 60, 5376, 32)
    assert (cfg.layer_head_dim(SLIDING), cfg.layer_kv_heads(SLIDING)) == (256, 16)
    assert (cfg.layer_head_dim(FULL), cfg.layer_kv_heads(FULL)) == (512, 4)
    assert cfg.shares_kv(FULL) and not cfg.shares_kv(SLIDING)
    assert cfg.layer_types.count(FULL) == 10 and cfg.sliding_window == 1024
    assert (cfg.attn_scale, cfg.attn_softcap, cfg.final_softcap, cfg.norm_offset) == (1.0, None, 30.0, 0.0)
    assert cfg.rope[FULL].rope_type == "proportional" and cfg.rope[FULL].partial_rotary_factor == 0.25
    assert 30.6e9 < cfg.parameter_count() < 30.8e9  # decoder only, tied embedding


def test_per_layer_config_form_equals_global_head_dim_form() -> None:
    from transformers import Gemma4TextConfig

    text = dict(GEMMA4_31B["text_config"], num_hidden_layers=6, layer_types=None)
    saved = Gemma4TextConfig(**{k: v for k, v in text.items() if k != "model_type"}).to_dict()
    assert "per_layer_config" in saved and "global_head_dim" not in saved
    assert config_from_hf(saved) == config_from_hf(text)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"hidden_size_per_layer_input": 256}, "per-layer input embeddings"),
        ({"hidden_size_per_layer_input": None, "num_kv_shared_layers": 2}, "KV sharing"),
        ({"enable_moe_block": True, "num_experts": 8, "top_k_experts": 2}, "mixture-of-experts"),
        ({"use_bidirectional_attention": "all"}, "not a causal LM"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}}, "yarn"),
    ],
)
def test_unimplemented_variants_are_refused(override: dict[str, Any], match: str) -> None:
    text = dict(GEMMA4_31B["text_config"], **override)
    with pytest.raises(UnsupportedModelError, match=match):
        config_from_hf(text)


def test_missing_per_layer_width_means_per_layer_embeddings_and_is_refused() -> None:
    # Gemma4TextConfig defaults hidden_size_per_layer_input to 256 (E2B/E4B), so absent is not "off".
    text = {k: v for k, v in GEMMA4_31B["text_config"].items() if k != "hidden_size_per_layer_input"}
    with pytest.raises(UnsupportedModelError, match="per-layer input embeddings"):
        config_from_hf(text)


@pytest.mark.parametrize(
    ("head_dim", "partial", "factor"), [(512, 0.25, 1.0), (32, 0.25, 1.0), (64, 0.5, 2.0)]
)
def test_proportional_rope_equals_transformers(head_dim: int, partial: float, factor: float) -> None:
    from transformers import Gemma4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": partial,
                           "rope_theta": 1e6, "factor": factor},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }  # fmt: skip
    hf = Gemma4TextConfig(
        num_hidden_layers=2, global_head_dim=head_dim, rope_parameters=rope, hidden_size_per_layer_input=0
    )
    expected, _ = ROPE_INIT_FUNCTIONS["proportional"](hf, None, layer_type="full_attention")
    cfg = config_from_hf(hf.to_dict())
    ours = inverse_frequencies(cfg.rope[FULL], cfg.layer_head_dim(FULL))
    assert ours.dtype == np.float32 and (ours == 0).sum() == (expected.numpy() == 0).sum()
    np.testing.assert_allclose(ours, expected.numpy(), rtol=3e-7, atol=0)  # float32 pow: 1 ulp


@pytest.fixture(scope="module")
def multimodal_gemma4(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Path:
    """Gemma4ForConditionalGeneration: the tiny text decoder plus a one-layer vision tower."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4VisionConfig

    text = json.loads((tiny_models["gemma4"] / "config.json").read_text())
    vision = Gemma4VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    config = Gemma4Config(text_config=text, vision_config=vision, audio_config=None)
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(config).to(torch.float32)
    out = tmp_path_factory.mktemp("gemma4-mm")
    model.save_pretrained(out)
    return out


def _hf_logits(model_dir: Path, ids: np.ndarray) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return model.eval()(torch.from_numpy(ids.astype(np.int64))).logits.numpy()


def test_multimodal_checkpoint_loads_its_text_decoder(multimodal_gemma4: Path, tmp_path: Path) -> None:
    loaded = load_hf(multimodal_gemma4)
    assert loaded.layout.prefix == "model.language_model."
    assert loaded.extra_names and all("vision" in n for n in loaded.extra_names)
    ids = packed_inputs(seed=3)["input_ids"][:1, :20]
    ours = np.asarray(loaded.model(jnp.asarray(ids), jnp.arange(20)[None], jnp.ones((1, 20), jnp.int32)))
    np.testing.assert_allclose(ours, _hf_logits(multimodal_gemma4, ids), atol=1e-4, rtol=1e-4)

    # With the layout: every tensor written back bit for bit, the vision tower passed through.
    out = export_hf(loaded.model, loaded.cfg, multimodal_gemma4, tmp_path / "mm", layout=loaded.layout)
    with TensorReader(multimodal_gemma4) as a, TensorReader(out) as b:
        assert sorted(a.names()) == sorted(b.names())
        assert all(np.array_equal(a.get(n), b.get(n)) for n in a.names())
    # Without it: the text decoder alone, as a Gemma4ForCausalLM checkpoint.
    text_only = export_hf(loaded.model, loaded.cfg, multimodal_gemma4, tmp_path / "text")
    assert json.loads((text_only / "config.json").read_text())["architectures"] == ["Gemma4ForCausalLM"]
    np.testing.assert_allclose(_hf_logits(text_only, ids), ours, atol=1e-4, rtol=1e-4)


def test_per_layer_config_it_cannot_represent_is_unsupported() -> None:
    # catalog.hf_config refuses with HfConfigError; the JAX path reports it as UnsupportedModelError.
    text = dict(GEMMA4_31B["text_config"], per_layer_config={"5": {"head_dim": 512}, "11": {"head_dim": 256}})
    with pytest.raises(UnsupportedModelError, match="same overrides"):
        config_from_hf(text)
