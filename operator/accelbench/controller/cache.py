"""What the operator keeps in memory of each watched object, and how objects find their owner. Pure.

The indexes hold slim copies: the fields observation reads, not whole bodies (managedFields, env,
volumes and kubectl's last-applied copy made a Job and its Pod ~0.7 MiB of operator memory).

Ownership is by UID, never by name: a Job counts for a resource only when its controller
ownerReference carries that resource's UID, and a Pod only when its controller is such a Job. A
same-named Job left by a deleted and re-created resource, or a pod that copies a worker's labels,
is never observed as this run's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api.contract import ANNOTATION_PATH, ANNOTATION_PORT, COMPLETION_INDEX_KEY, LABEL_KIND, LABEL_NAME
from .manifest import LAST_APPLIED_ANNOTATION

ResourceKey = tuple[str, str, str]  # kind, namespace, name

JOB_SPEC_FIELDS = ("suspend", "completions", "parallelism", "completionMode", "activeDeadlineSeconds")
POD_ANNOTATIONS = (ANNOTATION_PORT, ANNOTATION_PATH, COMPLETION_INDEX_KEY)
META_FIELDS = (
    "name",
    "namespace",
    "uid",
    "labels",
    "ownerReferences",
    "creationTimestamp",
    "deletionTimestamp",
)


def _meta(body: Mapping[str, Any], annotations: tuple[str, ...] = ()) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    slim = {k: meta[k] for k in META_FIELDS if k in meta}
    kept = {k: v for k, v in (meta.get("annotations") or {}).items() if k in annotations}
    if kept:
        slim["annotations"] = kept
    return slim


def slim_job(body: Mapping[str, Any]) -> dict[str, Any]:
    spec = body.get("spec") or {}
    return {
        "metadata": _meta(body),
        "spec": {k: spec[k] for k in JOB_SPEC_FIELDS if k in spec},
        "status": dict(body.get("status") or {}),
    }


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    spec = body.get("spec") or {}
    containers = [
        {"name": c.get("name"), "ports": c.get("ports") or []} for c in spec.get("containers") or []
    ]
    slim_spec: dict[str, Any] = {"containers": containers}
    if spec.get("nodeName"):
        slim_spec["nodeName"] = spec["nodeName"]
    return {
        "metadata": _meta(body, POD_ANNOTATIONS),
        "spec": slim_spec,
        "status": dict(body.get("status") or {}),
    }


def slim_resource(body: Mapping[str, Any]) -> dict[str, Any]:
    """A FinetuneJob/InferenceBench without managedFields and kubectl's copy of the manifest."""
    meta = dict(body.get("metadata") or {})
    meta.pop("managedFields", None)
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED_ANNOTATION}
    if annotations or "annotations" in meta:
        meta["annotations"] = annotations
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": meta,
        "spec": dict(body.get("spec") or {}),
        "status": dict(body.get("status") or {}),
    }


def controller_of(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with controller: true, if any."""
    refs = (body.get("metadata") or {}).get("ownerReferences") or []
    return next((ref for ref in refs if ref.get("controller")), None)


def controller_uid(body: Mapping[str, Any], kinds: frozenset[str]) -> str | None:
    ref = controller_of(body)
    return str(ref["uid"]) if ref is not None and ref.get("kind") in kinds and ref.get("uid") else None


def is_controlled_by(body: Mapping[str, Any], uid: str | None) -> bool:
    ref = controller_of(body)
    return uid is not None and ref is not None and ref.get("uid") == uid


def job_owner_key(job: Mapping[str, Any], kinds: frozenset[str]) -> ResourceKey | None:
    """The resource a Job event should wake: its controller, when that is one of our kinds."""
    ref = controller_of(job)
    namespace = (job.get("metadata") or {}).get("namespace")
    if ref is None or ref.get("kind") not in kinds or not namespace:
        return None
    return (str(ref["kind"]), str(namespace), str(ref.get("name")))


def pod_owner_key(pod: Mapping[str, Any], kinds: frozenset[str]) -> ResourceKey | None:
    """The resource a Pod event should wake, from the labels the renderer puts on pod templates.
    (Waking is cheap and harmless; what a pass then reads is filtered by UID.)"""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    kind, name = labels.get(LABEL_KIND), labels.get(LABEL_NAME)
    if kind not in kinds or not name or not meta.get("namespace"):
        return None
    return (str(kind), str(meta["namespace"]), str(name))
