"""kopf wiring. Handlers are thin: they gather inputs, call the pure modules, and hand kopf a patch.

- create/update/resume: parse -> plan -> render -> server-side apply -> status.plan/children/price.
  A bad spec becomes phase Failed + Ready=False/InvalidSpec and the handler returns normally: no
  children, no exception, so kopf does not retry an input that cannot improve by waiting.
- a timer per resource: observe the child Job and Pods from kopf indexes (no API reads), derive
  phase/conditions/cost/results, and patch the status only when it changed; one event per transition.
- delete (optional, no finalizer): drop the resource's metric series. Children go by ownerReferences.

Nothing registers at import: `register()` attaches the handlers (python -m accelbench.controller
calls it), so importing this module for a test or a benchmark starts nothing.
No handler returns a value: kopf would store it in the status under the handler's id.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ..api import GROUP, VERSION, FinetuneJob, InferenceBench, parse_resource
from ..api.contract import (
    ENV_OPERATOR_EVENT_LEVEL,
    ENV_OPERATOR_OBSERVE_INTERVAL,
    ENV_OPERATOR_PEERING,
    ENV_OPERATOR_PRICES_CONFIGMAP,
    ENV_OPERATOR_WORKERS,
    LABEL_NAME,
)
from ..api.status import ConditionType, Reason
from .children import accelerator_label, build_children, leave_suspend_to_kueue, plan_status
from .conditions import find_condition, parse_conditions
from .kube import Kube, api_error_message, load_config
from .manifest import manifest_of, spec_error_message
from .metrics import METRICS
from .progress import PROGRESS_ROLE, final_progress, read_progress, same_progress
from .reconcile import (
    client_to_resume,
    client_to_stop,
    job_vanished,
    jobs_to_clean,
    observe_resource,
    server_admitted,
    server_to_stop,
)
from .state import DEFAULT_PRICES_CONFIGMAP, ControllerState, operator_namespace
from .status import (
    APPLY_REJECTED,
    Price,
    applied_status,
    finished,
    invalid_spec_status,
    not_ready_status,
    spec_invalid,
    status_patch,
)

KINDS = (FinetuneJob, InferenceBench)
OBSERVE_INTERVAL = float(os.environ.get(ENV_OPERATOR_OBSERVE_INTERVAL, "5"))


def _state(memo: Any) -> ControllerState:
    return memo.state  # set by `configure`; a missing one is a wiring bug worth a loud AttributeError


# --- startup -----------------------------------------------------------------------------------


def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    # Progress and the last-handled spec live in annotations under our own prefix, so the status
    # stays ours alone and `kubectl get -o yaml` shows whose bookkeeping it is.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # The operator watches its two kinds only; scanning namespaces and CRDs would need RBAC it
    # does not otherwise use.
    settings.scanning.disabled = True
    # Sync handlers share kopf's thread pool; the default (a handful of threads) serialized child
    # creation and observer passes at scale (benchmarks/scale: status lagged pods by up to 94 s).
    settings.execution.max_workers = int(os.environ.get(ENV_OPERATOR_WORKERS, "32"))
    settings.posting.level = logging.getLevelName(os.environ.get(ENV_OPERATOR_EVENT_LEVEL, "INFO").upper())
    peering = os.environ.get(ENV_OPERATOR_PEERING, "").strip()
    if peering:
        settings.peering.standalone = False
        settings.peering.name = "accelbench" if peering.lower() in ("1", "true", "yes") else peering
        # kopf pauses every replica that sees a live peer of equal priority; distinct random
        # priorities make exactly one replica active and the others hot standbys.
        settings.peering.priority = random.randint(1, 2**31 - 1)
    else:
        settings.peering.standalone = True  # one replica by default: no KopfPeering CRD needed
    # Watches that end server-side before a silent network drop would stall them.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    if not hasattr(memo, "state"):
        load_config()
        memo.state = ControllerState(
            kube=Kube(),
            metrics=METRICS,
            price_namespace=operator_namespace(),
            price_config_map=os.environ.get(ENV_OPERATOR_PRICES_CONFIGMAP, DEFAULT_PRICES_CONFIGMAP),
        )
    logger.info("accelbench controller configured (peering: %s)", peering or "standalone")


# --- indexes: children by owner, so observing needs no API reads ----------------------------


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(dict(body))


def accelbench_jobs(namespace: str, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, labels[LABEL_NAME]): _plain(body)}


def accelbench_pods(namespace: str, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, labels[LABEL_NAME]): _plain(body)}


# --- ensure children ---------------------------------------------------------------------------


def _refuse(
    body: kopf.Body, current: Mapping[str, Any], message: str, generation: int | None, patch: kopf.Patch
) -> str:
    already = spec_invalid(current, generation) and current.get("message") == message
    patch.status.update(
        status_patch(current, invalid_spec_status(current, message, generation, datetime.now(UTC)))
    )
    if not already:
        kopf.event(body, type="Warning", reason=Reason.INVALID_SPEC.value, message=message[:1024])
    return "invalid"


def _ensure(
    body: kopf.Body,
    current: Mapping[str, Any],
    generation: int | None,
    patch: kopf.Patch,
    state: ControllerState,
    jobs: list[Mapping[str, Any]],
    only_kind_name: tuple[str, str] | None = None,
) -> str:
    """Render and apply the children (all of them, or only `only_kind_name`), then record them."""
    existing_jobs = [j["metadata"]["name"] for j in jobs]
    try:
        resource = parse_resource(manifest_of(body))
        plan, rendered = build_children(resource, state.catalog(), server_admitted(current, jobs))
    except (ValueError, KeyError) as exc:
        return _refuse(body, current, spec_error_message(exc), generation, patch)

    children = [leave_suspend_to_kueue(obj, existing_jobs) for obj in rendered.objects]
    chosen = [c for c in children if only_kind_name in (None, (c["kind"], c["metadata"]["name"]))]
    for child in chosen:
        ref = f"{child['kind']}/{child['metadata']['name']}"
        try:
            state.kube.apply(child)
        except ApiException as exc:
            if exc.status in (400, 422):  # e.g. an immutable Job template after a spec edit
                refusal = f"the apiserver refused {ref}: {api_error_message(exc)}"
                if not current.get("children"):
                    return _refuse(body, current, refusal, generation, patch)  # nothing runs yet
                rejected = not_ready_status(current, refusal, generation, APPLY_REJECTED)
                patch.status.update(status_patch(current, rejected))
                kopf.event(body, type="Warning", reason=APPLY_REJECTED, message=refusal[:1024])
                return "rejected"
            message = f"applying {ref} failed ({exc.status}): {api_error_message(exc)}"
            raise kopf.TemporaryError(message, delay=15) from exc
        except (HTTPError, OSError) as exc:
            raise kopf.TemporaryError(f"applying {ref} failed: {exc}", delay=15) from exc

    desired = applied_status(
        current,
        plan_status=plan_status(plan).to_wire(),
        accelerator=accelerator_label(plan),
        children=rendered.children,
        price=Price(plan.chips, plan.dollars_per_chip_hour, plan.price_source),
        generation=generation,
        now=datetime.now(UTC),
    )
    patch.status.update(status_patch(current, desired))
    ready = find_condition(parse_conditions(current.get("conditions")), ConditionType.READY.value)
    if ready is None or ready.status != "True":
        names = ", ".join(f"{c['kind']}/{c['metadata']['name']}" for c in chosen)
        kopf.event(body, type="Normal", reason=Reason.CHILDREN_CREATED.value, message=f"applied {names}")
    return "applied"


def ensure_children(
    body: kopf.Body,
    meta: kopf.Meta,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: logging.Logger,
    accelbench_jobs: kopf.Index | None = None,
    **_: Any,
) -> None:
    state = _state(memo)
    kind = str(body.get("kind"))
    current = dict(status or {})
    key = (meta.get("namespace"), meta.get("name"))
    jobs = list((accelbench_jobs or {}).get(key, []))
    generation = meta.get("generation")
    started, outcome = time.monotonic(), "error"
    try:
        if finished(current):
            logger.info(
                "the run already finished (%s); its children are left as they are", current.get("phase")
            )
            outcome = "skipped"
            return
        if job_vanished(current, jobs, datetime.now(UTC)):
            logger.warning("the run's Job is gone; it is not created again (the run would be paid twice)")
            outcome = "skipped"
            return
        outcome = _ensure(body, current, generation, patch, state, jobs)
    except kopf.TemporaryError:
        outcome = "retry"
        raise  # the apiserver was unavailable: that does improve by waiting
    except Exception as exc:
        logger.exception("reconciling %s failed", kind)
        patch.status.update(not_ready_status(current, f"{type(exc).__name__}: {exc}"[:1024], generation))
    finally:
        state.metrics.observe_reconcile(kind, outcome, time.monotonic() - started)


# --- observe children --------------------------------------------------------------------------


def observe_children(
    body: kopf.Body,
    namespace: str,
    name: str,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: logging.Logger,
    accelbench_jobs: kopf.Index,
    accelbench_pods: kopf.Index,
    **_: Any,
) -> None:
    state = _state(memo)
    kind = str(body.get("kind"))
    started, outcome = time.monotonic(), "error"
    try:
        key = (namespace, name)
        jobs = list(accelbench_jobs.get(key, []))
        pods = list(accelbench_pods.get(key, []))
        update = observe_resource(body, jobs, pods, datetime.now(UTC))
        status = dict(body.get("status") or {})
        outcome = "unchanged"
        if update is not None and update.changed:
            patch.status.update(update.patch)
            status |= update.patch
            outcome = "changed"
            for type_, reason, message in update.events:
                kopf.event(body, type=type_, reason=reason, message=message[:1024])
        phase = status.get("phase")
        progress = None
        if kind in PROGRESS_ROLE and phase == "Running":
            progress = read_progress(pods, datetime.now(UTC), PROGRESS_ROLE[kind])
        elif phase == "Succeeded":
            progress = final_progress(kind, status)
        if progress is not None and not same_progress(progress, status.get("progress")):
            patch.status["progress"] = progress
        client = client_to_resume(dict(body.get("spec") or {}), status, jobs)
        if client is not None:
            # Kueue admitted the server: the client (unqueued) starts now, through the same render.
            generation = (body.get("metadata") or {}).get("generation")
            _ensure(body, status, generation, patch, state, jobs, ("Job", client))
            logger.info("server admitted: resumed client Job %s", client)
        server = server_to_stop(status, jobs)
        if server is not None:
            state.kube.delete("batch/v1", "Job", namespace, server)
            logger.info("run finished: deleted server Job %s to free its chips", server)
        # Only once the terminal status is stored (the body's, not this pass's patch): a deleted
        # client must never be what an unfinished status is observed from.
        stored = dict(body.get("status") or {})
        waiting_client = client_to_stop(stored, jobs)
        if waiting_client is not None:
            state.kube.delete("batch/v1", "Job", namespace, waiting_client)
            logger.info("run ended without its client: deleted client Job %s", waiting_client)
        for expired in jobs_to_clean(dict(body.get("spec") or {}), stored, jobs, datetime.now(UTC)):
            state.kube.delete("batch/v1", "Job", namespace, expired)
            logger.info("ttlSecondsAfterFinished passed and the result is stored: deleted Job %s", expired)
        state.metrics.set_phase(namespace, name, kind, status.get("phase"))
        state.metrics.set_results(namespace, name, kind, status)
    except Exception:
        # Observing again in a few seconds is the retry; an exception would only add kopf's backoff.
        logger.exception("observing %s failed", kind)
    finally:
        state.metrics.observe_reconcile(kind, f"observe-{outcome}", time.monotonic() - started)


def forget_resource(body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    _state(memo).metrics.forget(namespace, name, str(body.get("kind")))


def register(registry: kopf.OperatorRegistry | None = None) -> None:
    """Attach the handlers for both kinds (to kopf's default registry unless one is given)."""
    kopf.on.startup(registry=registry)(configure)
    # Children carry LABEL_NAME (pod templates too), so both watches stay small.
    kopf.index("batch", "v1", "jobs", labels={LABEL_NAME: kopf.PRESENT}, registry=registry)(accelbench_jobs)
    kopf.index("", "v1", "pods", labels={LABEL_NAME: kopf.PRESENT}, registry=registry)(accelbench_pods)
    for kind in KINDS:
        plural = kind.PLURAL
        kopf.on.resume(GROUP, VERSION, plural, registry=registry)(ensure_children)
        kopf.on.create(GROUP, VERSION, plural, registry=registry)(ensure_children)
        kopf.on.update(GROUP, VERSION, plural, registry=registry)(ensure_children)
        kopf.timer(GROUP, VERSION, plural, interval=OBSERVE_INTERVAL, registry=registry)(observe_children)
        kopf.on.delete(GROUP, VERSION, plural, optional=True, registry=registry)(forget_resource)
