"""A campaign's rows -> what its status concludes: one summary per cell over its repeats (median and
spread), the ratios to the baseline and the regressions, total cost of ownership for each serving
cell that serves a trained one, the cost/speed front and the winner per metric. Pure.

Only succeeded runs count: a failed repeat is a row with its reason, never a number in a median.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api import FinetuneJob, InferenceBench, Phase
from ..api.campaign import CellRow, CellSummary, Ownership
from ..api.campaign import Spread as SpreadModel
from .summary import Ownership as Tco
from .summary import pareto_front, regression, spread, winner

SUCCEEDED = Phase.SUCCEEDED.value

# Summary field -> the row figure it aggregates.
AGGREGATED: tuple[tuple[str, Callable[[CellRow], float | None]], ...] = (
    ("tokens_per_second", lambda r: r.tokens_per_second),
    ("tokens_per_second_per_chip", lambda r: r.tokens_per_second_per_chip),
    ("mfu", lambda r: r.mfu),
    ("final_loss", lambda r: r.final_loss),
    ("peak_output_tokens_per_second", lambda r: r.peak_output_tokens_per_second),
    (
        "capacity_concurrency",
        lambda r: None if r.capacity_concurrency is None else float(r.capacity_concurrency),
    ),
    ("ttft_p99_ms", lambda r: r.ttft_p99_ms),
    ("tpot_p99_ms", lambda r: r.tpot_p99_ms),
    ("dollars_per_million_tokens", lambda r: r.dollars_per_million_tokens),
    ("cost_dollars", lambda r: r.cost_dollars),
    ("images_per_second", lambda r: r.images_per_second),
    ("images_per_second_per_chip", lambda r: r.images_per_second_per_chip),
    ("psnr", lambda r: r.psnr),
    ("effective_bits", lambda r: r.effective_bits),
    ("perplexity_increase", lambda r: r.perplexity_increase),
)

# What a baseline compares, per kind: (summary field, higher is better, which ratio it sets).
SPEED = {FinetuneJob.KIND: "tokens_per_second", InferenceBench.KIND: "peak_output_tokens_per_second"}
COST = {FinetuneJob.KIND: "cost_dollars", InferenceBench.KIND: "dollars_per_million_tokens"}
COUNT_PATH = "accelerator.count"  # the matrix axis scaling efficiency is read over


def speed_field(summary: CellSummary) -> str:
    """The throughput a cell is judged by: images/s for super-resolution, else its kind's."""
    return "images_per_second" if summary.images_per_second is not None else SPEED[summary.kind]


def scaling_efficiency(summaries: Sequence[CellSummary]) -> None:
    """Set T(N) / (N·T(1)) on every cell whose values differ from a one-chip cell's only in
    accelerator.count (1 = perfect scaling), T being the cell's median throughput."""
    by_rest: dict[tuple[str, str], dict[int, CellSummary]] = {}
    for s in summaries:
        values = json.loads(s.values)
        count = values.pop(COUNT_PATH, None)
        accelerator = values.get("accelerator")
        if count is None and isinstance(accelerator, dict):  # a matrix over whole accelerator objects
            values["accelerator"] = {k: v for k, v in accelerator.items() if k != "count"}
            count = accelerator.get("count")
        if isinstance(count, int) and s.kind == FinetuneJob.KIND:
            by_rest.setdefault((s.kind, json.dumps(values, sort_keys=True)), {})[count] = s
    for cells in by_rest.values():
        one = cells.get(1)
        if one is None:
            continue
        base = _median(one, speed_field(one))
        for count, s in cells.items():
            mine = _median(s, speed_field(s))
            if mine is not None and base:
                s.scaling_efficiency = round(mine / (count * base), 4)


@dataclass
class Conclusions:
    summary: list[CellSummary] = field(default_factory=list)
    ownership: list[Ownership] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    pareto_front: list[str] = field(default_factory=list)
    winners: dict[str, str] = field(default_factory=dict)


def _spread(values: Sequence[float | None]) -> SpreadModel | None:
    s = spread([v for v in values if v is not None])
    if s is None:
        return None
    cv = None if s.cv is None else round(abs(s.cv), 6)
    return SpreadModel(median=s.median, cv=cv, n=s.n)


def summarize(rows: Sequence[CellRow]) -> list[CellSummary]:
    """One summary per cell key, in the rows' order; figures over the succeeded repeats."""
    by_cell: dict[str, list[CellRow]] = {}
    for row in rows:
        by_cell.setdefault(f"{row.kind}/{row.cell}", []).append(row)
    out = []
    for group in by_cell.values():
        first = min(group, key=lambda r: r.repeat)
        ok = [r for r in group if r.phase == SUCCEEDED]
        summary = CellSummary(
            cell=first.cell,
            name=first.name,
            kind=first.kind,
            values=first.values,
            accelerator=next((r.accelerator for r in group if r.accelerator), None),
            runs=sum(r.phase not in ("Waiting", "Invalid", "Skipped") for r in group),
            succeeded=len(ok),
            dollars_per_hour=next((r.dollars_per_hour for r in ok if r.dollars_per_hour is not None), None),
            model_from=first.model_from,
        )
        for name, figure in AGGREGATED:
            setattr(summary, name, _spread([figure(r) for r in ok]))
        out.append(summary)
    return out


def _median(summary: CellSummary, name: str) -> float | None:
    value = getattr(summary, name)
    return value.median if value is not None else None


def selects(values_json: str, selection: Mapping[str, Any]) -> bool:
    """Does a cell (its values as JSON) have every path=value of `selection`?"""
    values = json.loads(values_json)
    normal = json.loads(json.dumps(dict(selection)))
    return all(path in values and values[path] == value for path, value in normal.items())


def compare_to_baseline(
    summaries: Sequence[CellSummary], baselines: Mapping[str, CellSummary | None], threshold: float
) -> list[str]:
    """Set each summary's ratios to its baseline (by key in `baselines`: the cell's own key for an
    earlier campaign, its kind for a cell of this one) and list the regressions."""
    regressions = []
    for s in summaries:
        base = baselines.get(f"{s.kind}/{s.cell}") or baselines.get(s.kind)
        if base is None or base is s:
            continue
        speed, cost = speed_field(s), COST[s.kind]
        mine_speed, base_speed = _median(s, speed), _median(base, speed)
        mine_cost, base_cost = _median(s, cost), _median(base, cost)
        if mine_speed is not None and base_speed:
            s.speed_ratio = round(mine_speed / base_speed, 4)
        if mine_cost is not None and base_cost:
            s.cost_ratio = round(mine_cost / base_cost, 4)
        for metric, higher in ((speed, True), (cost, False)):
            if regression(_median(s, metric), _median(base, metric), threshold, higher):
                s.regressed.append(metric)
        if s.regressed:
            regressions.append(f"{s.name}: {', '.join(_camel(m) for m in s.regressed)} vs {base.name}")
    return regressions


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def ownership(summaries: Sequence[CellSummary], serving_hours: Sequence[float]) -> list[Ownership]:
    """Training (the median cost of the trained cell) + hours x serving $/hour, for each serving cell
    that serves a trained cell, at each number of hours; ratio to the cheapest at the same hours."""
    trained = {s.name: s for s in summaries if s.kind == FinetuneJob.KIND}
    rows: list[Ownership] = []
    for s in summaries:
        source = trained.get(s.model_from or "")
        if s.kind != InferenceBench.KIND or source is None or s.succeeded == 0:
            continue
        training = _median(source, "cost_dollars")
        if training is None or s.dollars_per_hour is None:
            continue
        for hours in serving_hours:
            tco = Tco(training, s.dollars_per_hour, hours)
            rows.append(
                Ownership(
                    training=source.name,
                    serving=s.name,
                    training_accelerator=source.accelerator,
                    serving_accelerator=s.accelerator,
                    training_dollars=round(training, 4),
                    serving_dollars_per_hour=round(s.dollars_per_hour, 4),
                    serving_hours=hours,
                    dollars=round(tco.dollars, 4),
                )
            )
    for hours in {r.serving_hours for r in rows}:
        same = [r for r in rows if r.serving_hours == hours]
        cheapest = min(r.dollars for r in same)
        for r in same:
            r.ratio = round(r.dollars / cheapest, 4) if cheapest > 0 else None
    return rows


def conclude(
    rows: Sequence[CellRow],
    serving_hours: Sequence[float],
    baseline_cell: Mapping[str, Any] | None = None,
    baseline_campaign: Sequence[CellSummary] | None = None,
    threshold: float = 0.05,
) -> Conclusions:
    summaries = summarize(rows)
    out = Conclusions(summary=summaries)
    baselines: dict[str, CellSummary | None] = {}
    if baseline_cell is not None:
        for kind in (FinetuneJob.KIND, InferenceBench.KIND):
            chosen = [s for s in summaries if s.kind == kind and selects(s.values, baseline_cell)]
            baselines[kind] = chosen[0] if len(chosen) == 1 else None
    if baseline_campaign is not None:
        baselines.update({f"{s.kind}/{s.cell}": s for s in baseline_campaign})
    if baselines:
        out.regressions = compare_to_baseline(summaries, baselines, threshold)
    out.ownership = ownership(summaries, serving_hours)
    scaling_efficiency(summaries)

    trained = [s for s in summaries if s.kind == FinetuneJob.KIND and s.succeeded]
    served = [s for s in summaries if s.kind == InferenceBench.KIND and s.succeeded]
    points = {
        s.name: (cost, speed)
        for s in trained
        if (cost := _median(s, "cost_dollars")) is not None
        and (speed := _median(s, "tokens_per_second")) is not None
    }
    out.pareto_front = pareto_front(points)
    candidates = {
        "tokensPerSecondPerChip": ({s.name: _median(s, "tokens_per_second_per_chip") for s in trained}, True),
        "trainingCost": ({s.name: _median(s, "cost_dollars") for s in trained}, False),
        "peakOutputTokensPerSecond": (
            {s.name: _median(s, "peak_output_tokens_per_second") for s in served},
            True,
        ),
        "dollarsPerMillionTokens": (
            {s.name: _median(s, "dollars_per_million_tokens") for s in served},
            False,
        ),
        "totalCostOfOwnership": (
            {
                f"{r.training}+{r.serving}": r.dollars
                for r in out.ownership
                if r.serving_hours == serving_hours[0]
            },
            False,
        ),
    }
    for metric, (values, higher) in candidates.items():
        best = winner(values, higher)
        if best:
            out.winners[metric] = best
    return out
