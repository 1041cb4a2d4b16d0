"""The text decoder's dimensions, read from a Hugging Face config.json: one reader for every consumer.

The FLOPs count (a ModelShape, workers/flops.py) and the JAX model (ModelConfig, jaxmodels/config.py)
need the same numbers: widths, head counts, the local/global layer pattern and the global layers' own
head size. Reading them here, once, keeps a family default or a per-layer override from being
applied by one consumer and missed by the other. Pure: no JAX, no torch, nothing read from disk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .types import ModelShape

SLIDING = "sliding_attention"
FULL = "full_attention"

# Gemma4TextConfig's defaults (transformers 5.17 and 5.24 agree) for fields a hand-written config.json
# may leave out; one written by transformers carries them all. Consumers read the JAX-only ones
# (activation, refusals) from TextConfig.fields, which has these applied.
GEMMA4_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 512,
        "final_logit_softcapping": None,
        "attention_bias": False,
        "attention_k_eq_v": False,
        "hidden_size_per_layer_input": 256,  # per-layer embeddings ON unless the config says 0/null
        "num_kv_shared_layers": 0,
        "enable_moe_block": False,
        "use_bidirectional_attention": None,
    }
)
GEMMA4_GLOBAL_HEAD_DIM = 512  # Gemma4TextConfig's global_head_dim default
_GEMMA3_PERIOD = 6  # older Gemma 3 files give no layer_types: every 6th layer is global
_GEMMA4_PERIOD = 6
_PER_LAYER_KEYS = frozenset({"head_dim", "num_key_value_heads"})


class HfConfigError(ValueError):
    """config.json describes a layout these dimensions cannot represent (uneven per-layer overrides)."""


@dataclass(frozen=True)
class TextConfig:
    """The text decoder's dimensions, family defaults applied. Global (full-attention) layers use
    `global_head_dim` / `global_kv_heads` when set, and with `k_eq_v` have no V projection."""

    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    norm_eps: float
    tied_embeddings: bool
    layer_types: tuple[str, ...]
    sliding_window: int | None
    global_head_dim: int | None
    global_kv_heads: int | None
    k_eq_v: bool
    # The text config's own fields with the family defaults applied, for what only one consumer reads.
    fields: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def family(self) -> str:
        return model_family(self.model_type)

    @property
    def local_per_global(self) -> int | None:
        """Local layers before the first global one, when the model has sliding-window layers."""
        if not self.sliding_window or FULL not in self.layer_types:
            return None
        return self.layer_types.index(FULL) or None


def model_family(model_type: str) -> str:
    """'gemma3' / 'gemma4' for a checkpoint's text or multimodal model_type, else model_type itself."""
    if model_type in ("gemma3", "gemma3_text"):
        return "gemma3"
    if model_type in ("gemma4", "gemma4_text"):
        return "gemma4"
    return model_type


def decoder_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The text decoder's part: multimodal Gemma 3 and Gemma 4 checkpoints nest it under text_config."""
    return dict(raw.get("text_config") or raw)


def text_config(raw: Mapping[str, Any]) -> TextConfig:
    """The decoder dimensions of a config.json (top level or multimodal)."""
    text = decoder_fields(raw)
    model_type = str(text.get("model_type") or raw.get("model_type") or "")
    family = model_family(model_type)
    if family == "gemma4":
        text = {**GEMMA4_DEFAULTS, **text}
    heads = int(text["num_attention_heads"])
    hidden = int(text["hidden_size"])
    layers = int(text["num_hidden_layers"])
    head_dim = int(text.get("head_dim") or hidden // heads)
    layer_types = _layer_types(text, family, layers)
    global_head_dim, global_kv_heads = _global_shape(text, family, layer_types, head_dim)
    return TextConfig(
        model_type=model_type,
        vocab=int(text["vocab_size"]),
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        intermediate=int(text["intermediate_size"]),
        norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        tied_embeddings=_tied(text, raw, model_type),
        layer_types=layer_types,
        sliding_window=_optional_int(text.get("sliding_window")),
        global_head_dim=global_head_dim,
        global_kv_heads=global_kv_heads,
        k_eq_v=bool(text.get("attention_k_eq_v", False)),
        fields=MappingProxyType(text),
    )


def shape_from_hf_config(raw: Mapping[str, Any], family: str = "", size: str = "local") -> ModelShape:
    """The ModelShape of a config.json: what the FLOPs count of a checkpoint on disk works from."""
    t = text_config(raw)
    local_per_global = t.local_per_global
    return ModelShape(
        family=family or t.model_type or "unknown",
        size=size,
        reference="config.json",
        layers=t.layers,
        hidden=t.hidden,
        heads=t.heads,
        kv_heads=t.kv_heads,
        head_dim=t.head_dim,
        intermediate=t.intermediate,
        vocab=t.vocab,
        tied_embeddings=t.tied_embeddings,
        # ModelShape describes a regular pattern: local layers before each global one.
        sliding_window=t.sliding_window if local_per_global else None,
        local_per_global=local_per_global,
        global_head_dim=t.global_head_dim,
        global_kv_heads=t.global_kv_heads,
        attention_k_eq_v=t.k_eq_v,
        parameters=1,  # unknown here and unused by the FLOPs count
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _tied(text: Mapping[str, Any], raw: Mapping[str, Any], model_type: str) -> bool:
    """Gemma always ties the LM head to the input embedding unless the file says otherwise."""
    default = model_type.startswith("gemma")
    return bool(text.get("tie_word_embeddings", raw.get("tie_word_embeddings", default)))


def _every_nth_global(layers: int, period: int) -> list[str]:
    return [FULL if (i + 1) % period == 0 else SLIDING for i in range(layers)]


def _layer_types(text: Mapping[str, Any], family: str, layers: int) -> tuple[str, ...]:
    """Attention kind of every layer; files that give no layer_types get the family's pattern."""
    given = text.get("layer_types")
    if family == "gemma3":
        period = text.get("sliding_window_pattern") or text.get("_sliding_window_pattern") or _GEMMA3_PERIOD
        return tuple(given or _every_nth_global(layers, period))
    if family == "gemma4":
        kinds = list(given or _every_nth_global(layers, _GEMMA4_PERIOD))
        kinds[-1] = FULL  # transformers forces the last layer to full attention
        return tuple(kinds)
    if family == "llama":
        return (FULL,) * layers  # Llama has no sliding-window layers
    return tuple(given or (FULL,) * layers)


def _global_shape(
    text: Mapping[str, Any], family: str, layer_types: tuple[str, ...], head_dim: int
) -> tuple[int | None, int | None]:
    """(head_dim, kv_heads or None) of the full-attention layers when they differ from the rest.

    transformers (5.17 and later) writes them as per_layer_config {layer index: overrides}; older
    files (and the published Gemma 4 checkpoints) give global_head_dim (default 512) and
    num_global_key_value_heads, the latter used only when attention_k_eq_v is set.
    """
    per_layer = text.get("per_layer_config")
    if per_layer is not None:
        return _per_layer_global_shape(per_layer, layer_types, head_dim)
    if family == "gemma4":
        kv = text.get("num_global_key_value_heads") if text["attention_k_eq_v"] else None
        return int(text.get("global_head_dim", GEMMA4_GLOBAL_HEAD_DIM) or head_dim), _optional_int(kv)
    return _optional_int(text.get("global_head_dim")), _optional_int(text.get("num_global_key_value_heads"))


def _per_layer_global_shape(
    per_layer: Mapping[Any, Any], layer_types: tuple[str, ...], head_dim: int
) -> tuple[int, int | None]:
    """One (head_dim, kv_heads) for all global layers: refuses overrides that are not that."""
    by_index = {int(k): dict(v or {}) for k, v in per_layer.items()}
    if set(by_index) - set(range(len(layer_types))):
        raise HfConfigError(f"Gemma 4 per_layer_config names layers {sorted(by_index)} the model lacks")
    full = {i for i, kind in enumerate(layer_types) if kind == FULL}
    seen = {json.dumps(by_index.get(i, {}), sort_keys=True) for i in full}
    local = [i for i, o in by_index.items() if o and i not in full]
    if len(seen) > 1 or local:
        raise HfConfigError(
            "Gemma 4 per_layer_config must give every full-attention layer the same overrides and the "
            f"sliding layers none; got {per_layer}"
        )
    overrides = by_index.get(min(full), {}) if full else {}
    unknown = set(overrides) - _PER_LAYER_KEYS
    if unknown:
        raise HfConfigError(f"Gemma 4 per-layer overrides {sorted(unknown)} are not implemented")
    return int(overrides.get("head_dim") or head_dim), _optional_int(overrides.get("num_key_value_heads"))
