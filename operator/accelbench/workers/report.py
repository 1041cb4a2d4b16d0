"""Outcome -> WorkerReport, and how a worker leaves: termination message, log line, exit code.

The compact report goes to the termination-message file (ENV_TERMINATION_LOG, else
TERMINATION_LOG_PATH when writable), which the operator parses with api.parse_termination_message.
The full report is the last line of stdout, prefixed with REPORT_LOG_PREFIX so a log reader finds
it. Exit codes: api.contract.ExitCode.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from ..api.contract import ENV_TERMINATION_LOG, REPORT_LOG_PREFIX, TERMINATION_LOG_PATH, ExitCode
from ..api.report import (
    FinetuneMetrics,
    Memory,
    ReportKind,
    Timings,
    WorkerError,
    WorkerReport,
)
from ..api.status import WORKER_FAILURE_REASONS
from .finetune import FinetuneOutcome, StepRecord
from .flops import mfu

LOSS_HISTORY_LIMIT = 2000  # the full report keeps this many per-step losses (thinned evenly beyond)


def steady_steps(steps: list[StepRecord], excluded: int) -> list[StepRecord]:
    """Steps that count for throughput: all but the first `excluded`, or all when nothing is left."""
    return steps[excluded:] or steps


def throughput(steps: list[StepRecord], excluded: int) -> tuple[float, float | None]:
    """(trained tokens per second, mean step seconds) over the steady steps."""
    steady = steady_steps(steps, excluded)
    seconds = sum(s.seconds for s in steady)
    tokens = sum(s.trained_tokens for s in steady)
    if not steady or seconds <= 0:
        return 0.0, None
    return tokens / seconds, seconds / len(steady)


def _thin(values: list[float], limit: int) -> list[float]:
    if len(values) <= limit:
        return values
    stride = len(values) / limit
    return [values[int(i * stride)] for i in range(limit - 1)] + [values[-1]]


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def perplexity(eval_loss: float | None) -> float | None:
    if eval_loss is None or not math.isfinite(eval_loss):
        return None
    return math.exp(eval_loss) if eval_loss < 700 else None  # exp overflows float past ~709


def build_report(
    outcome: FinetuneOutcome,
    *,
    flops_per_token: float | None,
    mfu_formula: str | None,
    peak_tflops_per_chip: float | None,
    rank: int = 0,
    total_seconds: float,
    load: tuple[float, int] | None = None,
) -> WorkerReport:
    """`load`: (seconds, bytes) spent copying inputs from object storage, when there were any."""
    tokens_per_second, step_mean = throughput(outcome.steps, outcome.warmup_steps_excluded)
    chips = max(outcome.chips, 1)
    utilization = None
    if flops_per_token and peak_tflops_per_chip:
        utilization = mfu(tokens_per_second, flops_per_token, chips, peak_tflops_per_chip)
        if utilization > 1:  # the peak or the FLOPs count is wrong: tokens/s stays, the operator judges it
            utilization = None
    losses = [s.loss for s in outcome.steps if math.isfinite(s.loss)]
    eval_loss = _finite(outcome.eval_loss)
    metrics = FinetuneMetrics(
        steps=len(outcome.steps),
        trained_tokens=sum(s.trained_tokens for s in outcome.steps),
        tokens_per_second=tokens_per_second,
        tokens_per_second_per_chip=tokens_per_second / chips,
        mfu=utilization,
        flops_per_token=flops_per_token,
        mfu_formula=mfu_formula,
        peak_tflops_per_chip=peak_tflops_per_chip,
        first_loss=losses[0] if losses else None,
        final_loss=losses[-1] if losses else None,
        eval_loss=eval_loss,
        perplexity=perplexity(eval_loss),
        pass_at_k=outcome.pass_at_k,
        loss_history=_thin(losses, LOSS_HISTORY_LIMIT),
    )
    train_seconds = sum(s.seconds for s in outcome.steps)
    return WorkerReport(
        kind=ReportKind.FINETUNE,
        ok=True,
        framework=outcome.framework,
        device=outcome.device[:200],
        chips=chips,
        rank=rank,
        finetune=metrics,
        timings=Timings(
            total_seconds=max(total_seconds, 0.0),
            setup_seconds=max(outcome.setup_seconds, 0.0),
            compile_seconds=outcome.compile_seconds,
            train_seconds=train_seconds,
            step_seconds_mean=step_mean,
            load_seconds=load[0] if load else None,
            load_bytes=load[1] if load else None,
        ),
        memory=Memory(
            peak_bytes_per_chip=outcome.peak_memory_bytes,
            capacity_bytes_per_chip=outcome.memory_capacity_bytes,
        ),
        versions=dict(outcome.versions),
    )


def error_type(exc: BaseException) -> str:
    """An InvalidConfigError's (or OutputError's) reason, else the exception's class name."""
    reason = getattr(exc, "reason", None)
    return reason if reason in WORKER_FAILURE_REASONS else type(exc).__name__


def exit_code(exc: BaseException | None) -> ExitCode:
    if exc is None:
        return ExitCode.OK
    return exit_code_of_type(error_type(exc))


def exit_code_of_type(error_type: str) -> ExitCode:
    """A failure a retry cannot fix (a named reason) stops the Job; anything else is retried."""
    return ExitCode.INVALID_CONFIG if error_type in WORKER_FAILURE_REASONS else ExitCode.ERROR


def error_report(
    exc: BaseException, *, framework: str | None = None, rank: int = 0, total_seconds: float = 0.0
) -> WorkerReport:
    message = str(exc) or type(exc).__name__
    return WorkerReport(
        kind=ReportKind.FINETUNE,
        ok=False,
        framework=framework,
        rank=rank,
        timings=Timings(total_seconds=max(total_seconds, 0.0)),
        error=WorkerError(type=error_type(exc)[:200], message=message[:2000]),
    )


def termination_log_path(env: Mapping[str, str] | None = None) -> Path | None:
    """Where the compact report goes; None when there is nowhere writable (a laptop run)."""
    env = os.environ if env is None else env
    configured = env.get(ENV_TERMINATION_LOG)
    if configured:
        return Path(configured)
    default = Path(TERMINATION_LOG_PATH)
    if default.exists() and os.access(default, os.W_OK):
        return default
    return None


def write_report(
    report: WorkerReport,
    *,
    env: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
) -> Path | None:
    """Compact form to the termination log (when there is one), full JSON as stdout's last line.
    Returns the termination-log path written, if any."""
    path = termination_log_path(env)
    if path is not None:
        try:
            path.write_text(report.to_termination_message())
        except OSError as exc:
            print(f"warning: cannot write the termination message to {path}: {exc}", file=sys.stderr)
            path = None
    out = stream or sys.stdout
    out.write(REPORT_LOG_PREFIX + json.dumps(report.to_wire(), separators=(",", ":"), allow_nan=False) + "\n")
    out.flush()
    return path


def find_report_line(text: str) -> WorkerReport | None:
    """The full report from a worker's log (the last prefixed line), or None."""
    for line in reversed(text.splitlines()):
        if line.startswith(REPORT_LOG_PREFIX):
            return WorkerReport.model_validate(json.loads(line[len(REPORT_LOG_PREFIX) :]))
    return None
