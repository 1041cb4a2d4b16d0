"""Status composition: (current status, observation, report, clock) -> the status to write. Pure.

Every function returns wire-form (camelCase) dicts for the fields it owns; `status_patch` then keeps only
what differs from the current status, so an unchanged world writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..api.status import (
    BenchResults,
    Children,
    Condition,
    ConditionType,
    Cost,
    Phase,
    Reason,
    named_failure,
)
from ..cost import compute_cost, earlier_segments_hours, parse_time, with_serving_cost
from .conditions import (
    conditions_to_wire,
    find_condition,
    make_condition,
    merge_conditions,
    now_rfc3339,
    parse_conditions,
    remove_condition,
)
from .ingest import Ingested
from .observe import Observation

RECONCILE_ERROR = "ReconcileError"  # a bug or an unexpected failure on our side, not the user's spec
# The apiserver refused a child (e.g. an edit that would change an immutable Job template). The run
# that exists keeps going and keeps being observed, so this is not InvalidSpec and not phase Failed.
APPLY_REJECTED = "ApplyRejected"

# A worker's own ok=false is more telling than a bare exit code, but not than these platform causes.
PLATFORM_FAILURES = frozenset({Reason.DEADLINE_EXCEEDED, Reason.OOM_KILLED, Reason.PREEMPTED})
TERMINAL = frozenset({Phase.SUCCEEDED.value, Phase.FAILED.value})


@dataclass(frozen=True)
class Price:
    chips: int
    dollars_per_chip_hour: float | None  # None: no price known, the cost's dollars are None
    price_source: str

    @property
    def dollars_per_hour(self) -> float | None:
        return None if self.dollars_per_chip_hour is None else self.chips * self.dollars_per_chip_hour


def price_from_status(status: Mapping[str, Any]) -> Price | None:
    """The price seeded into status.cost when the children were applied (so the timer needs no plan)."""
    cost = status.get("cost") or {}
    try:
        rate = cost.get("dollarsPerChipHour")  # absent: no price known
        return Price(int(cost["chips"]), None if rate is None else float(rate), str(cost["priceSource"]))
    except (KeyError, TypeError, ValueError):
        return None


# Applied=False reasons of a run that ended before anything ran: a new generation may still start it.
NEVER_STARTED_REASONS = frozenset({Reason.INVALID_SPEC.value, Reason.MODEL_UNAVAILABLE.value})


def is_terminal(status: Mapping[str, Any]) -> bool:
    return status.get("phase") in TERMINAL


def finished(status: Mapping[str, Any]) -> bool:
    """A run that ended is never re-run by a restart or an edit (it would cost money), whatever its
    Applied condition says (an edit refused by the Job's immutability leaves Applied=False on a run that
    ran: the lifecycle fuzz re-ran one through that gap). The one end a new generation may leave is
    a spec the operator refused before anything ran: fixing the spec is how the user goes on."""
    if not is_terminal(status):
        return False
    ready = find_condition(parse_conditions(status.get("conditions")), ConditionType.APPLIED.value)
    refused_before_start = (
        ready is not None and ready.reason in NEVER_STARTED_REASONS and not status.get("startTime")
    )
    return not refused_before_start


def not_applied_status(
    current: Mapping[str, Any], message: str, generation: int | None, reason: str = RECONCILE_ERROR
) -> dict[str, Any]:
    """Applied=False with `reason`, the rest of the status as it is."""
    ready = make_condition(ConditionType.APPLIED.value, False, reason, message, generation)
    merged = merge_conditions(parse_conditions(current.get("conditions")), [ready], now=now_rfc3339())
    return {"conditions": conditions_to_wire(merged), "message": message}


def spec_invalid(status: Mapping[str, Any], generation: int | None) -> bool:
    """True when this generation was already refused; the timer then leaves the status alone."""
    ready = find_condition(parse_conditions(status.get("conditions")), ConditionType.APPLIED.value)
    return (
        ready is not None
        and ready.status == "False"
        and ready.reason == Reason.INVALID_SPEC.value
        and ready.observed_generation == generation
    )


def invalid_spec_status(
    current: Mapping[str, Any],
    message: str,
    generation: int | None,
    now: datetime,
    reason: str = Reason.INVALID_SPEC.value,
) -> dict[str, Any]:
    """Phase Failed with Applied=False/InvalidSpec (or `reason`: a run that can never start); fixing
    the spec (a new generation) clears it."""
    ready = make_condition(ConditionType.APPLIED.value, False, reason, message, generation)
    conditions = merge_conditions(parse_conditions(current.get("conditions")), [ready], now=now_rfc3339(now))
    return {
        "phase": Phase.FAILED.value,
        "conditions": conditions_to_wire(conditions),
        "message": message,
        "observedGeneration": generation,
    }


def applied_status(
    current: Mapping[str, Any],
    *,
    plan_status: Mapping[str, Any],
    accelerator: str,
    children: Children,
    price: Price,
    generation: int | None,
    now: datetime,
) -> dict[str, Any]:
    """After the children were applied: what was planned, which children exist, and the price book."""
    ready = make_condition(
        ConditionType.APPLIED.value, True, Reason.CHILDREN_CREATED.value, "children applied", generation
    )
    conditions = merge_conditions(parse_conditions(current.get("conditions")), [ready], now=now_rfc3339(now))
    status: dict[str, Any] = {
        "conditions": conditions_to_wire(conditions),
        "observedGeneration": generation,
        "plan": dict(plan_status),
        "accelerator": accelerator,
        "children": children.to_wire(),
    }
    refused_before = current.get("phase") == Phase.FAILED.value and not current.get("startTime")
    if not current.get("phase") or refused_before:
        status["phase"] = Phase.PENDING.value
        status["message"] = "children applied; waiting for the Job"
    if not is_terminal(current) or refused_before:
        old = current.get("cost") or {}
        status["cost"] = Cost(
            dollars=None if price.dollars_per_chip_hour is None else float(old.get("dollars") or 0.0),
            chips=price.chips,
            hours=float(old.get("hours", 0.0)),
            earlier_hours=float(old.get("earlierHours", 0.0)),  # a re-apply keeps every segment
            dollars_per_chip_hour=price.dollars_per_chip_hour,
            price_source=price.price_source,
        ).to_wire()
    return status


def _with_generation(conditions: tuple[Condition, ...], generation: int | None) -> list[Condition]:
    return [c.model_copy(update={"observed_generation": generation}) for c in conditions]


def recorded_worker_error(existing: list[Condition], ingested: Ingested | None) -> str | None:
    """The worker's own error, from this ingestion or from the one recorded earlier."""
    if ingested is not None:
        return ingested.worker_error
    result = find_condition(existing, ConditionType.RESULT_VALID.value)
    if result is not None and result.reason == Reason.WORKER_ERROR.value:
        return result.message
    return None


def apply_worker_error(obs: Observation, error: str | None) -> Observation:
    """A finished run whose worker reported an error failed for that error: its named reason
    (ObjectNotFound, OutputNotWritten, ...) when it has one, else WorkerError."""
    if error is None or not obs.terminal or obs.reason in PLATFORM_FAILURES:
        return obs
    named = named_failure(error)
    reason = named[0] if named else Reason.WORKER_ERROR.value
    failed = make_condition(ConditionType.FAILED.value, True, reason, error)
    running = make_condition(ConditionType.RUNNING.value, False, reason, error)
    return Observation(
        phase=Phase.FAILED,
        reason=reason,
        message=error,
        conditions=(running, failed),
        start_time=obs.start_time,
        completion_time=obs.completion_time,
        termination_message=obs.termination_message,
        exit_code=obs.exit_code,
        notes=obs.notes,
    )


BILLING_STEP_S = 60.0  # a running cost moves by whole minutes at the least


def billing_clock(
    now: datetime, terminal: bool, step_s: float = BILLING_STEP_S, start: str | None = None
) -> datetime:
    """The instant a running cost is billed to: whole steps of `step_s` since the run's `start`
    (a running cost that moved on every pass would rewrite the status on every pass; the loop widens
    the step for a large fleet). Counted from the start rather than the wall clock, so a run's first
    cost write comes a full step after it started, not at whichever minute boundary follows, and a
    fleet's writes spread over the step instead of landing on the same second. A final cost is exact."""
    if terminal:
        return now
    step = max(step_s, BILLING_STEP_S)
    began = parse_time(start)
    origin = began.timestamp() if began is not None and began <= now else 0.0
    return datetime.fromtimestamp(origin + (now.timestamp() - origin) // step * step, UTC)


def derive_status(
    current: Mapping[str, Any],
    observation: Observation,
    *,
    generation: int | None,
    now: datetime,
    ingested: Ingested | None = None,
    billing_step_s: float = BILLING_STEP_S,
) -> dict[str, Any]:
    """The fields the observer owns: phase, conditions, message, times, cost, results."""
    existing = parse_conditions(current.get("conditions"))
    obs = apply_worker_error(observation, recorded_worker_error(existing, ingested))

    desired = _with_generation(obs.conditions, generation)
    if ingested is not None:
        desired.append(ingested.condition)
    conditions = existing
    stale = (ConditionType.SUCCEEDED, ConditionType.FAILED) if not obs.terminal else ()
    if obs.phase == Phase.FAILED:
        stale = (ConditionType.SUCCEEDED,)
    for type_ in stale:
        conditions = remove_condition(conditions, type_.value)
    conditions = merge_conditions(conditions, desired, now=now_rfc3339(now))

    message = obs.message if not obs.notes else f"{obs.message} (earlier: {obs.notes[-1]})"
    status: dict[str, Any] = {
        "phase": obs.phase.value,
        "conditions": conditions_to_wire(conditions),
        "message": message,
        "startTime": obs.start_time,
        "completionTime": obs.completion_time if obs.terminal else None,
    }

    price = price_from_status(current)
    if price is not None:
        segment_closed = parse_time(obs.suspended_at) or now
        cost = compute_cost(
            chips=price.chips,
            dollars_per_chip_hour=price.dollars_per_chip_hour,
            price_source=price.price_source,
            start=obs.start_time,
            end=obs.completion_time if obs.terminal else None,
            now=billing_clock(now, obs.terminal, billing_step_s, obs.start_time),
            earlier_hours=earlier_segments_hours(current, obs.start_time, segment_closed),
            shown_hours=float((current.get("cost") or {}).get("hours") or 0.0),
            shown_dollars=float((current.get("cost") or {}).get("dollars") or 0.0),
        )
        if cost is not None:
            status["cost"] = cost.to_wire()

    if ingested is not None and ingested.results is not None:
        results = ingested.results
        if isinstance(results, BenchResults) and price is not None:
            results = with_serving_cost(results, price.dollars_per_hour)
        status["results"] = results.to_wire()
    return status


# Applied=False reasons that need someone to act (the operator retries a NameConflict, but only a
# person can remove the object in the way).
STALLING_APPLY_REASONS = frozenset(
    {Reason.INVALID_SPEC.value, Reason.NAME_CONFLICT.value, Reason.MODEL_UNAVAILABLE.value}
)


def kstatus_conditions(status: Mapping[str, Any], generation: int | None, now: datetime) -> dict[str, Any]:
    """Ready, Reconciling and Stalled from the phase and the Applied condition, the way kstatus
    (Flux's health checks, `kubectl wait --for=condition=Ready`) reads them: a run is Ready only once
    it succeeded, Reconciling while it waits or runs, Stalled once it failed or cannot start."""
    existing = parse_conditions(status.get("conditions"))
    phase = status.get("phase")
    message = str(status.get("message") or "")
    applied = find_condition(existing, ConditionType.APPLIED.value)
    failed = find_condition(existing, ConditionType.FAILED.value)
    if phase == Phase.SUCCEEDED.value:
        ready, reconciling, stalled = (True, Reason.COMPLETED.value), None, None
    elif phase == Phase.FAILED.value:
        reason = (failed.reason if failed and failed.status == "True" else None) or (
            applied.reason if applied and applied.status == "False" else Phase.FAILED.value
        )
        ready, reconciling, stalled = (False, reason), None, reason
    elif applied is not None and applied.status == "False" and applied.reason in STALLING_APPLY_REASONS:
        ready, reconciling, stalled = (False, applied.reason), None, applied.reason
    else:
        waiting = phase or Phase.PENDING.value
        if applied is not None and applied.status == "False":
            waiting = applied.reason  # QuotaExceeded, a refused edit, an apiserver away: retried
        ready, reconciling, stalled = (False, waiting), waiting, None
    desired = [
        make_condition(ConditionType.READY.value, ready[0], ready[1], message, generation),
        make_condition(
            ConditionType.RECONCILING.value,
            reconciling is not None,
            reconciling or "Done",
            message,
            generation,
        ),
        make_condition(
            ConditionType.STALLED.value, stalled is not None, stalled or "Progressing", message, generation
        ),
    ]
    merged = merge_conditions(existing, desired, now=now_rfc3339(now))
    return {"conditions": conditions_to_wire(merged)}


def status_patch(
    current: Mapping[str, Any], desired: Mapping[str, Any], whole_maps: bool = False
) -> dict[str, Any]:
    """Only the top-level fields that changed; None values are kept (they delete in a merge patch).
    A merge patch merges maps key by key, so with `whole_maps` (a status computed whole each pass,
    as a campaign's is) a changed map also deletes the keys it no longer has."""
    return {
        key: _replacing(current.get(key), value) if whole_maps else value
        for key, value in desired.items()
        if current.get(key) != value and not (value is None and current.get(key) is None)
    }


def _replacing(current: Any, desired: Any) -> Any:
    """`desired` as a merge patch over `current` that leaves exactly `desired`."""
    if not isinstance(current, Mapping) or not isinstance(desired, Mapping):
        return desired
    gone = {key: None for key in current if key not in desired}
    return {**gone, **{key: _replacing(current.get(key), value) for key, value in desired.items()}}


def needs_ingest(current: Mapping[str, Any]) -> bool:
    """Rank 0's report is read once: after that the ResultValid condition records the outcome."""
    return (
        find_condition(parse_conditions(current.get("conditions")), ConditionType.RESULT_VALID.value) is None
    )
