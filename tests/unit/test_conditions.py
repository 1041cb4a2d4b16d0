"""Conditions merge: transition times move only on a status flip; other types are left alone."""

from __future__ import annotations

from datetime import UTC, datetime

from accelbench.controller.conditions import (
    conditions_to_wire,
    find_condition,
    make_condition,
    merge_conditions,
    now_rfc3339,
    parse_conditions,
    remove_condition,
    set_condition,
)

T0 = "2026-05-04T10:00:00Z"
T1 = "2026-05-04T10:05:00Z"


def test_new_condition_is_stamped_and_appended() -> None:
    merged = set_condition([], make_condition("Ready", True, "ChildrenCreated", "ok", 3), now=T0)
    assert conditions_to_wire(merged) == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "ChildrenCreated",
            "message": "ok",
            "lastTransitionTime": T0,
            "observedGeneration": 3,
        }
    ]


def test_same_status_keeps_transition_time_but_takes_new_reason_and_generation() -> None:
    first = set_condition([], make_condition("Scheduled", False, "Unschedulable", "no tpu", 1), now=T0)
    second = set_condition(first, make_condition("Scheduled", False, "Queued", "in queue", 2), now=T1)
    (cond,) = second
    assert cond.last_transition_time == T0
    assert (cond.reason, cond.message, cond.observed_generation) == ("Queued", "in queue", 2)


def test_status_flip_moves_transition_time() -> None:
    first = set_condition([], make_condition("Running", False, "Scheduling"), now=T0)
    second = set_condition(first, make_condition("Running", True, "Running"), now=T1)
    assert second[0].last_transition_time == T1


def test_merge_keeps_order_and_untouched_types() -> None:
    existing = merge_conditions(
        [],
        [make_condition("Ready", True, "ChildrenCreated"), make_condition("Running", False, "Scheduling")],
        now=T0,
    )
    merged = merge_conditions(
        existing,
        [make_condition("Running", True, "Running"), make_condition("Succeeded", True, "Completed")],
        now=T1,
    )
    assert [c.type for c in merged] == ["Ready", "Running", "Succeeded"]
    ready = find_condition(merged, "Ready")
    assert ready is not None and ready.last_transition_time == T0


def test_parse_drops_malformed_entries_and_round_trips() -> None:
    raw = [
        {"type": "Ready", "status": "True", "reason": "ChildrenCreated", "lastTransitionTime": T0},
        {"type": "Broken", "status": "maybe", "reason": "x"},
        "not a mapping at all",
    ]
    parsed = parse_conditions(raw)  # type: ignore[arg-type]
    assert [c.type for c in parsed] == ["Ready"]
    assert conditions_to_wire(parsed)[0]["lastTransitionTime"] == T0


def test_remove_condition() -> None:
    conditions = merge_conditions([], [make_condition("Failed", True, "OOMKilled")], now=T0)
    assert remove_condition(conditions, "Failed") == []


def test_now_rfc3339_is_utc_seconds() -> None:
    assert now_rfc3339(datetime(2026, 5, 4, 10, 0, 0, 123456, tzinfo=UTC)) == T0
