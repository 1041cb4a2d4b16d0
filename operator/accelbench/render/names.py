"""Deterministic child names and labels.

Every child name is derived from the parent's name alone, so an operator that restarts finds the
objects it created before instead of creating a second set. The parent name is at most 52
characters (api.resources.ObjectMeta), which keeps `<name>-train-<index>` (the pod hostname of an
Indexed Job) within the 63-character DNS label limit.
"""

from __future__ import annotations

from ..api import Resource
from ..api.contract import (
    APP_NAME,
    LABEL_ACCELERATOR,
    LABEL_APP_NAME,
    LABEL_CAMPAIGN,
    LABEL_CELL,
    LABEL_INSTANCE,
    LABEL_KIND,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_ROLE,
    MANAGED_BY,
    Role,
)
from ..api.status import Children


def train_job_name(name: str) -> str:
    return f"{name}-train"


def train_service_name(name: str) -> str:
    # Same name as the Job: the pods' DNS names then read `<name>-train-<i>.<name>-train`.
    return f"{name}-train"


def server_name(name: str) -> str:
    return f"{name}-server"


def server_service_name(name: str) -> str:
    return f"{name}-server"


def client_job_name(name: str) -> str:
    return f"{name}-client"


def client_service_account_name(name: str) -> str:
    # Also the name of the Role and RoleBinding that let the client write its results ConfigMap.
    return f"{name}-client"


def train_service_account_name(name: str) -> str:
    # Also the name of the Role and RoleBinding that let rank 0 write its results ConfigMap.
    return f"{name}-train"


def results_config_map_name(name: str) -> str:
    return f"{name}-results"


def selector_labels(kind: str, name: str, role: Role) -> dict[str, str]:
    """The labels a Service selects on: stable for the life of the parent, unique per role."""
    return {LABEL_INSTANCE: name, LABEL_KIND: kind, LABEL_ROLE: role.value}


# The parent's labels every child carries too: a campaign's runs are selectable as a whole at every
# level (`kubectl get jobs,pods -l accelbench.io/campaign=NAME`), and the PodMonitor copies them
# onto each scraped series.
INHERITED_LABELS = (LABEL_CAMPAIGN, LABEL_CELL)


def labels(resource: Resource, role: Role, accelerator: str) -> dict[str, str]:
    """Labels on every child object and pod template."""
    name = resource.metadata.name
    inherited = {k: v for k in INHERITED_LABELS if (v := (resource.metadata.labels or {}).get(k))}
    return {
        LABEL_APP_NAME: APP_NAME,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_INSTANCE: name,
        LABEL_KIND: resource.kind,
        LABEL_NAME: name,
        LABEL_ROLE: role.value,
        LABEL_ACCELERATOR: accelerator,
        **inherited,
    }


def finetune_children(name: str, multi_host: bool) -> Children:
    """What status.children shows for a FinetuneJob. `job` is the Job whose rank 0 reports."""
    return Children(
        job=train_job_name(name),
        service=train_service_name(name) if multi_host else None,
        results_config_map=results_config_map_name(name),
    )


def inference_children(name: str, external: bool) -> Children:
    """What status.children shows for an InferenceBench (no server objects for an external endpoint).
    The client Job is the one that reports."""
    return Children(
        job=client_job_name(name),
        server=None if external else server_name(name),
        service=None if external else server_service_name(name),
        client=client_job_name(name),
        results_config_map=results_config_map_name(name),
    )
