"""Accelerators, prices and model shapes as package data, behind a typed loader.

The catalog reads nothing but its own data files; price overrides arrive as data (the controller
reads the ConfigMap and passes its `data` here), so every function stays pure and testable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from pydantic import ValidationError

from ..api.common import MAX_DOLLARS_PER_CHIP_HOUR, MAX_PARAMETERS, ModelSource
from .types import (
    AcceleratorSpec,
    Catalog,
    CatalogError,
    ModelCatalog,
    ModelShape,
    Price,
    TpuTopology,
)

__all__ = [
    "PRICES_KEY",
    "AcceleratorSpec",
    "Catalog",
    "CatalogError",
    "ModelCatalog",
    "ModelShape",
    "Price",
    "TpuTopology",
    "count_decoder_parameters",
    "load_catalog",
    "load_model_catalog",
    "model_shape",
    "parse_image_overrides",
    "parse_price_overrides",
    "parse_size",
    "projection_dims",
    "resolve_model_shape",
]

PRICES_KEY = "prices.yaml"  # the ConfigMap key that holds the price book overrides
_PRICE_FIELDS = {"onDemand": "on_demand", "spot": "spot", "source": "source", "date": "date"}


def _read_data(name: str) -> Any:
    text = resources.files(__name__).joinpath("data", name).read_text(encoding="utf-8")
    return yaml.safe_load(text)


@lru_cache(maxsize=1)
def _base_catalog() -> Catalog:
    raw = _read_data("accelerators.yaml")
    # The YAML is keyed by name; the model carries the name too so a spec is self-describing.
    accelerators = {name: {"name": name, **body} for name, body in raw["accelerators"].items()}
    return Catalog.model_validate({"accelerators": accelerators})


@lru_cache(maxsize=1)
def load_model_catalog() -> ModelCatalog:
    raw = _read_data("models.yaml")
    families = {
        family: {
            str(size).lower(): {"family": family, "size": str(size).lower(), **body}
            for size, body in sizes.items()
        }
        for family, sizes in raw["families"].items()
    }
    return ModelCatalog.model_validate({"families": families})


def load_catalog(
    price_overrides: Mapping[str, Any] | None = None,
    image_overrides: Mapping[str, Mapping[str, str]] | None = None,
) -> Catalog:
    """The accelerator catalog, with `price_overrides` (from parse_price_overrides) applied on top.

    An override replaces only the fields it gives; one for an accelerator the catalog does not
    know raises CatalogError, because a typo there would silently leave the list price in place.
    """
    base = _base_catalog()
    if not price_overrides and not image_overrides:
        return base
    accelerators = dict(base.accelerators)
    for name, images in (image_overrides or {}).items():
        if name not in accelerators:
            raise CatalogError(
                f"image override for unknown accelerator {name!r}; known: {', '.join(accelerators)}"
            )
        spec = accelerators[name]
        merged = spec.images.model_copy(update=dict(images))
        accelerators[name] = spec.model_copy(update={"images": merged})
    for name, fields in (price_overrides or {}).items():
        if name not in accelerators:
            raise CatalogError(
                f"price override for unknown accelerator {name!r}; known: {', '.join(accelerators)}"
            )
        spec = accelerators[name]
        accelerators[name] = spec.model_copy(update={"price": _merge_price(spec.price, fields)})
    return Catalog(accelerators=accelerators)


def _merge_price(price: Price, fields: Mapping[str, Any]) -> Price:
    data = price.model_dump() | {k: v for k, v in fields.items() if v is not None or k == "spot"}
    if "source" not in fields:
        # A changed figure must not keep pointing at the catalog's page for its origin.
        data["source"] = "price override (no source given)"
    try:
        return Price.model_validate(data)
    except ValidationError as exc:
        raise CatalogError(f"price override is invalid: {exc.errors()[0]['msg']}") from None


IMAGES_KEY = "images.yaml"
_IMAGE_ROLES = ("jax", "pytorch", "bench", "vllm", "tgi", "jetstream", "transformers")


def parse_image_overrides(configmap_data: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The optional `images.yaml` key of the same ConfigMap -> {accelerator: {role: image}}.

    Default worker and engine images per accelerator (e.g. a mirror in a private registry);
    a resource's own spec.image / spec.server.image / spec.clientImage still wins.
    """
    text = configmap_data.get(IMAGES_KEY)
    if not text:
        return {}
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{IMAGES_KEY} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise ValueError(f"{IMAGES_KEY} must map accelerator names to images, got {type(doc).__name__}")
    out: dict[str, dict[str, str]] = {}
    for name, entry in doc.items():
        if not isinstance(entry, Mapping):
            raise ValueError(f"{IMAGES_KEY}: {name} must map roles ({', '.join(_IMAGE_ROLES)}) to images")
        unknown = sorted(set(map(str, entry)) - set(_IMAGE_ROLES))
        if unknown:
            raise ValueError(
                f"{IMAGES_KEY}: {name} has unknown roles {unknown}; allowed: {list(_IMAGE_ROLES)}"
            )
        if not all(isinstance(v, str) and v for v in entry.values()):
            raise ValueError(f"{IMAGES_KEY}: {name}: every image must be a non-empty string")
        out[str(name)] = {str(k): str(v) for k, v in entry.items()}
    return out


def parse_price_overrides(configmap_data: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """A prices ConfigMap's `data` -> {accelerator: {on_demand, spot, source, date}} (given fields only).

    The ConfigMap holds one key, `prices.yaml`, e.g. `{h100: {onDemand: 11.06, spot: 3.5,
    source: "...", date: "2026-12-01"}}`. Anything else raises ValueError saying what is wrong.
    """
    if not isinstance(configmap_data, Mapping):
        raise ValueError("price ConfigMap data must be a mapping of keys to strings")
    text = configmap_data.get(PRICES_KEY)
    if text is None:
        raise ValueError(f"price ConfigMap has no {PRICES_KEY!r} key (keys: {sorted(configmap_data)})")
    if not isinstance(text, str):
        raise ValueError(f"{PRICES_KEY} must be a string of YAML")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{PRICES_KEY} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise ValueError(f"{PRICES_KEY} must map accelerator names to prices, got {type(doc).__name__}")
    return {str(name): _parse_price_entry(str(name), entry) for name, entry in doc.items()}


def _parse_price_entry(name: str, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{PRICES_KEY}: {name} must be a mapping with onDemand, spot, source, date")
    unknown = sorted(set(map(str, entry)) - set(_PRICE_FIELDS))
    if unknown:
        raise ValueError(f"{PRICES_KEY}: {name} has unknown fields {unknown}; allowed: {list(_PRICE_FIELDS)}")
    if not entry:
        raise ValueError(f"{PRICES_KEY}: {name} sets no field")
    out: dict[str, Any] = {}
    for wire, field in _PRICE_FIELDS.items():
        if wire not in entry:
            continue
        value = entry[wire]
        if field in ("on_demand", "spot"):
            out[field] = _dollars(name, wire, value)
        else:
            # YAML reads an unquoted 2026-12-01 as a date; keep it as the ISO text.
            out[field] = str(value)
    return out


def _dollars(name: str, wire: str, value: Any) -> float | None:
    if value is None and wire == "spot":
        return None
    # bool is an int subclass: `onDemand: yes` must not become $1.
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_DOLLARS_PER_CHIP_HOUR
    ):
        raise ValueError(
            f"{PRICES_KEY}: {name}.{wire} must be a number of $/chip-hour from 0 to "
            f"{MAX_DOLLARS_PER_CHIP_HOUR:g}, got {value!r}"
        )
    return float(value)


# ---------------------------------------------------------------- model shapes


def parse_size(size: str) -> int:
    """'31b' -> 31_000_000_000, '270m' -> 270_000_000, '0.5b' -> 500_000_000."""
    text = size.strip().lower()
    scale = {"m": 1_000_000, "b": 1_000_000_000}.get(text[-1:])
    try:
        number = float(text[:-1])
    except ValueError:
        number = -1.0
    if scale is None or not 0 < number * (scale or 0) <= MAX_PARAMETERS:  # also inf from 400 digits
        raise CatalogError(f"model size {size!r} is not a count such as 31b or 270m")
    return round(number * scale)


def model_shape(family: str, size: str) -> ModelShape:
    """Catalog lookup; CatalogError lists the sizes the family has."""
    sizes = load_model_catalog().families.get(family, {})
    shape = sizes.get(size.lower())
    if shape is None:
        known = ", ".join(sizes) or "none"
        raise CatalogError(f"model {family}-{size} is not in the catalog (known sizes: {known})")
    return shape


def resolve_model_shape(model: ModelSource) -> ModelShape:
    """The shape of `model`: catalog entry for family+size, else a generic shape from the count.

    `model.parameters` overrides the catalog's parameter count (the shape stays). A size the
    catalog does not have, or none at all, gets a shape derived from the count, marked approximate.
    """
    family = model.family.value
    size = model.size.lower() if model.size else None
    sizes = load_model_catalog().families.get(family, {})
    if size is not None and size in sizes:
        shape = sizes[size]
        if model.parameters is not None and model.parameters != shape.parameters:
            shape = shape.model_copy(update={"parameters": model.parameters})
        return shape
    if model.parameters is None and size is None:
        raise CatalogError(f"model {family} needs a size or a parameter count to be planned")
    count = model.parameters if model.parameters is not None else parse_size(size or "")
    template = _largest(sizes)
    return derive_shape(family, size or _size_label(count), count, template)


def _largest(sizes: Mapping[str, ModelShape]) -> ModelShape | None:
    real = [s for key, s in sizes.items() if key != "tiny"]
    return max(real, key=lambda s: s.parameters, default=None)


def _size_label(count: int) -> str:
    return f"{count / 1e9:.3g}b" if count >= 1e9 else f"{count / 1e6:.3g}m"


def derive_shape(family: str, size: str, parameters: int, template: ModelShape | None = None) -> ModelShape:
    """A generic decoder shape with about `parameters` parameters, for sizes the catalog lacks.

    Keeps the family's vocabulary, head size and attention pattern (from `template`) and grows a
    Llama-like body: hidden = 128 x layers (the aspect of mid-size open models), a quarter as many
    KV heads as query heads, and a gated MLP of 8/3 x hidden. Takes the fewest layers whose count
    reaches `parameters`; memory then uses `parameters` itself, so only activations and the KV cache
    depend on the guessed shape.
    """
    vocab = template.vocab if template else 128_256
    head_dim = template.head_dim if template else 128
    tied = template.tied_embeddings if template else False
    shape: ModelShape | None = None
    for layers in range(1, 257):
        hidden = max(head_dim, _round_up(128 * layers, head_dim))
        heads = hidden // head_dim
        shape = ModelShape(
            family=family,
            size=size,
            reference="derived from the parameter count",
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=max(1, heads // 4),
            head_dim=head_dim,
            intermediate=_round_up(hidden * 8 // 3, 256),
            vocab=vocab,
            tied_embeddings=tied,
            sliding_window=template.sliding_window if template else None,
            local_per_global=template.local_per_global if template else None,
            parameters=parameters,
            approximate=True,
            note=f"{family}-{size} is not in the catalog: generic shape for {parameters:,} parameters",
        )
        if count_decoder_parameters(shape) >= parameters:
            break
    assert shape is not None
    return shape


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def count_decoder_parameters(shape: ModelShape) -> int:
    """Weights of the decoder from its shape: embeddings, attention and gated-MLP projections.

    Norm weights and biases are left out (well under 0.1 % for these models).
    """
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied_embeddings else 2)
    layers = sum(_layer_parameters(shape, shape.is_global_layer(i)) for i in range(shape.layers))
    return embeddings + layers


def _layer_parameters(shape: ModelShape, global_layer: bool) -> int:
    return sum(fan_in * fan_out for fan_in, fan_out in projection_dims(shape, global_layer).values())


def projection_dims(shape: ModelShape, global_layer: bool) -> dict[str, tuple[int, int]]:
    """(in, out) features of every linear projection in one layer, by Hugging Face module name."""
    kv_heads, head_dim = shape.layer_heads(global_layer)
    q_out = shape.heads * head_dim
    kv_out = kv_heads * head_dim
    dims = {
        "q_proj": (shape.hidden, q_out),
        "k_proj": (shape.hidden, kv_out),
        "v_proj": (shape.hidden, kv_out),
        "o_proj": (q_out, shape.hidden),
        "gate_proj": (shape.hidden, shape.intermediate),
        "up_proj": (shape.hidden, shape.intermediate),
        "down_proj": (shape.intermediate, shape.hidden),
    }
    if global_layer and shape.attention_k_eq_v:
        # Keys double as values in these layers, so there is no V weight to load or adapt.
        del dims["v_proj"]
    return dims
