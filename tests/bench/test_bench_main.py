"""The entry point end to end against the fake server: env contract in, report and files out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import bench_env, serve

from accelbench.api.contract import ExitCode
from accelbench.api.report import parse_termination_message
from accelbench.cost import dollars_per_million_tokens
from accelbench.views import render_report
from accelbench.workers.bench.main import main

pytestmark = pytest.mark.timeout(120)

JOB = {
    "apiVersion": "accelbench.io/v1alpha1",
    "kind": "InferenceBench",
    "metadata": {"name": "b", "namespace": "ns"},
    "spec": {
        "model": {"uri": "pvc://models/tiny", "family": "llama"},
        "accelerator": {"type": "h100", "count": 2},
        "workload": {
            "inputLengths": [32, 64],
            "outputLength": 12,
            "concurrency": [1, 2],
            "requestsPerPoint": 6,
            "warmupRequests": 1,
        },
        "slo": {"ttftMs": 40, "attainment": 0.9},
    },
    "plan": {
        "accelerator": "h100",
        "framework": "pytorch",
        "chips": 2,
        "hosts": 1,
        "chipsPerHost": 2,
        "peakTflopsPerChip": 989.0,
        "dollarsPerChipHour": 10.0,
        "priceSource": "catalog h100 on-demand, test",
    },
}


def test_env_contract_end_to_end(tmp_path: Path) -> None:
    term = tmp_path / "termination-log"
    out = tmp_path / "results.json"
    # TTFT 30 ms, so the 40 ms SLO holds at low concurrency; 5 ms chunks.
    with serve(["--ttft", "0.03", "--gap", "0.005"]) as url:
        env = bench_env(JOB, url, term, ACCELBENCH_RESULTS_CONFIGMAP="b-results", POD_NAMESPACE="ns")
        assert main(["--out", str(out), "--max-concurrency", "4"], env=env) == 0
    report = parse_termination_message(term.read_text())
    assert report.ok and report.bench is not None
    assert report.bench.cells[0].input_length == 32 and report.bench.server_startup_seconds is not None
    full = json.loads(out.read_text())
    assert full["model"] == "fake-model" and full["tokenizer"] == {
        "source": "server",
        "exact": True,
        "promptsOffTarget": 0,
    }
    assert {c["inputLength"] for c in full["cells"]} == {32, 64}
    # The client prices nothing: it passes the plan's price on, and the report prices with it.
    assert full["price"] == {
        "dollarsPerChipHour": 10.0,
        "chips": 2,
        "priceSource": "catalog h100 on-demand, test",
    }
    assert report.bench.dollars_per_million_tokens_at_peak is None
    assert report.bench.price_source == "catalog h100 on-demand, test"
    paths = render_report(full, tmp_path / "report")
    page = paths["html"].read_text()
    assert page.count("<tr>") == len(full["cells"]) + 1
    peak_64 = max(c["outputTokensPerSecond"] for c in full["cells"] if c["inputLength"] == 64)
    assert f"{dollars_per_million_tokens(20.0, peak_64)}" in page  # $20/h = 2 chips at $10
    assert paths["ttft"].stat().st_size > 1000 and paths["throughput"].stat().st_size > 1000


def test_invalid_config_exit_code(tmp_path: Path) -> None:
    term = tmp_path / "t"
    env = {"ACCELBENCH_JOB": "{not json", "ACCELBENCH_TERMINATION_LOG": str(term)}
    assert main([], env=env) == ExitCode.INVALID_CONFIG
    report = parse_termination_message(term.read_text())
    assert not report.ok and report.error is not None


def test_server_never_ready_is_an_error(tmp_path: Path) -> None:
    env = {"ACCELBENCH_ENDPOINT": "http://127.0.0.1:9", "ACCELBENCH_HEALTH_PATH": "/health"}
    assert main(["--ready-timeout", "1"], env=env) == ExitCode.ERROR


def test_event_loop_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import sys

    from accelbench.workers.bench.main import ConfigError, loop_factory, loop_name

    assert loop_factory("asyncio") is None
    factory = loop_factory("auto")
    if factory is not None:  # uvloop installed (the bench extra): auto picks it
        loop = factory()
        try:
            assert loop_name(loop) == "uvloop"
        finally:
            loop.close()
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    assert loop_factory("auto") is None
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        loop_factory("uvloop")
    loop = asyncio.new_event_loop()
    try:
        assert loop_name(loop) == "asyncio"
    finally:
        loop.close()
