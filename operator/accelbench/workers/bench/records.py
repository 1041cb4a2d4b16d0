"""One request's timeline and the per-request metrics derived from it (pure functions).

Definitions (docs/design.md, Measurement definitions):
- TTFT = first token event - *scheduled* send time. For open loop that charges the client's own
  lateness to the server's account on purpose: a user who arrives at t waits from t.
- E2E = end of the stream - scheduled send time.
- TPOT = (E2E - TTFT) / (n - 1), n = the server's completion_tokens (usage), the client's count
  only when the server gave none.
- ITL is per token: a chunk's gap from the previous chunk divided by the tokens it carried, once
  for each of those tokens. A 4-token chunk after 40 ms is four 10 ms ITLs, not one 40 ms ITL and
  not 40/1 (the multi-token-chunk inflation several load generators have). Tokens of the first
  chunk arrived with the TTFT and have no ITL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


class TokenSource:
    """How the tokens in each chunk were known."""

    EXACT = "exact"  # token_ids / logprobs in every chunk
    ONE_PER_CHUNK = "one_per_chunk"  # chunks == server's count: one token each
    ESTIMATED = "estimated"  # server's total spread over chunks by text weight
    CLIENT_ONLY = "client_only"  # no usage from the server: one token per chunk assumed


@dataclass
class RequestRecord:
    """Raw observations of one request (perf_counter seconds)."""

    scheduled: float
    sent: float = math.nan
    input_tokens: int | None = None  # what the client built the prompt to be
    chunk_times: list[float] = field(default_factory=list)  # token-carrying events only
    chunk_tokens: list[int | None] = field(default_factory=list)  # exact counts when the server gave them
    chunk_chars: list[int] = field(default_factory=list)
    end: float | None = None
    server_prompt_tokens: int | None = None
    server_output_tokens: int | None = None
    cached_prompt_tokens: int | None = None  # prompt tokens the server took from its prefix cache
    error: str | None = None
    warmup: bool = False
    # Raw (read time, SSE payload) pairs as the transport saw them, folded into the fields above by
    # client.settle() once the cell is over: no JSON is parsed while requests are in flight.
    events: list[tuple[float, bytes]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and bool(self.chunk_times)


def allocate(total: int, weights: Sequence[float]) -> list[int]:
    """Split `total` tokens over chunks: at least one each, the rest in proportion to `weights`
    (largest remainder, so the parts add up exactly)."""
    count = len(weights)
    if count == 0:
        return []
    if total <= count:
        return [1] * count
    rest = total - count
    weight_sum = sum(weights)
    shares = [rest * w / weight_sum for w in weights] if weight_sum > 0 else [rest / count] * count
    parts = [math.floor(s) for s in shares]
    short = rest - sum(parts)
    order = sorted(range(count), key=lambda i: shares[i] - parts[i], reverse=True)
    for i in order[:short]:
        parts[i] += 1
    return [1 + p for p in parts]


def resolve_chunk_tokens(
    hints: Sequence[int | None], server_total: int | None, weights: Sequence[float]
) -> tuple[list[int], str]:
    """Tokens per chunk, and how they were known (a TokenSource value)."""
    if hints and all(h is not None for h in hints):
        return [int(h or 0) for h in hints], TokenSource.EXACT
    if server_total is None:
        return [1] * len(hints), TokenSource.CLIENT_ONLY
    if server_total == len(hints):
        return [1] * len(hints), TokenSource.ONE_PER_CHUNK
    return allocate(server_total, weights), TokenSource.ESTIMATED


def per_token_itl(times: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """Per-token inter-token latencies (seconds): each chunk's gap over its tokens, per token."""
    itl: list[float] = []
    for i in range(1, len(times)):
        k = tokens[i]
        if k <= 0:
            continue
        itl.extend([(times[i] - times[i - 1]) / k] * k)
    return itl


def tpot(e2e: float, ttft: float, output_tokens: int) -> float | None:
    """Time per output token after the first; undefined for a single token."""
    if output_tokens < 2:
        return None
    return (e2e - ttft) / (output_tokens - 1)


@dataclass(frozen=True)
class RequestMetrics:
    ok: bool
    error: str | None
    ttft: float | None = None
    e2e: float | None = None
    tpot: float | None = None
    itl: tuple[float, ...] = ()
    output_tokens: int = 0  # the server's count when given
    client_output_tokens: int = 0  # what the client counted from the chunks
    server_output_tokens: int | None = None
    input_tokens: int | None = None  # the server's prompt count when given
    schedule_lag: float = 0.0
    sent: bool = True  # False: the request never left (no connection)
    cached_prompt_tokens: int | None = None
    token_source: str = TokenSource.CLIENT_ONLY
    start: float = 0.0  # scheduled
    end: float = 0.0


def request_metrics(record: RequestRecord) -> RequestMetrics:
    lag = 0.0 if math.isnan(record.sent) else max(record.sent - record.scheduled, 0.0)
    if not record.ok:
        error = record.error or ("no_tokens" if record.end is not None else "incomplete")
        return RequestMetrics(
            ok=False,
            error=error,
            schedule_lag=lag,
            sent=not math.isnan(record.sent),
            start=record.scheduled,
            end=record.end or record.scheduled,
            input_tokens=record.server_prompt_tokens or record.input_tokens,
        )
    assert record.end is not None
    counts, source = resolve_chunk_tokens(
        record.chunk_tokens, record.server_output_tokens, [max(c, 1) for c in record.chunk_chars]
    )
    client_tokens = sum(h if h is not None else 1 for h in record.chunk_tokens)
    n = record.server_output_tokens if record.server_output_tokens is not None else sum(counts)
    ttft = record.chunk_times[0] - record.scheduled
    e2e = record.end - record.scheduled
    return RequestMetrics(
        ok=True,
        error=None,
        ttft=ttft,
        e2e=e2e,
        tpot=tpot(e2e, ttft, n),
        itl=tuple(per_token_itl(record.chunk_times, counts)),
        output_tokens=n,
        client_output_tokens=client_tokens,
        server_output_tokens=record.server_output_tokens,
        input_tokens=record.server_prompt_tokens or record.input_tokens,
        schedule_lag=lag,
        cached_prompt_tokens=record.cached_prompt_tokens,
        token_source=source,
        start=record.scheduled,
        end=record.end,
    )
