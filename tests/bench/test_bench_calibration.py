"""The client measures itself against the null server (its own process, loopback) at the planned
open-loop rates before a run: a rate it cannot deliver is flagged, and that rate's cells say
`clientLimited`, so a slow client is never read as a slow server."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import sys
from pathlib import Path

import pytest
from bench_helpers import bench_env, serve
from test_bench_main import JOB

from accelbench.api.report import parse_termination_message
from accelbench.workers.bench.calibration import (
    DELIVERY_BAR,
    MAX_REQUESTS,
    calibrate,
    delivered,
    limited_rates,
    null_server,
    overhead,
    point,
)
from accelbench.workers.bench.main import main
from accelbench.workers.bench.prompts import ApproxTokenizer, PromptFactory
from accelbench.workers.bench.records import RequestRecord
from accelbench.workers.bench.runner import Runner, RunSettings

pytestmark = pytest.mark.timeout(120)


def record(scheduled: float, sent: float) -> RequestRecord:
    r = RequestRecord(scheduled=scheduled, input_tokens=8)
    r.sent = sent
    return r


def test_delivered_is_the_planned_span_over_the_actual_one() -> None:
    on_time = [record(t, t + 0.0002) for t in (0.0, 1.0, 2.0, 3.0)]
    assert delivered(on_time) == pytest.approx(1.0)
    slow = [record(t, t * 1.25) for t in (0.0, 1.0, 2.0, 3.0)]  # falls further behind: 80 % delivered
    assert delivered(slow) == pytest.approx(0.8)
    assert delivered([record(0.0, math.nan), record(1.0, 1.0)]) is None  # one sent
    points = [point(4.0, on_time), point(8.0, slow)]
    result = overhead(points)
    assert not result.delivers_planned_rates and limited_rates(result) == {8.0}
    assert points[0].send_lag_p99_ms == pytest.approx(0.2, abs=1e-6)
    assert overhead(points[:1]).delivers_planned_rates and DELIVERY_BAR == 0.995


async def _calibrate(rates: list[float], seconds: float) -> object:
    settings = RunSettings(base_url="http://unused", model="m", output_length=8, warmup_requests=2)
    return await calibrate(Runner(settings, PromptFactory(ApproxTokenizer())), rates, 16, seconds)


def test_against_the_null_server_a_modest_rate_is_delivered_and_an_absurd_one_is_flagged() -> None:
    result = asyncio.run(_calibrate([40.0, 1_000_000.0], seconds=2.0))
    modest, absurd = result.points  # type: ignore[attr-defined]
    assert (modest.request_rate, modest.requests) == (40.0, 80)
    # Loose on purpose: this machine is shared; the bar itself is DELIVERY_BAR, checked above.
    assert modest.delivered_fraction is not None and modest.delivered_fraction > 0.9, modest
    assert absurd.requests == MAX_REQUESTS and absurd.delivered_fraction < 0.5, absurd  # a million a second
    assert 1_000_000.0 in limited_rates(result) and not result.delivers_planned_rates  # type: ignore[arg-type]


def test_a_run_with_open_loop_rates_reports_its_calibration_and_marks_its_cells(tmp_path: Path) -> None:
    job = copy.deepcopy(JOB)
    job["spec"]["workload"].update({"inputLengths": [32], "concurrency": [1], "requestRates": [5.0]})
    term, out = tmp_path / "termination-log", tmp_path / "results.json"
    with serve(["--ttft", "0.01", "--gap", "0.002"]) as url:
        assert main(["--out", str(out), "--no-capacity-search"], env=bench_env(job, url, term)) == 0
    bench = parse_termination_message(term.read_text()).bench
    assert bench is not None and bench.client_overhead is not None
    (calibrated,) = bench.client_overhead.points
    assert calibrated.request_rate == 5.0 and calibrated.requests == 50
    opened = [c for c in bench.cells if c.request_rate is not None]
    closed = [c for c in bench.cells if c.concurrency is not None]
    limited = not bench.client_overhead.delivers_planned_rates
    assert opened and all(c.client_limited is limited for c in opened)
    assert closed and all(c.client_limited is None for c in closed)  # closed loop has no schedule
    assert json.loads(out.read_text())["clientOverhead"]["points"][0]["requestRate"] == 5.0


def _fake_python(tmp_path: Path, script: str) -> str:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return str(path)


def test_a_null_server_that_cannot_start_fails_calibration_saying_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its exit code and the last line it wrote to stderr reach the error (and so the report)."""
    monkeypatch.setattr(sys, "executable", _fake_python(tmp_path, "echo 'no module named x' >&2; exit 3"))

    async def go() -> None:
        async with null_server(timeout_s=30):
            pass

    with pytest.raises(RuntimeError, match=r"did not start \(exit 3; stderr: no module named x\)"):
        asyncio.run(go())


def test_a_null_server_that_never_listens_is_given_up_on_and_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = tmp_path / "pid"
    monkeypatch.setattr(sys, "executable", _fake_python(tmp_path, f"echo $$ > {pidfile}; exec sleep 60"))

    async def go() -> None:
        async with null_server(timeout_s=1):
            pass

    with pytest.raises(RuntimeError, match=r"did not start \(not listening after 1 s"):
        asyncio.run(go())
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not left running


def test_the_null_server_announces_the_port_the_kernel_gave_it() -> None:
    """`--port 0`: the port comes from the server once it listens (no port picked in advance that
    another process could take first); two processes share it."""

    async def go() -> bytes:
        async with null_server(processes=2) as url:
            host, port = url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            writer.close()
            return head

    assert asyncio.run(go()).startswith(b"HTTP/1.1 200 OK")
