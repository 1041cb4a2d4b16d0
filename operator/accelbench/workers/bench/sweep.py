"""The sweep: every input length × concurrency (closed) and × rate (open), then the capacity search."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ...api.inference import Slo, Workload
from .capacity import LevelOutcome, capacity_result, next_level
from .records import request_metrics
from .runner import Runner
from .stats import CellKey, aggregate_cell

log = logging.getLogger("accelbench.bench")

DEFAULT_MIN_REQUESTS = 32
DEFAULT_REQUESTS_PER_WORKER = 8
DEFAULT_OPEN_LOOP_SECONDS = 30.0


def closed_loop_count(workload: Workload, concurrency: int) -> int:
    """Requests per closed-loop cell: as set, else enough that every worker sends several
    (steady state, not just the first burst). Never fewer than two per worker: with fewer
    requests than workers the level is never reached, and a capacity search would "pass" any
    concurrency (8 requests cannot load 1024 workers)."""
    if workload.requests_per_point:
        return max(workload.requests_per_point, 2 * concurrency)
    if workload.seconds_per_point:
        # Upper bound; the deadline ends the cell. Prompts are built ahead, so keep it finite.
        return max(DEFAULT_MIN_REQUESTS, concurrency * 64)
    return max(DEFAULT_MIN_REQUESTS, concurrency * DEFAULT_REQUESTS_PER_WORKER)


def open_loop_count(workload: Workload, rate: float) -> int:
    if workload.requests_per_point:
        return workload.requests_per_point
    seconds = workload.seconds_per_point or DEFAULT_OPEN_LOOP_SECONDS
    return max(DEFAULT_MIN_REQUESTS // 4, round(rate * seconds))


@dataclass
class SweepResult:
    cells: list[dict]
    capacity: dict[int, dict]  # per input length


async def run_cell(
    runner: Runner, workload: Workload, slo: Slo | None, key: CellKey, tag: str = "sweep"
) -> dict:
    if key.concurrency is not None:
        records = await runner.closed_loop(
            key.input_length,
            key.concurrency,
            closed_loop_count(workload, key.concurrency),
            workload.seconds_per_point,
        )
    else:
        assert key.request_rate is not None
        records = await runner.open_loop(
            key.input_length, key.request_rate, open_loop_count(workload, key.request_rate)
        )
    cell = aggregate_cell(key, [request_metrics(r) for r in records], slo, workload.output_length)
    cell["phase"] = tag
    log.info(
        "cell in=%d c=%s rate=%s: %d ok, %d errors, ttft p50 %s ms, out %.1f tok/s",
        key.input_length,
        key.concurrency,
        key.request_rate,
        cell["completed"],
        cell["errors"],
        f"{cell['ttftMs']['p50']:.1f}" if cell["ttftMs"] else "-",
        cell["outputTokensPerSecond"],
    )
    return cell


def outcome_of(cell: dict) -> LevelOutcome:
    return LevelOutcome(
        passed=bool(cell.get("sloMet")),
        attainment_by_bound=cell.get("attainmentByBound") or {},
        output_tokens_per_second=cell["outputTokensPerSecond"],
    )


async def run_sweep(
    runner: Runner,
    workload: Workload,
    slo: Slo | None,
    search: bool,
    max_concurrency: int = 1024,
    on_cell: Callable[[dict], None] | None = None,
) -> SweepResult:
    cells: list[dict] = []
    capacity: dict[int, dict] = {}

    async def measure(key: CellKey, tag: str) -> dict:
        cell = await run_cell(runner, workload, slo, key, tag)
        cells.append(cell)
        if on_cell:
            on_cell(cell)
        return cell

    for length in workload.input_lengths:
        outcomes: dict[int, LevelOutcome] = {}
        for c in workload.concurrency:
            cell = await measure(CellKey(length, concurrency=c), "sweep")
            outcomes[c] = outcome_of(cell)
        for rate in workload.request_rates:
            await measure(CellKey(length, request_rate=rate), "sweep")
        if slo is None or not search:
            continue
        # The sweep's levels seed the search: doubling continues from the largest passing one.
        while (level := next_level(outcomes, start=1, max_level=max_concurrency)) is not None:
            cell = await measure(CellKey(length, concurrency=level), "search")
            outcomes[level] = outcome_of(cell)
        result = capacity_result(outcomes)
        capacity[length] = {
            "capacityConcurrency": result.capacity,
            "firstFailingConcurrency": result.first_failing,
            "bindingConstraint": result.binding_constraint,
            "outputTokensPerSecondAtCapacity": result.output_tokens_per_second,
            "levelsMeasured": sorted(outcomes),
        }
    return SweepResult(cells=cells, capacity=capacity)
