"""Small helpers both planners share: lookups that raise PlanError, the fit rule, labels."""

from __future__ import annotations

import re

from ..api.common import ModelSource
from ..api.finetune import Framework
from ..catalog import AcceleratorSpec, Catalog, CatalogError, ModelShape, resolve_model_shape
from .memory import GB
from .placement import Placement
from .types import MemoryEstimate, PlanError

# Plan to at most 90 % of HBM: allocators fragment, and compilers and kernels grab workspace the
# estimate does not model. A plan that needs the last 10 % tends to OOM on the first long batch.
HBM_FRACTION = 0.9


def accelerator(catalog: Catalog, name: str) -> AcceleratorSpec:
    try:
        return catalog.get(name)
    except KeyError as exc:
        raise PlanError(str(exc.args[0])) from None


def model_shape(model: ModelSource) -> ModelShape:
    try:
        return resolve_model_shape(model)
    except CatalogError as exc:
        raise PlanError(str(exc)) from None


def framework_for(framework: Framework | None, accel: AcceleratorSpec) -> str:
    """The spec's framework, else the accelerator's default (jax on TPU, pytorch elsewhere)."""
    return framework.value if framework is not None else accel.default_framework


def usable_bytes(accel: AcceleratorSpec) -> float:
    return accel.hbm_gb * GB * HBM_FRACTION


def fits(memory: MemoryEstimate, accel: AcceleratorSpec) -> bool:
    return memory.total <= usable_bytes(accel)


def chip_label(accel: AcceleratorSpec) -> str:
    """'H100 80 GB', 'TPU v5p 95 GB': the chip as a user names it, with its memory."""
    name = accel.display_name.split(" (")[0]
    name = re.sub(r"^(NVIDIA|Intel) ", "", name)
    name = re.sub(r" \d+GB$", "", name)
    return f"{name} {accel.hbm_gb:g} GB"


def gb(value: float) -> str:
    return f"{value / GB:.0f}" if value >= 10 * GB else f"{value / GB:.1f}"


def amount(placement: Placement, accel: AcceleratorSpec) -> str:
    """'4 x H100 80 GB' or 'a TPU v5p 95 GB slice 2x2x2 (8 chips)'."""
    if placement.topology:
        return f"a {chip_label(accel)} slice {placement.describe()}"
    return f"{placement.chips} x {chip_label(accel)}"
