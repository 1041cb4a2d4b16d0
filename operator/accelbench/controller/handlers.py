"""kopf wiring: kopf watches and indexes; the loop (loop.py) does the work.

- indexes (slim copies, cache.py): our resources by (namespace, name), Jobs by their controller's
  UID, Pods by their Job's UID;
- event handlers for all three only wake the owning resource in the loop's work queue; they run
  after kopf has listed every indexed kind, so a pass never sees a half-filled cache;
- startup builds the shared state and starts the loop; cleanup stops it.

No create/update/timer/daemon handlers: kopf then writes no bookkeeping annotations and puts no
finalizer on a resource (deleting one, or its namespace, never waits for the operator), and all
writes to a resource come from one pass at a time (loop.py, reconciler.py).

Nothing registers at import: `register()` attaches the handlers (python -m accelbench.controller
calls it), so importing this module for a test or a benchmark starts nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from ..api import GROUP, VERSION, FinetuneJob, InferenceBench
from ..api.campaign import BenchCampaign
from ..api.contract import (
    ENV_OPERATOR_EVENT_LEVEL,
    ENV_OPERATOR_PRICES_CONFIGMAP,
    ENV_OPERATOR_WORKERS,
    LABEL_NAME,
)
from ..kubeapi import Connection, load_connection
from ..kubeapi.config import BasicAuth
from .cache import (
    controller_of,
    controller_uid,
    job_owner_key,
    pod_owner_key,
    slim_job,
    slim_pod,
    slim_resource,
)
from .kube import PARALLEL_CREATES, Kube
from .loop import Controller, Indexes
from .metrics import METRICS
from .served import source_name
from .state import (
    DEFAULT_PRICES_CONFIGMAP,
    ControllerState,
    api_limiter,
    network_policies,
    operator_namespace,
)

KINDS = (FinetuneJob, InferenceBench)
KIND_NAMES = frozenset(k.KIND for k in KINDS)
CAMPAIGN_KINDS = frozenset({BenchCampaign.KIND})
WORKERS = int(os.environ.get(ENV_OPERATOR_WORKERS, "64"))  # the chart's `workers` (values.yaml)
CONNECTIONS = WORKERS + PARALLEL_CREATES  # every pass and every parallel create on a kept connection


def _state(memo: Any) -> ControllerState:
    return memo.state  # set by `configure`; a missing one is a wiring bug worth a loud AttributeError


# --- startup -----------------------------------------------------------------------------------


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base is the "essence" of each object (a deep copy of its body) that change
    handlers (on.create/update/field) compare; it builds one on every watch event. This operator
    registers none, only event handlers and indexes, so the copy was pure cost: ~6 % of the
    operator's samples while 1,000 runs started (benchmarks/scale, py-spy)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return None

    def fetch(self, *, body: kopf.Body) -> Any:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    # The operator watches its two kinds only; scanning namespaces and CRDs would need RBAC it
    # does not otherwise use.
    settings.scanning.disabled = True
    settings.posting.level = logging.getLevelName(os.environ.get(ENV_OPERATOR_EVENT_LEVEL, "INFO").upper())
    # One acting replica is leader election's job (leader.py, before kopf starts), not kopf peering's.
    settings.peering.standalone = True
    # Watches that end server-side before a silent network drop would stall them.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.persistence.diffbase_storage = NoDiffBase()
    if not hasattr(memo, "state"):
        limiter = api_limiter()
        METRICS.api_throttled.set_function(lambda: limiter.waited_s)
        kube = Kube(load_connection(), limiter, METRICS.observe_request, connections=CONNECTIONS)
        memo.state = ControllerState(
            kube=kube,
            metrics=METRICS,
            price_namespace=operator_namespace(),
            price_config_map=os.environ.get(ENV_OPERATOR_PRICES_CONFIGMAP, DEFAULT_PRICES_CONFIGMAP),
            network=network_policies(),
        )
    logger.info("accelbench controller configured")


def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's watches log in as the operator's own requests do (kubeapi), so both read one
    kubeconfig or ServiceAccount, exec credential plugins included. kopf calls this again when
    the apiserver answers 401 or the credentials' expiration passes."""
    return connection_info(load_connection())


def connection_info(conn: Connection) -> kopf.ConnectionInfo:
    headers = conn.auth.headers()
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    basic = conn.auth if isinstance(conn.auth, BasicAuth) else None
    return kopf.ConnectionInfo(
        server=conn.server,
        ca_path=conn.ca_file,
        ca_data=conn.ca_data,
        insecure=conn.insecure,
        username=basic.username if basic else None,
        password=basic.password if basic else None,
        scheme=scheme if token and not basic else None,
        token=token if token and not basic else None,
        certificate_path=conn.client_cert_file,
        private_key_path=conn.client_key_file,
        default_namespace=conn.namespace,
        proxy_url=conn.proxy_url,
        expiration=conn.auth.expires,
    )


async def start_loop(memo: kopf.Memo, logger: logging.Logger, **indices: Any) -> None:
    """Start the loop over kopf's indexes (empty now; kopf fills them before any event handler runs)."""
    controller = Controller(_state(memo), WORKERS)
    resources = {kind.KIND: indices[f"{kind.PLURAL}_index"] for kind in (*KINDS, BenchCampaign)}
    runs = [indices[f"{kind.PLURAL}_runs"] for kind in KINDS]
    controller.start(
        Indexes(
            resources=resources,
            jobs=indices["jobs_index"],
            pods=indices["pods_index"],
            runs=runs,
            sources=indices["inferencebenches_sources"],
        )
    )
    memo.controller = controller
    logger.info("accelbench loop started with %d workers", WORKERS)


async def stop_loop(memo: kopf.Memo, **_: Any) -> None:
    controller = getattr(memo, "controller", None)
    if controller is not None:
        await controller.stop()


# --- indexes and wake-ups ------------------------------------------------------------------------


def resources_index(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): slim_resource(body)}


def jobs_index(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    owner = controller_uid(body, KIND_NAMES)
    return {owner: slim_job(body)} if owner else {}


def pods_index(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    owner = controller_uid(body, frozenset({"Job"}))
    return {owner: slim_pod(body)} if owner else {}


def sources_index(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """InferenceBenches by the FinetuneJob they serve from (served.py)."""
    source = source_name(body)
    return {(namespace, source): (InferenceBench.KIND, namespace, name)} if source else {}


def runs_index(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """A campaign's runs, by its UID, with their status: the rows of its table."""
    owner = controller_uid(body, CAMPAIGN_KINDS)
    return {owner: slim_resource(body)} if owner else {}


async def resource_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    meta = body.get("metadata") or {}
    namespace = str(meta.get("namespace"))
    version = meta.get("resourceVersion")
    key = (str(body.get("kind")), namespace, str(meta.get("name")))
    memo.controller.resource_changed(key, str(version) if version else None)
    if key[0] == FinetuneJob.KIND:
        memo.controller.wake_servers_of(namespace, key[2])
    owner = controller_of(body)
    if owner is not None and owner.get("kind") in CAMPAIGN_KINDS:  # a run's change is its campaign's
        memo.controller.wake((str(owner["kind"]), namespace, str(owner.get("name"))))


async def job_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    key = job_owner_key(body, KIND_NAMES)
    if key is not None:
        memo.controller.wake(key)


async def pod_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    key = pod_owner_key(body, KIND_NAMES)
    if key is not None:
        memo.controller.wake(key)


def register(registry: kopf.OperatorRegistry | None = None) -> None:
    """Attach the handlers for both kinds (to kopf's default registry unless one is given)."""
    kopf.on.login(registry=registry)(login)
    kopf.on.startup(registry=registry)(configure)
    kopf.on.startup(registry=registry)(start_loop)
    kopf.on.cleanup(registry=registry)(stop_loop)
    # Children carry LABEL_NAME (pod templates too), so both watches stay small.
    children = {LABEL_NAME: kopf.PRESENT}
    kopf.index("batch", "v1", "jobs", labels=children, registry=registry)(jobs_index)
    kopf.index("", "v1", "pods", labels=children, registry=registry)(pods_index)
    kopf.on.event("batch", "v1", "jobs", labels=children, registry=registry)(job_event)
    kopf.on.event("", "v1", "pods", labels=children, registry=registry)(pod_event)
    for kind in (*KINDS, BenchCampaign):
        index_id = f"{kind.PLURAL}_index"
        kopf.index(GROUP, VERSION, kind.PLURAL, id=index_id, registry=registry)(resources_index)
        kopf.on.event(GROUP, VERSION, kind.PLURAL, registry=registry)(resource_event)
    for kind in KINDS:
        kopf.index(GROUP, VERSION, kind.PLURAL, id=f"{kind.PLURAL}_runs", registry=registry)(runs_index)
    plural = InferenceBench.PLURAL
    kopf.index(GROUP, VERSION, plural, id=f"{plural}_sources", registry=registry)(sources_index)
