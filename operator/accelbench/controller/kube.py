"""Thin Kubernetes I/O: server-side apply of children, reads by label, the price ConfigMap, deletes.

Requests go through the kubernetes client's ApiClient (auth, TLS, proxies) but bodies stay plain
camelCase dicts, the same shape render/ produces and observe/ reads, with no model round trip.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlencode

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ..api.contract import MANAGED_BY
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
MERGE_PATCH = "application/merge-patch+json"
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


def load_config(kubeconfig: str | None = None, context: str | None = None) -> None:
    """An explicit kubeconfig or context wins; else in a pod its service account; else the default
    kubeconfig (the local control plane, a user's laptop)."""
    if kubeconfig is None and context is None:
        try:
            config.load_incluster_config()
            return
        except config.ConfigException:
            pass
    config.load_kube_config(config_file=kubeconfig, context=context)


class Kube:
    """The operator's only client. Every method is one request (plus paging for lists), each taking
    a token from `limiter` first when there is one (ratelimit.py)."""

    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        limiter: TokenBucket | None = None,
        on_response: Callable[[str, int], None] | None = None,
        connections: int | None = None,
    ) -> None:
        """`connections`: keep-alive connections kept open to the apiserver; as many as threads call
        at once. The client's default (5 per CPU of the machine) is below the operator's worker
        count on a small node, and each request past it opened and dropped a TLS connection."""
        if api_client is None:
            cfg = client.Configuration.get_default_copy()
            if connections is not None:
                cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, connections)
            api_client = client.ApiClient(cfg)
        self.api = api_client
        self.limiter = limiter
        self.on_response = on_response  # (method, status): the request counter
        self._creators: ThreadPoolExecutor | None = None

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
        # The REST layer directly, in the form kubernetes 36 and 37 share: their ApiClients differ
        # (37's param_serialize), and workers' images pin 36 (botocore caps python-dateutil below 3).
        headers = {"Accept": "application/json", "Content-Type": content_type or "application/json"}
        for setting in self.api.configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        url = self.api.configuration.host + path + (f"?{urlencode(list(query))}" if query else "")
        payload = self.api.sanitize_for_serialization(body) if body is not None else None
        if self.limiter is not None:
            self.limiter.acquire()
        response = self.api.rest_client.request(
            method, url, headers=headers, body=payload, _request_timeout=timeout
        )
        data = response.data if getattr(response, "data", None) is not None else response.read()
        if self.on_response is not None:
            self.on_response(method, response.status)
        if response.status == TOO_MANY_REQUESTS and self.limiter is not None:
            self.limiter.pause(retry_after_seconds(response.getheader("Retry-After")))
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
        return json.loads(data) if data else {}

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
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete with background propagation (its pods go through the garbage collector); 404 is fine."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            self._call("DELETE", resource_path(api_version, kind, namespace, name), body=body)
        except ApiException as exc:
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


def api_error_message(exc: ApiException) -> str:
    """The apiserver's own message (a Status object), which is what a user needs to read."""
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        body = {}
    return str(body.get("message") or exc.reason or exc)
