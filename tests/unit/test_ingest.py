"""Ingestion of rank 0's termination message: every kind of garbage is a condition, never an exception."""

from __future__ import annotations

import json
from typing import Any

import pytest

from accelbench.api.report import WorkerReport
from accelbench.api.status import BenchResults, FinetuneResults
from accelbench.controller.ingest import ingest

FINETUNE_REPORT: dict[str, Any] = {
    "schemaVersion": 1,
    "kind": "finetune",
    "ok": True,
    "device": "NVIDIA H200",
    "chips": 2,
    "finetune": {
        "steps": 50,
        "trainedTokens": 1_000_000,
        "tokensPerSecond": 4200.0,
        "tokensPerSecondPerChip": 2100.0,
        "mfu": 0.38,
        "mfuFormula": "(4N + attn) x tok/s / (chips x peak)",
        "finalLoss": 0.9,
        "lossHistory": [2.0, 1.1, 0.9],
    },
    "timings": {"totalSeconds": 900.0, "trainSeconds": 600.0},
}

BENCH_REPORT: dict[str, Any] = {
    "schemaVersion": 1,
    "kind": "bench",
    "ok": True,
    "bench": {
        "cells": [{"inputLength": 512, "concurrency": 4, "outputTokensPerSecond": 400.0, "ttftP50Ms": 50.0}],
        "capacityConcurrency": 4,
    },
}


def _text(report: dict[str, Any]) -> str:
    return json.dumps(report, separators=(",", ":"))


def test_valid_finetune_report_becomes_results() -> None:
    result = ingest(_text(FINETUNE_REPORT), "FinetuneJob", generation=2)
    assert result.valid
    assert result.condition.reason == "ResultValid"
    assert result.condition.observed_generation == 2
    assert isinstance(result.results, FinetuneResults)
    assert result.results.tokens_per_second == 4200.0
    assert result.results.train_seconds == 600.0
    assert result.results.device == "NVIDIA H200"
    assert "lossHistory" not in result.results.to_wire()  # the status keeps headlines only


def test_report_written_by_the_worker_helper_round_trips() -> None:
    text = WorkerReport.model_validate(FINETUNE_REPORT).to_termination_message()
    assert ingest(text, "FinetuneJob").valid


def test_valid_bench_report_passes_through() -> None:
    result = ingest(_text(BENCH_REPORT), "InferenceBench")
    assert result.valid
    assert isinstance(result.results, BenchResults)
    assert result.results == BenchResults.model_validate(BENCH_REPORT["bench"])


@pytest.mark.parametrize(
    ("text", "reason", "fragment"),
    [
        (None, "ResultMissing", "no report"),
        ("", "ResultMissing", "no report"),
        ("   \n", "ResultMissing", "no report"),
        ("Traceback (most recent call last):\n  ValueError: boom", "ResultInvalid", "not JSON"),
        (_text(FINETUNE_REPORT)[:200], "ResultInvalid", "not JSON"),  # cut off by the kubelet
        ("x" * 5000, "ResultInvalid", "over the 4096 limit"),
        ("[1, 2, 3]", "ResultInvalid", "JSON object"),
        ('"ok"', "ResultInvalid", "JSON object"),
        ("null", "ResultInvalid", "JSON object"),
        ('{"kind": "finetune", "ok": true}', "ResultInvalid", "schemaVersion"),
        ('{"schemaVersion": 1, "kind": "finetune", "ok": "yes please"}', "ResultInvalid", "schema"),
        ('{"schemaVersion": 1, "kind": "sql", "ok": true}', "ResultInvalid", "schema"),
        ("[" * 100_000, "ResultInvalid", "over the"),
        ("[" * 3000, "ResultInvalid", "not JSON"),  # deep nesting under the size cap
    ],
)
def test_garbage_gives_a_condition_not_an_exception(text: str | None, reason: str, fragment: str) -> None:
    result = ingest(text, "FinetuneJob", generation=1)
    assert not result.valid
    assert result.results is None
    assert result.condition.type == "ResultValid"
    assert result.condition.status == "False"
    assert result.condition.reason == reason
    assert fragment in result.condition.message


def test_report_of_the_other_kind_is_invalid() -> None:
    result = ingest(_text(BENCH_REPORT), "FinetuneJob")
    assert result.condition.reason == "ResultInvalid"
    assert "expected finetune" in result.condition.message


def test_ok_report_without_metrics_is_invalid() -> None:
    report = {k: v for k, v in FINETUNE_REPORT.items() if k != "finetune"}
    result = ingest(_text(report), "FinetuneJob")
    assert result.condition.reason == "ResultInvalid"
    assert "no finetune metrics" in result.condition.message


def test_worker_error_is_reported_with_its_message() -> None:
    report = {
        "schemaVersion": 1,
        "kind": "finetune",
        "ok": False,
        "error": {"type": "ResourceExhausted", "message": "XLA: out of HBM allocating 12.5G"},
    }
    result = ingest(_text(report), "FinetuneJob")
    assert not result.valid
    assert result.condition.reason == "WorkerError"
    assert result.worker_error == "ResourceExhausted: XLA: out of HBM allocating 12.5G"
    assert result.results is None


def test_worker_error_without_details() -> None:
    result = ingest(_text({"schemaVersion": 1, "kind": "bench", "ok": False}), "InferenceBench")
    assert result.worker_error == "the worker reported ok=false without an error"


def test_unexpected_exception_inside_parsing_is_contained(monkeypatch: pytest.MonkeyPatch) -> None:
    import accelbench.controller.ingest as module

    def explode(_: str | None) -> WorkerReport:
        raise RuntimeError("bug")

    monkeypatch.setattr(module, "parse_termination_message", explode)
    result = module.ingest("{}", "FinetuneJob")
    assert result.condition.reason == "ResultInvalid"
    assert "RuntimeError" in result.condition.message


# --- bad numbers never reach status (issue 15) ---------------------------------------------------

INT64_MAX = 2**63 - 1


def _with(report: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(report))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize(
    ("report", "path", "value", "field"),
    [
        (FINETUNE_REPORT, ("finetune", "finalLoss"), float("nan"), "finetune.finalLoss"),
        (FINETUNE_REPORT, ("finetune", "tokensPerSecond"), float("inf"), "finetune.tokensPerSecond"),
        (FINETUNE_REPORT, ("finetune", "mfu"), 1.2, "finetune.mfu"),
        (FINETUNE_REPORT, ("finetune", "trainedTokens"), 2**70, "finetune.trainedTokens"),
        (FINETUNE_REPORT, ("timings", "trainSeconds"), -1e30, "timings.trainSeconds"),
        (BENCH_REPORT, ("bench", "cells", 0, "ttftP50Ms"), -1e30, "bench.cells.0.ttftP50Ms"),
        (BENCH_REPORT, ("bench", "cells", 0, "errors"), 2**70, "bench.cells.0.errors"),
        (BENCH_REPORT, ("bench", "serverStartupSeconds"), -5.0, "bench.serverStartupSeconds"),
        (BENCH_REPORT, ("bench", "cells", 0, "attainment"), 1.5, "bench.cells.0.attainment"),
    ],
)
def test_a_number_no_status_can_hold_is_result_invalid_naming_the_field(
    report: dict[str, Any], path: tuple[Any, ...], value: Any, field: str
) -> None:
    kind = "FinetuneJob" if report["kind"] == "finetune" else "InferenceBench"
    result = ingest(json.dumps(_with(report, path, value)), kind)  # json.dumps writes NaN as the worker could
    assert not result.valid and result.condition.reason == "ResultInvalid"
    assert field in result.condition.message, result.condition.message


def test_throughput_beyond_the_chips_peak_is_result_invalid() -> None:
    """2 chips × 989 TFLOP/s cannot train a 6 GFLOP/token model at 1M tokens/s (6e15 > 1.98e15)."""
    report = _with(FINETUNE_REPORT, ("finetune", "tokensPerSecond"), 1e6)
    report["finetune"].update({"flopsPerToken": 6e9, "peakTflopsPerChip": 989.0})
    result = ingest(json.dumps(report), "FinetuneJob")
    assert not result.valid and "finetune.tokensPerSecond" in result.condition.message
    report["finetune"]["tokensPerSecond"] = 1.5e5  # 9e14: possible
    assert ingest(json.dumps(report), "FinetuneJob").valid


def test_fields_a_newer_worker_adds_are_tolerated() -> None:
    report = json.loads(json.dumps(FINETUNE_REPORT))
    report["futureSection"] = {"x": 1}
    report["finetune"]["tokensPerSecondP99"] = 4000.0
    result = ingest(json.dumps(report), "FinetuneJob")
    assert result.valid and result.results.tokens_per_second == 4200.0
    bench = json.loads(json.dumps(BENCH_REPORT))
    bench["bench"]["cells"][0]["kvCacheHitRate"] = 0.4
    assert ingest(json.dumps(bench), "InferenceBench").valid


def _status_safe(value: Any) -> bool:
    """What a status write can carry: finite numbers, integers within int64."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    if isinstance(value, int):
        return -INT64_MAX - 1 <= value <= INT64_MAX
    if isinstance(value, list):
        return all(_status_safe(v) for v in value)
    return all(_status_safe(v) for v in value.values())


def test_mutated_reports_never_carry_a_bad_number_into_status() -> None:
    """20,000 reports from benchmarks/ingest_fuzz's generator (1-3 fields replaced by odd values, an
    unknown field added, or garbage): no exception, and whatever is accepted is finite, within int64
    and physically possible. The benchmark sends 100,000 and writes each accepted result to a real
    apiserver (dry run); tests/e2e/test_ingest_fuzz.py runs a few thousand of those."""
    import importlib.util
    import random
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks/ingest_fuzz/run.py"
    spec = importlib.util.spec_from_file_location("ingest_fuzz_run", path)
    assert spec is not None and spec.loader is not None
    fuzz = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = fuzz
    spec.loader.exec_module(fuzz)

    rng = random.Random(15)
    accepted = 0
    for _ in range(20_000):
        kind, _plural, seed = rng.choice(fuzz.SEEDS)
        result = ingest(fuzz.mutated_report(rng, seed), kind)
        if result.valid:
            accepted += 1
            wire = result.results.to_wire()
            json.dumps(wire, allow_nan=False)
            assert _status_safe(wire), wire
            if kind == "FinetuneJob":
                assert 0 <= (wire.get("mfu") or 0) <= 1 and wire["tokensPerSecond"] >= 0
            else:
                for cell in wire.get("cells", []):
                    assert all(v >= 0 for k, v in cell.items() if k.endswith(("Ms", "PerSecond")))
    assert accepted > 500  # mutations that keep a report valid were accepted, not everything refused


# --- the ConfigMap copy, read when the termination message is gone (issue 14) ---------------------


def test_a_missing_termination_message_is_answered_by_the_stored_copy() -> None:
    from accelbench.controller.ingest import StoredReport

    stored = StoredReport("ConfigMap run-results", _text(FINETUNE_REPORT))
    ingested = ingest(None, "FinetuneJob", 3, stored)
    assert ingested.valid and isinstance(ingested.results, FinetuneResults)
    assert ingested.results.tokens_per_second == 4200.0
    assert "from ConfigMap run-results" in ingested.condition.message


def test_the_termination_message_wins_over_the_stored_copy() -> None:
    """A retried pod's message is this attempt's; the ConfigMap may hold an earlier attempt's."""
    from accelbench.controller.ingest import StoredReport

    failed = {**FINETUNE_REPORT, "ok": False, "error": {"type": "RuntimeError", "message": "attempt 1"}}
    ingested = ingest(_text(FINETUNE_REPORT), "FinetuneJob", 1, StoredReport("ConfigMap x", _text(failed)))
    assert ingested.valid and ingested.condition.message == "worker report accepted"


def test_no_report_anywhere_says_where_it_looked() -> None:
    from accelbench.controller.ingest import StoredReport

    ingested = ingest("", "FinetuneJob", 1, StoredReport("ConfigMap run-results", None))
    assert ingested.condition.reason == "ResultMissing"
    assert "termination message" in ingested.condition.message
    assert "none is in ConfigMap run-results" in ingested.condition.message


def test_a_bad_stored_copy_is_result_invalid_like_a_bad_message() -> None:
    from accelbench.controller.ingest import StoredReport

    bad = _with(FINETUNE_REPORT, ("finetune", "mfu"), 7.0)
    ingested = ingest(None, "FinetuneJob", 1, StoredReport("ConfigMap x", json.dumps(bad)))
    assert ingested.condition.reason == "ResultInvalid" and "mfu" in ingested.condition.message
    long_history = {
        **FINETUNE_REPORT,
        "finetune": {**FINETUNE_REPORT["finetune"], "lossHistory": [1.0] * 2000},
    }
    assert len(_text(long_history)) > 4096  # too big for a termination message, whole in a ConfigMap
    assert ingest(None, "FinetuneJob", 1, StoredReport("ConfigMap x", _text(long_history))).valid
