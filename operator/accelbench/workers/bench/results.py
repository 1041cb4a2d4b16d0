"""Results: compact cells for the WorkerReport, the full JSON, and where both are written.

The compact BenchResults goes in the WorkerReport (workers/report.py writes its copies); the full
per-cell JSON goes to the results ConfigMap beside it, with --out to a local file, and with
spec.output (ENV_OUTPUT_URI) to object storage beside the HTML report.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ...api.contract import RESULTS_CONFIGMAP_KEY
from ...api.report import ReportKind, Timings, WorkerError, WorkerReport
from ...api.status import BenchCell, BenchResults, InputLengthCapacity
from ..report import error_type

log = logging.getLogger("accelbench.bench")

RESULTS_SCHEMA_VERSION = 1
CONFIGMAP_LIMIT_BYTES = 700_000  # etcd caps an object near 1 MiB; the WorkerReport shares it


def _pick(stats: dict | None, key: str) -> float | None:
    return None if not stats else round(stats[key], 3)


def compact_cell(cell: dict) -> BenchCell:
    return BenchCell(
        input_length=cell["inputLength"],
        concurrency=cell.get("concurrency"),
        request_rate=cell.get("requestRate"),
        ttft_p50_ms=_pick(cell.get("ttftMs"), "p50"),
        ttft_p99_ms=_pick(cell.get("ttftMs"), "p99"),
        tpot_p50_ms=_pick(cell.get("tpotMs"), "p50"),
        tpot_p99_ms=_pick(cell.get("tpotMs"), "p99"),
        itl_p50_ms=_pick(cell.get("itlMs"), "p50"),
        itl_p99_ms=_pick(cell.get("itlMs"), "p99"),
        e2e_p50_ms=_pick(cell.get("e2eMs"), "p50"),
        e2e_p99_ms=_pick(cell.get("e2eMs"), "p99"),
        output_tokens_per_second=round(cell["outputTokensPerSecond"], 2),
        requests_per_second=_round(cell.get("requestsPerSecond"), 3),
        goodput_output_tokens_per_second=_round(cell.get("goodputOutputTokensPerSecond"), 2),
        attainment=None if cell.get("attainment") is None else round(cell["attainment"], 4),
        errors=cell["errors"],
        client_limited=cell.get("clientLimited"),
    )


def capacity_for_status(capacity: dict[int, dict]) -> dict | None:
    """Status holds one capacity: the longest input length's, the most demanding one swept."""
    if not capacity:
        return None
    return capacity[max(capacity)]


def bench_results(cells: list[dict], capacity: dict[int, dict], startup_s: float | None) -> BenchResults:
    """The compact results: what was measured. The $ fields stay empty: the operator prices them
    (accelbench.cost) with the price it holds."""
    peak = max((c["outputTokensPerSecond"] for c in cells), default=None)
    cap = capacity_for_status(capacity) or {}
    return BenchResults(
        cells=[compact_cell(c) for c in cells],
        capacity_concurrency=cap.get("capacityConcurrency"),
        capacity_input_length=max(capacity) if capacity else None,
        capacity_by_input_length=[
            InputLengthCapacity(
                input_length=length,
                capacity_concurrency=found.get("capacityConcurrency"),
                first_failing_concurrency=found.get("firstFailingConcurrency"),
                binding_constraint=found.get("bindingConstraint"),
                output_tokens_per_second=_round(found.get("outputTokensPerSecondAtCapacity"), 2),
            )
            for length, found in sorted(capacity.items())
        ],
        binding_constraint=cap.get("bindingConstraint"),
        first_failing_concurrency=cap.get("firstFailingConcurrency"),
        peak_output_tokens_per_second=round(peak, 2) if peak else None,
        server_startup_seconds=None if startup_s is None else round(startup_s, 2),
    )


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def worker_report(
    results: BenchResults | None, seconds: float, versions: dict[str, str], error: Exception | None = None
) -> WorkerReport:
    return WorkerReport(
        kind=ReportKind.BENCH,
        ok=error is None,
        framework="accelbench-bench",
        bench=results,
        timings=Timings(total_seconds=round(seconds, 3)),
        versions=versions,
        error=None
        if error is None
        else WorkerError(type=error_type(error), message=str(error)[:2000] or type(error).__name__),
    )


def write_local(full: dict, path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(full, indent=1, allow_nan=False))
        log.info("wrote %s", path)


def fit_configmap(full: dict, limit: int = CONFIGMAP_LIMIT_BYTES) -> str:
    """The JSON for the ConfigMap; per-cell extras are dropped if an enormous sweep would not fit."""
    text = json.dumps(full, separators=(",", ":"), allow_nan=False)
    if len(text.encode()) <= limit:
        return text
    slim = dict(full)
    dropped = ("itlMs", "scheduleLagMs")
    slim["cells"] = [{k: v for k, v in c.items() if k not in dropped} for c in full["cells"]]
    slim["truncated"] = True
    return json.dumps(slim, separators=(",", ":"), allow_nan=False)


def upload_results(full: dict, report: WorkerReport, uri: str) -> None:
    """results.json, report.json and the HTML report with its plots (views.render_report, as
    `accelbench report` draws it) to `uri`, with manifest.json last (workers.storage)."""
    import tempfile

    from ...views import render_report
    from .. import storage

    with tempfile.TemporaryDirectory(prefix="accelbench-results-") as tmp:
        out = Path(tmp)
        (out / RESULTS_CONFIGMAP_KEY).write_text(json.dumps(full, indent=1))  # the same name everywhere
        (out / "report.json").write_text(json.dumps(report.to_wire(), indent=1))
        render_report(full, out)
        storage.upload_dir(out, uri, log=log.info)
