"""Per-request metrics and cell aggregation, on hand-made timelines."""

from __future__ import annotations

import pytest

from accelbench.api.inference import Slo
from accelbench.workers.bench.records import (
    RequestRecord,
    TokenSource,
    allocate,
    per_token_itl,
    request_metrics,
    resolve_chunk_tokens,
    tpot,
)
from accelbench.workers.bench.stats import CellKey, aggregate_cell, meets, summarize


def record(times: list[float], tokens: list[int | None], server: int | None, scheduled: float = 0.0):
    return RequestRecord(
        scheduled=scheduled,
        sent=scheduled,
        chunk_times=times,
        chunk_tokens=tokens,
        chunk_chars=[4] * len(times),
        end=times[-1],
        server_output_tokens=server,
        server_prompt_tokens=10,
    )


def test_itl_is_per_token_for_multi_token_chunks() -> None:
    # A 4-token chunk 40 ms after the previous one is four 10 ms ITLs.
    assert per_token_itl([0.0, 0.04], [1, 4]) == pytest.approx([0.01] * 4)
    # Tokens of the first chunk came with the TTFT: no ITL for them.
    assert per_token_itl([0.0, 0.01], [3, 1]) == pytest.approx([0.01])


def test_tpot_uses_server_count() -> None:
    m = request_metrics(record([0.1, 0.2, 0.3], [None, None, None], server=9))
    assert m.ttft == pytest.approx(0.1) and m.e2e == pytest.approx(0.3)
    assert m.tpot == pytest.approx(0.2 / 8)  # (E2E - TTFT) / (n - 1), n from the server
    assert (m.output_tokens, m.client_output_tokens, m.token_source) == (9, 3, TokenSource.ESTIMATED)
    assert len(m.itl) == 9 - 3  # 9 tokens spread 3/3/3 by text weight; the first chunk's 3 have none
    assert tpot(1.0, 0.5, 1) is None


def test_ttft_counts_from_the_scheduled_time_not_the_send() -> None:
    r = record([1.1, 1.2], [1, 1], server=2, scheduled=1.0)
    r.sent = 1.05  # the client was 50 ms late
    m = request_metrics(r)
    assert m.ttft == pytest.approx(0.1) and m.schedule_lag == pytest.approx(0.05)


def test_token_resolution() -> None:
    assert resolve_chunk_tokens([2, 1], 3, [1, 1]) == ([2, 1], TokenSource.EXACT)
    assert resolve_chunk_tokens([None] * 3, 3, [1, 1, 1]) == ([1, 1, 1], TokenSource.ONE_PER_CHUNK)
    assert resolve_chunk_tokens([None] * 2, None, [1, 1]) == ([1, 1], TokenSource.CLIENT_ONLY)
    counts, source = resolve_chunk_tokens([None] * 3, 10, [1, 3, 1])
    assert sum(counts) == 10 and source == TokenSource.ESTIMATED and counts[1] > counts[0]


@pytest.mark.parametrize(
    "total,weights", [(10, [1, 1, 1]), (7, [5, 1]), (3, [1, 1, 1, 1]), (100, [0, 0, 0]), (5, [])]
)
def test_allocate_sums_and_minimum(total: int, weights: list[float]) -> None:
    parts = allocate(total, weights)
    assert len(parts) == len(weights)
    if weights and total >= len(weights):
        assert sum(parts) == total
    assert all(p >= 1 for p in parts)


def test_summarize_percentiles() -> None:
    s = summarize(range(1, 101), 1.0)
    assert s is not None
    assert (s["mean"], s["p50"], s["p99"], s["max"]) == (50.5, 50.5, pytest.approx(99.01), 100)
    assert summarize([]) is None


def test_cell_aggregation_slo_goodput_and_errors() -> None:
    good = [
        request_metrics(record([0.05 + i, 0.15 + i], [None, None], server=2, scheduled=i)) for i in range(3)
    ]
    slow = request_metrics(record([3.5, 3.6], [None, None], server=2, scheduled=3.0))
    failed = request_metrics(RequestRecord(scheduled=3.0, sent=3.0, end=3.1, error="http_500"))
    slo = Slo(ttft_ms=100, attainment=0.8)
    cell = aggregate_cell(CellKey(64, concurrency=1), [*good, slow, failed], slo, output_length=2)
    assert cell["errors"] == 1 and cell["errorsByType"] == {"http_500": 1}
    assert cell["attainment"] == pytest.approx(3 / 5) and cell["sloMet"] is False
    assert cell["attainmentByBound"] == {"ttft": pytest.approx(3 / 5)}
    assert cell["durationSeconds"] == pytest.approx(3.6)
    assert cell["outputTokensPerSecond"] == pytest.approx(8 / 3.6)
    assert cell["goodputOutputTokensPerSecond"] == pytest.approx(6 / 3.6)
    assert cell["outputTokens"] == {
        "server": 8,
        "client": 8,
        "requestsWithoutServerCount": 0,
        "requestsShort": 0,
    }
    assert meets(failed, slo) == {"ttft": False}


def test_prefix_cache_hits_and_failures_stay_out_of_the_latency_percentiles() -> None:
    fresh = [
        request_metrics(record([0.2 + i, 0.3 + i], [None, None], server=2, scheduled=i)) for i in range(4)
    ]
    hit = record([4.01, 4.1], [None, None], server=2, scheduled=4.0)
    hit.cached_prompt_tokens = 8
    timeout = request_metrics(RequestRecord(scheduled=5.0, sent=5.0, end=5.5, error="timeout"))
    cell = aggregate_cell(
        CellKey(64, request_rate=1.0), [*fresh, request_metrics(hit), timeout], None, output_length=2
    )
    assert cell["ttftMs"]["min"] == pytest.approx(200.0) and cell["ttftMs"]["max"] == pytest.approx(200.0)
    assert cell["prefixCacheHits"]["requests"] == 1
    assert cell["prefixCacheHits"]["cachedPromptTokens"] == 8
    assert cell["prefixCacheHits"]["ttftMs"]["p50"] == pytest.approx(10.0)
    assert cell["errorsByType"] == {"timeout": 1} and cell["completed"] == 5
    assert cell["deliveredFraction"] == pytest.approx(1.0)  # every request left at its scheduled time


def test_delivered_fraction_of_an_open_loop_cell_that_fell_behind() -> None:
    late = [request_metrics(record([t * 1.25 + 0.1], [None], server=1, scheduled=t)) for t in range(5)]
    for m, t in zip(late, range(5), strict=True):
        object.__setattr__(m, "schedule_lag", t * 0.25)
    cell = aggregate_cell(CellKey(64, request_rate=1.0), late, None, output_length=1)
    assert cell["deliveredFraction"] == pytest.approx(0.8)
    closed = aggregate_cell(CellKey(64, concurrency=1), late, None, output_length=1)
    assert closed["deliveredFraction"] is None
