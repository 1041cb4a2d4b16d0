"""Which of a campaign's waiting cells may start now, under its budget and concurrency caps. Pure.

Projections can be wrong, so a cell is not admitted on its projection alone: it is given an
allowance, its projection plus its headroom, cut to what the budget has left, and the allowance becomes
its deadline (the Job's activeDeadlineSeconds). A cell is admitted only when its allowance still
covers its projection. Finished cells count what they cost, running ones their allowance, so the
campaign as a whole never spends more than `maxUSD` (or `maxChipHours`), whatever the projections
said; a cell that runs long is stopped at its deadline and says so (DeadlineExceeded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Candidate:
    """A cell waiting to start: its price and its projected duration."""

    name: str
    accelerator: str
    chips: int
    dollars_per_hour: float  # chips x $/chip-hour
    projected_hours: float
    headroom: float = 0.5  # fraction of the projection it may run past it (campaign/projection.py)

    @property
    def projected_dollars(self) -> float:
        return self.dollars_per_hour * self.projected_hours

    @property
    def projected_chip_hours(self) -> float:
        return self.chips * self.projected_hours


@dataclass(frozen=True)
class Started:
    """A cell that was admitted: what it has cost so far (all of it once `finished`), and the
    allowance it was given (its deadline's worth; None when the campaign has no budget)."""

    name: str
    accelerator: str
    spent_dollars: float
    allowed_dollars: float | None = None
    spent_chip_hours: float = 0.0
    allowed_chip_hours: float | None = None
    finished: bool = False

    @property
    def committed_dollars(self) -> float:
        if self.finished or self.allowed_dollars is None:
            return self.spent_dollars
        return max(self.spent_dollars, self.allowed_dollars)

    @property
    def committed_chip_hours(self) -> float:
        if self.finished or self.allowed_chip_hours is None:
            return self.spent_chip_hours
        return max(self.spent_chip_hours, self.allowed_chip_hours)


@dataclass(frozen=True)
class Limits:
    max_usd: float | None = None
    max_chip_hours: float | None = None
    max_concurrent: int | None = None
    max_per_accelerator: int | None = None


@dataclass
class Admission:
    admitted: list[tuple[str, int | None]] = field(default_factory=list)  # (name, deadline seconds)
    held: dict[str, str] = field(default_factory=dict)  # name -> why it waits


def admit(candidates: Sequence[Candidate], started: Sequence[Started], limits: Limits) -> Admission:
    """The cells to start now, in the order given, each with the deadline that keeps the campaign
    within its budget; the rest with the reason they wait (a cap on concurrency, or the budget)."""
    out = Admission()
    running = [s for s in started if not s.finished]
    per_accelerator: dict[str, int] = {}
    for s in running:
        per_accelerator[s.accelerator] = per_accelerator.get(s.accelerator, 0) + 1
    count = len(running)
    dollars = sum(s.committed_dollars for s in started)
    chip_hours = sum(s.committed_chip_hours for s in started)
    for cell in candidates:
        if limits.max_concurrent is not None and count >= limits.max_concurrent:
            out.held[cell.name] = (
                f"{count} cell(s) running or starting (maxConcurrent {limits.max_concurrent})"
            )
            continue
        on_accel = per_accelerator.get(cell.accelerator, 0)
        if limits.max_per_accelerator is not None and on_accel >= limits.max_per_accelerator:
            out.held[cell.name] = (
                f"{on_accel} cell(s) run or start on {cell.accelerator} "
                f"(maxConcurrentPerAccelerator {limits.max_per_accelerator})"
            )
            continue
        hours = allowed_hours(cell, dollars, chip_hours, limits)
        if hours is not None and hours < cell.projected_hours:
            out.held[cell.name] = _over_budget(cell, dollars, chip_hours, limits)
            continue
        out.admitted.append(
            (cell.name, None if hours is None else max(math.floor(hours * SECONDS_PER_HOUR), 1))
        )
        used = cell.projected_hours if hours is None else hours
        dollars += cell.dollars_per_hour * used
        chip_hours += cell.chips * used
        count += 1
        per_accelerator[cell.accelerator] = on_accel + 1
    return out


def allowed_hours(
    cell: Candidate, committed_dollars: float, committed_chip_hours: float, limits: Limits
) -> float | None:
    """The projection plus its headroom, cut to what the budget has left; None without a budget."""
    caps = []
    if limits.max_usd is not None and cell.dollars_per_hour > 0:
        caps.append((limits.max_usd - committed_dollars) / cell.dollars_per_hour)
    if limits.max_chip_hours is not None and cell.chips > 0:
        caps.append((limits.max_chip_hours - committed_chip_hours) / cell.chips)
    if not caps:
        return None
    return min(cell.projected_hours * (1 + cell.headroom), *caps)


def _over_budget(cell: Candidate, dollars: float, chip_hours: float, limits: Limits) -> str:
    if limits.max_usd is not None and dollars + cell.projected_dollars > limits.max_usd:
        return (
            f"projected ${cell.projected_dollars:.2f} would take the campaign past maxUSD "
            f"{limits.max_usd:g} (${dollars:.2f} spent or committed)"
        )
    return (
        f"projected {cell.projected_chip_hours:.2f} chip-hours would take the campaign past "
        f"maxChipHours {limits.max_chip_hours:g} ({chip_hours:.2f} spent or committed)"
    )
