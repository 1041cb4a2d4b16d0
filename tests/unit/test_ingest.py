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
