"""One pass over a campaign: its cells, the runs to create now, and its status. Pure.

Input: the campaign, the runs it already made (by its UID, from the operator's index), the catalog.
Output: the manifests of the cells admitted now (each with the deadline its budget allows) and the
whole status. A cell's run is made once, under a name that is a hash of its values; a run that
exists is never made again, whatever the matrix says now (removed cells keep their rows, marked).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..api import API_VERSION, FinetuneJob, InferenceBench, Phase, parse_resource
from ..api.campaign import BenchCampaign, CellRow, Matrix, Totals
from ..api.contract import ANNOTATION_CELL_VALUES, LABEL_CAMPAIGN, LABEL_CELL
from ..api.errors import describe
from ..catalog.types import Catalog
from ..plan import plan_for
from .budget import Candidate, Limits, Started, admit
from .matrix import Cell, MatrixError, apply_assignment, cells_of
from .projection import project, unprojectable
from .summary import pareto_front, winner

TERMINAL = (Phase.SUCCEEDED.value, Phase.FAILED.value)


@dataclass
class CampaignPass:
    create: list[dict[str, Any]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)  # cell run name -> why it cannot be made


def arms(campaign: BenchCampaign) -> list[tuple[str, dict[str, Any], Matrix]]:
    arms = []
    if campaign.spec.finetune is not None:
        arms.append(
            (FinetuneJob.KIND, campaign.spec.finetune.template.to_wire(), campaign.spec.finetune.matrix)
        )
    if campaign.spec.inference is not None:
        arms.append(
            (InferenceBench.KIND, campaign.spec.inference.template.to_wire(), campaign.spec.inference.matrix)
        )
    return arms


def child_manifest(campaign: BenchCampaign, cell: Cell, template: Mapping[str, Any]) -> dict[str, Any]:
    """The run of one cell: the template with the cell's values, owned by the campaign; an output
    location gets the run's name appended, so cells never write over each other."""
    name = cell.child_name(campaign.metadata.name)
    spec = apply_assignment(template, cell.values())
    if isinstance(spec.get("output"), dict) and spec["output"].get("uri"):
        spec["output"] = {**spec["output"], "uri": f"{str(spec['output']['uri']).rstrip('/')}/{name}"}
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": campaign.metadata.namespace,
        "labels": {LABEL_CAMPAIGN: campaign.metadata.name, LABEL_CELL: cell.key},
        "annotations": {
            ANNOTATION_CELL_VALUES: json.dumps(cell.values(), sort_keys=True, separators=(",", ":"))
        },
    }
    if campaign.metadata.uid:
        metadata["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": BenchCampaign.KIND,
                "name": campaign.metadata.name,
                "uid": campaign.metadata.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {"apiVersion": API_VERSION, "kind": cell.kind, "metadata": metadata, "spec": spec}


def _f(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def row_of(cell: Cell | None, run: Mapping[str, Any], in_matrix: bool) -> CellRow:
    meta = run.get("metadata") or {}
    status = run.get("status") or {}
    results = status.get("results") or {}
    cost = status.get("cost") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    chips, hours = _f(cost.get("chips")), _f(cost.get("hours"))
    return CellRow(
        name=str(meta.get("name")),
        kind=str(run.get("kind")),
        cell=cell.key if cell else str((meta.get("labels") or {}).get(LABEL_CELL, "")),
        values=json.dumps(cell.values(), sort_keys=True)
        if cell
        else str((meta.get("annotations") or {}).get(ANNOTATION_CELL_VALUES, "{}")),
        repeat=cell.repeat if cell else 0,
        accelerator=status.get("accelerator"),
        phase=status.get("phase"),
        reason=ready.get("reason"),
        tokens_per_second=_f(results.get("tokensPerSecond")),
        tokens_per_second_per_chip=_f(results.get("tokensPerSecondPerChip")),
        mfu=_f(results.get("mfu")),
        final_loss=_f(results.get("finalLoss")),
        peak_output_tokens_per_second=_f(results.get("peakOutputTokensPerSecond")),
        capacity_concurrency=results.get("capacityConcurrency"),
        dollars_per_million_tokens=_f(results.get("dollarsPerMillionTokensAtCapacity"))
        or _f(results.get("dollarsPerMillionTokensAtPeak")),
        cost_dollars=_f(cost.get("dollars")),
        chip_hours=chips * hours if chips is not None and hours is not None else None,
        in_matrix=in_matrix,
    )


def plan_campaign(
    campaign: BenchCampaign, runs: Sequence[Mapping[str, Any]], catalog: Catalog, now: datetime
) -> CampaignPass:
    out = CampaignPass()
    existing = {str((r.get("metadata") or {}).get("name")): r for r in runs}
    cells: list[tuple[Cell, dict[str, Any]]] = []
    for kind, template, matrix in arms(campaign):
        try:
            for cell in cells_of(kind, matrix.axes, matrix.include, matrix.exclude, campaign.spec.repeats):
                cells.append((cell, template))
        except MatrixError as exc:
            out.invalid[f"{kind} matrix"] = str(exc)

    # What finished cells took: the projection for their siblings on the same accelerator.
    measured: dict[tuple[str, str], float] = {}
    for run in runs:
        status = run.get("status") or {}
        hours, accel = (
            _f((status.get("cost") or {}).get("hours")),
            (status.get("plan") or {}).get("accelerator"),
        )
        if status.get("phase") == Phase.SUCCEEDED.value and hours and run.get("kind"):
            accelerator = str((run.get("spec") or {}).get("accelerator", {}).get("type") or accel)
            measured.setdefault((str(run["kind"]), accelerator), hours)

    candidates: list[Candidate] = []
    unprojected: dict[str, str] = {}  # cells a budget cannot admit: no projection
    manifests: dict[str, dict[str, Any]] = {}
    rows: list[CellRow] = []
    for cell, template in cells:
        name = cell.child_name(campaign.metadata.name)
        run = existing.get(name)
        if run is not None:
            rows.append(row_of(cell, run, True))
            continue
        try:
            manifest = child_manifest(campaign, cell, template)
            resource = parse_resource(manifest)
            plan = plan_for(resource, catalog)
        except (ValueError, KeyError, MatrixError) as exc:
            out.invalid[name] = describe(exc)
            rows.append(_row(cell, name, "Invalid", "InvalidCell"))
            continue
        projection = project(resource, plan, measured)
        budgeted = campaign.spec.budget.max_usd is not None or campaign.spec.budget.max_chip_hours is not None
        if projection is None and budgeted:
            unprojected[name] = unprojectable(resource)
            rows.append(_row(cell, name, "Waiting"))
            continue
        hours, headroom = (projection.hours, projection.headroom) if projection else (0.0, 0.0)
        candidates.append(
            Candidate(name, plan.accelerator, plan.chips, plan.dollars_per_hour, hours, headroom)
        )
        manifests[name] = manifest
        rows.append(_row(cell, name, "Waiting"))
    in_matrix = {row.name for row in rows}
    rows += [row_of(None, run, False) for name, run in sorted(existing.items()) if name not in in_matrix]

    started = [_started(run) for run in runs]
    budget = campaign.spec.budget
    limits = Limits(
        max_usd=budget.max_usd,
        max_chip_hours=budget.max_chip_hours,
        max_concurrent=campaign.spec.max_concurrent,
        max_per_accelerator=campaign.spec.max_concurrent_per_accelerator,
    )
    admission = admit(candidates, started, limits)
    for name, deadline in admission.admitted:
        manifest = manifests[name]
        if deadline is not None:
            own = manifest["spec"].get("activeDeadlineSeconds")
            manifest["spec"]["activeDeadlineSeconds"] = min(deadline, own) if own else deadline
        out.create.append(manifest)
    admitted = {name for name, _ in admission.admitted}
    for row in rows:
        if row.name in admitted:
            row.phase = "Creating"
    out.status = campaign_status(campaign, rows, {**admission.held, **unprojected}, out.invalid)
    return out


def _row(cell: Cell, name: str, phase: str, reason: str | None = None) -> CellRow:
    """A cell without a run (yet): waiting for admission, or one that cannot be made."""
    values = json.dumps(cell.values(), sort_keys=True)
    return CellRow(
        name=name,
        kind=cell.kind,
        cell=cell.key,
        values=values,
        repeat=cell.repeat,
        phase=phase,
        reason=reason,
    )


def _started(run: Mapping[str, Any]) -> Started:
    status = run.get("status") or {}
    cost = status.get("cost") or {}
    dollars, chips, hours = (
        _f(cost.get("dollars")) or 0.0,
        _f(cost.get("chips")) or 0.0,
        _f(cost.get("hours")) or 0.0,
    )
    per_hour = chips * (_f(cost.get("dollarsPerChipHour")) or 0.0)
    deadline = _f((run.get("spec") or {}).get("activeDeadlineSeconds"))
    allowed = per_hour * deadline / 3600 if deadline is not None and per_hour else None
    return Started(
        name=str((run.get("metadata") or {}).get("name")),
        accelerator=str(status.get("accelerator") or ""),
        spent_dollars=dollars,
        allowed_dollars=allowed,
        spent_chip_hours=chips * hours,
        allowed_chip_hours=chips * deadline / 3600 if deadline is not None else None,
        finished=status.get("phase") in TERMINAL,
    )


def campaign_status(
    campaign: BenchCampaign, rows: list[CellRow], held: Mapping[str, str], invalid: Mapping[str, str]
) -> dict[str, Any]:
    """Rows, totals, the front and the winners, the phase and the kstatus conditions' inputs."""
    counted = [r for r in rows if r.phase != "Invalid"]
    totals = Totals(
        cells=len(rows),
        succeeded=sum(r.phase == Phase.SUCCEEDED.value for r in counted),
        failed=sum(r.phase == Phase.FAILED.value for r in counted),
        running=sum(r.phase not in (*TERMINAL, "Waiting", "Creating") for r in counted),
        waiting=sum(r.phase in ("Waiting", "Creating") for r in counted),
        dollars=round(sum(r.cost_dollars or 0.0 for r in rows), 4),
        chip_hours=round(sum(r.chip_hours or 0.0 for r in rows), 4),
    )
    trained = {r.name: r for r in rows if r.kind == FinetuneJob.KIND and r.phase == Phase.SUCCEEDED.value}
    points = {
        name: (r.cost_dollars, r.tokens_per_second)
        for name, r in trained.items()
        if r.cost_dollars is not None and r.tokens_per_second is not None
    }
    served = {r.name: r for r in rows if r.kind == InferenceBench.KIND and r.phase == Phase.SUCCEEDED.value}
    winners = {
        "tokensPerSecondPerChip": winner({n: r.tokens_per_second_per_chip for n, r in trained.items()}, True),
        "trainingCost": winner({n: r.cost_dollars for n, r in trained.items()}, False),
        "peakOutputTokensPerSecond": winner(
            {n: r.peak_output_tokens_per_second for n, r in served.items()}, True
        ),
        "dollarsPerMillionTokens": winner(
            {n: r.dollars_per_million_tokens for n, r in served.items()}, False
        ),
    }
    pending = totals.running + totals.waiting
    budget_held = {
        n: why for n, why in held.items() if "maxUSD" in why or "maxChipHours" in why or "projection" in why
    }
    if invalid:
        phase, message = "Stalled", "; ".join(f"{n}: {why}" for n, why in sorted(invalid.items()))[:1024]
    elif totals.waiting and totals.running == 0 and len(budget_held) == totals.waiting:
        phase, message = (
            "Stalled",
            f"budget reached: {len(budget_held)} cell(s) cannot start; " + next(iter(budget_held.values())),
        )
    elif pending:
        phase = "Running"
        done = totals.succeeded + totals.failed
        message = f"{done} of {len(counted)} cells done, {totals.running} running, {totals.waiting} waiting"
    else:
        phase, message = (
            "Finished",
            f"{len(counted)} cells: {totals.succeeded} succeeded, {totals.failed} failed",
        )
    return {
        "phase": phase,
        "message": message,
        "observedGeneration": campaign.metadata.generation,
        "cells": [r.to_wire() for r in rows],
        "waiting": dict(sorted(held.items())),
        "totals": totals.to_wire(),
        "paretoFront": pareto_front(points),
        "winners": {metric: name for metric, name in winners.items() if name},
    }
