"""Pure helpers around the children: plan and render them, keep Kueue's suspend, the plan as status,
and which pods belong to the run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..api import Resource
from ..api.contract import LABEL_KUEUE_QUEUE
from ..api.status import Children, PlanStatus
from ..catalog.types import Catalog
from ..plan import Plan, plan_for
from ..render import NetworkPolicies, Rendered, render
from .observe import pod_job_name

GB_PER_BYTE = 1 / 1e9  # plan bytes -> the GB the catalog states HBM in


def build_children(
    resource: Resource,
    catalog: Catalog,
    server_admitted: bool = False,
    network: NetworkPolicies | None = None,
) -> tuple[Plan, Rendered]:
    """Plan and render; PlanError and RenderError (ValueErrors) and KeyError (an unknown
    accelerator) mean a bad spec.

    `server_admitted` (InferenceBench): the live server Job runs, so a queued bench's client may too.
    `network`: the run's NetworkPolicies, when the operator renders them.
    """
    plan = plan_for(resource, catalog)
    return plan, render(resource, plan, catalog, server_admitted, network)


def leave_suspend_to_kueue(obj: Mapping[str, Any], live: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """spec.suspend of a Kueue-queued Job that already exists (`live`: the owned Jobs by name) is
    Kueue's to change, so a re-apply (a spec edit, a pass repeated after a status conflict) keeps it:

    - not admitted yet (live suspend true): apply `true` again. Leaving the field out would drop the
      operator's ownership of it, server-side apply would then remove it, and the Job would start
      without Kueue's admission;
    - admitted (live suspend false, now Kueue's field): leave it out; applying our rendered `true`
      with force would take the field back and stop a running Job.
    """
    child = dict(obj)
    labels = (child.get("metadata") or {}).get("labels") or {}
    existing = live.get(str((child.get("metadata") or {}).get("name")))
    if child.get("kind") == "Job" and LABEL_KUEUE_QUEUE in labels and existing is not None:
        spec = {k: v for k, v in (child.get("spec") or {}).items() if k != "suspend"}
        if (existing.get("spec") or {}).get("suspend") is True:
            spec["suspend"] = True
        child["spec"] = spec
    return child


def plan_status(plan: Plan) -> PlanStatus:
    """The plan as the user sees it in status.plan."""
    return PlanStatus(
        chips=plan.chips,
        hosts=plan.hosts,
        chips_per_host=plan.chips_per_host,
        topology=plan.topology,
        fsdp=plan.fsdp,
        tp=plan.tp,
        strategy=plan.strategy or None,
        memory_per_chip_gb=round(plan.memory.total * GB_PER_BYTE, 2),
        hbm_per_chip_gb=plan.hbm_per_chip_gb,
        framework=plan.framework,
    )


def accelerator_label(plan: Plan) -> str:
    """Short text for the printer column: `tpu-v5p 2x2x1` or `h100 x2`."""
    if plan.topology:
        return f"{plan.accelerator} {plan.topology}"
    return f"{plan.accelerator} x{plan.chips}"


def select_pods(pods: Iterable[Mapping[str, Any]], children: Children) -> list[Mapping[str, Any]]:
    """The pods of the reporting Job, plus the server's pods for a bench."""
    jobs = {name for name in (children.job, children.server) if name}
    return [pod for pod in pods if pod_job_name(pod) in jobs]
