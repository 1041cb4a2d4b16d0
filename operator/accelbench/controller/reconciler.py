"""One pass over one resource: apply its children when its spec is new, else observe them.

The loop (loop.py) takes a Snapshot on its event-loop thread (the resource, the Jobs it controls,
their Pods, the last progress read) and runs `reconcile` on a worker thread. All decisions are the
pure functions of reconcile.py, status.py and observe.py; this module does the I/O they ask for:
server-side apply, one conditional status write per pass, Events, deletes.

Invariants:
- The status write carries the resourceVersion the pass read: a pass computed from an old body is
  refused (409) and computed again, so two passes never overwrite each other's phase or result.
- Children are (re)applied only for a new generation of an unfinished run whose Job never vanished:
  an operator restart, a resync or a rejected edit never starts a paid run again.
- Nothing is deleted on the strength of this pass's own conclusions, only of the stored status: the
  outcome is recorded before the Jobs that produced it may go.
- An object with a child's name that this resource does not control is never touched (NameConflict).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from urllib3.exceptions import HTTPError

from ..api import parse_resource
from ..api.contract import ENV_OPERATOR_OBSERVE_INTERVAL, LABEL_CAMPAIGN, REPORT_CONFIGMAP_KEY
from ..api.status import ConditionType, Phase, Reason
from ..cost import parse_time
from ..kubeapi import ApiError
from .cache import ResourceKey, controller_of, is_controlled_by
from .children import accelerator_label, build_children, leave_suspend_to_kueue, plan_status
from .conditions import find_condition, now_rfc3339, parse_conditions
from .kube import api_error_message
from .manifest import manifest_of, spec_error_message
from .observe import pods_refused
from .progress import PROGRESS_ROLE, final_progress, same_progress
from .reconcile import (
    ask_why_again_after,
    client_to_resume,
    client_to_stop,
    job_vanished,
    jobs_to_ask_why,
    jobs_to_clean,
    observe_resource,
    server_admitted,
    server_to_stop,
)
from .served import SERVED_MODEL_STATUS, Resolution, resolve_served_model
from .state import ControllerState
from .status import (
    APPLY_REJECTED,
    BILLING_STEP_S,
    Price,
    applied_status,
    finished,
    invalid_spec_status,
    is_terminal,
    kstatus_conditions,
    needs_ingest,
    not_applied_status,
    spec_invalid,
    status_patch,
)

log = logging.getLogger(__name__)

# Progress read and billing clock of a Running run (the e2e suite sets 1 s).
RUNNING_PASS_S = float(os.environ.get(ENV_OPERATOR_OBSERVE_INTERVAL, "5"))
WAITING_PASS_S = 15.0  # graces (report, vanished Job) and FailedCreate of an unfinished run
STOP_JOBS_AFTER_S = 1.0  # the pass after the one that ended a run, which deletes its Jobs
CONFLICT_RETRY_S = 30.0  # a foreign object holds a child's name: look again (the user may remove it)
PREVIOUS_RUN_RETRY_S = 3.0  # the same-named resource's old child is being garbage-collected
QUOTA_RETRY_S = 30.0  # a ResourceQuota refused a child: apply again once others may have freed it
# How the apiserver's quota admission words its 403s (the second before the quota is first counted).
QUOTA_REFUSALS = ("exceeded quota", "status unknown for quota")


@dataclass(frozen=True)
class Snapshot:
    key: ResourceKey
    body: Mapping[str, Any] | None  # None: the resource is gone
    jobs: Sequence[Mapping[str, Any]] = ()  # Jobs whose controller is this resource (by UID)
    pods: Sequence[Mapping[str, Any]] = ()  # Pods whose controller is one of those Jobs
    progress: Mapping[str, Any] | None = None  # the latest progress read of its rank 0
    runs: Sequence[Mapping[str, Any]] = ()  # a BenchCampaign's: the runs whose controller it is
    baseline: Mapping[str, Any] | None = None  # a BenchCampaign's: the earlier campaign it compares with
    source: Mapping[str, Any] | None = None  # an InferenceBench's: the FinetuneJob it serves from (served.py)
    billing_step_s: float = BILLING_STEP_S  # how far a running cost moves at a time (loop.billing_step)


@dataclass(frozen=True)
class Outcome:
    label: str  # accelbench_reconciles{outcome}
    requeue_after: float | None = None
    retry: bool = False  # failed for a reason waiting can fix: again after the queue's backoff
    # The resourceVersion the pass's status write replaced: until the index shows a newer body, a
    # pass would start from the state before that write (see Controller._stale).
    wrote_over: str | None = None
    # The resourceVersion that write made: its watch event is our own echo (Controller.echo).
    wrote: str | None = None


class RetryLater(Exception):
    """The apiserver was unavailable or refused for a moment: the pass is retried with backoff."""


@dataclass
class Writes:
    """What a pass wants written: one merged status patch and the Events to post after it."""

    body: Mapping[str, Any]
    status: dict[str, Any]  # the stored status with this pass's changes
    patch: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def update(self, desired: Mapping[str, Any]) -> None:
        changed = status_patch(self.status, desired)
        self.patch |= changed
        self.status |= changed

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


# --- apply --------------------------------------------------------------------------------------


def _refuse(w: Writes, message: str, generation: int | None, now: datetime) -> str:
    already = spec_invalid(w.status, generation) and w.status.get("message") == message
    w.update(invalid_spec_status(w.status, message, generation, now))
    if not already:
        w.event("Warning", Reason.INVALID_SPEC.value, message)
    return "invalid"


def _conflict(w: Writes, message: str, generation: int | None) -> None:
    ready = find_condition(parse_conditions(w.status.get("conditions")), ConditionType.APPLIED.value)
    if ready is None or ready.reason != Reason.NAME_CONFLICT.value or w.status.get("message") != message:
        w.event("Warning", Reason.NAME_CONFLICT.value, message)
    w.update(not_applied_status(w.status, message, generation, Reason.NAME_CONFLICT.value))
    w.update({"observedGeneration": generation})  # seen (kstatus can then read it as Stalled), retried


def _over_quota(w: Writes, message: str, generation: int | None) -> None:
    ready = find_condition(parse_conditions(w.status.get("conditions")), ConditionType.APPLIED.value)
    if ready is None or ready.reason != Reason.QUOTA_EXCEEDED.value:
        w.event("Warning", Reason.QUOTA_EXCEEDED.value, message)
    w.update(not_applied_status(w.status, message, generation, Reason.QUOTA_EXCEEDED.value))
    w.update({"observedGeneration": generation})  # seen, and retried while Applied says why


def foreign_holder(
    existing: Mapping[str, Any] | None, uid: str | None, kind: str, name: str
) -> tuple[str, float] | None:
    """(why, when to look again) if `existing` holds a child's name and is not controlled by `uid`."""
    if existing is None or is_controlled_by(existing, uid):
        return None
    meta = existing.get("metadata") or {}
    ref = f"{existing.get('kind')}/{meta.get('name')}"
    owner = controller_of(existing)
    if owner is not None and owner.get("kind") == kind and owner.get("name") == name:
        return (
            f"{ref} belongs to an earlier {kind} of the same name (uid {owner.get('uid')}); waiting for "
            "the garbage collector to remove it (its result is never reported as this run's)",
            PREVIOUS_RUN_RETRY_S,
        )
    held = (
        f"controlled by {owner.get('kind')}/{owner.get('name')}"
        if owner
        else "controlled by no resource (made by hand, or orphaned)"
    )
    return (
        f"{ref} already exists and is {held}; accelbench never changes or adopts an object it does not "
        "own: delete or rename it, or rename this resource",
        CONFLICT_RETRY_S,
    )


def _holder(state: ControllerState, child: Mapping[str, Any], owned_jobs: set[str]) -> dict[str, Any] | None:
    meta = child["metadata"]
    if child["kind"] == "Job" and meta["name"] in owned_jobs:
        return None  # ours, known from the index: no read needed
    try:
        return state.kube.get(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])
    except ApiError as exc:
        message = f"reading {child['kind']}/{meta['name']} failed ({exc.status}): {api_error_message(exc)}"
        raise RetryLater(message) from exc
    except (HTTPError, OSError) as exc:
        raise RetryLater(f"reading {child['kind']}/{meta['name']} failed: {exc}") from exc


def _apply_failed(
    w: Writes, child: Mapping[str, Any], exc: ApiError, generation: int | None, now: datetime
) -> Outcome:
    """What a refused create or apply of a child means for the run (RetryLater when it is passing)."""
    ref = f"{child['kind']}/{child['metadata']['name']}"
    if exc.status in (400, 422):  # e.g. an immutable Job template after a spec edit
        refusal = f"the apiserver refused {ref}: {api_error_message(exc)}"
        if not w.status.get("children"):
            return Outcome(_refuse(w, refusal, generation, now))  # nothing runs yet
        w.update(not_applied_status(w.status, refusal, generation, APPLY_REJECTED))
        w.update({"observedGeneration": generation})  # handled: not re-applied on every pass
        w.event("Warning", APPLY_REJECTED, refusal)
        return Outcome("rejected")
    if exc.status == 403 and any(q in api_error_message(exc) for q in QUOTA_REFUSALS):
        _over_quota(w, f"a ResourceQuota refused {ref}: {api_error_message(exc)}", generation)
        return Outcome("quota", requeue_after=QUOTA_RETRY_S)
    raise RetryLater(f"applying {ref} failed ({exc.status}): {api_error_message(exc)}") from exc


def _model_not_ready(w: Writes, resolution: Resolution, generation: int | None, now: datetime) -> Outcome:
    """A bench whose FinetuneJob has not succeeded (waits: that FinetuneJob's events wake it) or
    never will (Failed, like a refused spec: nothing started, nothing billed)."""
    if resolution.fail is not None:
        message = resolution.fail
        already = w.status.get("phase") == Phase.FAILED.value and w.status.get("message") == message
        w.update(invalid_spec_status(w.status, message, generation, now, Reason.MODEL_UNAVAILABLE.value))
        if not already:
            w.event("Warning", Reason.MODEL_UNAVAILABLE.value, message)
        return Outcome("model-unavailable")
    message = str(resolution.wait)
    if w.status.get("message") != message:
        w.event("Normal", Reason.WAITING_FOR_MODEL.value, message)
    w.update(not_applied_status(w.status, message, generation, Reason.WAITING_FOR_MODEL.value))
    w.update({"observedGeneration": generation, "phase": w.status.get("phase") or Phase.PENDING.value})
    return Outcome("waiting-for-model")


# Kinds created only once the kinds they name exist: the apiserver checks a RoleBinding against
# its Role (privilege escalation) and answers 404 while the Role is not there yet.
CREATED_AFTER = {"RoleBinding": "Role"}


def create_waves(children: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The children split into groups POSTed one group after the other, each group at once: a
    RoleBinding after its Role, everything else together."""
    later = {c for c in CREATED_AFTER if CREATED_AFTER[c] in {x["kind"] for x in children}}
    first = [c for c in children if c["kind"] not in later]
    second = [c for c in children if c["kind"] in later]
    return [wave for wave in (first, second) if wave]


def _create_failed(
    w: Writes, child: Mapping[str, Any], error: Exception | None, generation: int | None, now: datetime
) -> Outcome | None:
    """What a child's create error means: None when created or held by a name (409: read the
    holder next), the pass's Outcome when refused; the apiserver away is retried later."""
    if error is None or (isinstance(error, ApiError) and error.status == 409):
        return None
    if isinstance(error, ApiError):
        return _apply_failed(w, child, error, generation, now)
    if isinstance(error, (HTTPError, OSError)):
        ref = f"{child['kind']}/{child['metadata']['name']}"
        raise RetryLater(f"creating {ref} failed: {error}") from error
    raise error


def ensure_children(
    body: Mapping[str, Any],
    w: Writes,
    state: ControllerState,
    jobs: Sequence[Mapping[str, Any]],
    now: datetime,
    only: tuple[str, str] | None = None,
    source: Mapping[str, Any] | None = None,
) -> Outcome:
    """Render and apply the children (all, or only `only` = (kind, name)), then record them.
    `source`: the FinetuneJob an InferenceBench serves from, if it names one."""
    meta = body.get("metadata") or {}
    generation, uid = meta.get("generation"), meta.get("uid")
    kind, name = str(body.get("kind")), str(meta.get("name"))
    owned_jobs = {str((j.get("metadata") or {}).get("name")) for j in jobs}
    resolution = resolve_served_model(manifest_of(body), w.status, source)
    if resolution.manifest is None:
        return _model_not_ready(w, resolution, generation, now)
    try:
        resource = parse_resource(resolution.manifest)
        plan, rendered = build_children(
            resource, state.catalog(), server_admitted(w.status, jobs), state.network
        )
    except (ValueError, KeyError) as exc:
        return Outcome(_refuse(w, spec_error_message(exc), generation, now))

    live = {str((j.get("metadata") or {}).get("name")): j for j in jobs}
    children = [leave_suspend_to_kueue(obj, live) for obj in rendered.objects]
    chosen = [c for c in children if only in (None, (c["kind"], c["metadata"]["name"]))]
    # A run's first apply creates (POST) each child: one request, and a 409 when anything holds the
    # name; only then is the holder read. Jobs come last and only when nothing was held, so no Job
    # starts beside a foreign Service or ConfigMap. Later applies (an edit before the start, a
    # re-created child) read every holder first, as a re-apply must never take over what it does
    # not own. Fields set at creation belong to our Update manager, later ones to our Apply manager.
    remaining = list(chosen)
    if not w.status.get("children"):
        remaining = []
        for wave in create_waves([c for c in chosen if c["kind"] != "Job"]):
            for child, error in zip(wave, state.kube.create_many(wave), strict=True):
                failed = _create_failed(w, child, error, generation, now)
                if failed is not None:
                    return failed
                if error is not None:
                    remaining.append(child)  # something holds the name: read it below
        for child in [c for c in chosen if c["kind"] == "Job"]:
            if remaining:
                remaining.append(child)
                continue
            error = None
            try:
                state.kube.create(child)
            except Exception as exc:
                error = exc
            failed = _create_failed(w, child, error, generation, now)
            if failed is not None:
                return failed
            if error is not None:
                remaining.append(child)
    for child in remaining:
        held = foreign_holder(_holder(state, child, owned_jobs), uid, kind, name)
        if held is not None:
            _conflict(w, held[0], generation)
            return Outcome("conflict", requeue_after=held[1])
    for child in remaining:
        ref = f"{child['kind']}/{child['metadata']['name']}"
        try:
            state.kube.apply(child)
        except ApiError as exc:
            return _apply_failed(w, child, exc, generation, now)
        except (HTTPError, OSError) as exc:
            raise RetryLater(f"applying {ref} failed: {exc}") from exc

    was_ready = find_condition(parse_conditions(w.status.get("conditions")), ConditionType.APPLIED.value)
    w.update(
        applied_status(
            w.status,
            plan_status=plan_status(plan).to_wire(),
            accelerator=accelerator_label(plan),
            children=rendered.children,
            price=Price(plan.chips, plan.dollars_per_chip_hour, plan.price_source),
            generation=generation,
            now=now,
        )
    )
    if resolution.served is not None:
        w.update({SERVED_MODEL_STATUS: resolution.served})
    if was_ready is None or was_ready.status != "True":
        names = ", ".join(f"{c['kind']}/{c['metadata']['name']}" for c in chosen)
        w.event("Normal", Reason.CHILDREN_CREATED.value, f"applied {names}")
    return Outcome("applied", requeue_after=1.0)


# --- observe ------------------------------------------------------------------------------------


def _refusals(
    state: ControllerState, snap: Snapshot, status: Mapping[str, Any], now: datetime
) -> dict[str, str]:
    """Job name -> why its pods were refused, read only for Jobs stuck without pods."""
    namespace = snap.key[1]
    found: dict[str, str] = {}
    for job_name, job_uid in jobs_to_ask_why(status, snap.jobs, snap.pods, now):
        asked = state.asked_why.get(job_uid)
        if asked is not None and now - asked.when < ask_why_again_after(asked.asks):
            refused = asked.refused  # the last answer stands until it is asked again
        elif not state.ask_why_budget.try_acquire():
            if asked is None:
                continue  # the operator's asks are spent for now: a later pass asks
            refused = asked.refused
        else:
            try:
                refused = pods_refused(state.kube.events_about(namespace, job_uid))
            except (ApiError, HTTPError, OSError) as exc:
                log.warning("reading the Events of Job %s/%s failed: %s", namespace, job_name, exc)
                continue
            state.remember_asked_why(job_uid, now, refused)
        if refused is not None:
            found[job_name] = refused
    return found


def stored_report_reader(state: ControllerState, snap: Snapshot) -> Callable[[str], str | None]:
    """Reads the report copy from the run's results ConfigMap: only one this resource controls
    (a same-named predecessor's, still being garbage-collected, is not this run's)."""
    namespace = snap.key[1]
    uid = ((snap.body or {}).get("metadata") or {}).get("uid")

    def read(name: str) -> str | None:
        try:
            found = state.kube.get("v1", "ConfigMap", namespace, name)
        except (ApiError, HTTPError, OSError) as exc:
            detail = api_error_message(exc) if isinstance(exc, ApiError) else str(exc)
            raise RetryLater(f"reading ConfigMap {namespace}/{name} failed: {detail}") from exc
        if found is None or not uid or not is_controlled_by(found, uid):
            return None
        return (found.get("data") or {}).get(REPORT_CONFIGMAP_KEY)

    return read


def observe_children(snap: Snapshot, w: Writes, state: ControllerState, now: datetime) -> Outcome:
    body = snap.body or {}
    kind, namespace, _ = snap.key
    stored = dict(body.get("status") or {})
    spec = dict(body.get("spec") or {})
    label = "observe-unchanged"
    refusals = _refusals(state, snap, stored, now)
    update = observe_resource(
        body, snap.jobs, snap.pods, now, refusals, stored_report_reader(state, snap), snap.billing_step_s
    )
    if update is not None and update.changed:
        w.update(update.patch)
        label = "observe-changed"
        for event in update.events:
            w.event(*event)

    phase = w.status.get("phase")
    progress = None
    if kind in PROGRESS_ROLE and phase == Phase.RUNNING.value:
        progress = snap.progress
    elif phase == Phase.SUCCEEDED.value:
        progress = final_progress(kind, w.status)
    if progress is not None and not same_progress(progress, w.status.get("progress")):
        w.update({"progress": dict(progress)})

    client = client_to_resume(spec, w.status, snap.jobs)
    if client is not None:
        # Kueue admitted the server: the client (unqueued) starts now, through the same render.
        ensure_children(body, w, state, snap.jobs, now, ("Job", client))
        log.info("%s/%s: server admitted, resumed client Job %s", namespace, snap.key[2], client)

    # Deletes follow the stored status only: the outcome is kept before its Jobs may go.
    doomed = [
        (server_to_stop(stored, snap.jobs), "run finished: deleted server Job %s to free its chips"),
        (client_to_stop(stored, snap.jobs), "run ended without its client: deleted client Job %s"),
        *(
            (name, "ttlSecondsAfterFinished passed and the result is stored: deleted Job %s")
            for name in jobs_to_clean(spec, stored, snap.jobs, now)
        ),
    ]
    failed_delete = False
    for job_name, why in dict.fromkeys(doomed):
        if job_name is None:
            continue
        try:
            state.kube.delete("batch/v1", "Job", namespace, job_name)
        except (ApiError, HTTPError, OSError) as exc:
            detail = api_error_message(exc) if isinstance(exc, ApiError) else str(exc)
            log.warning("%s/%s: deleting Job %s failed: %s", namespace, snap.key[2], job_name, detail)
            failed_delete = True  # the status is still written; the delete is retried with backoff
            continue
        log.info(why, f"{namespace}/{job_name}")
    if failed_delete:
        return Outcome(label, retry=True)
    if not is_terminal(stored) and is_terminal(w.status) and jobs_to_stop(spec, w.status, snap.jobs, now):
        # This pass ended the run; its Jobs go on the next pass, once the outcome is stored. No event
        # need come to bring that pass (a client deleted while the operator was down sends none).
        return Outcome(label, requeue_after=STOP_JOBS_AFTER_S)
    return Outcome(label, requeue_after=next_pass(spec, w.status, now))


def jobs_to_stop(
    spec: Mapping[str, Any], status: Mapping[str, Any], jobs: Sequence[Mapping[str, Any]], now: datetime
) -> bool:
    """A status like `status`, once stored, has Jobs to delete (a server to stop, a client left, a TTL
    that has run out)."""
    return bool(
        server_to_stop(status, jobs) or client_to_stop(status, jobs) or jobs_to_clean(spec, status, jobs, now)
    )


def next_pass(spec: Mapping[str, Any], status: Mapping[str, Any], now: datetime) -> float | None:
    """When to look again without an event: progress and the billing clock while Running; the
    graces while waiting; the TTL of a finished run. None: only events (and the resync) wake it."""
    if not status.get("children") or spec_invalid(status, status.get("observedGeneration")):
        return None
    if status.get("phase") == Phase.RUNNING.value:
        return RUNNING_PASS_S
    if not is_terminal(status):
        return WAITING_PASS_S
    if needs_ingest(status):
        return RUNNING_PASS_S  # the report grace runs
    ttl = spec.get("ttlSecondsAfterFinished")
    ended = parse_time(status.get("completionTime"))
    if ttl is None or ended is None:
        return None
    left = (ended + timedelta(seconds=int(ttl)) - now).total_seconds()
    return max(left, 0.0) + 0.5 if left > -60 else None  # long past: the Jobs are gone already


# --- the pass -----------------------------------------------------------------------------------


# Applied=False reasons whose generation was seen but whose children are still to be applied.
APPLY_RETRIED = frozenset(
    {Reason.NAME_CONFLICT.value, Reason.QUOTA_EXCEEDED.value, Reason.WAITING_FOR_MODEL.value}
)


def write_status(
    state: ControllerState,
    key: ResourceKey,
    body: Mapping[str, Any],
    patch: Mapping[str, Any],
    outcome: Outcome,
) -> tuple[Outcome, bool]:
    """The pass's one status write, conditional on the resourceVersion it read. Returns the pass's
    Outcome and whether it stands: `outcome` with the versions written over and made, or as it was
    when nothing needed writing; else why the write did not happen (409: computed from an old
    body, so computed again)."""
    if not patch:
        return outcome, True
    kind, namespace, name = key
    read = (body.get("metadata") or {}).get("resourceVersion")
    try:
        stored = state.kube.patch_status(body, patch, read)
    except ApiError as exc:
        if exc.status == 409:
            return Outcome("conflict-retry", requeue_after=0.5), False
        if exc.status == 404:
            return Outcome("gone"), False
        log.warning("%s %s/%s: status write failed: %s", kind, namespace, name, api_error_message(exc))
        return Outcome("retry", retry=True), False
    except (HTTPError, OSError) as exc:
        log.warning("%s %s/%s: status write failed: %s", kind, namespace, name, exc)
        return Outcome("retry", retry=True), False
    made = ((stored or {}).get("metadata") or {}).get("resourceVersion")
    return replace(outcome, wrote_over=read, wrote=str(made) if made else None), True


def wants_apply(
    status: Mapping[str, Any], generation: int | None, jobs: Sequence[Mapping[str, Any]], now: datetime
) -> bool:
    """A generation not applied yet (or held back by a NameConflict or a quota, retried), of a run
    that neither finished nor lost its Job."""
    applied = find_condition(parse_conditions(status.get("conditions")), ConditionType.APPLIED.value)
    held = applied is not None and applied.status == "False" and applied.reason in APPLY_RETRIED
    return (
        (status.get("observedGeneration") != generation or held)
        and not finished(status)
        and not job_vanished(status, jobs, now)
    )


def reconcile(snap: Snapshot, state: ControllerState, now: datetime) -> Outcome:
    kind, namespace, name = snap.key
    if snap.body is None:
        state.metrics.forget(namespace, name, kind)
        return Outcome("gone")
    body = snap.body
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return Outcome("deleting")  # its children go with it (ownerReferences)
    stored = dict(body.get("status") or {})
    w = Writes(body=body, status=dict(stored))
    generation = meta.get("generation")
    try:
        if wants_apply(stored, generation, snap.jobs, now):
            outcome = ensure_children(body, w, state, snap.jobs, now, source=snap.source)
        else:
            outcome = observe_children(snap, w, state, now)
            if finished(w.status) and w.status.get("observedGeneration") != generation:
                # An edit of a run that ended changes nothing (it is never run again); saying it was
                # seen lets kstatus-based tools (Flux, Argo CD) read the run as settled, not as
                # reconciling forever (found by the lifecycle fuzz).
                w.update({"observedGeneration": generation})
    except RetryLater as exc:
        # Said in the status too (a missing RBAC rule reads there, not only in the operator's log);
        # with the apiserver away that write fails as well, and the retry is all there is.
        log.warning("%s %s/%s: %s", kind, namespace, name, exc)
        w.update(not_applied_status(w.status, str(exc)[:1024], generation))
        outcome = Outcome("retry", retry=True)
    except Exception as exc:  # a bug on our side: say so in the status, retry with backoff
        log.exception("%s %s/%s: reconciling failed", kind, namespace, name)
        w.update(not_applied_status(w.status, f"{type(exc).__name__}: {exc}"[:1024], generation))
        outcome = Outcome("error", retry=True)
    w.update(kstatus_conditions(w.status, generation, now))

    outcome, written = write_status(state, snap.key, body, w.patch, outcome)
    if not written:
        return outcome
    stamp = now_rfc3339(now)
    for type_, reason, message in w.events:
        try:
            state.kube.post_event(body, type_, reason, message, stamp)
        except (ApiError, HTTPError, OSError) as exc:  # an Event is a courtesy, never a failure
            log.warning("%s %s/%s: posting event %s failed: %s", kind, namespace, name, reason, exc)
    state.metrics.set_phase(namespace, name, kind, w.status.get("phase"))
    campaign = str(((body.get("metadata") or {}).get("labels") or {}).get(LABEL_CAMPAIGN, ""))
    state.metrics.set_results(namespace, name, kind, w.status, campaign)
    return outcome
