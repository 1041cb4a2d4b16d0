"""Pure functions: (resource, plan, catalog) -> Kubernetes objects as plain dicts. No I/O.

`render` is the one place a resource's kind picks its renderer. It returns the objects together
with the record of what they are (status.children: which Job reports, which is the server, the
client, the Service and the results ConfigMap), so the controller never re-derives roles from names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api import FinetuneJob, InferenceBench, Resource
from ..api.inference import Engine
from ..api.status import Children
from ..catalog.types import Catalog
from ..plan.types import Plan
from .errors import RenderError
from .finetune import render_finetune
from .inference import render_inference
from .names import finetune_children, inference_children
from .network import NetworkPolicies, build_network_policies
from .payload import build_job_payload, job_payload_json


@dataclass(frozen=True)
class Rendered:
    objects: list[dict[str, Any]]  # in the order to apply them
    children: Children  # which object plays which part (status.children)


def render(
    resource: Resource,
    plan: Plan,
    catalog: Catalog,
    server_admitted: bool = False,
    network: NetworkPolicies | None = None,
) -> Rendered:
    """Every child of `resource` and the record of them.

    `server_admitted` (InferenceBench): the live server Job runs (Kueue admitted it), so a queued
    bench's client may start too. `network`: the run's NetworkPolicies go first (render/network.py),
    so no pod of the run starts open.
    """
    policies = build_network_policies(resource, plan.accelerator, network)
    if isinstance(resource, FinetuneJob):
        children = finetune_children(resource.metadata.name, plan.multi_host)
        return Rendered([*policies, *render_finetune(resource, plan, catalog)], children)
    if isinstance(resource, InferenceBench):
        external = resource.spec.server.engine == Engine.EXTERNAL
        children = inference_children(resource.metadata.name, external)
        objects = render_inference(resource, plan, catalog, server_admitted)
        return Rendered([*policies, *objects], children)
    raise TypeError(f"cannot render {type(resource).__name__}")


__all__ = [
    "NetworkPolicies",
    "RenderError",
    "Rendered",
    "build_job_payload",
    "job_payload_json",
    "render",
    "render_finetune",
    "render_inference",
]
