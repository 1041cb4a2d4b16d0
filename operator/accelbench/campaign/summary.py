"""A campaign's numbers: repeats -> median and spread, training + serving -> total cost of
ownership, the cost/speed Pareto front and the winner per metric. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    median: float
    cv: float | None  # sample standard deviation / mean; None with fewer than two values
    n: int


def spread(values: Sequence[float]) -> Spread | None:
    """Median and coefficient of variation of a cell's repeats (None when none has a value)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    mean = statistics.fmean(present)
    cv = statistics.stdev(present) / mean if len(present) > 1 and mean else None
    return Spread(median=statistics.median(present), cv=cv, n=len(present))


@dataclass(frozen=True)
class Ownership:
    """Fine-tune once on one accelerator, then serve the result for `serving_hours` on another."""

    training_dollars: float
    serving_dollars_per_hour: float
    serving_hours: float

    @property
    def dollars(self) -> float:
        return self.training_dollars + self.serving_dollars_per_hour * self.serving_hours


def ownership_ratio(a: Ownership, b: Ownership) -> float:
    """How many times `b` costs `a` (the study's "1.82x")."""
    return b.dollars / a.dollars


def pareto_front(points: Mapping[str, tuple[float, float]]) -> list[str]:
    """Names of the (cost, speed) points no other point beats on both: cheaper-or-equal and
    faster-or-equal, and strictly better on one. Sorted by cost."""
    front = [
        name
        for name, (cost, speed) in points.items()
        if not any(
            (c <= cost and s >= speed) and (c < cost or s > speed)
            for other, (c, s) in points.items()
            if other != name
        )
    ]
    return sorted(front, key=lambda name: (points[name][0], -points[name][1], name))


def winner(values: Mapping[str, float | None], higher_is_better: bool) -> str | None:
    """The name with the best value (ties: the first name in sorted order); None when none has one."""
    present = {name: v for name, v in values.items() if v is not None}
    if not present:
        return None
    best = max(present.values()) if higher_is_better else min(present.values())
    return min(name for name, v in present.items() if v == best)


def regression(value: float | None, baseline: float | None, threshold: float, higher_is_better: bool) -> bool:
    """True when `value` is worse than `baseline` by more than `threshold` (a fraction)."""
    if value is None or baseline is None or baseline == 0:
        return False
    change = (value - baseline) / abs(baseline)
    return change < -threshold if higher_is_better else change > threshold
