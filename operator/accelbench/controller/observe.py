"""From a child Job and its Pods (camelCase JSON, as the API returns them) to what the user should see.

Pure: no clock, no I/O. The rules follow how kube 1.3x reports trouble:
- Job conditions: Complete / Failed are terminal; SuccessCriteriaMet / FailureTarget come first while pods
  are still terminating, so they are not terminal yet; Suspended while suspended.
- Pod trouble is visible only on pods: PodScheduled=False reason Unschedulable (with the scheduler's
  message), container waiting reasons (ErrImagePull, ImagePullBackOff), terminated reasons (OOMKilled,
  exit codes), and DisruptionTarget for preemption, eviction and node shutdown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api.contract import COMPLETION_INDEX_KEY, JOB_NAME_LABELS, LABEL_KUEUE_QUEUE
from ..api.status import Condition, ConditionType, Phase, Reason, named_failure
from .conditions import make_condition

Obj = Mapping[str, Any]

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
# Pod-level reasons the kubelet writes when it, not the workload, ended the pod.
DISRUPTION_POD_REASONS = frozenset({"Preempted", "Shutdown", "NodeShutdown", "Terminated"})
# Job Failed reasons that only say "too many pods failed"; the pods tell why.
GENERIC_JOB_FAILURES = frozenset({"BackoffLimitExceeded", "MaxFailedIndexesExceeded", "PodFailurePolicy"})


@dataclass(frozen=True)
class Observation:
    phase: Phase
    reason: str
    message: str
    conditions: tuple[Condition, ...] = ()
    start_time: str | None = None
    completion_time: str | None = None
    termination_message: str | None = None  # rank 0's, once it terminated
    exit_code: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)  # secondary facts, e.g. an earlier preemption
    suspended_at: str | None = None  # when the Job was suspended (ends a billed segment)

    @property
    def terminal(self) -> bool:
        return self.phase in (Phase.SUCCEEDED, Phase.FAILED)


@dataclass(frozen=True)
class PodProblem:
    """The most telling thing wrong with one pod."""

    reason: str
    message: str
    exit_code: int | None = None


# --- small accessors over API JSON -------------------------------------------------------------


def _status(obj: Obj) -> Mapping[str, Any]:
    return obj.get("status") or {}


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def job_condition(job: Obj, type_: str) -> Mapping[str, Any] | None:
    """The Job condition of that type when its status is True."""
    for cond in _status(job).get("conditions") or ():
        if cond.get("type") == type_ and cond.get("status") == "True":
            return cond
    return None


def pod_condition(pod: Obj, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in _status(pod).get("conditions") or () if c.get("type") == type_), None)


def pod_job_name(pod: Obj) -> str | None:
    labels = _meta(pod).get("labels") or {}
    return next((labels[k] for k in JOB_NAME_LABELS if k in labels), None)


def completion_index(pod: Obj) -> int | None:
    meta = _meta(pod)
    raw = (meta.get("labels") or {}).get(COMPLETION_INDEX_KEY) or (meta.get("annotations") or {}).get(
        COMPLETION_INDEX_KEY
    )
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _container_statuses(pod: Obj) -> list[Mapping[str, Any]]:
    status = _status(pod)
    return [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]


def _terminated(cs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The current terminated state, else the last one (restartPolicy OnFailure / crash loops)."""
    return (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")


def _pod_name(pod: Obj) -> str:
    return str(_meta(pod).get("name", "?"))


def _is_deleted(pod: Obj) -> bool:
    return bool(_meta(pod).get("deletionTimestamp"))


# --- per-pod diagnosis ------------------------------------------------------------------------


def pod_disruption(pod: Obj) -> PodProblem | None:
    """Preemption, eviction or node shutdown: DisruptionTarget (kube >= 1.26) or the kubelet's reason."""
    target = pod_condition(pod, "DisruptionTarget")
    if target is not None and target.get("status") == "True":
        detail = target.get("message") or target.get("reason") or "disrupted"
        return PodProblem(
            Reason.PREEMPTED, f"pod {_pod_name(pod)} was disrupted ({target.get('reason')}): {detail}"
        )
    reason = _status(pod).get("reason")
    if reason in DISRUPTION_POD_REASONS:
        detail = _status(pod).get("message") or reason
        return PodProblem(Reason.PREEMPTED, f"pod {_pod_name(pod)} was stopped ({reason}): {detail}")
    return None


def pod_unschedulable(pod: Obj) -> PodProblem | None:
    scheduled = pod_condition(pod, "PodScheduled")
    if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return PodProblem(
            Reason.UNSCHEDULABLE, f"pod {_pod_name(pod)}: {scheduled.get('message', '')}".strip()
        )
    return None


def pod_image_pull(pod: Obj) -> PodProblem | None:
    for cs in _container_statuses(pod):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            detail = waiting.get("message") or cs.get("image", "")
            return PodProblem(
                Reason.IMAGE_PULL_BACK_OFF,
                f"pod {_pod_name(pod)} container {cs.get('name')}: {waiting['reason']}: {detail}",
            )
    return None


def pod_container_failure(pod: Obj) -> PodProblem | None:
    """OOMKilled before any other non-zero exit: it is the one a user fixes differently."""
    failures = []
    for cs in _container_statuses(pod):
        term = _terminated(cs)
        if term and term.get("exitCode", 0) != 0:
            failures.append((cs, term))
    for cs, term in failures:
        if term.get("reason") == "OOMKilled":
            return PodProblem(
                Reason.OOM_KILLED,
                f"pod {_pod_name(pod)} container {cs.get('name')} ran out of memory (OOMKilled, "
                f"exit code {term.get('exitCode')}); raise the memory limit or lower the batch size",
                term.get("exitCode"),
            )
    for cs, term in failures:
        named = named_failure(str(term.get("message") or ""))
        if named is not None:  # our own container said why (workers.storage's fetch: `Reason: message`)
            where = f"pod {_pod_name(pod)} container {cs.get('name')}"
            return PodProblem(named[0], f"{where}: {named[1]}", term.get("exitCode"))
    if failures:
        cs, term = failures[0]
        code = term.get("exitCode")
        why = term.get("reason") or "Error"
        return PodProblem(
            Reason.CONTAINER_FAILED,
            f"pod {_pod_name(pod)} container {cs.get('name')} exited with code {code} ({why})",
            code,
        )
    return None


def pod_problem(pod: Obj) -> PodProblem | None:
    """The first of: disruption, unschedulable, image pull, container failure."""
    for check in (pod_disruption, pod_unschedulable, pod_image_pull, pod_container_failure):
        problem = check(pod)
        if problem is not None:
            return problem
    return None


_FAILURE_PRIORITY = (Reason.OOM_KILLED, Reason.PREEMPTED, Reason.IMAGE_PULL_BACK_OFF, Reason.CONTAINER_FAILED)


def root_cause(pods: Sequence[Obj]) -> PodProblem | None:
    """Across failed pods, the most actionable cause (OOM beats preemption beats a bare exit code)."""
    problems = [p for p in (pod_problem(pod) for pod in pods) if p is not None]
    for reason in _FAILURE_PRIORITY:
        found = next((p for p in problems if p.reason == reason), None)
        if found is not None:
            return found
    return problems[0] if problems else None


# --- rank 0 and its termination message --------------------------------------------------------


def rank0_pod(pods: Sequence[Obj], job_name: str | None) -> Obj | None:
    """Index 0 of the Job (any pod for a non-indexed Job); a succeeded one first, else the newest."""
    mine = [p for p in pods if job_name is None or pod_job_name(p) == job_name]
    indexed = [p for p in mine if completion_index(p) == 0]
    candidates = indexed or [p for p in mine if completion_index(p) is None]
    if not candidates:
        return None
    succeeded = [p for p in candidates if _status(p).get("phase") == "Succeeded"]
    pool = succeeded or candidates
    return max(pool, key=lambda p: str(_meta(p).get("creationTimestamp") or ""))


def termination_message(pod: Obj | None) -> str | None:
    """The first terminated container's message; workers write their WorkerReport there."""
    if pod is None:
        return None
    for cs in _status(pod).get("containerStatuses") or ():
        term = _terminated(cs)
        if term and term.get("message"):
            return str(term["message"])
    return None


# --- the Job as a whole -----------------------------------------------------------------------


def _earliest(*times: str | None) -> str | None:
    # RFC 3339 UTC strings with a Z sort lexically in time order.
    present = [t for t in times if t]
    return min(present) if present else None


def _start_time(job: Obj, pods: Sequence[Obj]) -> str | None:
    """When chips were first held: the Job's startTime, or an earlier pod (an inference server)."""
    return _earliest(_status(job).get("startTime"), *(_status(p).get("startTime") for p in pods))


def _cond(type_: ConditionType, status: bool, reason: str, message: str) -> Condition:
    return make_condition(type_.value, status, str(reason), message)


def _failed(job: Obj, pods: Sequence[Obj], failed: Mapping[str, Any]) -> Observation:
    job_reason = failed.get("reason") or "Failed"
    message = failed.get("message") or ""
    cause = root_cause([p for p in pods if pod_job_name(p) == _meta(job).get("name")] or pods)
    exit_code = cause.exit_code if cause else None
    if job_reason == "DeadlineExceeded":
        reason = Reason.DEADLINE_EXCEEDED.value
        message = message or "the Job ran past activeDeadlineSeconds"
    elif cause is not None and job_reason in GENERIC_JOB_FAILURES:
        reason, message = cause.reason, f"{cause.message}; {message}".rstrip("; ")
    elif job_reason in GENERIC_JOB_FAILURES:
        reason = Reason.BACKOFF_LIMIT_EXCEEDED.value
    else:
        reason = job_reason
    reason = str(reason)
    return Observation(
        phase=Phase.FAILED,
        reason=reason,
        message=message,
        conditions=(
            *_placed(pods),
            _cond(ConditionType.RUNNING, False, reason, message),
            _cond(ConditionType.FAILED, True, reason, message),
        ),
        start_time=_start_time(job, pods),
        # A failed Job has no completionTime; the Failed condition says when it ended.
        completion_time=_status(job).get("completionTime") or failed.get("lastTransitionTime"),
        termination_message=termination_message(rank0_pod(pods, _meta(job).get("name"))),
        exit_code=exit_code,
    )


def _placed(pods: Sequence[Obj]) -> tuple[Condition, ...]:
    """Scheduled=True once any pod reached a node, so a finished run keeps no stale Scheduling."""
    if any((p.get("spec") or {}).get("nodeName") for p in pods):
        return (_cond(ConditionType.SCHEDULED, True, Reason.SCHEDULED, "pods were placed on nodes"),)
    return ()


def _succeeded(job: Obj, pods: Sequence[Obj], complete: Mapping[str, Any]) -> Observation:
    message = "the Job completed"
    return Observation(
        phase=Phase.SUCCEEDED,
        reason=Reason.COMPLETED.value,
        message=message,
        conditions=(
            # A Job that completed had its pods placed, even if it finished before a pass saw them.
            _cond(ConditionType.SCHEDULED, True, Reason.SCHEDULED, "all pods were placed on nodes"),
            _cond(ConditionType.RUNNING, False, Reason.COMPLETED, message),
            _cond(ConditionType.SUCCEEDED, True, Reason.COMPLETED, message),
        ),
        start_time=_start_time(job, pods),
        completion_time=_status(job).get("completionTime") or complete.get("lastTransitionTime"),
        termination_message=termination_message(rank0_pod(pods, _meta(job).get("name"))),
        exit_code=0,
    )


def _suspended(job: Obj) -> Observation:
    labels = _meta(job).get("labels") or {}
    queue = labels.get(LABEL_KUEUE_QUEUE)
    if queue:
        reason, message = Reason.QUEUED.value, f"waiting in Kueue queue {queue} for admission"
    else:
        reason, message = Reason.SUSPENDED.value, "the Job is suspended (spec.suspend)"
    suspended = job_condition(job, "Suspended")
    return Observation(
        phase=Phase.SUSPENDED,
        reason=reason,
        message=message,
        suspended_at=(suspended or {}).get("lastTransitionTime"),
        conditions=(
            _cond(ConditionType.SCHEDULED, False, reason, message),
            _cond(ConditionType.RUNNING, False, reason, message),
        ),
    )


def pods_refused(events: Sequence[Obj]) -> str | None:
    """The Job controller's latest FailedCreate message (a Pod refused at admission: a quota, Pod
    Security, an unknown priorityClassName), from the Events about the Job; None when there is none."""
    refused = [e for e in events if e.get("reason") == "FailedCreate" and e.get("type") == "Warning"]
    if not refused:
        return None

    def when(event: Obj) -> str:
        return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")

    return str(max(refused, key=when).get("message") or "the Job's pods were refused")


def _active(job: Obj, pods: Sequence[Obj], refusal: str | None = None) -> Observation:
    """Job not finished: pods decide between Scheduling and Running, and say what blocks them."""
    live = [p for p in pods if _status(p).get("phase") in ("Pending", "Running") and not _is_deleted(p)]
    pending = [p for p in live if _status(p).get("phase") == "Pending"]
    running = [p for p in live if _status(p).get("phase") == "Running"]
    disrupted = [d for d in (pod_disruption(p) for p in pods if p not in live) if d is not None]
    notes = tuple(d.message for d in disrupted)
    start = _start_time(job, pods)

    blocking = [pod_unschedulable(p) for p in pending] + [pod_image_pull(p) for p in pending]
    crash = [pod_container_failure(p) for p in running if _restarting(p)]
    problem = next((p for p in blocking if p is not None), None)
    if problem is None and not live and refusal is not None:
        problem = PodProblem(Reason.POD_CREATE_FAILED, f"the Job cannot create its pods: {refusal}")
    if problem is None and not running and disrupted:
        # Pods were preempted and their replacements are not placed yet: say so, not just "pending".
        problem = PodProblem(Reason.PREEMPTED, f"{disrupted[-1].message}; the Job is re-creating the pod")

    finishing = job_condition(job, "FailureTarget") or job_condition(job, "SuccessCriteriaMet")
    if finishing is not None and not pending:
        # Kube 1.31+ marks the outcome first and waits for pods to terminate before Complete/Failed.
        message = f"finishing: {finishing.get('reason') or finishing.get('type')}"
        return Observation(
            phase=Phase.RUNNING,
            reason=Reason.RUNNING.value,
            message=message,
            conditions=(
                _cond(ConditionType.SCHEDULED, True, Reason.SCHEDULED, "all pods are on nodes"),
                _cond(ConditionType.RUNNING, True, Reason.RUNNING, message),
            ),
            start_time=start,
            notes=notes,
        )

    if pending or not running:
        reason = problem.reason if problem else "Scheduling"
        if problem:
            message = problem.message
        elif pending:
            message = f"{len(pending)} pod(s) pending"
        else:
            message = "waiting for the Job's pods"
        scheduled = problem is not None and problem.reason == Reason.IMAGE_PULL_BACK_OFF
        return Observation(
            phase=Phase.SCHEDULING,
            reason=str(reason),
            message=message,
            conditions=(
                _cond(
                    ConditionType.SCHEDULED,
                    scheduled,
                    Reason.SCHEDULED if scheduled else str(reason),
                    "all pods are on nodes" if scheduled else message,
                ),
                _cond(ConditionType.RUNNING, False, str(reason), message),
            ),
            start_time=start,
            notes=notes,
        )

    crash_problem = next((p for p in crash if p is not None), None)
    reason = str(crash_problem.reason) if crash_problem else Reason.RUNNING.value
    message = crash_problem.message if crash_problem else f"{len(running)} pod(s) running"
    return Observation(
        phase=Phase.RUNNING,
        reason=reason,
        message=message,
        conditions=(
            _cond(ConditionType.SCHEDULED, True, Reason.SCHEDULED, "all pods are on nodes"),
            _cond(ConditionType.RUNNING, True, reason, message),
        ),
        start_time=start,
        exit_code=crash_problem.exit_code if crash_problem else None,
        notes=notes,
    )


def _restarting(pod: Obj) -> bool:
    """A running pod whose container is in a crash loop (restartPolicy OnFailure or a server)."""
    return any(
        ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
        for cs in _container_statuses(pod)
    )


def observe_server(server: Obj | None, pods: Sequence[Obj]) -> Observation | None:
    """An InferenceBench whose server Job failed (the model could not be fetched, the engine crashed
    past its retries) has failed for that reason, whatever its client is still waiting for. One
    whose server Job is suspended (waiting in a Kueue queue: only the server is queued) says so; its
    client Job is merely held until the server is admitted."""
    if server is None:
        return None
    failed = job_condition(server, "Failed")
    if failed is None:
        if (server.get("spec") or {}).get("suspend"):
            return _suspended(server)
        return None
    obs = _failed(server, pods, failed)
    # The server writes no WorkerReport: nothing of it is a result to ingest.
    return dataclasses.replace(obs, termination_message=None, exit_code=obs.exit_code)


def observe(job: Obj | None, pods: Sequence[Obj], refusal: str | None = None) -> Observation:
    """The observation for one child Job and the pods that belong to it (and to its server, if any);
    `refusal` is the Job's latest FailedCreate message, when there is one (see pods_refused)."""
    if job is None:
        return Observation(phase=Phase.PENDING, reason="JobNotFound", message="waiting for the child Job")
    failed = job_condition(job, "Failed")
    if failed is not None:
        return _failed(job, pods, failed)
    complete = job_condition(job, "Complete")
    if complete is not None:
        return _succeeded(job, pods, complete)
    if (job.get("spec") or {}).get("suspend") or job_condition(job, "Suspended"):
        return _suspended(job)
    return _active(job, pods, refusal)
