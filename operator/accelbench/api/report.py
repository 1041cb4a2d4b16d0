"""WorkerReport: what a worker writes when it ends. Workers write it, the operator validates it.

The compact form goes to the termination-message file, which the kubelet caps at 4096 bytes, so
`to_termination_message` drops the long fields (loss history, per-cell data) until it fits.
"""

from __future__ import annotations

import json
import logging
from enum import StrEnum
from typing import Any

from pydantic import Field, ValidationError

from .base import ApiModel
from .status import BenchCell, BenchResults, PassAtKResults, QuantizationResults, SuperResolutionResults

log = logging.getLogger(__name__)

TERMINATION_MESSAGE_LIMIT = 4096
STORED_REPORT_LIMIT = 1_000_000  # the full report in the results ConfigMap (an object is at most ~1 MiB)
REPORT_SCHEMA_VERSION = 1


class ReportKind(StrEnum):
    FINETUNE = "finetune"
    BENCH = "bench"


class WorkerError(ApiModel):
    type: str = Field(max_length=200)
    message: str = Field(max_length=2000)


class FinetuneMetrics(ApiModel):
    steps: int = Field(ge=0)
    trained_tokens: int | None = Field(
        default=None, ge=0, description="Tokens that carry loss, after masking (task causalLM)."
    )
    tokens_per_second: float | None = Field(
        default=None, ge=0, description="Trained tokens per second of steady-state steps (task causalLM)."
    )
    tokens_per_second_per_chip: float | None = Field(default=None, ge=0)
    mfu: float | None = Field(default=None, ge=0, le=1)
    flops_per_token: float | None = Field(default=None, ge=0)
    mfu_formula: str | None = Field(default=None, max_length=300)
    peak_tflops_per_chip: float | None = Field(default=None, gt=0)
    first_loss: float | None = None
    final_loss: float | None = None
    eval_loss: float | None = None
    perplexity: float | None = Field(default=None, ge=0)
    pass_at_k: PassAtKResults | None = None
    loss_history: list[float] = Field(default_factory=list)


class Timings(ApiModel):
    total_seconds: float = Field(ge=0)
    setup_seconds: float | None = Field(default=None, ge=0)
    compile_seconds: float | None = Field(default=None, ge=0)
    train_seconds: float | None = Field(default=None, ge=0)
    step_seconds_mean: float | None = Field(default=None, ge=0)
    load_seconds: float | None = Field(
        default=None, ge=0, description="Copying the model and data from object storage, when any."
    )
    load_bytes: int | None = Field(default=None, ge=0, description="Bytes downloaded for that.")


class Memory(ApiModel):
    peak_bytes_per_chip: int | None = Field(default=None, ge=0)
    capacity_bytes_per_chip: int | None = Field(default=None, ge=0)


class WorkerReport(ApiModel):
    schema_version: int = REPORT_SCHEMA_VERSION
    kind: ReportKind
    ok: bool
    framework: str | None = Field(default=None, max_length=50)
    device: str | None = Field(default=None, max_length=200, description="What ran it, e.g. NVIDIA H200.")
    chips: int = Field(default=1, ge=1)
    rank: int = Field(default=0, ge=0)
    finetune: FinetuneMetrics | None = None
    super_resolution: SuperResolutionResults | None = None  # task superResolution
    quantization: QuantizationResults | None = None  # task quantize
    bench: BenchResults | None = None
    timings: Timings | None = None
    memory: Memory | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    error: WorkerError | None = None
    finished_at: str | None = Field(
        default=None, max_length=40, description="When the worker wrote the report (UTC, RFC 3339)."
    )

    def to_termination_message(self, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
        """Compact JSON under `limit` bytes: long lists are thinned, then dropped, then long texts and
        the pass@k section; ValueError if even that does not fit (the ConfigMap copy is whole)."""
        report = self.model_copy(deep=True)
        text = _compact(report)
        if len(text.encode()) <= limit:
            return text
        if report.finetune is not None:
            report.finetune.loss_history = report.finetune.loss_history[-16:]
        if report.bench is not None:
            report.bench.cells = _thin_cells(report.bench, 8)
        report.versions = dict(list(report.versions.items())[:6])
        text = _compact(report)
        if len(text.encode()) <= limit:
            return text
        if report.finetune is not None:
            report.finetune.loss_history = []
        if report.bench is not None:
            report.bench.cells = []
        report.versions = {}
        text = _compact(report)
        if len(text.encode()) <= limit:
            return text
        # Long texts last: they explain, the numbers are the result.
        if report.error is not None:
            report.error.message = report.error.message[:300]
        if report.finetune is not None:
            report.finetune.mfu_formula = None
            report.finetune.pass_at_k = None
        text = _compact(report)
        if len(text.encode()) > limit:
            raise ValueError(f"report does not fit {limit} bytes even without its lists and texts")
        return text


def _thin_cells(bench: BenchResults, keep: int) -> list[BenchCell]:
    """At most `keep` cells (more only when the cells status reads must stay: every open-loop point,
    and the cells at each input length's SLO capacity, whose latencies are the run's headline), the
    rest of the sweep evenly spaced from first to last; in the order measured."""
    at_capacity = {(c.input_length, c.capacity_concurrency) for c in bench.capacity_by_input_length}
    at_capacity |= {(length, bench.capacity_concurrency) for length in {c.input_length for c in bench.cells}}
    must = [
        i
        for i, c in enumerate(bench.cells)
        if c.request_rate is not None
        or (c.concurrency is not None and (c.input_length, c.concurrency) in at_capacity)
    ]
    rest = [i for i in range(len(bench.cells)) if i not in set(must)]
    kept = set(must) | set(_spread(rest, max(keep - len(must), 2)))
    return [c for i, c in enumerate(bench.cells) if i in kept]


def _spread(items: list, keep: int) -> list:
    """`keep` items evenly spaced from first to last, so every input length stays represented."""
    if len(items) <= keep:
        return items
    step = (len(items) - 1) / (keep - 1)
    return [items[round(i * step)] for i in range(keep)]


def _compact(report: WorkerReport) -> str:
    return json.dumps(report.to_wire(), separators=(",", ":"), allow_nan=False)


class ReportError(ValueError):
    """A report that cannot be trusted; `reason` becomes the condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse_termination_message(text: str | None, limit: int = TERMINATION_MESSAGE_LIMIT) -> WorkerReport:
    """Validate a worker's termination message. Garbage raises ReportError, never anything else."""
    if text is None or not text.strip():
        raise ReportError("ResultMissing", "the worker wrote no report to its termination message")
    if len(text.encode(errors="replace")) > limit:
        raise ReportError("ResultInvalid", f"report is {len(text.encode())} bytes, over the {limit} limit")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ReportError("ResultInvalid", f"report is not JSON: {_short(str(exc))}") from None
    if not isinstance(data, dict):
        raise ReportError("ResultInvalid", f"report must be a JSON object, got {type(data).__name__}")
    version = data.get("schemaVersion")
    if version != REPORT_SCHEMA_VERSION:
        raise ReportError("ResultInvalid", f"report schemaVersion {version!r} is not {REPORT_SCHEMA_VERSION}")
    # Fields this operator does not know are dropped and logged, not refused: a newer worker's
    # report still reaches an older operator. Everything else is validated as the schema says.
    for _ in range(3):
        try:
            report = WorkerReport.model_validate(data)
        except ValidationError as exc:
            unknown = [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]
            if not unknown or not all(_drop(data, loc) for loc in unknown):
                raise ReportError(
                    "ResultInvalid", f"report does not match the schema at {first_error(exc)}"
                ) from None
            log.info("report fields this operator does not know were ignored: %s", _short(str(unknown)))
            continue
        except ValueError as exc:
            raise ReportError(
                "ResultInvalid", f"report does not match the schema: {_short(str(exc))}"
            ) from None
        if impossible := physically_impossible(report):
            raise ReportError("ResultInvalid", f"report is physically impossible at {impossible}")
        return report
    raise ReportError("ResultInvalid", "report has unknown fields at every level")


def physically_impossible(report: WorkerReport) -> str | None:
    """Tokens/s × FLOPs/token beyond what the chips can do at their peak: the measurement, the
    FLOPs count or the catalog's peak is wrong, and the run's figures cannot be shown as measured.
    Judged where reports are read (a worker still writes what it measured)."""
    ft = report.finetune
    if ft is None or ft.tokens_per_second is None or not ft.flops_per_token or not ft.peak_tflops_per_chip:
        return None
    achieved = ft.tokens_per_second * ft.flops_per_token
    peak = report.chips * ft.peak_tflops_per_chip * 1e12
    if achieved <= peak * (1 + 1e-9):
        return None
    return (
        f"finetune.tokensPerSecond: {ft.tokens_per_second:.6g} tok/s × {ft.flops_per_token:.6g} FLOPs/token "
        f"is more than {report.chips} chip(s) × {ft.peak_tflops_per_chip:.6g} TFLOP/s can do"
    )


def _drop(data: Any, loc: tuple[int | str, ...]) -> bool:
    """Delete the field at `loc` (a pydantic error location) from the parsed JSON; False if absent."""
    node = data
    for key in loc[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return False
    if isinstance(node, dict) and loc[-1] in node:
        del node[loc[-1]]
        return True
    return False


def first_error(exc: ValidationError) -> str:
    """`finetune.mfu: Input should be less than or equal to 1` (and how many more)."""
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "(report)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _short(f"{where}: {first['msg']}{more}")


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
