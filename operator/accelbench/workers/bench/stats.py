"""Aggregation of request metrics into one sweep cell (pure functions).

Throughput window: from the first request's scheduled send to the last request's end. Requests of a
closed-loop cell all start at the window start, so tokens/s is total tokens over wall time with no
idle head or tail excluded or added.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ...api.inference import Slo
from .records import RequestMetrics

PERCENTILES = (50, 90, 95, 99)
SLO_CONSTRAINTS = ("ttft", "tpot", "e2e")


def summarize(values: Iterable[float], scale: float = 1.0) -> dict[str, float] | None:
    """mean, p50, p90, p95, p99, max (linear interpolation, numpy's default), times `scale`."""
    arr = np.fromiter(values, dtype=float)
    if arr.size == 0:
        return None
    arr = arr * scale
    out = {"mean": float(arr.mean())}
    for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES), strict=True):
        out[f"p{p}"] = float(v)
    out["max"] = float(arr.max())
    out["min"] = float(arr.min())
    return out


def meets(m: RequestMetrics, slo: Slo) -> dict[str, bool]:
    """Which SLO bounds one request met; a failed request meets none."""
    if not m.ok:
        return {c: False for c in SLO_CONSTRAINTS if _bound(slo, c) is not None}
    values = {"ttft": m.ttft, "tpot": m.tpot, "e2e": m.e2e}
    result: dict[str, bool] = {}
    for name in SLO_CONSTRAINTS:
        bound = _bound(slo, name)
        if bound is None:
            continue
        value = values[name]
        # A one-token answer has no TPOT: nothing to violate.
        result[name] = value is None or value * 1000.0 <= bound
    return result


def _bound(slo: Slo, name: str) -> float | None:
    return {"ttft": slo.ttft_ms, "tpot": slo.tpot_ms, "e2e": slo.e2e_ms}[name]


@dataclass(frozen=True)
class CellKey:
    input_length: int
    concurrency: int | None = None
    request_rate: float | None = None


def delivered_fraction(times: Sequence[tuple[float, float]]) -> float | None:
    """(scheduled, sent) pairs: the planned send span over the actual one; None under two sends."""
    if len(times) < 2:
        return None
    planned = max(t[0] for t in times) - min(t[0] for t in times)
    actual = max(t[1] for t in times) - min(t[1] for t in times)
    return planned / actual if actual > 0 else None


def window_seconds(metrics: Sequence[RequestMetrics]) -> float:
    if not metrics:
        return 0.0
    return max(m.end for m in metrics) - min(m.start for m in metrics)


def aggregate_cell(
    key: CellKey, metrics: Sequence[RequestMetrics], slo: Slo | None, output_length: int
) -> dict:
    """The full per-cell record (camelCase keys, times in ms) written to the results JSON."""
    ok = [m for m in metrics if m.ok]
    window = window_seconds(metrics)
    out_tokens = sum(m.output_tokens for m in ok)
    in_tokens = sum(m.input_tokens or 0 for m in ok)
    errors = Counter(m.error for m in metrics if not m.ok)
    # A prompt served from the engine's prefix cache skips most of its prefill: its TTFT and E2E
    # are another population, reported apart (prompts here are random, so a hit is the exception).
    hits = [m for m in ok if m.cached_prompt_tokens]
    fresh = [m for m in ok if not m.cached_prompt_tokens]
    cell: dict = {
        "inputLength": key.input_length,
        "outputLength": output_length,
        "concurrency": key.concurrency,
        "requestRate": key.request_rate,
        "requests": len(metrics),
        "completed": len(ok),
        "errors": sum(errors.values()),
        "errorsByType": dict(sorted(errors.items())),
        "durationSeconds": window,
        "ttftMs": summarize((m.ttft for m in fresh if m.ttft is not None), 1000.0),
        "tpotMs": summarize((m.tpot for m in ok if m.tpot is not None), 1000.0),
        "itlMs": summarize((x for m in ok for x in m.itl), 1000.0),
        "e2eMs": summarize((m.e2e for m in fresh if m.e2e is not None), 1000.0),
        "prefixCacheHits": {
            "requests": len(hits),
            "cachedPromptTokens": sum(m.cached_prompt_tokens or 0 for m in hits),
            "ttftMs": summarize((m.ttft for m in hits if m.ttft is not None), 1000.0),
        },
        "scheduleLagMs": summarize((m.schedule_lag for m in metrics), 1000.0),
        # 1/TPOT: the decode speed one user sees (the x axis of throughput-vs-interactivity plots).
        "userTokensPerSecond": summarize(1.0 / m.tpot for m in ok if m.tpot),
    }
    rate = (lambda x: x / window) if window > 0 else (lambda x: 0.0)
    cell.update(
        {
            "inputTokensPerSecond": rate(in_tokens),
            "outputTokensPerSecond": rate(out_tokens),
            "totalTokensPerSecond": rate(in_tokens + out_tokens),
            "requestsPerSecond": rate(len(ok)),
            # Offered load is the schedule; achieved is what completed. Little's law gives the
            # mean number in flight, which for closed loop should equal the concurrency.
            "offeredRequestsPerSecond": key.request_rate,
            "achievedRequestsPerSecond": rate(len(ok)),
            # Open loop: the planned send span over the actual one (1.0: every request left on
            # schedule; 0.99: the client ran 1 % slow, so the offered rate was not quite offered).
            "deliveredFraction": (
                delivered_fraction([(m.start, m.start + m.schedule_lag) for m in metrics if m.sent])
                if key.request_rate is not None
                else None
            ),
            "meanInFlight": rate(sum((m.end - m.start) for m in metrics)),
            "inputTokensMean": (in_tokens / len(ok)) if ok else None,
            "outputTokens": {
                "server": sum(m.server_output_tokens or 0 for m in ok),
                "client": sum(m.client_output_tokens for m in ok),
                "requestsWithoutServerCount": sum(1 for m in ok if m.server_output_tokens is None),
                "requestsShort": sum(1 for m in ok if m.output_tokens < output_length),
            },
            "tokenCountSource": dict(Counter(m.token_source for m in ok)),
        }
    )
    if slo is not None:
        cell.update(slo_figures(metrics, slo, window))
    return cell


def slo_figures(metrics: Sequence[RequestMetrics], slo: Slo, window: float) -> dict:
    """Attainment (share of all requests, errors count as misses), per-bound attainment and
    goodput (the throughput of the requests that met every bound)."""
    if not metrics:
        return {"attainment": None}
    checks = [meets(m, slo) for m in metrics]
    good = [m for m, c in zip(metrics, checks, strict=True) if all(c.values())]
    per_bound = {name: sum(1 for c in checks if c.get(name)) / len(metrics) for name in checks[0]}
    return {
        "attainment": len(good) / len(metrics),
        "attainmentByBound": per_bound,
        "sloMet": len(good) / len(metrics) >= slo.attainment,
        "goodputRequestsPerSecond": len(good) / window if window > 0 else 0.0,
        "goodputOutputTokensPerSecond": (sum(m.output_tokens for m in good) / window) if window > 0 else 0.0,
    }
