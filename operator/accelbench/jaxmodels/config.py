"""The decoder shape and math switches, read from a Hugging Face config.json.

The dimensions (widths, heads, layer pattern, Gemma 4's global-layer shape and defaults) come from
catalog.hf_config, the reader the FLOPs count uses too; this module adds what only the JAX model
needs (rope, norms, soft-caps, attention scale) and refuses what it does not implement.

One `ModelConfig` describes every supported family; the differences (Gemma 3's (1+scale) norms, q/k
norms, sandwich norms, scaled embeddings, soft-capping, local/global layers; Llama's rope scaling;
Gemma 4's per-layer-type head sizes, shared k/v projection, value norm, proportional rope and layer
scalars) are explicit fields, so the model code has no `if family == ...` branches beyond reading them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..catalog.hf_config import FULL, SLIDING, HfConfigError, TextConfig, text_config


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture is not one the JAX path implements."""


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding for one layer type, as transformers' rope_parameters describes it."""

    theta: float
    rope_type: str = "default"  # default | linear | llama3 | proportional
    factor: float = 1.0
    partial_rotary_factor: float = 1.0  # proportional only: the rotated share of the head
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "llama" | "gemma3" | "gemma4"
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
    # Gemma 4: global (full-attention) layers may have their own head size and KV-head count, and
    # with k_eq_v they have no V projection (values are the un-normed, un-rotated keys).
    global_head_dim: int | None = None
    global_kv_heads: int | None = None
    k_eq_v: bool = False
    value_norm: bool = False  # Gemma 4: RMS-normalize values (no learned scale)
    layer_scalar: bool = False  # Gemma 4: each block's output is multiplied by a stored scalar
    hf_config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_gemma(self) -> bool:
        """Gemma block structure: q/k norms, sandwich norms, gelu-tanh, scaled embeddings."""
        return self.family in ("gemma3", "gemma4")

    @property
    def norm_offset(self) -> float:
        # Gemma 3 stores the norm scale zero-centred (output = x·(1+scale)); Llama and Gemma 4 store
        # the multiplier itself.
        return 1.0 if self.family == "gemma3" else 0.0

    def layer_head_dim(self, layer_type: str) -> int:
        return (self.global_head_dim or self.head_dim) if layer_type == FULL else self.head_dim

    def layer_kv_heads(self, layer_type: str) -> int:
        return (self.global_kv_heads or self.kv_heads) if layer_type == FULL else self.kv_heads

    def shares_kv(self, layer_type: str) -> bool:
        """The layer's values are its keys' projection (no V weight)."""
        return self.k_eq_v and layer_type == FULL

    @property
    def activation(self) -> str:
        return "gelu_tanh" if self.is_gemma else "silu"

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden) if self.is_gemma else 1.0

    def parameter_count(self) -> int:
        d = self.hidden
        total = self.vocab_size * d * (1 if self.tied_embeddings else 2) + d
        for kind in self.layer_types:
            h, k = self.layer_head_dim(kind), self.layer_kv_heads(kind)
            attn = d * h * (2 * self.heads + (1 if self.shares_kv(kind) else 2) * k)
            mlp = 3 * d * self.intermediate
            norms = d * (4 if self.is_gemma else 2) + (2 * h if self.is_gemma else 0)
            total += attn + mlp + norms + (1 if self.layer_scalar else 0)
        return total


def load_config(model_dir: str | Path) -> ModelConfig:
    raw = json.loads((Path(model_dir) / "config.json").read_text())
    return config_from_hf(raw)


def config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    model_type = raw.get("model_type", "")
    build = _BUILDERS.get(model_type)
    if build is None:
        raise UnsupportedModelError(
            f"model_type {model_type!r}: the JAX path supports llama, gemma3 and gemma4 (dense text decoder)"
        )
    try:
        text = text_config(raw)  # catalog.hf_config owns the dimensions; this module the math switches
    except HfConfigError as exc:
        raise UnsupportedModelError(str(exc)) from None
    return build(text, raw)


def _dimensions(text: TextConfig) -> dict[str, Any]:
    """ModelConfig's dimension fields, as the shared config.json reader gives them."""
    return {
        "vocab_size": text.vocab,
        "hidden": text.hidden,
        "layers": text.layers,
        "heads": text.heads,
        "kv_heads": text.kv_heads,
        "head_dim": text.head_dim,
        "intermediate": text.intermediate,
        "norm_eps": text.norm_eps,
        "tied_embeddings": text.tied_embeddings,
        "layer_types": text.layer_types,
    }


def _rope_spec(params: dict[str, Any] | None, default_theta: float) -> RopeSpec:
    params = params or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3", "proportional"):
        raise UnsupportedModelError(f"rope_type {rope_type!r} is not implemented in the JAX path")
    return RopeSpec(
        theta=float(params.get("rope_theta", default_theta)),
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_positions=int(params.get("original_max_position_embeddings", 8192)),
        partial_rotary_factor=float(params.get("partial_rotary_factor", 1.0)),
    )


def _llama(text: TextConfig, raw: dict[str, Any]) -> ModelConfig:
    fields = text.fields
    if fields.get("attention_bias") or fields.get("mlp_bias"):
        raise UnsupportedModelError("llama with projection biases is not implemented in the JAX path")
    # transformers 5 writes rope_parameters; older files carry rope_theta + rope_scaling.
    params = fields.get("rope_parameters") or {
        **(fields.get("rope_scaling") or {}),
        "rope_theta": fields.get("rope_theta", 10000.0),
    }
    return ModelConfig(
        family="llama",
        rope={FULL: _rope_spec(params, 10000.0)},
        attn_scale=text.head_dim**-0.5,
        hf_config=raw,
        **_dimensions(text),
    )


def _gemma3_rope(text: Mapping[str, Any]) -> dict[str, RopeSpec]:
    params = text.get("rope_parameters")
    if params and SLIDING in params:
        return {kind: _rope_spec(params.get(kind), 10000.0) for kind in (SLIDING, FULL)}
    scaling = text.get("rope_scaling") or {}
    return {
        SLIDING: RopeSpec(theta=float(text.get("rope_local_base_freq", 10000.0))),
        FULL: _rope_spec({**scaling, "rope_theta": text.get("rope_theta", 1_000_000.0)}, 1_000_000.0),
    }


def _gemma3(text: TextConfig, raw: dict[str, Any]) -> ModelConfig:
    fields = text.fields
    if fields.get("use_bidirectional_attention"):
        raise UnsupportedModelError("bidirectional Gemma 3 (embedding models) is not a causal LM")
    return ModelConfig(
        family="gemma3",
        rope=_gemma3_rope(fields),
        sliding_window=text.sliding_window,
        attn_scale=float(fields.get("query_pre_attn_scalar", text.head_dim)) ** -0.5,
        attn_softcap=fields.get("attn_logit_softcapping"),
        final_softcap=fields.get("final_logit_softcapping"),
        hf_config=raw,
        **_dimensions(text),
    )


_GEMMA4_ROPE: dict[str, dict[str, Any]] = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}


def _gemma4_refusals(text: Mapping[str, Any]) -> None:
    """Gemma 4 variants whose extra machinery the JAX path does not implement: refuse, never approximate."""
    if text["hidden_size_per_layer_input"]:
        raise UnsupportedModelError(
            "Gemma 4 per-layer input embeddings (hidden_size_per_layer_input="
            f"{text['hidden_size_per_layer_input']}, the E2B/E4B models) are not implemented in the JAX "
            "path; only dense Gemma 4 decoders without them (e.g. 31B) are"
        )
    if text["num_kv_shared_layers"]:
        raise UnsupportedModelError(
            f"Gemma 4 KV sharing across layers (num_kv_shared_layers={text['num_kv_shared_layers']}) "
            "is not implemented in the JAX path"
        )
    if text["enable_moe_block"]:
        raise UnsupportedModelError(
            "Gemma 4 mixture-of-experts blocks (enable_moe_block, e.g. 26B-A4B) are not implemented "
            "in the JAX path"
        )
    if text["use_bidirectional_attention"] == "all":
        raise UnsupportedModelError(
            "bidirectional Gemma 4 (use_bidirectional_attention='all') is not a causal LM"
        )
    if text["attention_bias"]:
        raise UnsupportedModelError("Gemma 4 with attention biases is not implemented in the JAX path")
    if text["hidden_activation"] not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise UnsupportedModelError(
            f"Gemma 4 hidden_activation {text['hidden_activation']!r}: the JAX path implements "
            "gelu_pytorch_tanh only"
        )


def _gemma4_layer_kinds(text: Mapping[str, Any]) -> None:
    """Refuses attention kinds other than sliding and full (checked on the file's own list)."""
    kinds = set(text.get("layer_types") or ())
    if kinds - {FULL, SLIDING}:
        raise UnsupportedModelError(
            f"Gemma 4 layer types {sorted(kinds)} are not implemented in the JAX path"
        )


def _gemma4_rope(text: Mapping[str, Any]) -> dict[str, RopeSpec]:
    params = text.get("rope_parameters") or _GEMMA4_ROPE
    out = {}
    for kind in (SLIDING, FULL):
        spec = _rope_spec(params.get(kind) or _GEMMA4_ROPE[kind], _GEMMA4_ROPE[kind]["rope_theta"])
        if spec.rope_type not in ("default", "proportional"):
            raise UnsupportedModelError(
                f"Gemma 4 rope_type {spec.rope_type!r} is not implemented in the JAX path"
            )
        out[kind] = spec
    return out


def _gemma4(text: TextConfig, raw: dict[str, Any]) -> ModelConfig:
    fields = text.fields  # Gemma4TextConfig's defaults applied (catalog.hf_config.GEMMA4_DEFAULTS)
    _gemma4_refusals(fields)
    _gemma4_layer_kinds(fields)
    return ModelConfig(
        family="gemma4",
        rope=_gemma4_rope(fields),
        sliding_window=text.sliding_window,
        attn_scale=1.0,  # q and k are RMS-normed; transformers' Gemma 4 attention uses scaling 1.0
        attn_softcap=None,  # Gemma 4 has no attention-logit soft-cap
        final_softcap=fields["final_logit_softcapping"],
        global_head_dim=text.global_head_dim,
        global_kv_heads=text.global_kv_heads,
        k_eq_v=text.k_eq_v,
        value_norm=True,
        layer_scalar=True,
        hf_config=raw,
        **_dimensions(text),
    )


_BUILDERS: dict[str, Callable[[TextConfig, dict[str, Any]], ModelConfig]] = {
    "llama": _llama,
    "gemma3": _gemma3,
    "gemma3_text": _gemma3,
    "gemma4": _gemma4,
    "gemma4_text": _gemma4,
}
