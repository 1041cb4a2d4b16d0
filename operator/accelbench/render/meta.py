"""Object metadata shared by every child: namespace, labels, owner reference."""

from __future__ import annotations

from typing import Any

from ..api import API_VERSION, Resource

# Where children go when the parent carries no namespace (a manifest rendered before it is applied,
# e.g. by `accelbench render`); the in-cluster controller always sees a namespace.
DEFAULT_NAMESPACE = "default"


def namespace_of(resource: Resource) -> str:
    return resource.metadata.namespace or DEFAULT_NAMESPACE


def owner_references(resource: Resource) -> list[dict[str, Any]]:
    """The parent as controller owner, so deleting it cascades to every child.

    A parent that was never stored has no uid yet; an owner reference without one is invalid, so
    the preview renders none.
    """
    if not resource.metadata.uid:
        return []
    return [
        {
            "apiVersion": API_VERSION,
            "kind": resource.kind,
            "name": resource.metadata.name,
            "uid": resource.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def build_metadata(resource: Resource, name: str, labels: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace_of(resource), "labels": dict(labels)}
    owners = owner_references(resource)
    if owners:
        meta["ownerReferences"] = owners
    return meta


# The port a worker serves its Prometheus gauges on (container port named `metrics`), and the
# annotations that say so: the operator scrapes them into status.progress, and annotation-based
# Prometheus set-ups find the same gauges.
METRICS_PORT = 9090
METRICS_PORT_NAME = "metrics"
METRICS_PATH = "/metrics"
SCRAPE_ANNOTATION = "prometheus.io/scrape"
PORT_ANNOTATION = "prometheus.io/port"
PATH_ANNOTATION = "prometheus.io/path"


def metrics_annotations(port: int = METRICS_PORT) -> dict[str, str]:
    return {SCRAPE_ANNOTATION: "true", PORT_ANNOTATION: str(port), PATH_ANNOTATION: METRICS_PATH}


def metrics_port_entry(port: int = METRICS_PORT) -> dict[str, Any]:
    return {"name": METRICS_PORT_NAME, "containerPort": port, "protocol": "TCP"}
