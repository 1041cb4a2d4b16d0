"""Capacity search as a table-driven state machine ($ per 1M tokens: tests/unit/test_cost.py)."""

from __future__ import annotations

import pytest

from accelbench.workers.bench.capacity import (
    LevelOutcome,
    binding_constraint,
    capacity_result,
    next_level,
)


def drive(limit: int | None, max_level: int = 1024, seeds: tuple[int, ...] = ()) -> tuple[list[int], dict]:
    """Run the search against a server that meets the SLO up to `limit` (None: always)."""

    def outcome(c: int) -> LevelOutcome:
        ok = limit is None or c <= limit
        return LevelOutcome(ok, {"ttft": 0.99 if ok else 0.5, "tpot": 0.95 if ok else 0.8}, 10.0 * c)

    outcomes = {c: outcome(c) for c in seeds}
    tried = []
    while (level := next_level(outcomes, max_level=max_level)) is not None:
        assert level not in outcomes
        tried.append(level)
        outcomes[level] = outcome(level)
    return tried, outcomes


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7, 8, 9, 100, 511, 1000])
def test_search_finds_the_exact_limit(limit: int) -> None:
    _tried, outcomes = drive(limit)
    result = capacity_result(outcomes)
    assert result.capacity == limit and result.first_failing == limit + 1
    assert result.binding_constraint == "ttft"
    assert result.output_tokens_per_second == 10.0 * limit


def test_doubling_then_bisection_order() -> None:
    tried, _ = drive(5)
    assert tried == [1, 2, 4, 8, 6, 5]


def test_nothing_passes() -> None:
    tried, outcomes = drive(0)
    assert tried == [1]
    result = capacity_result(outcomes)
    assert (result.capacity, result.first_failing) == (None, 1)


def test_everything_passes_up_to_the_ceiling() -> None:
    tried, outcomes = drive(None, max_level=48)
    assert tried[-1] == 48
    result = capacity_result(outcomes)
    assert (result.capacity, result.first_failing, result.binding_constraint) == (48, None, None)


def test_sweep_levels_seed_the_search() -> None:
    tried, outcomes = drive(20, seeds=(1, 4, 16, 64))
    assert capacity_result(outcomes).capacity == 20
    assert tried == [40, 28, 22, 19, 20, 21]


def test_non_monotonic_never_exceeds_a_failing_level() -> None:
    outcomes = {
        1: LevelOutcome(True, {"ttft": 1.0}),
        2: LevelOutcome(False, {"ttft": 0.5}),
        4: LevelOutcome(True, {"ttft": 1.0}),
    }
    assert next_level(outcomes) is None
    assert capacity_result(outcomes).capacity == 1


def test_binding_constraint_is_the_least_met_bound() -> None:
    assert binding_constraint(LevelOutcome(False, {"ttft": 0.9, "tpot": 0.7, "e2e": 0.8})) == "tpot"
    assert binding_constraint(LevelOutcome(False, {"ttft": 0.5, "e2e": 0.5})) == "ttft"
    assert binding_constraint(LevelOutcome(False, {})) is None
