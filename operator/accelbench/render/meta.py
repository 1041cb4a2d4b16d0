"""Object metadata shared by every child: namespace, labels, the one place owner references are
built, and the metrics port and annotations of the pods that serve gauges."""

from __future__ import annotations

from typing import Any

from ..api import API_VERSION, Resource
from ..api.contract import (
    ANNOTATION_PATH,
    ANNOTATION_PORT,
    ANNOTATION_SCRAPE,
    METRICS_PATH,
    METRICS_PORT,
    METRICS_PORT_NAME,
)

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


def metrics_annotations(port: int = METRICS_PORT) -> dict[str, str]:
    """Where a pod's gauges are: the operator scrapes them into status.progress, and
    annotation-based Prometheus set-ups find the same gauges."""
    return {ANNOTATION_SCRAPE: "true", ANNOTATION_PORT: str(port), ANNOTATION_PATH: METRICS_PATH}


def metrics_port_entry(port: int = METRICS_PORT) -> dict[str, Any]:
    return {"name": METRICS_PORT_NAME, "containerPort": port, "protocol": "TCP"}
