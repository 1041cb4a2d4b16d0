"""Thin Kubernetes I/O: server-side apply of children, reads by label, the price ConfigMap, deletes.

Requests go through kubeapi (the connection's TLS and credentials, one keep-alive pool); bodies
stay plain camelCase dicts, the same shape render/ produces and observe/ reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from ..api.contract import MANAGED_BY
from ..kubeapi import ApiError, Connection, KubeHTTP, load_connection
from ..kubeapi.http import MERGE_PATCH
from .ratelimit import TokenBucket, retry_after_seconds

log = logging.getLogger(__name__)

FIELD_MANAGER = MANAGED_BY  # server-side apply owner of every field the operator renders
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"  # JSON is YAML, so a JSON body is fine

# Plurals of the kinds the renderer emits; anything else is refused rather than guessed.
PLURALS: dict[str, str] = {
    "Job": "jobs",
    "Service": "services",
    "ConfigMap": "configmaps",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "NetworkPolicy": "networkpolicies",
    "FinetuneJob": "finetunejobs",
    "InferenceBench": "inferencebenches",
    "BenchCampaign": "benchcampaigns",
    "Event": "events",
    "Lease": "leases",
}
# create_many's threads, shared by every pass: as many as the workers that may create at once, so
# spreading a run's creates never queues them behind another run's.
PARALLEL_CREATES = 32
TOO_MANY_REQUESTS = 429


def resource_path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    """REST path of a namespaced kind: /api/v1/... for the core group, /apis/<group>/<v>/... otherwise."""
    plural = PLURALS.get(kind)
    if plural is None:
        raise ValueError(f"kind {kind!r} is not one the operator manages")
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{quote(namespace, safe='')}/{plural}" if namespace else f"{prefix}/{plural}"
    return f"{path}/{quote(name, safe='')}" if name else path


def _error_of(call: Callable[[Mapping[str, Any]], Any], obj: Mapping[str, Any]) -> Exception | None:
    try:
        call(obj)
    except Exception as exc:  # handed to the caller, which decides what each error means
        return exc
    return None


class Kube:
    """The operator's only client. Every method is one request (plus paging for lists), each taking
    a token from `limiter` first when there is one (ratelimit.py)."""

    def __init__(
        self,
        connection: Connection | None = None,
        limiter: TokenBucket | None = None,
        on_response: Callable[[str, int], None] | None = None,
        connections: int | None = None,
    ) -> None:
        """`connection`: where and as whom (kubeapi.load_connection() when None, at the first
        request). `connections`: keep-alive connections kept open to the apiserver; as many as
        threads call at once, so a burst of creates never opens and drops TLS connections."""
        self._connection = connection
        self._connections = connections or 10
        self._http: KubeHTTP | None = None
        self.limiter = limiter
        self.on_response = on_response  # (method, status): the request counter
        self._creators: ThreadPoolExecutor | None = None

    @property
    def http(self) -> KubeHTTP:
        if self._http is None:
            self._http = KubeHTTP(self._connection or load_connection(), self._connections)
        return self._http

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        if self.limiter is not None:
            self.limiter.acquire()
        response = self.http.request(
            method, path, query=query, body=body, content_type=content_type, timeout=timeout
        )
        if self.on_response is not None:
            self.on_response(method, response.status)
        if response.status == TOO_MANY_REQUESTS and self.limiter is not None:
            self.limiter.pause(retry_after_seconds(response.headers.get("Retry-After")))
        return response.raise_for_status().json()

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply with force: the operator owns every field it renders, and nothing else."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        return self._call("PATCH", path, query=query, body=dict(obj), content_type=APPLY_CONTENT_TYPE)

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POST: fails with 409 when anything holds the name, so nothing of anyone else is touched."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        return self._call("POST", path, query=[("fieldManager", FIELD_MANAGER)], body=dict(obj))

    def create_many(self, objs: Sequence[Mapping[str, Any]]) -> list[Exception | None]:
        """POST objects that do not depend on one another all at once: one round trip for a run's
        ServiceAccount, Role, RoleBinding and ConfigMap instead of one each. Per object, the error
        its create raised, or None when it was created."""
        if len(objs) <= 1:
            return [_error_of(self.create, obj) for obj in objs]
        if self._creators is None:
            self._creators = ThreadPoolExecutor(PARALLEL_CREATES, thread_name_prefix="create")
        return list(self._creators.map(lambda obj: _error_of(self.create, obj), objs))

    def patch_status(
        self, obj: Mapping[str, Any], status: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        """Merge-patch the status subresource. With `resource_version` the write is conditional:
        a 409 means the status was computed from an older object and must be computed again."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]) + "/status"
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self._call("PATCH", path, body=body, content_type=MERGE_PATCH)

    def post_event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        """A core/v1 Event about `obj`, which `kubectl describe` shows."""
        meta = obj["metadata"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
        }
        self._call("POST", resource_path("v1", "Event", meta.get("namespace")), body=event)

    def events_about(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        """Events whose involvedObject is the object with this uid (one field-selected read)."""
        query = [("fieldSelector", f"involvedObject.uid={uid}"), ("limit", "100")]
        page = self._call("GET", resource_path("v1", "Event", namespace), query=query)
        return list(page.get("items") or [])

    def replace(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """PUT; with metadata.resourceVersion set, a write from an older read is refused (409)."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        return self._call("PUT", path, body=dict(obj))

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", resource_path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete with background propagation (its pods go through the garbage collector); 404 is fine."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            self._call("DELETE", resource_path(api_version, kind, namespace, name), body=body)
        except ApiError as exc:
            if exc.status != 404:
                raise

    def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """All objects matching the selector (every namespace when None), following `continue`."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query = [("labelSelector", label_selector), ("limit", "500")]
            if token:
                query.append(("continue", token))
            page = self._call("GET", resource_path(api_version, kind, namespace), query=query)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    def read_config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """The data of a ConfigMap, or None when it does not exist (no price overrides then)."""
        found = self.get("v1", "ConfigMap", namespace, name)
        return None if found is None else dict(found.get("data") or {})


def api_error_message(exc: ApiError) -> str:
    """The apiserver's own message (a Status object), which is what a user needs to read."""
    return exc.message
