"""Outcome -> WorkerReport, and how a worker leaves: report copies and exit code.

A report leaves three ways, so that losing one loses nothing:
- compact, to the termination-message file (ENV_TERMINATION_LOG, else TERMINATION_LOG_PATH when
  writable), which the operator parses with api.parse_termination_message;
- full, to the run's results ConfigMap under REPORT_CONFIGMAP_KEY (rank 0 only; ENV_RESULTS_CONFIGMAP
  in ENV_POD_NAMESPACE), which outlives the pod and its Job: the operator reads it when the
  termination message is gone;
- full, as the last line of stdout prefixed with REPORT_LOG_PREFIX, for a person reading the log.
None of these writes can fail the worker: a measured run is never thrown away over its report.
Exit codes: api.contract.ExitCode.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO
from urllib.parse import quote

from ..api.contract import (
    ENV_POD_NAMESPACE,
    ENV_RESULTS_CONFIGMAP,
    ENV_TERMINATION_LOG,
    REPORT_CONFIGMAP_KEY,
    REPORT_LOG_PREFIX,
    TERMINATION_LOG_PATH,
    ExitCode,
)
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

log = logging.getLogger(__name__)

LOSS_HISTORY_LIMIT = 2000  # the full report keeps this many per-step losses (thinned evenly beyond)
CONFIGMAP_ATTEMPTS = 4  # the apiserver away for a moment: 1 + 2 + 4 s of waiting, then give up


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


def thin(values: list[float], limit: int) -> list[float]:
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
) -> WorkerReport:
    """The total run time and object-storage copy are the entrypoint's to add (with_run_timings)."""
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
        loss_history=thin(losses, LOSS_HISTORY_LIMIT),
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
            total_seconds=0.0,
            setup_seconds=max(outcome.setup_seconds, 0.0),
            compile_seconds=outcome.compile_seconds,
            train_seconds=train_seconds,
            step_seconds_mean=step_mean,
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


def write_termination_message(report: WorkerReport, path: Path) -> bool:
    """The compact report; a report that cannot be made to fit leaves the file empty (the operator
    then reads the ConfigMap copy) rather than failing a run that measured."""
    try:
        text = report.to_termination_message()
    except ValueError as exc:
        print(f"warning: {exc}; the full report is in the results ConfigMap and the log", file=sys.stderr)
        text = ""
    try:
        path.write_text(text)
    except OSError as exc:
        print(f"warning: cannot write the termination message to {path}: {exc}", file=sys.stderr)
        return False
    return bool(text)


def write_results_config_map(
    data: Mapping[str, str],
    env: Mapping[str, str] | None = None,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Merge `data` into the run's results ConfigMap; False (logged) when there is none to write to
    (a laptop run) or the apiserver refused every attempt. The pod's ServiceAccount may patch that one
    ConfigMap (render/results.py); the local executor's pods reach the API through KUBECONFIG."""
    env = os.environ if env is None else env
    name, namespace = env.get(ENV_RESULTS_CONFIGMAP), env.get(ENV_POD_NAMESPACE)
    if not name or not namespace:
        return False
    from ..kubeapi import KubeHTTP, load_connection
    from ..kubeapi.config import ENV_KUBECONFIG, ENV_SERVICE_HOST
    from ..kubeapi.http import MERGE_PATCH

    in_cluster = bool(env.get(ENV_SERVICE_HOST))
    kubeconfig = env.get(ENV_KUBECONFIG)
    if not in_cluster and not kubeconfig:
        log.info("not in a cluster: results ConfigMap %s/%s not written", namespace, name)
        return False

    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/configmaps/{quote(name, safe='')}"
    for attempt in range(CONFIGMAP_ATTEMPTS):
        try:
            http = KubeHTTP(load_connection(None if in_cluster else kubeconfig), connections=1)
            patch = {"data": dict(data)}
            http.request("PATCH", path, body=patch, content_type=MERGE_PATCH).raise_for_status()
        except Exception as exc:  # the termination message and the log still carry the report
            status = getattr(exc, "status", None)
            final = attempt == CONFIGMAP_ATTEMPTS - 1 or status in (400, 401, 403, 404, 413, 422)
            log.warning("cannot patch ConfigMap %s/%s (%s): %s", namespace, name, status, exc)
            if final:
                return False
            sleep(2**attempt)
            continue
        log.info("patched ConfigMap %s/%s keys %s", namespace, name, ", ".join(sorted(data)))
        return True
    return False


def write_report(
    report: WorkerReport,
    *,
    env: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
    extra: Mapping[str, str] | None = None,
) -> Path | None:
    """Every copy of the report (module docstring); `extra`: more ConfigMap keys written in the same
    patch (the bench's full results). Returns the termination-log path written, if any."""
    if report.finished_at is None:
        finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        report = report.model_copy(update={"finished_at": finished})
    full = json.dumps(report.to_wire(), separators=(",", ":"), allow_nan=False)
    path = termination_log_path(env)
    if path is not None and not write_termination_message(report, path):
        path = None
    if report.rank == 0:
        write_results_config_map({REPORT_CONFIGMAP_KEY: full, **(extra or {})}, env)
    out = stream or sys.stdout
    out.write(REPORT_LOG_PREFIX + full + "\n")
    out.flush()
    return path


def find_report_line(text: str) -> WorkerReport | None:
    """The full report from a worker's log (the last prefixed line), or None."""
    for line in reversed(text.splitlines()):
        if line.startswith(REPORT_LOG_PREFIX):
            return WorkerReport.model_validate(json.loads(line[len(REPORT_LOG_PREFIX) :]))
    return None
