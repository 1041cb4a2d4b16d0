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
from ..api.base import ApiModel
from ..api.campaign import FROM_FINETUNE, Baseline, BenchCampaign, CellRow, CellSummary, Matrix, Totals
from ..api.contract import ANNOTATION_CELL_VALUES, LABEL_CAMPAIGN, LABEL_CELL
from ..api.errors import describe
from ..catalog.types import Catalog
from ..plan import plan_for
from ..plan.pricing import is_unpriced
from .budget import Candidate, Limits, Started, admit
from .matrix import Cell, MatrixError, apply_assignment, cells_of
from .projection import Measured, project, unprojectable, work_of
from .results import Conclusions, conclude, selects

TERMINAL = (Phase.SUCCEEDED.value, Phase.FAILED.value)
WAITING_FOR_MODEL = "waiting for its model"
SKIPPED = "Skipped"  # a serving cell whose model's training failed: it never runs
NOT_STARTED = ("Waiting", "Creating")  # counted as waiting in totals
REJECTED = "RejectedByApiserver"  # a cell's run the apiserver refused to create (with_rejected)


@dataclass
class CampaignPass:
    create: list[dict[str, Any]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)  # cell run name -> why it cannot be made
    skipped: dict[str, str] = field(default_factory=dict)  # cell run name -> why it never runs


def as_written(template: ApiModel) -> dict[str, Any]:
    """A template as its author wrote it: the fields they set, no defaults filled in. Each run's
    spec is this plus its cell's values; the defaults come back when the run is read. A default
    written out counts as set on the apiserver (`has()`), and some fields are refused when set
    (spec.training with task superResolution), so filling them in would refuse every such run."""
    return template.model_dump(by_alias=True, exclude_none=True, exclude_unset=True, mode="json")


def arms(campaign: BenchCampaign) -> list[tuple[str, dict[str, Any], Matrix]]:
    arms = []
    if campaign.spec.finetune is not None:
        arms.append(
            (FinetuneJob.KIND, as_written(campaign.spec.finetune.template), campaign.spec.finetune.matrix)
        )
    if campaign.spec.inference is not None:
        arms.append(
            (
                InferenceBench.KIND,
                as_written(campaign.spec.inference.template),
                campaign.spec.inference.matrix,
            )
        )
    return arms


def child_manifest(
    campaign: BenchCampaign, cell: Cell, template: Mapping[str, Any], model_uri: str | None = None
) -> dict[str, Any]:
    """The run of one cell: the template with the cell's values, owned by the campaign; an output
    location gets the run's name appended, so cells never write over each other. `model_uri`: a
    serving cell serves what a training cell wrote there."""
    name = cell.child_name(campaign.metadata.name)
    spec = apply_assignment(template, {k: v for k, v in cell.values().items() if k != FROM_FINETUNE})
    if model_uri is not None:
        spec["model"] = {**(spec.get("model") or {}), "uri": model_uri}
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


def _at_capacity(results: Mapping[str, Any]) -> Mapping[str, Any]:
    """The sweep point the SLO capacity was found at (empty when there is none)."""
    concurrency, length = results.get("capacityConcurrency"), results.get("capacityInputLength")
    if concurrency is None:
        return {}
    return next(
        (
            c
            for c in results.get("cells") or []
            if c.get("concurrency") == concurrency and (length is None or c.get("inputLength") == length)
        ),
        {},
    )


def row_of(
    cell: Cell | None, run: Mapping[str, Any], in_matrix: bool, model_from: str | None = None
) -> CellRow:
    meta = run.get("metadata") or {}
    status = run.get("status") or {}
    results = status.get("results") or {}
    cost = status.get("cost") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    chips, hours = _f(cost.get("chips")), _f(cost.get("hours"))
    price = _f(cost.get("dollarsPerChipHour"))
    capacity = _at_capacity(results)
    sr = results.get("superResolution") or {}
    quantization = results.get("quantization") or {}
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
        dollars_per_hour=chips * price if chips is not None and price is not None else None,
        ttft_p99_ms=_f(capacity.get("ttftP99Ms")),
        tpot_p99_ms=_f(capacity.get("tpotP99Ms")),
        images_per_second=_f(sr.get("imagesPerSecond")),
        images_per_second_per_chip=_f(sr.get("imagesPerSecondPerChip")),
        psnr=_f(sr.get("psnr")),
        effective_bits=_f(quantization.get("effectiveBits")),
        perplexity_increase=_f(quantization.get("perplexityIncrease")),
        model_from=model_from,
        in_matrix=in_matrix,
    )


@dataclass(frozen=True)
class ModelSource:
    """Where a serving cell's model comes from: a training run of this campaign, once it succeeded."""

    run: str  # the training run (the selected cell's first repeat)
    uri: str | None = None  # its output, once it succeeded
    wait: str | None = None  # why the serving cell waits
    skip: str | None = None  # why it never will run (the training failed)


def model_source(
    selection: Mapping[str, Any],
    campaign: BenchCampaign,
    trained: Sequence[tuple[Cell, dict[str, Any]]],
    existing: Mapping[str, Mapping[str, Any]],
) -> ModelSource:
    """The training cell `selection` picks (it must pick exactly one) and the state of its first run.
    Raises MatrixError when it picks none or several, or the training writes no output."""
    chosen = [(c, t) for c, t in trained if c.repeat == 0 and selects(_values_json(c), selection)]
    if len(chosen) != 1:
        found = "no training cell" if not chosen else f"{len(chosen)} training cells"
        raise MatrixError(
            f"{FROM_FINETUNE} {json.dumps(selection, sort_keys=True)} selects {found}: it must select one"
        )
    cell, template = chosen[0]
    if not (template.get("output") or {}).get("uri"):
        raise MatrixError(f"{FROM_FINETUNE}: the finetune template has no output.uri to serve from")
    name = cell.child_name(campaign.metadata.name)
    run = existing.get(name)
    phase = ((run or {}).get("status") or {}).get("phase")
    if run is None or phase not in TERMINAL:
        return ModelSource(name, wait=f"{WAITING_FOR_MODEL}: training run {name} has not finished")
    if phase != Phase.SUCCEEDED.value:
        return ModelSource(name, skip=f"its model's training run {name} {str(phase).lower()}")
    uri = ((run.get("spec") or {}).get("output") or {}).get("uri")
    if not uri:
        raise MatrixError(f"{FROM_FINETUNE}: training run {name} has no output.uri")
    return ModelSource(name, uri=str(uri))


def _values_json(cell: Cell) -> str:
    return json.dumps(cell.values(), sort_keys=True)


def _selection(campaign: BenchCampaign, cell: Cell) -> dict[str, Any] | None:
    if cell.kind != InferenceBench.KIND:
        return None
    values = cell.values()
    if FROM_FINETUNE in values:
        chosen = values[FROM_FINETUNE]
        if not isinstance(chosen, dict):
            raise MatrixError(f"{FROM_FINETUNE} must be matrix values (an object), not {chosen!r}")
        return chosen
    arm = campaign.spec.inference
    return arm.from_finetune if arm is not None else None


def measured_runs(
    runs: Sequence[Mapping[str, Any]], catalog: Catalog
) -> dict[tuple[str, str], list[Measured]]:
    """What the succeeded cells took, and their work: the projection for their siblings on the same
    accelerator."""
    measured: dict[tuple[str, str], list[Measured]] = {}
    for run in runs:
        status = run.get("status") or {}
        hours = _f((status.get("cost") or {}).get("hours"))
        if status.get("phase") != Phase.SUCCEEDED.value or not hours or not run.get("kind"):
            continue
        try:
            resource = parse_resource({k: v for k, v in run.items() if k != "status"})  # its spec
            plan = plan_for(resource, catalog)
        except (ValueError, KeyError):
            continue  # a run edited out of shape by hand: it projects nothing
        measured.setdefault((resource.kind, plan.accelerator), []).append(
            Measured(hours, work_of(resource, plan))
        )
    return measured


def plan_campaign(
    campaign: BenchCampaign,
    runs: Sequence[Mapping[str, Any]],
    catalog: Catalog,
    now: datetime,
    baseline: Sequence[CellSummary] | None = None,
) -> CampaignPass:
    """`baseline`: the summary of the earlier campaign spec.baseline.campaign names, when it has one."""
    out = CampaignPass()
    existing = {str((r.get("metadata") or {}).get("name")): r for r in runs}
    cells: list[tuple[Cell, dict[str, Any]]] = []
    for kind, template, matrix in arms(campaign):
        try:
            for cell in cells_of(kind, matrix.axes, matrix.include, matrix.exclude, campaign.spec.repeats):
                cells.append((cell, template))
        except MatrixError as exc:
            out.invalid[f"{kind} matrix"] = str(exc)
    trained = [(c, t) for c, t in cells if c.kind == FinetuneJob.KIND]

    measured = measured_runs(runs, catalog)

    budget = campaign.spec.budget
    budgeted = budget.max_usd is not None or budget.max_chip_hours is not None
    candidates: list[Candidate] = []
    unadmitted: dict[str, str] = {}  # cells that wait for something other than a cap: why
    manifests: dict[str, dict[str, Any]] = {}
    rows: list[CellRow] = []
    for cell, template in cells:
        name = cell.child_name(campaign.metadata.name)
        try:
            selection = _selection(campaign, cell)
            source = model_source(selection, campaign, trained, existing) if selection is not None else None
        except MatrixError as exc:
            out.invalid[name] = str(exc)
            rows.append(_row(cell, name, "Invalid", "InvalidCell"))
            continue
        model_from = source.run if source else None
        run = existing.get(name)
        if run is not None:
            rows.append(row_of(cell, run, True, model_from))
            continue
        if source is not None and source.skip:
            rows.append(_row(cell, name, SKIPPED, "ModelNotTrained", model_from))
            out.skipped[name] = source.skip
            continue
        if source is not None and source.wait:
            rows.append(_row(cell, name, "Waiting", None, model_from))
            unadmitted[name] = source.wait
            continue
        try:
            manifest = child_manifest(campaign, cell, template, source.uri if source else None)
            resource = parse_resource(manifest)
            plan = plan_for(resource, catalog)
        except (ValueError, KeyError, MatrixError) as exc:
            out.invalid[name] = describe(exc)
            rows.append(_row(cell, name, "Invalid", "InvalidCell", model_from))
            continue
        rows.append(_row(cell, name, "Waiting", None, model_from))
        if budget.max_usd is not None and is_unpriced(plan.dollars_per_chip_hour):
            unadmitted[name] = (
                f"no price for {plan.accelerator}: maxUSD cannot admit it (set one in the prices ConfigMap "
                "or pricing.source custom; a maxChipHours-only budget can)"
            )
            continue
        projection = project(resource, plan, measured)
        if projection is None and budgeted:
            unadmitted[name] = unprojectable(resource)
            continue
        hours, headroom = (projection.hours, projection.headroom) if projection else (0.0, 0.0)
        candidates.append(
            # An unpriced cell gets here only without maxUSD (refused above), where $ bound nothing.
            Candidate(name, plan.accelerator, plan.chips, plan.dollars_per_hour or 0.0, hours, headroom)
        )
        manifests[name] = manifest
    in_matrix = {row.name for row in rows}
    rows += [row_of(None, run, False) for name, run in sorted(existing.items()) if name not in in_matrix]

    started = [_started(run) for run in runs]
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
    out.status = campaign_status(
        campaign, rows, {**admission.held, **unadmitted}, out.invalid, out.skipped, baseline
    )
    return out


def _row(
    cell: Cell, name: str, phase: str, reason: str | None = None, model_from: str | None = None
) -> CellRow:
    """A cell without a run (yet): waiting for admission or its model, skipped, or one that cannot be made."""
    return CellRow(
        name=name,
        kind=cell.kind,
        cell=cell.key,
        values=_values_json(cell),
        repeat=cell.repeat,
        phase=phase,
        reason=reason,
        model_from=model_from,
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
    campaign: BenchCampaign,
    rows: list[CellRow],
    held: Mapping[str, str],
    invalid: Mapping[str, str],
    skipped: Mapping[str, str] | None = None,
    baseline: Sequence[CellSummary] | None = None,
) -> dict[str, Any]:
    """Rows, totals, the per-cell summary and what it concludes, the phase and the kstatus
    conditions' inputs."""
    counted = [r for r in rows if r.phase != "Invalid"]
    totals = Totals(
        cells=len(rows),
        succeeded=sum(r.phase == Phase.SUCCEEDED.value for r in counted),
        failed=sum(r.phase == Phase.FAILED.value for r in counted),
        skipped=sum(r.phase == SKIPPED for r in counted),
        running=sum(r.phase not in (*TERMINAL, SKIPPED, *NOT_STARTED) for r in counted),
        waiting=sum(r.phase in NOT_STARTED for r in counted),
        dollars=round(sum(r.cost_dollars or 0.0 for r in rows), 4),
        chip_hours=round(sum(r.chip_hours or 0.0 for r in rows), 4),
        unpriced_cells=sum(r.cost_dollars is None and bool(r.chip_hours) for r in rows),
    )
    spec_baseline = campaign.spec.baseline
    concluded = conclude(
        rows,
        campaign.spec.serving_hours,
        baseline_cell=spec_baseline.cell if spec_baseline else None,
        baseline_campaign=baseline if spec_baseline and spec_baseline.campaign else None,
        threshold=spec_baseline.threshold if spec_baseline else 0.05,
    )
    pending = totals.running + totals.waiting
    budget_held = {
        n: why for n, why in held.items() if "maxUSD" in why or "maxChipHours" in why or "projection" in why
    }
    # With nothing running or starting, a cell waiting for its model waits for a training cell the
    # budget holds: it cannot go on either.
    creating = sum(r.phase == "Creating" for r in rows)
    blocked = {**budget_held, **{n: why for n, why in held.items() if why.startswith(WAITING_FOR_MODEL)}}
    if invalid:
        phase, message = "Stalled", "; ".join(f"{n}: {why}" for n, why in sorted(invalid.items()))[:1024]
    elif budget_held and totals.running == 0 and creating == 0 and len(blocked) == totals.waiting:
        phase, message = (
            "Stalled",
            f"budget reached: {len(budget_held)} cell(s) cannot start; " + next(iter(budget_held.values())),
        )
    elif pending:
        phase = "Running"
        done = totals.succeeded + totals.failed + totals.skipped
        message = f"{done} of {len(counted)} cells done, {totals.running} running, {totals.waiting} waiting"
    else:
        phase, message = (
            "Finished",
            f"{len(counted)} cells: {totals.succeeded} succeeded, {totals.failed} failed"
            + (f", {totals.skipped} skipped" if totals.skipped else ""),
        )
    status: dict[str, Any] = {
        "phase": phase,
        "message": message,
        "observedGeneration": campaign.metadata.generation,
        "cells": [r.to_wire() for r in rows],
        "waiting": dict(sorted({**held, **(skipped or {})}.items())),
        "totals": totals.to_wire(),
        "summary": [s.to_wire() for s in concluded.summary],
        "ownership": [o.to_wire() for o in concluded.ownership],
        "paretoFront": concluded.pareto_front,
        "winners": concluded.winners,
        "regressions": concluded.regressions,
    }
    if spec_baseline is not None:
        status["baseline"] = _describe_baseline(spec_baseline, concluded, baseline)
    return status


def with_rejected(status: Mapping[str, Any], rejected: Mapping[str, str]) -> dict[str, Any]:
    """The status of a pass whose runs the apiserver refused to create (`rejected`: run name -> its
    message): those cells Invalid and the campaign Stalled, saying why, as for a cell the plan
    could not make. The same spec is refused again, so only a new campaign spec moves it on."""
    if not rejected:
        return dict(status)
    rows = status.get("cells") or []
    cells = [
        {**row, "phase": "Invalid", "reason": REJECTED} if row.get("name") in rejected else row
        for row in rows
    ]
    was_waiting = sum(row.get("name") in rejected and row.get("phase") in NOT_STARTED for row in rows)
    totals = dict(status.get("totals") or {})
    if was_waiting:  # an Invalid cell is not counted as waiting
        totals["waiting"] = max(0, int(totals.get("waiting", 0)) - was_waiting)
    why = "; ".join(f"{name}: rejected by the apiserver: {msg}" for name, msg in sorted(rejected.items()))
    return {**status, "phase": "Stalled", "message": why[:1024], "cells": cells, "totals": totals}


def _describe_baseline(spec: Baseline, concluded: Conclusions, earlier: Sequence[CellSummary] | None) -> str:
    if spec.campaign:
        found = "" if earlier else " (not found or without results yet)"
        return f"campaign {spec.campaign}{found}, threshold {spec.threshold:g}"
    chosen = [s.name for s in concluded.summary if selects(s.values, spec.cell or {})]
    return f"cell {', '.join(chosen) or 'selecting none'}, threshold {spec.threshold:g}"
