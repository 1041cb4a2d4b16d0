"""How long a campaign cell will hold its chips, before it runs. Pure.

In order of trust: what the finished cells of the same kind on the same accelerator took in this
campaign (measured: the longest of them, scaled up by how much more work this cell has, never
down, since a small run's time is mostly start-up); for fine-tuning, the tokens it trains at a
prior MFU on the chips' peak; for a bench, its requests at a prior time per output token; else the
run's own activeDeadlineSeconds, reserved whole (the most it can cost). The deadline also caps
the others. Without any of these there is no projection, and a campaign with a budget does not
start the cell (it says why): a guess would either overspend or stop a paid run early. Each
projection says what it rests on, and how far the run may go past it before the budget's deadline
stops it (`headroom`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..api import FinetuneJob, InferenceBench, Resource, Task
from ..catalog import CatalogError, resolve_model_shape
from ..plan.types import Plan

STARTUP_HOURS = 0.1  # image pull, model load and compile before the first step or request
MFU_PRIOR = 0.3  # a LoRA or full fine-tune that fits its chips; what the published runs reach
TPOT_PRIOR_S = 0.05  # seconds per output token per request, a loaded engine under concurrency
# How far past its projection a run may go before its budget deadline stops it.
HEADROOM_MEASURED = 0.5
# ...and at least this long: a measured minute-long run can take twice that on a busy node, while a
# minute is noise beside a real run's hours.
MIN_SLACK_HOURS = 60 / 3600
HEADROOM_PRIOR = 2.0  # priors are rough: an MFU a third of the prior still finishes


@dataclass(frozen=True)
class Projection:
    hours: float
    basis: str  # what the estimate rests on, in words
    headroom: float = 0.0  # fraction of `hours` the run may add before its budget deadline


@dataclass(frozen=True)
class Measured:
    """A finished cell of this campaign: the hours it held its chips, and its work (`work_of`)."""

    hours: float
    work: float | None = None


MeasuredRuns = Mapping[tuple[str, str], Sequence[Measured]]  # (kind, accelerator) -> finished cells


def work_of(resource: Resource, plan: Plan) -> float | None:
    """What a run has to do per chip, in a unit only compared within one kind: a fine-tune's
    parameter-tokens, a bench's sweep time at the prior. None when it cannot be told."""
    if isinstance(resource, FinetuneJob):
        sized = _trained(resource)
        return None if sized is None else sized[0] * sized[1] / max(plan.chips, 1)
    if isinstance(resource, InferenceBench):
        return _bench_seconds(resource)
    return None


def _from_measured(resource: Resource, plan: Plan, siblings: Sequence[Measured]) -> Projection:
    work = work_of(resource, plan)
    hours = max(
        m.hours * max(1.0, work / m.work) if work is not None and m.work else m.hours for m in siblings
    )
    basis = f"measured: {len(siblings)} finished {resource.kind}(s) on {plan.accelerator}"
    return Projection(hours, basis, max(HEADROOM_MEASURED, MIN_SLACK_HOURS / hours) if hours else 0.0)


def project(resource: Resource, plan: Plan, measured: MeasuredRuns | None = None) -> Projection | None:
    siblings = (measured or {}).get((resource.kind, plan.accelerator))
    deadline = resource.spec.active_deadline_seconds
    projection: Projection | None
    if siblings:
        projection = _from_measured(resource, plan, siblings)
    elif isinstance(resource, FinetuneJob):
        projection = _finetune_prior(resource, plan)
    elif isinstance(resource, InferenceBench):
        projection = _bench_prior(resource)
    else:
        raise TypeError(f"cannot project {type(resource).__name__}")
    if deadline is None:
        return projection
    capped = Projection(deadline / 3600, f"activeDeadlineSeconds {deadline}, reserved whole")
    if projection is None or projection.hours >= capped.hours:
        return capped
    return projection


def unprojectable(resource: Resource) -> str:
    """Why a cell has no projection, and what the user can set."""
    if isinstance(resource, FinetuneJob) and resource.spec.task != Task.CAUSAL_LM:
        return (
            f"no cost projection for task {resource.spec.task.value} (it has no token count): "
            "set activeDeadlineSeconds"
        )
    if isinstance(resource, FinetuneJob):
        return (
            "no cost projection (training by epochs, or an unknown model size): "
            "set training.maxSteps or activeDeadlineSeconds"
        )
    return "no cost projection: set activeDeadlineSeconds"


def _trained(job: FinetuneJob) -> tuple[float, int] | None:
    """(parameters, tokens) of a fine-tune by steps; None by epochs or with an unknown model size."""
    training = job.spec.training
    if training.max_steps is None or job.spec.model is None or job.spec.task != Task.CAUSAL_LM:
        return None
    try:
        parameters = resolve_model_shape(job.spec.model).parameters
    except CatalogError:
        return None
    return parameters, training.max_steps * training.global_batch_size * training.seq_length


def _finetune_prior(job: FinetuneJob, plan: Plan) -> Projection | None:
    sized = _trained(job)
    if sized is None:
        return None
    parameters, tokens = sized
    flops = 6.0 * parameters * tokens  # forward + backward of a dense decoder (LoRA saves a third)
    seconds = flops / (MFU_PRIOR * plan.chips * plan.peak_tflops_per_chip * 1e12)
    return Projection(
        STARTUP_HOURS + seconds / 3600,
        f"prior: {tokens:,} tokens at MFU {MFU_PRIOR:g} "
        f"on {plan.chips} x {plan.peak_tflops_per_chip:g} TFLOP/s",
        HEADROOM_PRIOR,
    )


def _bench_seconds(bench: InferenceBench) -> float:
    work = bench.spec.workload
    per_point = work.requests_per_point or 0
    levels = [*work.concurrency, *([1] * len(work.request_rates))] or [1]
    return sum(
        max(per_point, 4 * level) * work.output_length * TPOT_PRIOR_S / level
        for _ in work.input_lengths
        for level in levels
    )


def _bench_prior(bench: InferenceBench) -> Projection:
    work = bench.spec.workload
    levels = [*work.concurrency, *([1] * len(work.request_rates))] or [1]
    seconds = _bench_seconds(bench)
    return Projection(
        STARTUP_HOURS + seconds / 3600,
        f"prior: {len(work.input_lengths) * len(levels)} sweep points "
        f"at {TPOT_PRIOR_S * 1000:g} ms per token",
        HEADROOM_PRIOR,
    )
