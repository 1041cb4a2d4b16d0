"""Turn rank 0's report into results, or into a condition that says why there are none.

The report is read from rank 0's termination message; when that is gone (the pods were
garbage-collected or the Job deleted before the operator looked), from the full copy the worker
wrote into the run's results ConfigMap (workers/report.py). Whatever the text is (empty, cut off
by the kubelet, a stack trace, a JSON list, another schema), the outcome is an `Ingested` value
and never an exception: a bad report is a user-visible condition, not a reason to retry forever.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from accelbench.api.report import (
    STORED_REPORT_LIMIT,
    ReportError,
    ReportKind,
    WorkerReport,
    first_error,
    parse_termination_message,
)
from accelbench.api.status import (
    BenchResults,
    Condition,
    ConditionType,
    FinetuneResults,
    PassAtKResults,
    Reason,
)

from .conditions import make_condition

log = logging.getLogger(__name__)

KIND_REPORTS: dict[str, ReportKind] = {"FinetuneJob": ReportKind.FINETUNE, "InferenceBench": ReportKind.BENCH}


@dataclass(frozen=True)
class Ingested:
    condition: Condition  # ResultValid, True or False with a reason
    report: WorkerReport | None = None
    results: FinetuneResults | BenchResults | None = None
    worker_error: str | None = None  # set when the worker itself reported ok=false

    @property
    def valid(self) -> bool:
        return self.condition.status == "True"


@dataclass(frozen=True)
class StoredReport:
    """The ConfigMap copy of the report: `where` names it for the user, `text` is None when absent."""

    where: str
    text: str | None


def _invalid(reason: str, message: str, generation: int | None) -> Ingested:
    return Ingested(make_condition(ConditionType.RESULT_VALID.value, False, reason, message, generation))


def finetune_results(report: WorkerReport) -> FinetuneResults:
    """The status view of a fine-tune report (any task): the headline numbers, not the loss history.

    Rounded to what a measurement supports (and what `kubectl get` columns can show): 4
    significant digits; the full-precision figures stay in the worker's log."""
    metrics, timings = report.finetune, report.timings
    if metrics is None:
        raise ReportError(Reason.RESULT_INVALID.value, "finetune report has no finetune metrics")
    if metrics.tokens_per_second is None and report.super_resolution is None and report.quantization is None:
        raise ReportError(
            Reason.RESULT_INVALID.value,
            "finetune report has no throughput: neither tokensPerSecond nor a superResolution or "
            "quantization section",
        )
    return FinetuneResults(
        tokens_per_second=_sig(metrics.tokens_per_second),
        tokens_per_second_per_chip=_sig(metrics.tokens_per_second_per_chip),
        mfu=_sig(metrics.mfu),
        mfu_formula=metrics.mfu_formula,
        trained_tokens=metrics.trained_tokens,
        steps=metrics.steps,
        first_loss=_sig(metrics.first_loss),
        final_loss=_sig(metrics.final_loss),
        eval_loss=_sig(metrics.eval_loss),
        perplexity=_sig(metrics.perplexity),
        train_seconds=_sig(timings.train_seconds) if timings else None,
        device=report.device,
        pass_at_k=pass_at_k_results(metrics.pass_at_k),
        super_resolution=_rounded(report.super_resolution),
        quantization=_rounded(report.quantization),
    )


M = TypeVar("M", bound=BaseModel)


def _rounded(section: M | None) -> M | None:
    """A report section with its float fields at 4 significant digits (counts and texts as they are)."""
    if section is None:
        return None
    update = {
        name: _sig(value) for name, value in section if isinstance(value, float) and name not in _EXACT_FIELDS
    }
    return section.model_copy(update=update)


# Budgets and bits are set or counted exactly; rounding them would misstate a ≤ 4.5-bit result.
_EXACT_FIELDS = frozenset({"budget_bits", "effective_bits", "model_effective_bits"})


def pass_at_k_results(section: PassAtKResults | None) -> PassAtKResults | None:
    """The report's pass@k section (already validated: counts add up, scores in [0, 1]), rounded."""
    if section is None:
        return None
    return section.model_copy(
        update={
            "scores": {k: min(max(float(_sig(v) or 0.0), 0.0), 1.0) for k, v in section.scores.items()},
            "seconds": _sig(section.seconds),
            "generate_seconds": _sig(section.generate_seconds),
            "check_seconds": _sig(section.check_seconds),
        }
    )


def _sig(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else float(f"{value:.{digits}g}")


def worker_error_message(report: WorkerReport) -> str:
    if report.error is None:
        return "the worker reported ok=false without an error"
    return f"{report.error.type}: {report.error.message}"


def results_of(report: WorkerReport, kind: str) -> FinetuneResults | BenchResults:
    """Results for the resource kind; ReportError when the report is of the other kind or empty."""
    expected = KIND_REPORTS.get(kind)
    if expected is not None and report.kind != expected:
        raise ReportError(
            Reason.RESULT_INVALID.value, f"report kind is {report.kind.value}, expected {expected.value}"
        )
    if report.kind == ReportKind.FINETUNE:
        return finetune_results(report)
    if report.bench is None:
        raise ReportError(Reason.RESULT_INVALID.value, "bench report has no bench results")
    return report.bench  # the worker already wrote the status shape; it passes through


def ingest(
    text: str | None, kind: str, generation: int | None = None, stored: StoredReport | None = None
) -> Ingested:
    """Validate rank 0's report for a resource of `kind`: its termination message `text`, else the
    `stored` copy (read only when the message is missing)."""
    accepted = "worker report accepted"
    try:
        if (text is None or not text.strip()) and stored is not None and stored.text:
            report = parse_termination_message(stored.text, STORED_REPORT_LIMIT)
            accepted = f"worker report accepted from {stored.where} (the termination message was gone)"
        else:
            report = _parse(text, stored)
        if not report.ok:
            message = worker_error_message(report)
            return Ingested(
                make_condition(
                    ConditionType.RESULT_VALID.value, False, Reason.WORKER_ERROR.value, message, generation
                ),
                report=report,
                worker_error=message,
            )
        try:
            results = results_of(report, kind)
        except ValidationError as exc:  # a bound of the status the report's own schema lacks
            raise ReportError(Reason.RESULT_INVALID.value, f"report field {first_error(exc)}") from None
    except ReportError as exc:
        return _invalid(exc.reason, str(exc), generation)
    except Exception as exc:  # parse_termination_message promises ReportError; this guards that promise
        log.exception("unexpected error while ingesting a worker report")
        return _invalid(
            Reason.RESULT_INVALID.value, f"report could not be read: {type(exc).__name__}", generation
        )
    condition = make_condition(
        ConditionType.RESULT_VALID.value, True, Reason.RESULT_VALID.value, accepted, generation
    )
    return Ingested(condition, report=report, results=results)


def _parse(text: str | None, stored: StoredReport | None) -> WorkerReport:
    try:
        return parse_termination_message(text)
    except ReportError as exc:
        if exc.reason == Reason.RESULT_MISSING.value and stored is not None:
            raise ReportError(exc.reason, f"{exc}, and none is in {stored.where}") from None
        raise
