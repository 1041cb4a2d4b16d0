"""The decoder shape and math switches, read from a Hugging Face config.json.

One `ModelConfig` describes both supported families; the differences (Gemma's (1+scale) norms, q/k
norms, sandwich norms, scaled embeddings, soft-capping, local/global layers; Llama's rope scaling)
are explicit fields, so the model code has no `if family == ...` branches beyond reading them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture is not one the JAX path implements."""


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding for one layer type, as transformers' rope_parameters describes it."""

    theta: float
    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "llama" | "gemma3"
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    norm_eps: float
    tied_embeddings: bool
    layer_types: tuple[str, ...]
    rope: dict[str, RopeSpec]  # by layer type
    sliding_window: int | None = None
    attn_scale: float = 1.0  # multiplies q·k
    attn_softcap: float | None = None
    final_softcap: float | None = None
    hf_config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_gemma(self) -> bool:
        return self.family == "gemma3"

    @property
    def norm_offset(self) -> float:
        # Gemma stores the norm scale zero-centred (output = x·(1+scale)); Llama stores the multiplier.
        return 1.0 if self.is_gemma else 0.0

    @property
    def activation(self) -> str:
        return "gelu_tanh" if self.is_gemma else "silu"

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden) if self.is_gemma else 1.0

    def parameter_count(self) -> int:
        d, h = self.hidden, self.head_dim
        attn = d * h * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * d * self.intermediate
        norms = d * (4 if self.is_gemma else 2) + (2 * h if self.is_gemma else 0)
        embed = self.vocab_size * d * (1 if self.tied_embeddings else 2)
        return self.layers * (attn + mlp + norms) + embed + d


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Multimodal Gemma 3 checkpoints nest the decoder's config under text_config."""
    return raw.get("text_config", raw)


def load_config(model_dir: str | Path) -> ModelConfig:
    raw = json.loads((Path(model_dir) / "config.json").read_text())
    return config_from_hf(raw)


def config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    model_type = raw.get("model_type", "")
    text = text_config(raw)
    if model_type in ("gemma3", "gemma3_text"):
        return _gemma3(text, raw)
    if model_type == "llama":
        return _llama(text, raw)
    raise UnsupportedModelError(f"model_type {model_type!r}: the JAX path supports llama and gemma3")


def _common(text: dict[str, Any]) -> dict[str, Any]:
    heads = text["num_attention_heads"]
    return {
        "vocab_size": text["vocab_size"],
        "hidden": text["hidden_size"],
        "layers": text["num_hidden_layers"],
        "heads": heads,
        "kv_heads": text.get("num_key_value_heads") or heads,
        "head_dim": text.get("head_dim") or text["hidden_size"] // heads,
        "intermediate": text["intermediate_size"],
        "norm_eps": text.get("rms_norm_eps", 1e-6),
    }


def _rope_spec(params: dict[str, Any] | None, default_theta: float) -> RopeSpec:
    params = params or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3"):
        raise UnsupportedModelError(f"rope_type {rope_type!r} is not implemented in the JAX path")
    return RopeSpec(
        theta=float(params.get("rope_theta", default_theta)),
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_positions=int(params.get("original_max_position_embeddings", 8192)),
    )


def _llama(text: dict[str, Any], raw: dict[str, Any]) -> ModelConfig:
    if text.get("attention_bias") or text.get("mlp_bias"):
        raise UnsupportedModelError("llama with projection biases is not implemented in the JAX path")
    common = _common(text)
    # transformers 5 writes rope_parameters; older files carry rope_theta + rope_scaling.
    params = text.get("rope_parameters") or {
        **(text.get("rope_scaling") or {}),
        "rope_theta": text.get("rope_theta", 10000.0),
    }
    return ModelConfig(
        family="llama",
        tied_embeddings=bool(text.get("tie_word_embeddings", raw.get("tie_word_embeddings", False))),
        layer_types=(FULL,) * common["layers"],
        rope={FULL: _rope_spec(params, 10000.0)},
        attn_scale=common["head_dim"] ** -0.5,
        hf_config=raw,
        **common,
    )


def _gemma3_layer_types(text: dict[str, Any], layers: int) -> tuple[str, ...]:
    if text.get("layer_types"):
        return tuple(text["layer_types"])
    # Older config files give only the period: every Nth layer is global.
    pattern = text.get("sliding_window_pattern") or text.get("_sliding_window_pattern") or 6
    return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers))


def _gemma3_rope(text: dict[str, Any]) -> dict[str, RopeSpec]:
    params = text.get("rope_parameters")
    if params and SLIDING in params:
        return {kind: _rope_spec(params.get(kind), 10000.0) for kind in (SLIDING, FULL)}
    scaling = text.get("rope_scaling") or {}
    return {
        SLIDING: RopeSpec(theta=float(text.get("rope_local_base_freq", 10000.0))),
        FULL: _rope_spec({**scaling, "rope_theta": text.get("rope_theta", 1_000_000.0)}, 1_000_000.0),
    }


def _gemma3(text: dict[str, Any], raw: dict[str, Any]) -> ModelConfig:
    if text.get("use_bidirectional_attention"):
        raise UnsupportedModelError("bidirectional Gemma 3 (embedding models) is not a causal LM")
    common = _common(text)
    return ModelConfig(
        family="gemma3",
        # Gemma 3 always ties the output projection to the input embedding.
        tied_embeddings=bool(text.get("tie_word_embeddings", raw.get("tie_word_embeddings", True))),
        layer_types=_gemma3_layer_types(text, common["layers"]),
        rope=_gemma3_rope(text),
        sliding_window=text.get("sliding_window"),
        attn_scale=float(text.get("query_pre_attn_scalar", common["head_dim"])) ** -0.5,
        attn_softcap=text.get("attn_logit_softcapping"),
        final_softcap=text.get("final_logit_softcapping"),
        hf_config=raw,
        **common,
    )
