"""spec.passAtK and the pass@k report section: validation, CRD rule, report size, ingest, volumes."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from accelbench.api import FinetuneJob, parse_resource
from accelbench.api.finetune import PassAtK
from accelbench.api.report import WorkerReport, parse_termination_message
from accelbench.api.status import PassAtKResults
from accelbench.catalog import load_catalog
from accelbench.cli.crdgen import generate_crds
from accelbench.controller.ingest import ingest
from accelbench.render.finetune import build_worker_storage

CHECKER = {"command": ["sh", "-c", "iverilog -o sim {sample} && vvp sim"], "timeoutSeconds": 30}


def _job(pass_at_k: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"uri": "pvc://models/tiny", "family": "llama", "size": "tiny"},
        "dataset": {"uri": "pvc://data/train.jsonl"},
        "accelerator": {"type": "cpu"},
    }
    if pass_at_k is not None:
        spec["passAtK"] = pass_at_k
    return {
        "apiVersion": "accelbench.io/v1alpha1",
        "kind": "FinetuneJob",
        "metadata": {"name": "t"},
        "spec": spec,
    }


def test_defaults_and_wire_names() -> None:
    job = parse_resource(_job({"dataset": "pvc://eval/problems.jsonl", "checker": CHECKER}))
    assert isinstance(job, FinetuneJob)
    spec = job.spec.pass_at_k
    assert spec is not None
    assert spec.k == [1] and spec.n == 1 and spec.temperature == 0 and spec.checker.extract == "raw"
    assert spec.checker.sample_file == "sample.txt"
    wire = job.spec.to_wire()["passAtK"]
    assert wire["checker"]["timeoutSeconds"] == 30 and "samplesPerProblem" not in wire


def test_samples_per_problem_defaults_to_the_largest_k() -> None:
    assert PassAtK(dataset="p.jsonl", k=[1, 5, 10], checker=CHECKER).n == 10


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"k": [1, 10], "samplesPerProblem": 5}, "at least the largest k"),
        ({"k": []}, "at least 1 item"),
        ({"k": [0]}, "greater than or equal to 1"),
        ({"temperature": -0.1}, "greater than or equal to 0"),
        ({"topP": 0}, "greater than 0"),
        ({"checker": {"command": []}}, "at least 1 item"),
        ({"checker": {"command": ["true"], "sampleFile": "../escape.v"}}, "pattern"),
        ({"checker": {"command": ["true"], "shell": True}}, "Extra inputs"),
    ],
)
def test_invalid_specs_are_refused(fields: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        PassAtK.model_validate({"dataset": "p.jsonl", "checker": CHECKER, **fields})


def test_crd_carries_the_n_covers_k_rule() -> None:
    crd = generate_crds(load_catalog())["accelbench.io_finetunejobs.yaml"]
    version = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema = version["properties"]["spec"]["properties"]["passAtK"]
    rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    assert any("self.k.all(x, x <= self.samplesPerProblem)" in r for r in rules)
    assert schema["required"] == ["dataset", "checker"]
    status = version["properties"]["status"]["properties"]["results"]["properties"]["passAtK"]
    assert status["properties"]["scores"]["additionalProperties"]["maximum"] == 1


SECTION = {
    "scores": {"pass@1": 0.41234567, "pass@5": 0.6, "pass@10": 0.7},
    "problems": 156,
    "samplesPerProblem": 10,
    "samples": 1560,
    "passed": 640,
    "failed": 920,
    "timeouts": 12,
    "checkerErrors": 0,
    "seconds": 812.123456,
    "generateSeconds": 700.5,
    "checkSeconds": 111.6,
}


def _report(section: dict[str, Any], history: int = 0) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "kind": "finetune",
        "ok": True,
        "device": "NVIDIA H200",
        "finetune": {
            "steps": 50,
            "trainedTokens": 1000,
            "tokensPerSecond": 4200.0,
            "tokensPerSecondPerChip": 4200.0,
            "lossHistory": [1.2345678] * history,
            "passAtK": section,
        },
        "timings": {"totalSeconds": 900.0},
        "versions": {f"lib{i}": "1.2.3" for i in range(12)},
    }


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"passed": 641}, "must equal samples"),
        ({"timeouts": 900, "checkerErrors": 100}, "cannot exceed failed"),
        ({"scores": {"pass@1": 1.5}}, "less than or equal to 1"),
        ({"problems": -1}, "greater than or equal to 0"),
    ],
)
def test_section_counts_must_add_up(change: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        PassAtKResults.model_validate({**SECTION, **change})


def test_termination_message_keeps_pass_at_k_and_fits() -> None:
    section = {**SECTION, "scores": {f"pass@{k}": 0.123456 for k in (1, 2, 5, 10, 20, 50, 100, 200)}}
    section["note"] = "checker error: " + "x" * 280
    report = WorkerReport.model_validate(_report(section, history=2000))
    text = report.to_termination_message()
    assert len(text.encode()) <= 4096
    back = parse_termination_message(text)
    assert back.finetune is not None and back.finetune.pass_at_k is not None
    assert back.finetune.pass_at_k.scores["pass@200"] == pytest.approx(0.123456)


def test_ingest_puts_pass_at_k_into_the_status_results() -> None:
    result = ingest(json.dumps(_report(SECTION)), "FinetuneJob")
    assert result.valid, result.condition.message
    section = result.results.pass_at_k
    assert section.scores == {"pass@1": 0.4123, "pass@5": 0.6, "pass@10": 0.7}
    assert (section.samples, section.passed, section.failed, section.timeouts) == (1560, 640, 920, 12)
    assert section.seconds == 812.1


@pytest.mark.parametrize(
    "garbage",
    [
        {"passed": 5},  # counts do not add up
        {"scores": {"pass@1": "high"}},
        {"scores": [0.5]},
        {"samples": None},
        {"note": "x" * 5000},
    ],
)
def test_garbage_pass_at_k_is_a_condition_not_an_exception(garbage: dict[str, Any]) -> None:
    section = copy.deepcopy(SECTION) | garbage
    text = json.dumps(_report(section))[:4096]
    result = ingest(text, "FinetuneJob")
    assert not result.valid and result.condition.reason == "ResultInvalid"


def test_pass_at_k_problems_on_a_claim_are_mounted() -> None:
    job = parse_resource(_job({"dataset": "pvc://evalsets/verilog/problems.jsonl", "checker": CHECKER}))
    volumes, mounts = build_worker_storage(job)
    claims = {v["persistentVolumeClaim"]["claimName"] for v in volumes}
    assert claims == {"models", "data", "evalsets"}
    assert all(m["readOnly"] for m in mounts)
