"""Pure functions: (resource, plan, catalog) -> Kubernetes objects as plain dicts. No I/O."""

from __future__ import annotations

from typing import Any

from ..api import FinetuneJob, InferenceBench, Resource
from ..catalog.types import Catalog
from ..plan.types import Plan
from .errors import RenderError
from .finetune import EXIT_ERROR, EXIT_INVALID_CONFIG, EXIT_OK, render_finetune
from .inference import render_inference
from .names import (
    Role,
    client_job_name,
    client_service_account_name,
    finetune_children,
    inference_children,
    labels,
    results_config_map_name,
    selector_labels,
    server_name,
    server_service_name,
    train_job_name,
    train_service_name,
)
from .payload import JOB_ENV, build_job_payload, job_payload_json


def render(resource: Resource, plan: Plan, catalog: Catalog) -> list[dict[str, Any]]:
    """Every child object of `resource`, in the order to apply them."""
    if isinstance(resource, FinetuneJob):
        return render_finetune(resource, plan, catalog)
    if isinstance(resource, InferenceBench):
        return render_inference(resource, plan, catalog)
    raise TypeError(f"cannot render {type(resource).__name__}")


__all__ = [
    "EXIT_ERROR",
    "EXIT_INVALID_CONFIG",
    "EXIT_OK",
    "JOB_ENV",
    "RenderError",
    "Role",
    "build_job_payload",
    "client_job_name",
    "client_service_account_name",
    "finetune_children",
    "inference_children",
    "job_payload_json",
    "labels",
    "render",
    "render_finetune",
    "render_inference",
    "results_config_map_name",
    "selector_labels",
    "server_name",
    "server_service_name",
    "train_job_name",
    "train_service_name",
]
