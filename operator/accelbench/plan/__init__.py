"""Memory estimate and placement: the fewest chips that fit, topology -> hosts, price. No I/O."""

from ..api import FinetuneJob, InferenceBench
from ..catalog.types import Catalog
from .finetune import plan_finetune
from .inference import plan_inference
from .memory import activation_bytes, finetune_memory, kv_cache_bytes, lora_adapter_parameters, serving_memory
from .types import MemoryEstimate, Plan, PlanError
from .validate import validate_against_catalog


def plan_for(resource: FinetuneJob | InferenceBench, catalog: Catalog) -> Plan:
    """The plan of either kind of resource."""
    if isinstance(resource, FinetuneJob):
        return plan_finetune(resource.spec, catalog)
    return plan_inference(resource.spec, catalog)


__all__ = [
    "MemoryEstimate",
    "Plan",
    "PlanError",
    "activation_bytes",
    "finetune_memory",
    "kv_cache_bytes",
    "lora_adapter_parameters",
    "plan_finetune",
    "plan_for",
    "plan_inference",
    "serving_memory",
    "validate_against_catalog",
]
