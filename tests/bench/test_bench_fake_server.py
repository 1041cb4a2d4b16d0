"""The client against the calibrated fake server: figures match the known timeline.

Fake server (conftest.fake_server): TTFT 50 ms, a chunk every 10 ms, chunk sizes 1, 3, 2 tokens in
turn. For 30 output tokens that is 15 chunks, the last at 50 + 14 × 10 = 190 ms, so
TPOT = 140 / 29 ms and the per-token ITLs are 10 ms (1-token chunks), 5 ms (2) and 3.33 ms (3).
Medians are compared (the machine is shared; a single scheduling hiccup must not fail the test),
with tolerances of the quiet-machine bar plus a few times the scheduling jitter measured around
the test (bench_helpers.scheduling_jitter_ms): tight on a quiet machine, as loose as the scheduler
is on a loaded one. The known-timeline test also allows the fake's own lateness, read from its
stamps.

Two references: the nominal timeline above, and the truth — the server stamps every chunk with
the time it wrote it (`x_sent`, same monotonic clock as the client). On a loaded machine the fake
server itself runs late; comparing with the truth keeps the test about the client's accuracy,
while the nominal comparison keeps the fake honest.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable

import pytest

from accelbench.workers.bench import client as client_mod
from accelbench.workers.bench import rawhttp
from accelbench.workers.bench.client import make_session, settle, stream_request
from accelbench.workers.bench.prompts import PromptFactory, ServerTokenizer
from accelbench.workers.bench.records import RequestRecord, TokenSource, request_metrics
from accelbench.workers.bench.runner import Runner, RunSettings
from accelbench.workers.bench.stats import CellKey, aggregate_cell

pytestmark = pytest.mark.timeout(120)

TTFT_MS, GAP_MS, N = 50.0, 10.0, 30
CHUNKS = 15
E2E_MS = TTFT_MS + (CHUNKS - 1) * GAP_MS
TPOT_MS = (CHUNKS - 1) * GAP_MS / (N - 1)


def ms_slack(quiet_ms: float, jitter_ms: float) -> float:
    """An absolute bound in ms: the quiet-machine bar plus two measured CPU waits."""
    return quiet_ms + 2.0 * jitter_ms


def rel_slack(quiet: float, jitter_ms: float, span_ms: float) -> float:
    """A relative bound on a figure measured over `span_ms`: the quiet bar plus two CPU waits of it."""
    return quiet + 2.0 * jitter_ms / span_ms


@pytest.fixture
def truth(monkeypatch: pytest.MonkeyPatch) -> list[tuple[RequestRecord, list[float]]]:
    """Capture the server's x_sent stamps of every request next to its record."""
    seen: list[tuple[RequestRecord, list[float]]] = []
    original = client_mod.apply_events

    def capture(record: RequestRecord, events: list[tuple[float, bytes]]) -> None:
        stamps = []
        for _, payload in events:
            if payload.startswith(b"{") and b"x_sent" in payload:
                stamps.append(json.loads(payload)["x_sent"])
        seen.append((record, stamps))
        original(record, events)

    monkeypatch.setattr(client_mod, "apply_events", capture)
    return seen


def fake_lateness_ms(truth: list) -> tuple[float, float, float]:
    """How late the fake server ran, from its own stamps (medians over requests, ms, never < 0):
    its first chunk past TTFT_MS, its last chunk past E2E_MS, and its mean chunk gap past GAP_MS.
    The nominal timeline shifted by these is what a perfect client would have measured."""
    runs = [(r, st) for r, st in truth if not r.warmup and len(st) == CHUNKS]
    first = statistics.median((st[0] - r.sent) * 1000 for r, st in runs) - TTFT_MS
    last = statistics.median((st[-1] - r.sent) * 1000 for r, st in runs) - E2E_MS
    gap = statistics.median((st[-1] - st[0]) * 1000 / (CHUNKS - 1) for _, st in runs) - GAP_MS
    return max(first, 0.0), max(last, 0.0), max(gap, 0.0)


# The accuracy bar on a quiet machine: TPOT, ITL and throughput within 2 % of the truth.
REL = 0.02


async def _runner(url: str, extra: dict | None = None, warmup: int = 2) -> Runner:
    settings = RunSettings(
        base_url=url, model="fake-model", output_length=N, extra_body=extra or {}, warmup_requests=warmup
    )
    # The fake's /tokenize counts words: exact lengths through the server-tokenizer path.
    session = make_session(1)
    prompts = PromptFactory(ServerTokenizer(session, url, "fake-model"))
    await prompts.prepare(256)
    runner = Runner(settings, prompts)
    runner._session = session  # closed by the caller
    return runner


async def _closed(url: str, concurrency: int, count: int, extra: dict | None = None) -> dict:
    runner = await _runner(url, extra)
    try:
        records = await runner.closed_loop(128, concurrency, count)
    finally:
        await runner._session.close()
    return aggregate_cell(
        CellKey(128, concurrency=concurrency), [request_metrics(r) for r in records], None, N
    )


def test_latencies_match_the_server_truth(
    fake_server: str, truth: list, measure_jitter: Callable[[], float]
) -> None:
    """Client TTFT/TPOT/ITL against what the server really did, request by request (medians)."""
    cell = asyncio.run(_closed(fake_server, 1, 12, {"logprobs": 1}))
    jitter_ms = measure_jitter()
    measured = [(request_metrics(r), stamps) for r, stamps in truth if not r.warmup and len(stamps) == CHUNKS]
    assert len(measured) >= 12
    ttft_err_ms = [(m.ttft - (stamps[0] - m.start)) * 1000 for m, stamps in measured]
    # Delivery of the first chunk: under 1 ms on a quiet machine.
    assert 0 <= statistics.median(ttft_err_ms) < ms_slack(1.0, jitter_ms)
    tpot_err, itl_err = [], []
    for m, stamps in measured:
        true_tpot = (stamps[-1] - stamps[0]) / (N - 1)
        tpot_err.append(abs(m.tpot - true_tpot) / true_tpot)
        true_total = sum(b - a for a, b in itertools.pairwise(stamps))
        itl_err.append(abs(sum(m.itl) - true_total) / true_total)
    bar = rel_slack(REL, jitter_ms, E2E_MS - TTFT_MS)
    assert statistics.median(tpot_err) < bar and statistics.median(itl_err) < bar, (tpot_err, itl_err)
    assert cell["tokenCountSource"] == {TokenSource.EXACT: 12}


def test_latencies_match_the_known_timeline(
    fake_server: str, truth: list, measure_jitter: Callable[[], float]
) -> None:
    # logprobs makes every chunk's token count exact, so ITL is checked per token.
    cell = asyncio.run(_closed(fake_server, 1, 12, {"logprobs": 1}))
    jitter_ms = measure_jitter()
    assert cell["completed"] == 12 and cell["errors"] == 0
    assert cell["tokenCountSource"] == {TokenSource.EXACT: 12}
    # The fake's own lateness counts here (~0 on a quiet machine): the nominal timeline, shifted.
    first_late, last_late, gap_late = fake_lateness_ms(truth)
    assert TTFT_MS <= cell["ttftMs"]["p50"] <= TTFT_MS + first_late + ms_slack(1.0, jitter_ms)
    span = E2E_MS - TTFT_MS
    assert cell["tpotMs"]["p50"] == pytest.approx(TPOT_MS, rel=rel_slack(REL, jitter_ms + last_late, span))
    assert cell["e2eMs"]["p50"] == pytest.approx(E2E_MS + last_late, abs=ms_slack(1.5, jitter_ms))
    # 29 per-token ITLs per request: 15 of 3.33 ms, 10 of 5 ms, 4 of 10 ms.
    itl_slack = jitter_ms + gap_late
    assert cell["itlMs"]["p50"] == pytest.approx(GAP_MS / 3, rel=rel_slack(REL, itl_slack, GAP_MS / 3))
    assert cell["itlMs"]["mean"] == pytest.approx(TPOT_MS, rel=rel_slack(REL, jitter_ms + last_late, span))
    assert cell["itlMs"]["p99"] == pytest.approx(GAP_MS, rel=rel_slack(REL, itl_slack, GAP_MS))
    assert cell["inputTokensMean"] == 128  # exact through the engine's /tokenize
    assert cell["outputTokens"]["server"] == 12 * N and cell["outputTokens"]["client"] == 12 * N


def test_without_per_chunk_counts_tpot_stays_exact(
    fake_server: str, truth: list, measure_jitter: Callable[[], float]
) -> None:
    """No logprobs: chunk sizes are estimated, TPOT (server count) is not affected. Compared with
    what the server really did (its stamps), so a fake server slowed by a loaded machine does not
    count against the client."""
    cell = asyncio.run(_closed(fake_server, 1, 8))
    jitter_ms = measure_jitter()
    assert cell["tokenCountSource"] == {TokenSource.ESTIMATED: 8}
    runs = [(request_metrics(r), st) for r, st in truth if not r.warmup and len(st) == CHUNKS]
    assert len(runs) == 8
    true_tpot = [(st[-1] - st[0]) / (N - 1) for _, st in runs]
    bar = rel_slack(REL, jitter_ms, E2E_MS - TTFT_MS)
    errors = [abs(m.tpot - t) / t for (m, _), t in zip(runs, true_tpot, strict=True)]
    assert statistics.median(errors) < bar, errors
    assert cell["itlMs"]["mean"] == pytest.approx(statistics.fmean(true_tpot) * 1000, rel=bar)
    assert cell["outputTokens"] == {
        "server": 8 * N,
        "client": 8 * CHUNKS,  # the client saw 15 chunks, the server says 30 tokens
        "requestsWithoutServerCount": 0,
        "requestsShort": 0,
    }


def test_closed_loop_throughput(fake_server: str, truth: list, measure_jitter: Callable[[], float]) -> None:
    cell = asyncio.run(_closed(fake_server, 4, 24, {"logprobs": 1}))
    jitter_ms = measure_jitter()
    _, last_late, _ = fake_lateness_ms(truth)
    expected = 4 * N / (cell["e2eMs"]["mean"] / 1000.0)  # four users, each 30 tokens per E2E
    bar = rel_slack(REL, jitter_ms, E2E_MS)
    assert cell["e2eMs"]["p50"] == pytest.approx(E2E_MS + last_late, rel=bar)
    assert cell["outputTokensPerSecond"] == pytest.approx(expected, rel=bar)
    assert cell["meanInFlight"] == pytest.approx(4, rel=bar)  # Little's law: no hidden queue
    assert cell["requestsPerSecond"] == pytest.approx(4 / (cell["e2eMs"]["mean"] / 1000.0), rel=bar)


def test_open_loop_schedule_lag_and_offered_load(
    fake_server: str, truth: list, measure_jitter: Callable[[], float]
) -> None:
    async def run() -> dict:
        runner = await _runner(fake_server, {"logprobs": 1}, warmup=2)
        try:
            records = await runner.open_loop(64, 40.0, 120)
        finally:
            await runner._session.close()
        return aggregate_cell(CellKey(64, request_rate=40.0), [request_metrics(r) for r in records], None, N)

    cell = asyncio.run(run())
    jitter_ms = measure_jitter()
    assert cell["errors"] == 0 and cell["offeredRequestsPerSecond"] == 40.0
    # The median shows the dispatcher sends on time; the tail on 2 shared cores is the neighbours'
    # (9 ms seen while a JAX suite ran beside it; one VM stall of 184 ms in a CI run, which at 40
    # requests/s makes about 7 of the 120 late: the p99, not the p90). The p99 < 1 ms bar is a
    # benchmark figure (benchmarks/client_overhead), so here the tail only has to rule out a broken
    # scheduler, which falls behind on every request after the first late one: the p90 shows that.
    assert cell["scheduleLagMs"]["p50"] < ms_slack(0.5, jitter_ms)
    assert cell["scheduleLagMs"]["p90"] < 50.0
    # Achieved ≈ offered for a server that is never saturated (Poisson: wide tolerance on 120).
    assert cell["achievedRequestsPerSecond"] == pytest.approx(40.0, rel=0.35)
    first_late, _, _ = fake_lateness_ms(truth)
    assert TTFT_MS <= cell["ttftMs"]["p50"] <= TTFT_MS + first_late + ms_slack(1.5, jitter_ms)


def test_errors_are_counted_by_type(fake_server: str) -> None:
    async def one(prompt: str, timeout: float = 30.0) -> RequestRecord:
        async with make_session(1) as session:
            body = {"model": "fake-model", "prompt": prompt, "max_tokens": 8, "stream": True}
            record = RequestRecord(scheduled=time.perf_counter())
            await stream_request(
                session, fake_server + "/v1/completions", json.dumps(body).encode(), record, timeout
            )
            return settle(record)

    async def run() -> list[RequestRecord]:
        return list(
            await asyncio.gather(one("FAIL500 x"), one("DISCONNECT x"), one("HANG x", 0.3), one("fine"))
        )

    records = asyncio.run(run())
    metrics = [request_metrics(r) for r in records]
    cell = aggregate_cell(CellKey(8, concurrency=4), metrics, None, 8)
    assert cell["errorsByType"] == {"disconnect": 1, "http_500": 1, "timeout": 1}
    assert cell["completed"] == 1


def test_connection_refused_is_an_error_not_a_crash() -> None:
    async def run() -> RequestRecord:
        async with make_session(1) as session:
            record = RequestRecord(scheduled=0.0)
            await stream_request(session, "http://127.0.0.1:9/v1/completions", b"{}", record, 5.0)
            return record

    assert asyncio.run(run()).error == "connect"


def test_raw_transport_counts_errors_by_type(fake_server: str) -> None:
    async def one(session: rawhttp.RawSession, prompt: str, timeout: float = 30.0) -> RequestRecord:
        body = {"model": "fake-model", "prompt": prompt, "max_tokens": 8, "stream": True}
        record = RequestRecord(scheduled=time.perf_counter())
        await session.stream("/v1/completions", json.dumps(body).encode(), record, timeout)
        return settle(record)

    async def run() -> list[RequestRecord]:
        async with rawhttp.RawSession(fake_server) as s:
            return list(
                await asyncio.gather(
                    one(s, "FAIL500 x"), one(s, "DISCONNECT x"), one(s, "HANG x", 0.3), one(s, "fine")
                )
            )

    records = asyncio.run(run())
    assert [r.error for r in records] == ["http_500", "disconnect", "timeout", None]
    assert records[3].server_output_tokens is None and len(records[3].chunk_times) == 5  # 1,3,2,1,1


def test_raw_send_now_writes_before_returning(fake_server: str) -> None:
    """On an idle connection the open-loop send leaves in the dispatcher's own loop turn."""

    async def run() -> tuple[float, RequestRecord, RequestRecord]:
        body = json.dumps({"model": "fake-model", "prompt": "x", "max_tokens": 8, "stream": True}).encode()
        async with rawhttp.RawSession(fake_server) as session:
            first = RequestRecord(scheduled=time.perf_counter())
            await session.stream("/v1/completions", body, first, 30.0)  # leaves an idle connection
            second = RequestRecord(scheduled=time.perf_counter())
            pending = session.send_now("/v1/completions", body, second, 30.0)
            sent_before_any_await = second.sent
            await pending
            return sent_before_any_await, settle(first), settle(second)

    sent, first, second = asyncio.run(run())
    assert not math.isnan(sent) and sent == second.sent
    assert first.ok and second.ok and second.chunk_times[0] > second.sent
