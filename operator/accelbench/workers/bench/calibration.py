"""Before measuring a server at open-loop rates, measure the client at those rates.

An open-loop point is only the server's latency if the client sent every request when it was
scheduled. So the client first drives a zero-latency null server (nullserver.py, its own process on
loopback) with the same schedule, prompts and transport at each planned rate, and reports what it
delivered: the planned send span over the actual one (1.0: on schedule; 0.9: it ran 10 % slow) and
the p99 send lag. A rate delivered below DELIVERY_BAR is flagged, and the run's cells at that rate
say `clientLimited`, so a slow client is never read as a slow server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence

from ...api.status import ClientCalibrationPoint, ClientOverhead
from . import nullserver
from .records import RequestRecord, request_metrics
from .runner import Runner
from .stats import delivered_fraction, summarize

log = logging.getLogger("accelbench.bench")

DELIVERY_BAR = 0.995  # the share of the planned rate a client must deliver for its cells to count
CALIBRATION_SECONDS = 10.0  # per rate: long enough that a few ms of lag is not a percent of the span
MIN_REQUESTS = 20
MAX_REQUESTS = 20000  # 2 s at 10,000 req/s: a shorter span is mostly start-up transient
NULL_SERVER_RATE = 3000.0  # req/s per null-server process: below one process's measured ceiling
AGAINST = "loopback null server (accelbench.workers.bench.nullserver), same pod"


def calibration_count(rate: float, seconds: float = CALIBRATION_SECONDS) -> int:
    return max(MIN_REQUESTS, min(MAX_REQUESTS, round(rate * seconds)))


def delivered(records: Sequence[RequestRecord]) -> float | None:
    """The planned send span over the actual one; None with fewer than two requests sent."""
    return delivered_fraction([(r.scheduled, r.sent) for r in records if not math.isnan(r.sent)])


def point(rate: float, records: Sequence[RequestRecord]) -> ClientCalibrationPoint:
    lag = summarize((request_metrics(r).schedule_lag for r in records), 1000.0)
    fraction = delivered(records)
    return ClientCalibrationPoint(
        request_rate=rate,
        requests=len(records),
        delivered_fraction=None if fraction is None else round(fraction, 5),
        send_lag_p99_ms=round(lag["p99"], 3) if lag else None,
    )


def overhead(points: Sequence[ClientCalibrationPoint]) -> ClientOverhead:
    return ClientOverhead(
        against=AGAINST,
        points=list(points),
        delivers_planned_rates=all(
            p.delivered_fraction is not None and p.delivered_fraction >= DELIVERY_BAR for p in points
        ),
    )


def limited_rates(result: ClientOverhead) -> set[float]:
    return {
        p.request_rate
        for p in result.points
        if p.delivered_fraction is None or p.delivered_fraction < DELIVERY_BAR
    }


NULL_SERVER_START_S = 120.0  # a python start and import on a busy pod (2 shared vCPUs) can take long


@contextlib.asynccontextmanager
async def null_server(processes: int = 1, timeout_s: float = NULL_SERVER_START_S) -> AsyncIterator[str]:
    """The null server in its own process(es) (never on the client's event loop); its URL. The
    server picks its port and announces it once listening: no port chosen here that another
    process could take first, no polling."""
    command = [sys.executable, "-m", "accelbench.workers.bench.nullserver", "--port", "0"]
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [*command, "--processes", str(processes)], stdout=subprocess.PIPE, stderr=stderr
        )
        announced = proc.stdout
        assert announced is not None
        try:
            try:
                line = await asyncio.wait_for(asyncio.to_thread(announced.readline), timeout_s)
            except TimeoutError:
                line = b""
            word, _, port = line.decode(errors="replace").partition(" ")
            if word != nullserver.LISTENING:
                stderr.seek(0)
                said = stderr.read().decode(errors="replace").strip().splitlines()[-1:] or ["nothing"]
                code = proc.poll()
                state = f"exit {code}" if code is not None else f"not listening after {timeout_s:.0f} s"
                raise RuntimeError(f"the null server did not start ({state}; stderr: {said[0][:300]})")
            yield f"http://127.0.0.1:{int(port)}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            announced.close()


async def calibrate(
    runner: Runner, rates: Sequence[float], input_length: int, seconds: float = CALIBRATION_SECONDS
) -> ClientOverhead:
    """Drive the null server at each planned rate with the run's own prompts, transport and
    sending processes."""
    async with null_server(null_server_processes(max(rates))) as url:
        settings = dataclasses.replace(runner.settings, base_url=url, model="null")
        probe = Runner(settings, runner.prompts)
        points = []
        try:
            for rate in sorted(set(rates)):
                records = await probe.open_loop(input_length, rate, calibration_count(rate, seconds))
                points.append(point(rate, records))
                log.info(
                    "client calibration at %g req/s: delivered %s of the schedule, send lag p99 %s ms",
                    rate,
                    points[-1].delivered_fraction,
                    points[-1].send_lag_p99_ms,
                )
        finally:
            probe.close()
    return overhead(points)


def null_server_processes(rate: float) -> int:
    """One null-server process answers ~4,600 req/s of 64-token streams (benchmarks/client_overhead,
    2-vCPU VM); more share the port past NULL_SERVER_RATE each."""
    return max(1, math.ceil(rate / NULL_SERVER_RATE))
