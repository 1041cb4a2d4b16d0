"""SLO capacity search (pure functions).

The search is a state machine over the levels measured so far, so the runner can measure, record,
and ask again, and tests can drive it with a table instead of a server:
1. doubling from `start` while levels pass (up to `max_level`);
2. then bisection between the largest passing level below the first failure and that failure,
   until they are adjacent (or within `tolerance` of each other).
It assumes attainment falls as concurrency rises; when a measured curve is not monotonic, the
bracket is still taken from the smallest failing level, so the answer never exceeds a level that
was seen to fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .stats import SLO_CONSTRAINTS


@dataclass(frozen=True)
class LevelOutcome:
    passed: bool
    attainment_by_bound: Mapping[str, float]
    output_tokens_per_second: float = 0.0


@dataclass(frozen=True)
class CapacityResult:
    capacity: int | None  # largest level meeting the SLO; None when even the smallest failed
    first_failing: int | None  # smallest failing level; None when every level passed
    binding_constraint: str | None  # the bound with the lowest attainment at first_failing
    output_tokens_per_second: float | None  # at capacity


def bracket(outcomes: Mapping[int, LevelOutcome]) -> tuple[int, int | None]:
    """(largest pass below the first failure or 0, first failure or None)."""
    fails = [c for c, o in outcomes.items() if not o.passed]
    first_fail = min(fails) if fails else None
    passes = [c for c, o in outcomes.items() if o.passed and (first_fail is None or c < first_fail)]
    return (max(passes) if passes else 0), first_fail


def next_level(
    outcomes: Mapping[int, LevelOutcome], start: int = 1, max_level: int = 1024, tolerance: float = 0.0
) -> int | None:
    """The next concurrency to measure, or None when the search is done."""
    if not outcomes:
        return start
    lo, hi = bracket(outcomes)
    if hi is None:  # still doubling
        if lo >= max_level:
            return None
        return min(max(lo * 2, start), max_level)
    if hi - lo <= max(1, int(tolerance * lo)):
        return None
    mid = (lo + hi) // 2
    return mid if mid not in outcomes else None


def binding_constraint(outcome: LevelOutcome) -> str | None:
    """The bound that held least often; ties resolve in the order ttft, tpot, e2e."""
    bounds = [b for b in SLO_CONSTRAINTS if b in outcome.attainment_by_bound]
    if not bounds:
        return None
    return min(bounds, key=lambda b: outcome.attainment_by_bound[b])


def capacity_result(outcomes: Mapping[int, LevelOutcome]) -> CapacityResult:
    lo, hi = bracket(outcomes)
    capacity = lo or None
    return CapacityResult(
        capacity=capacity,
        first_failing=hi,
        binding_constraint=binding_constraint(outcomes[hi]) if hi is not None else None,
        output_tokens_per_second=outcomes[capacity].output_tokens_per_second if capacity else None,
    )
