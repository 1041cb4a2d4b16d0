"""Deterministic child names and labels.

Every child name is derived from the parent's name alone, so an operator that restarts finds the
objects it created before instead of creating a second set. The parent name is at most 52
characters (api.resources.ObjectMeta), which keeps `<name>-train-<index>` (the pod hostname of an
Indexed Job) within the 63-character DNS label limit.
"""

from __future__ import annotations

from enum import StrEnum

from ..api.status import Children

APP_NAME = "accelbench"
MANAGED_BY = "accelbench-operator"

LABEL_APP_NAME = "app.kubernetes.io/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_KIND = "accelbench.io/kind"
LABEL_NAME = "accelbench.io/name"
LABEL_ROLE = "accelbench.io/role"
LABEL_ACCELERATOR = "accelbench.io/accelerator"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"


class Role(StrEnum):
    TRAIN = "train"
    SERVER = "server"
    CLIENT = "client"


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


def results_config_map_name(name: str) -> str:
    return f"{name}-results"


def selector_labels(kind: str, name: str, role: Role) -> dict[str, str]:
    """The labels a Service selects on: stable for the life of the parent, unique per role."""
    return {LABEL_INSTANCE: name, LABEL_KIND: kind, LABEL_ROLE: role.value}


def labels(kind: str, name: str, role: Role, accelerator: str) -> dict[str, str]:
    """Labels on every child object and pod template."""
    return {
        LABEL_APP_NAME: APP_NAME,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_INSTANCE: name,
        LABEL_KIND: kind,
        LABEL_NAME: name,
        LABEL_ROLE: role.value,
        LABEL_ACCELERATOR: accelerator,
    }


def finetune_children(name: str, multi_host: bool) -> Children:
    """What status.children shows for a FinetuneJob."""
    return Children(job=train_job_name(name), service=train_service_name(name) if multi_host else None)


def inference_children(name: str, external: bool) -> Children:
    """What status.children shows for an InferenceBench (no server objects for an external endpoint)."""
    return Children(
        server=None if external else server_name(name),
        service=None if external else server_service_name(name),
        client=client_job_name(name),
        results_config_map=results_config_map_name(name),
    )
