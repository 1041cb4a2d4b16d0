"""Pure helpers around the rendered children: ownership, which child is which, the plan as status."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from accelbench.api.status import Children, PlanStatus

NAME_LABEL = "accelbench.io/name"
ROLE_LABEL = "accelbench.io/role"
KIND_LABEL = "accelbench.io/kind"

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SERVER_KINDS = frozenset({"Deployment", "StatefulSet", "LeaderWorkerSet"})
GIB_PER_BYTE = 1 / 1e9  # plan bytes -> the GB the catalog states HBM in


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """A controller reference so deleting the resource deletes its children (and kopf sees the link)."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `obj` in the owner's namespace with the owner's controller reference (exactly once)."""
    child = copy.deepcopy(dict(obj))
    meta = child.setdefault("metadata", {})
    meta.setdefault("namespace", owner["metadata"].get("namespace"))
    ref = owner_reference(owner)
    refs = [r for r in meta.get("ownerReferences") or () if r.get("uid") != ref["uid"]]
    meta["ownerReferences"] = [*refs, ref]
    return child


def leave_suspend_to_kueue(obj: Mapping[str, Any], existing: Iterable[str]) -> dict[str, Any]:
    """Drop spec.suspend from a Kueue-queued Job that already exists.

    Kueue flips suspend to false on admission; re-applying our rendered `suspend: true` with force (on
    an operator restart or a spec edit) would take the field back and stop a running Job.
    """
    child = dict(obj)
    labels = (child.get("metadata") or {}).get("labels") or {}
    name = (child.get("metadata") or {}).get("name")
    if child.get("kind") == "Job" and KUEUE_QUEUE_LABEL in labels and name in set(existing):
        child["spec"] = {k: v for k, v in (child.get("spec") or {}).items() if k != "suspend"}
    return child


def _role(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    role = (meta.get("labels") or {}).get(ROLE_LABEL)
    if role:
        return str(role)
    name = str(meta.get("name", ""))
    return name.rsplit("-", 1)[-1] if "-" in name else ""


def children_of(objs: Iterable[Mapping[str, Any]]) -> Children:
    """Which rendered object plays which part. `job` is always the Job whose rank 0 writes the report:
    the training Job, or the bench client Job."""
    found: dict[str, str] = {}
    for obj in objs:
        kind = obj.get("kind")
        name = str((obj.get("metadata") or {}).get("name", ""))
        role = _role(obj)
        if kind == "ConfigMap":
            found.setdefault("results_config_map", name)
        elif kind == "Service":
            found.setdefault("service", name)
        elif kind in SERVER_KINDS or (kind == "Job" and role == "server"):
            found.setdefault("server", name)
        elif kind == "Job" and role == "client":
            found["client"] = name
            found["job"] = name
        elif kind == "Job":
            found.setdefault("job", name)
    return Children(**found)


def plan_status(plan: Any) -> PlanStatus:
    """The plan (plan.types.Plan) as the user sees it in status.plan."""
    return PlanStatus(
        chips=plan.chips,
        hosts=plan.hosts,
        chips_per_host=plan.chips_per_host,
        topology=plan.topology,
        fsdp=plan.fsdp,
        tp=plan.tp,
        memory_per_chip_gb=round(plan.memory.total * GIB_PER_BYTE, 2),
        hbm_per_chip_gb=plan.hbm_per_chip_gb,
        framework=plan.framework,
    )


def accelerator_label(plan: Any) -> str:
    """Short text for the printer column: `tpu-v5p 2x2x1` or `h100 x2`."""
    if plan.topology:
        return f"{plan.accelerator} {plan.topology}"
    return f"{plan.accelerator} x{plan.chips}"


def job_name_of(pod: Mapping[str, Any]) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")


def select_pods(pods: Iterable[Mapping[str, Any]], children: Children) -> list[Mapping[str, Any]]:
    """The pods of the report Job, plus the server's pods (named `<server>-<hash>...`) for a bench."""
    selected = []
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name", ""))
        of_job = bool(children.job) and job_name_of(pod) == children.job
        of_server = bool(children.server) and name.startswith(f"{children.server}-")
        if of_job or of_server:
            selected.append(pod)
    return selected
