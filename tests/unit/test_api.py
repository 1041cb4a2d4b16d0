"""API models: round trip, defaults, and invalid specs refused with messages a user understands."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from pydantic import ValidationError

from accelbench.api import FinetuneJob, InferenceBench, parse_resource
from accelbench.api.errors import describe_validation_error
from accelbench.api.report import (
    ReportError,
    WorkerReport,
    parse_termination_message,
)

FINETUNE: dict[str, Any] = {
    "apiVersion": "accelbench.io/v1alpha1",
    "kind": "FinetuneJob",
    "metadata": {"name": "gemma-lora", "namespace": "team-a"},
    "spec": {
        "model": {"uri": "pvc://models/gemma-4-31b", "family": "gemma4", "size": "31b"},
        "dataset": {"uri": "pvc://data/verilog.jsonl", "format": "chat"},
        "method": {"type": "lora", "rank": 64, "alpha": 128},
        "training": {"seqLength": 3072, "globalBatchSize": 8, "maxSteps": 100, "gradientCheckpointing": True},
        "accelerator": {"type": "tpu-v5p", "topology": "2x2x1"},
    },
}

BENCH: dict[str, Any] = {
    "apiVersion": "accelbench.io/v1alpha1",
    "kind": "InferenceBench",
    "metadata": {"name": "serve"},
    "spec": {
        "model": {"uri": "pvc://models/gemma", "family": "gemma3", "size": "1b"},
        "accelerator": {"type": "h100", "count": 2},
        "workload": {"inputLengths": [512, 4096], "outputLength": 256, "concurrency": [1, 8]},
        "slo": {"ttftMs": 500, "tpotMs": 50},
    },
}


def _with(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(base)
    node = obj
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    if value is _DELETE:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return obj


_DELETE = object()


def _errors(obj: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        parse_resource(obj)
    return "\n".join(describe_validation_error(info.value))


def test_finetune_round_trip_keeps_every_field() -> None:
    job = parse_resource(FINETUNE)
    assert isinstance(job, FinetuneJob)
    again = FinetuneJob.model_validate(json.loads(json.dumps(job.to_wire())))
    assert again == job
    assert job.spec.training.seq_length == 3072
    assert job.spec.method.lora_alpha == 128


def test_bench_round_trip_and_defaults() -> None:
    bench = parse_resource(BENCH)
    assert isinstance(bench, InferenceBench)
    assert InferenceBench.model_validate(bench.to_wire()) == bench
    assert bench.spec.server.engine == "vllm"
    assert bench.spec.slo is not None and bench.spec.slo.attainment == 0.9


def test_wire_form_is_camel_case() -> None:
    wire = parse_resource(FINETUNE).to_wire()
    assert "seqLength" in wire["spec"]["training"]
    assert "seq_length" not in wire["spec"]["training"]


def test_lora_alpha_defaults_to_twice_rank() -> None:
    job = parse_resource(_with(FINETUNE, "spec.method", {"type": "lora", "rank": 8}))
    assert job.spec.method.lora_alpha == 16


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.method", {"type": "lora"}, "spec.method: method lora needs a rank"),
        ("spec.method", {"type": "full", "rank": 8}, "rank and alpha apply only to method lora"),
        ("spec.training.seqLength", 4, "spec.training.seqLength: Input should be greater than or equal to 8"),
        ("spec.training.maxSteps", 0, "spec.training.maxSteps"),
        ("spec.training.epochs", 1, "set epochs or maxSteps, not both"),
        ("spec.accelerator", {"type": "tpu-v5p", "count": 4}, "TPU slices are sized by topology, not count"),
        ("spec.accelerator", {"type": "h100", "topology": "2x2"}, "topology applies only to TPU types"),
        ("spec.accelerator", {"type": "b200"}, "spec.accelerator.type: Input should be"),
        ("spec.accelerator", {"type": "h100", "capacity": "reservation"}, "needs reservationName"),
        ("spec.model.size", "big", "spec.model.size: String should match pattern"),
        ("spec.trainng", {}, "spec.trainng: unknown field"),
        ("spec.pricing", {"source": "custom"}, "pricing source custom needs dollarsPerChipHour"),
        ("spec.parallelism", {"strategy": "explicit"}, "explicit parallelism needs fsdp and/or tp"),
        ("spec.model", _DELETE, "spec.model is required for tasks causalLM and quantize"),
        ("metadata.name", "Not_A_DNS_Name", "metadata.name: String should match pattern"),
    ],
)
def test_invalid_finetune_specs_name_the_field(path: str, value: Any, expected: str) -> None:
    assert expected in _errors(_with(FINETUNE, path, value))


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.workload.concurrency", [0, 4], "every concurrency must be at least 1"),
        ("spec.workload", {"concurrency": []}, "workload needs concurrency levels or request rates"),
        ("spec.workload.requestRates", [-1.0], "every request rate must be above 0"),
        ("spec.slo", {"attainment": 0.9}, "slo needs at least one of ttftMs, tpotMs, e2eMs"),
        ("spec.server", {"engine": "external"}, "engine external needs an endpoint"),
        ("spec.server", {"engine": "vllm", "endpoint": "http://x"}, "endpoint applies only to external"),
        ("spec.workload.dataset", {"type": "jsonl"}, "dataset jsonl needs a uri"),
    ],
)
def test_invalid_bench_specs_name_the_field(path: str, value: Any, expected: str) -> None:
    assert expected in _errors(_with(BENCH, path, value))


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"kind": "Pod", "apiVersion": "v1"}, "kind 'Pod' is not one of"),
        (_with(FINETUNE, "apiVersion", "accelbench.io/v1"), "apiVersion must be accelbench.io/v1alpha1"),
    ],
)
def test_wrong_kind_or_version(obj: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        parse_resource(obj)


def _report(**extra: Any) -> WorkerReport:
    return WorkerReport.model_validate(
        {
            "kind": "finetune",
            "ok": True,
            "framework": "pytorch",
            "device": "cpu",
            "finetune": {
                "steps": 10,
                "trainedTokens": 20480,
                "tokensPerSecond": 1000.0,
                "tokensPerSecondPerChip": 1000.0,
                "lossHistory": [2.0 - i / 1000 for i in range(1000)],
            },
            **extra,
        }
    )


def test_report_termination_message_fits_and_parses_back() -> None:
    report = _report(versions={f"pkg{i}": "1.0" for i in range(50)})
    text = report.to_termination_message()
    assert len(text.encode()) <= 4096
    back = parse_termination_message(text)
    assert back.finetune is not None
    assert back.finetune.trained_tokens == 20480
    assert len(back.finetune.loss_history) <= 16


def test_long_texts_give_way_before_a_report_is_refused_the_termination_message(tmp_path: Path) -> None:
    """Lists go first, then long texts and the pass@k section; what still cannot fit leaves the
    termination message empty (the ConfigMap copy is whole) and never crashes the worker."""
    from accelbench.workers.report import write_report

    error = {"type": "RuntimeError", "message": "x" * 2000}
    long_error = _report(ok=False, error=error, device="d" * 200, framework="f" * 50)
    text = long_error.to_termination_message()
    assert len(text.encode()) <= 4096 and parse_termination_message(text).error is not None
    huge = _report(versions={"v": "1"})
    assert huge.finetune is not None
    huge.finetune.mfu_formula = "m" * 300
    with pytest.raises(ValueError, match="does not fit 100 bytes"):
        huge.to_termination_message(limit=100)
    log = tmp_path / "termination-log"
    stream = io.StringIO()
    env = {"ACCELBENCH_TERMINATION_LOG": str(log)}
    with mock.patch.object(type(huge), "to_termination_message", side_effect=ValueError("too big")):
        assert write_report(huge, env=env, stream=stream) is None
    assert log.read_text() == ""  # the operator then reads the ConfigMap copy
    assert stream.getvalue().startswith("ACCELBENCH_REPORT ") and '"finishedAt":' in stream.getvalue()


@pytest.mark.parametrize(
    ("text", "reason", "fragment"),
    [
        (None, "ResultMissing", "no report"),
        ("   ", "ResultMissing", "no report"),
        ("Traceback (most recent call last):", "ResultInvalid", "not JSON"),
        ('{"schemaVersion": 1, "kind": "finetune", "ok": tr', "ResultInvalid", "not JSON"),
        ("[1, 2]", "ResultInvalid", "must be a JSON object"),
        ('{"schemaVersion": 99, "kind": "finetune", "ok": true}', "ResultInvalid", "schemaVersion 99"),
        ('{"schemaVersion": 1, "kind": "finetune", "ok": "maybe"}', "ResultInvalid", "does not match"),
        ('{"schemaVersion": 1, "kind": "nope", "ok": true}', "ResultInvalid", "does not match"),
        ("x" * 5000, "ResultInvalid", "over the 4096 limit"),
        ("[" * 3000 + "]" * 1000, "ResultInvalid", "not JSON"),
    ],
)
def test_garbage_reports_raise_report_error_only(text: str | None, reason: str, fragment: str) -> None:
    with pytest.raises(ReportError) as info:
        parse_termination_message(text)
    assert info.value.reason == reason
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "uri",
    ["pvc://models/gemma", "pvc://m", "gs://my-bucket/models/x", "s3://bucket.name/a/b", "file:///opt/m",
     "/opt/models/x", "relative/data.jsonl", "google/gemma-3-1b-it"],
)  # fmt: skip
def test_storage_uris_that_are_accepted(uri: str) -> None:
    from accelbench.api.common import check_storage_uri

    assert check_storage_uri(uri) == uri


@pytest.mark.parametrize(
    "uri", ["gcs://bucket/m", "http://example.com/x", "pvc://Bad_Claim/x", "gs://ab", "pvc:/x", "s3:/b/x"]
)
def test_storage_uris_that_are_refused_with_the_accepted_forms(uri: str) -> None:
    from accelbench.api.common import ModelSource

    with pytest.raises(ValueError, match="must be pvc://CLAIM/PATH, gs://BUCKET/PATH"):
        ModelSource.model_validate({"uri": uri, "family": "llama", "size": "8b"})


def test_a_thinned_bench_report_keeps_the_open_loop_points_and_the_cells_at_capacity() -> None:
    """The termination message holds at most 8 cells of a long sweep; status reads the open-loop
    TTFT and the latencies at SLO capacity from it, so those cells are never the ones thinned away
    (a CI run once lost the 2 req/s point of a sweep whose capacity search added 8 cells)."""
    from accelbench.api.status import BenchCell, BenchResults, InputLengthCapacity

    levels = [1, 2, 4, 8, 16, 32, 24, 20, 18, 17]
    cells = [BenchCell(input_length=16, concurrency=c, ttft_p50_ms=float(c)) for c in levels[:2]]
    cells.append(BenchCell(input_length=16, request_rate=2.0, ttft_p50_ms=5.0))
    cells += [BenchCell(input_length=16, concurrency=c, ttft_p50_ms=float(c)) for c in levels[2:]]
    bench = BenchResults(
        cells=cells,
        capacity_concurrency=17,
        capacity_by_input_length=[InputLengthCapacity(input_length=16, capacity_concurrency=17)],
    )
    report = WorkerReport(kind="bench", ok=True, framework="accelbench-bench", bench=bench)
    kept = report.model_copy(deep=True)
    kept.versions = {f"package-{i}": "x" * 300 for i in range(12)}  # too long whole: cells get thinned
    back = parse_termination_message(kept.to_termination_message())
    assert back.bench is not None and len(back.bench.cells) == 8
    assert [c.request_rate for c in back.bench.cells if c.request_rate] == [2.0]
    assert 17 in [c.concurrency for c in back.bench.cells] and back.bench.cells[0].concurrency == 1
