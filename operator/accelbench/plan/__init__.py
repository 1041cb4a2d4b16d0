"""Memory estimate and placement: the fewest chips that fit, topology -> hosts, price. No I/O.

`plan_for` is the one place a resource's kind picks its planner; the framework default (jax on
TPU, pytorch elsewhere) is resolved here and nowhere else.
"""

from ..api import FinetuneJob, InferenceBench
from ..api.payload import WorkerPlan
from ..catalog.types import Catalog
from .common import framework_for
from .finetune import plan_finetune
from .inference import plan_inference
from .memory import activation_bytes, finetune_memory, kv_cache_bytes, lora_adapter_parameters, serving_memory
from .types import MemoryEstimate, Plan, PlanError


def plan_for(resource: FinetuneJob | InferenceBench, catalog: Catalog) -> Plan:
    """The plan of either kind of resource."""
    if isinstance(resource, FinetuneJob):
        return plan_finetune(resource.spec, catalog)
    return plan_inference(resource.spec, catalog)


def local_worker_plan(
    resource: FinetuneJob | InferenceBench, catalog: Catalog
) -> tuple[WorkerPlan, str | None]:
    """The plan for a worker started outside the operator (`accelbench run`, a bare `--job FILE`).

    In a pod the payload always carries the operator's plan. A local run plans the same way; a
    spec the planner refuses (e.g. it would not fit the chips named) still runs here, on the spec's
    own framework and chip count, because a local run is where one tries such a spec out; the
    second value then says why there is no plan.
    """
    try:
        return plan_for(resource, catalog).worker_plan(), None
    except PlanError as exc:
        accel = catalog.get(resource.spec.accelerator.type.value)
        chips = resource.spec.accelerator.count or 1
        unplanned = WorkerPlan(
            accelerator=accel.name,
            framework=framework_for(getattr(resource.spec, "framework", None), accel),
            chips=chips,
            hosts=1,
            chips_per_host=chips,
            peak_tflops_per_chip=accel.serving_peak_tflops,
            dollars_per_chip_hour=0.0,
            price_source="unplanned local run",
        )
        return unplanned, f"no plan ({exc}); running with the spec alone"


__all__ = [
    "MemoryEstimate",
    "Plan",
    "PlanError",
    "activation_bytes",
    "finetune_memory",
    "kv_cache_bytes",
    "local_worker_plan",
    "lora_adapter_parameters",
    "plan_finetune",
    "plan_for",
    "plan_inference",
    "serving_memory",
]
