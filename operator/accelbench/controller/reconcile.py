"""One observation pass for one resource, as a pure function the timer calls.

Input: the resource body and the child Jobs/Pods from kopf's indexes. Output: the status patch (empty
when nothing changed) and whether the phase moved, so the handler can post one event per transition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..api.status import Children, ConditionType, Phase, Reason
from ..cost import parse_time
from .children import select_pods
from .conditions import find_condition, make_condition, parse_conditions
from .ingest import Ingested, StoredReport, ingest
from .observe import Observation, job_condition, observe, observe_server, pod_job_name
from .status import (
    BILLING_STEP_S,
    apply_worker_error,
    derive_status,
    is_terminal,
    needs_ingest,
    recorded_worker_error,
    spec_invalid,
    status_patch,
)

# The kubelet writes the pod's termination message before the Job controller counts the pod, but the
# two watch streams may deliver out of order: wait this long before calling a missing report missing.
REPORT_GRACE = timedelta(seconds=20)
# A Job the operator applied shows up in its index within a moment; one still absent this long after
# the apply (or gone after it was seen) was deleted, and is never created again: that would pay twice.
VANISHED_GRACE = timedelta(seconds=60)
STARTED_PHASES = frozenset({Phase.SCHEDULING.value, Phase.RUNNING.value, Phase.SUSPENDED.value})

WARNING_REASONS = frozenset(
    {
        Reason.UNSCHEDULABLE,
        Reason.IMAGE_PULL_BACK_OFF,
        Reason.OOM_KILLED,
        Reason.PREEMPTED,
        Reason.DEADLINE_EXCEEDED,
        Reason.BACKOFF_LIMIT_EXCEEDED,
        Reason.CONTAINER_FAILED,
        Reason.WORKER_ERROR,
        Reason.RESULT_INVALID,
        Reason.RESULT_MISSING,
        Reason.JOB_DELETED,
        Reason.POD_CREATE_FAILED,
        Reason.NAME_CONFLICT,
    }
)


@dataclass(frozen=True)
class StatusUpdate:
    patch: dict[str, Any]
    old_phase: str | None
    new_phase: str | None
    reason: str
    message: str
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)

    @property
    def changed(self) -> bool:
        return bool(self.patch)


def event_type(reason: str, phase: str | None) -> str:
    return "Warning" if phase == Phase.FAILED.value or reason in WARNING_REASONS else "Normal"


def _children(status: Mapping[str, Any]) -> Children | None:
    try:
        return Children.model_validate(dict(status.get("children") or {}))
    except ValueError:
        return None


def _report_overdue(obs: Observation, now: datetime) -> bool:
    ended = parse_time(obs.completion_time)
    return ended is None or now - ended >= REPORT_GRACE


# Reads the run's results ConfigMap copy of the report: (ConfigMap name) -> its text or None.
StoredReader = Callable[[str], str | None]


def _maybe_ingest(
    status: Mapping[str, Any],
    obs: Observation,
    kind: str,
    generation: int | None,
    now: datetime,
    read_stored: StoredReader | None,
) -> Ingested | None:
    """Read rank 0's report once, on the first terminal observation that has it (or after the grace);
    without a termination message by then, the copy in the results ConfigMap (one read)."""
    if not obs.terminal or not needs_ingest(status):
        return None
    gone = obs.reason == Reason.JOB_DELETED.value  # its pods and their reports went with it
    if obs.termination_message is None and not gone and not _report_overdue(obs, now):
        return None
    stored = None
    children = _children(status)
    if (
        obs.termination_message is None
        and read_stored is not None
        and children
        and children.results_config_map
    ):
        name = children.results_config_map
        stored = StoredReport(f"ConfigMap {name}", read_stored(name))
    return ingest(obs.termination_message, kind, generation, stored)


def reported_before_vanishing(obs: Observation, ingested: Ingested | None, now: datetime) -> Observation:
    """A Job deleted after rank 0 stored a valid report finished its work: the run Succeeded (its
    completion is when the worker wrote the report, within the run's billed span)."""
    if obs.reason != Reason.JOB_DELETED.value or ingested is None or not ingested.valid:
        return obs
    message = f"rank 0 stored its report in the results ConfigMap; {obs.message}"
    start, gone = parse_time(obs.start_time), parse_time(obs.completion_time) or now
    finished = parse_time(ingested.report.finished_at if ingested.report else None) or gone
    finished = min(max(finished, start or finished), gone)
    return dataclasses.replace(
        obs,
        phase=Phase.SUCCEEDED,
        reason=Reason.COMPLETED.value,
        message=message,
        conditions=(
            make_condition(ConditionType.RUNNING.value, False, Reason.COMPLETED.value, message),
            make_condition(ConditionType.SUCCEEDED.value, True, Reason.COMPLETED.value, message),
        ),
        completion_time=finished.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def observe_resource(
    body: Mapping[str, Any],
    jobs: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    now: datetime,
    refusals: Mapping[str, str] | None = None,
    read_stored: StoredReader | None = None,
    billing_step_s: float = BILLING_STEP_S,
) -> StatusUpdate | None:
    """None when there is nothing for the observer to do (refused spec, children not applied yet,
    or a finished run whose Job was cleaned up by its TTL). `refusals`: Job name -> its latest
    FailedCreate message, for the Jobs `jobs_to_ask_why` named. `read_stored`: reads the report
    copy in the results ConfigMap, called only when the termination message is gone.
    `billing_step_s`: how far a running cost's clock moves at a time (status.billing_clock)."""
    refusals = refusals or {}
    kind = str(body.get("kind"))
    status: Mapping[str, Any] = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    if spec_invalid(status, generation):
        return None
    children = _children(status)
    # children.job reports: a FinetuneJob's train Job, an InferenceBench's client Job (the server
    # Job never completes by itself); the pods of both feed the conditions.
    watched = children.job if children is not None else None
    if not watched:
        return None
    if is_terminal(status) and not needs_ingest(status):
        return None  # final: the outcome and its result are stored; the phase never moves back
    job = next((j for j in jobs if (j.get("metadata") or {}).get("name") == watched), None)
    if job is None and is_terminal(status):
        return None  # the operator cleaned up after the results were stored
    selected = select_pods(pods, children)
    if job is None:
        if not job_vanished(status, jobs, now):
            return None  # applied a moment ago: the index has not shown it yet
        obs = vanished_observation(watched, now, status.get("startTime"))
    elif pods_not_due_yet(status, job, selected, now):
        return None  # the apply's "waiting for the Job" still holds: no write until its pods come
    else:
        obs = observe(job, selected, refusals.get(watched))
    if not obs.terminal and children is not None and children.server:
        server = next((j for j in jobs if (j.get("metadata") or {}).get("name") == children.server), None)
        obs = observe_server(server, selected) or obs
        refused = refusals.get(children.server)
        if server is not None and refused is not None and not obs.terminal:
            server_pods = [p for p in selected if pod_job_name(p) == children.server]
            server_obs = observe(server, server_pods, refused)
            obs = server_obs if server_obs.reason == Reason.POD_CREATE_FAILED.value else obs

    if is_terminal(status) and not obs.terminal:
        return None  # e.g. a bench's server Job deleted after it failed: still the stored outcome
    obs = never_back_to_waiting(status, obs)
    ingested = _maybe_ingest(status, obs, kind, generation, now, read_stored)
    obs = reported_before_vanishing(obs, ingested, now)
    obs = apply_worker_error(obs, recorded_worker_error(parse_conditions(status.get("conditions")), ingested))
    desired = derive_status(
        status, obs, generation=generation, now=now, ingested=ingested, billing_step_s=billing_step_s
    )
    patch = status_patch(status, desired)

    events = []
    old_phase, new_phase = status.get("phase"), desired.get("phase")
    if old_phase != new_phase:
        transition = f"{old_phase or 'None'} -> {new_phase}: {obs.message}"
        events.append((event_type(obs.reason, new_phase), obs.reason, transition))
    if ingested is not None and not ingested.valid and ingested.worker_error is None:
        events.append(("Warning", ingested.condition.reason, ingested.condition.message))
    return StatusUpdate(patch, old_phase, new_phase, obs.reason, obs.message, events)


def never_back_to_waiting(status: Mapping[str, Any], obs: Observation) -> Observation:
    """A run that reached Running stays Running until it ends (or is suspended): a pod between a
    finished container and the Job's Complete, or a preempted pod being re-created, is said in the
    conditions and the message, not by moving the phase back to Scheduling."""
    if status.get("phase") == Phase.RUNNING.value and obs.phase in (Phase.PENDING, Phase.SCHEDULING):
        return dataclasses.replace(obs, phase=Phase.RUNNING)
    return obs


def server_to_stop(status: Mapping[str, Any], jobs: Iterable[Mapping[str, Any]]) -> str | None:
    """The InferenceBench server Job to delete once the run is over: it holds chips and never ends."""
    children = _children(status)
    if children is None or not children.server or not is_terminal(status):
        return None
    for job in jobs:
        meta = job.get("metadata") or {}
        if meta.get("name") == children.server and not meta.get("deletionTimestamp"):
            return children.server
    return None


def _applied_at(status: Mapping[str, Any]) -> datetime | None:
    ready = find_condition(parse_conditions(status.get("conditions")), ConditionType.APPLIED.value)
    if ready is None or ready.reason != Reason.CHILDREN_CREATED.value:
        return None
    return parse_time(ready.last_transition_time)


def job_vanished(status: Mapping[str, Any], jobs: Iterable[Mapping[str, Any]], now: datetime) -> bool:
    """The run's Job was applied and is gone: seen running before, or absent long after the apply.
    Such a run is failed, never re-created (ensure_children asks this too)."""
    children = _children(status)
    if children is None or not children.job or is_terminal(status):
        return False
    if any((j.get("metadata") or {}).get("name") == children.job for j in jobs):
        return False
    if status.get("phase") in STARTED_PHASES:
        return True
    applied = _applied_at(status)
    return applied is not None and now - applied >= VANISHED_GRACE


def vanished_observation(job_name: str, now: datetime, start_time: str | None) -> Observation:
    message = (
        f"the Job {job_name} was deleted before its completion was observed (by hand, by pod "
        "garbage collection, or with the operator down); the run is not started again, which would "
        "pay for it twice"
    )
    failed = make_condition(ConditionType.FAILED.value, True, Reason.JOB_DELETED.value, message)
    running = make_condition(ConditionType.RUNNING.value, False, Reason.JOB_DELETED.value, message)
    return Observation(
        phase=Phase.FAILED,
        reason=Reason.JOB_DELETED.value,
        message=message,
        conditions=(running, failed),
        start_time=start_time,  # as last seen: billed until the run was found gone
        completion_time=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def jobs_to_clean(
    spec: Mapping[str, Any], status: Mapping[str, Any], jobs: Iterable[Mapping[str, Any]], now: datetime
) -> list[str]:
    """The run's Jobs once spec.ttlSecondsAfterFinished has passed since it ended, and only after its
    result (or its absence) is recorded in the stored status: the operator owns this cleanup, so a
    Job never disappears before the run's outcome is kept (Jobs carry no TTL of their own)."""
    ttl = spec.get("ttlSecondsAfterFinished")
    children = _children(status)
    if ttl is None or children is None or not is_terminal(status) or needs_ingest(status):
        return []
    ended = parse_time(status.get("completionTime"))
    if ended is None or now - ended < timedelta(seconds=int(ttl)):
        return []
    mine = {name for name in (children.job, children.client, children.server) if name}
    return sorted(
        str(meta.get("name"))
        for meta in ((j.get("metadata") or {}) for j in jobs)
        if meta.get("name") in mine and not meta.get("deletionTimestamp")
    )


def client_to_stop(status: Mapping[str, Any], jobs: Iterable[Mapping[str, Any]]) -> str | None:
    """The InferenceBench client Job still running after the run ended without it (its server
    failed): it would only wait out its readiness timeout."""
    children = _children(status)
    if children is None or not children.server or not children.job or not is_terminal(status):
        return None
    for job in jobs:
        meta = job.get("metadata") or {}
        if meta.get("name") != children.job or meta.get("deletionTimestamp"):
            continue
        if job_condition(job, "Complete") is None and job_condition(job, "Failed") is None:
            return children.job
    return None


def server_admitted(status: Mapping[str, Any], jobs: Iterable[Mapping[str, Any]]) -> bool:
    """True when the InferenceBench's server Job exists and is not suspended (Kueue admitted it)."""
    children = _children(status)
    if children is None or not children.server:
        return False
    for job in jobs:
        meta = job.get("metadata") or {}
        if meta.get("name") == children.server and not meta.get("deletionTimestamp"):
            return not (job.get("spec") or {}).get("suspend")
    return False


def client_to_resume(
    spec: Mapping[str, Any], status: Mapping[str, Any], jobs: Iterable[Mapping[str, Any]]
) -> str | None:
    """The suspended client Job of a queued bench whose server has just been admitted, or None."""
    children = _children(status)
    if spec.get("suspend") or not spec.get("queueName") or children is None or not children.client:
        return None
    if is_terminal(status):
        return None
    jobs = list(jobs)
    if not server_admitted(status, jobs):
        return None
    for job in jobs:
        if (job.get("metadata") or {}).get("name") == children.client:
            return children.client if (job.get("spec") or {}).get("suspend") else None
    return None


# A Job this old with no pod of its own is asked why (its FailedCreate Events): a read of a stuck
# run only, never of a healthy one. The read is a field-selected LIST the apiserver answers by
# scanning the namespace's Events, so while thousands of runs start and the Job controller lags, the
# asks themselves can swamp the apiserver: 5,000 runs on the scale benchmark made 4,047 such LISTs,
# 6.2 s each, 25,000 s of apiserver time, more than every other request together, and statuses
# trailed their pods by minutes. So a Job is asked again after a doubling interval (15 s, 30 s, ...
# ASK_WHY_MAX), and the whole operator asks at most ASK_WHY_QPS a second (state.ask_why_budget);
# a pass that finds no token leaves the question to a later pass. A refusal is a steady state:
# being seconds (or a few minutes, in such a backlog) late to say so is fine.
POD_CREATE_GRACE = timedelta(seconds=15)
ASK_WHY_EVERY = timedelta(seconds=15)
ASK_WHY_MAX = timedelta(seconds=240)
ASK_WHY_QPS = 1.0
ASK_WHY_BURST = 5


def ask_why_again_after(asks: int) -> timedelta:
    """How long the answer of a Job asked `asks` times stands before it is asked again."""
    return min(ASK_WHY_MAX, ASK_WHY_EVERY * 2 ** max(asks - 1, 0))


def pods_not_due_yet(
    status: Mapping[str, Any], job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: datetime
) -> bool:
    """A run never observed before (Pending since its apply) whose Job is younger than
    POD_CREATE_GRACE and has no pods yet: the Job controller has not got to it, and the status
    the apply wrote says just that. Reporting "Scheduling: waiting for the Job's pods" here, then
    "1 pod(s) pending" a moment later, was one status write per run more (the 100-run scale test
    measured 12.2-12.8 writes a run). A suspended Job (queued by Kueue) is reported at once; past
    the grace the Job is asked why (jobs_to_ask_why) and the phase moves on."""
    meta = job.get("metadata") or {}
    created = parse_time(meta.get("creationTimestamp"))
    return (
        status.get("phase") == Phase.PENDING.value
        and not pods
        and not (job.get("spec") or {}).get("suspend")
        and not job_condition(job, "Complete")
        and not job_condition(job, "Failed")
        and created is not None
        and now - created < POD_CREATE_GRACE
    )


def jobs_to_ask_why(
    status: Mapping[str, Any],
    jobs: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    now: datetime,
) -> list[tuple[str, str]]:
    """(name, uid) of the run's unfinished, unsuspended Jobs that have no pods after POD_CREATE_GRACE."""
    children = _children(status)
    if children is None or is_terminal(status):
        return []
    with_pods = {pod_job_name(p) for p in pods}
    mine = {name for name in (children.job, children.server) if name}
    asked = []
    for job in jobs:
        meta = job.get("metadata") or {}
        name, created = meta.get("name"), parse_time(meta.get("creationTimestamp"))
        if name not in mine or name in with_pods or meta.get("deletionTimestamp") or not meta.get("uid"):
            continue
        if (
            (job.get("spec") or {}).get("suspend")
            or job_condition(job, "Complete")
            or job_condition(job, "Failed")
        ):
            continue
        if created is not None and now - created >= POD_CREATE_GRACE:
            asked.append((str(name), str(meta["uid"])))
    return asked
