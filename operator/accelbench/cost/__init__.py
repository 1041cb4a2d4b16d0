"""Cost, the one owner of every $ formula. Pure arithmetic, no clock, no I/O.

- A run: chips x hours x $/chip-hour. Hours run from when the Job (or, for a bench, its server)
  started to when it finished, or to `now` while it runs. The price is the plan's: catalog
  on-demand/spot, a ConfigMap override, or custom.
- Per token: $/hour / (tokens/s x 3600) x 1e6, for serving (output tokens at the SLO capacity or
  at peak) and for fine-tuning (trained tokens).

Workers report throughput only; the operator (status), `accelbench compare` and the HTML report
price it here, so every $ figure a user sees comes from the same formula and the same price.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from accelbench.api.status import BenchCell, BenchResults, Cost

SECONDS_PER_HOUR = 3600.0


def parse_time(value: str | None) -> datetime | None:
    """metav1.Time (RFC 3339, usually with a Z) as an aware datetime; None for missing or unparsable."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def elapsed_hours(start: str | None, end: str | None, now: datetime) -> float | None:
    """Hours from start to end (or now); None before the start is known. Clock skew never goes negative."""
    begin = parse_time(start)
    if begin is None:
        return None
    finish = parse_time(end) or now
    return max(0.0, (finish - begin).total_seconds()) / SECONDS_PER_HOUR


def earlier_segments_hours(previous: Mapping[str, Any], start: str | None, closed_at: datetime) -> float:
    """Hours of the run's segments before the current one. A suspend (Kueue preemption, spec.suspend)
    ends a segment, when the Job says it was suspended (`closed_at`); a resume starts one with a new
    Job startTime. Every segment is kept, so the cost sums them and never decreases."""
    cost = previous.get("cost") or {}
    earlier = float(cost.get("earlierHours") or 0.0)
    before, current = parse_time(previous.get("startTime")), parse_time(start)
    # Suspended now (no start), or started again later. An earlier start is the same segment seen
    # better (a server pod that started before the Job): no new segment.
    if before is None or (current is not None and current <= before):
        return earlier
    end = current if current is not None else closed_at  # a resume we saw without the suspend
    closed = max(0.0, (min(end, closed_at) - before).total_seconds()) / SECONDS_PER_HOUR
    return max(earlier + closed, float(cost.get("hours") or 0.0))


def compute_cost(
    *,
    chips: int,
    dollars_per_chip_hour: float | None,
    price_source: str,
    start: str | None,
    end: str | None,
    now: datetime,
    earlier_hours: float = 0.0,
    shown_hours: float = 0.0,
    shown_dollars: float = 0.0,
) -> Cost | None:
    """`shown_*`: what status already billed. A bill never goes down: a running run is billed to
    the minute it was seen in, and an end the watch delivered late can precede that minute. Both
    are floors, as the shown hours are rounded and dollars from them alone can round lower.
    No price (`dollars_per_chip_hour` None): the hours are counted, the dollars are None."""
    segment = elapsed_hours(start, end, now)
    if segment is None and not earlier_hours:
        return None
    hours = max(earlier_hours + (segment or 0.0), shown_hours)
    return Cost(
        dollars=None
        if dollars_per_chip_hour is None
        else max(round(chips * hours * dollars_per_chip_hour, 4), shown_dollars),
        chips=chips,
        hours=round(hours, 6),
        earlier_hours=round(earlier_hours, 6),
        dollars_per_chip_hour=dollars_per_chip_hour,
        price_source=price_source,
    )


def dollars_per_hour(chips: float, dollars_per_chip_hour: float | None) -> float | None:
    return None if dollars_per_chip_hour is None else chips * dollars_per_chip_hour


def dollars_per_million_tokens(hourly: float | None, tokens_per_second: float | None) -> float | None:
    """$/hour / tokens/hour * 1e6; None when nothing was produced (no finite price per token) or
    no price is known."""
    if hourly is None or not tokens_per_second or tokens_per_second <= 0:
        return None
    return hourly / (tokens_per_second * SECONDS_PER_HOUR) * 1e6


def capacity_cells(results: BenchResults) -> list[BenchCell]:
    if results.capacity_concurrency is None:
        return []
    return [c for c in results.cells if c.concurrency == results.capacity_concurrency]


def capacity_throughput(results: BenchResults) -> float | None:
    """Output tok/s at the SLO capacity: the slowest input length there, so the price holds for all."""
    rates = [c.output_tokens_per_second for c in capacity_cells(results) if c.output_tokens_per_second]
    return min(rates) if rates else None


def peak_throughput(results: BenchResults) -> float | None:
    if results.peak_output_tokens_per_second:
        return results.peak_output_tokens_per_second
    rates = [c.output_tokens_per_second for c in results.cells if c.output_tokens_per_second]
    return max(rates) if rates else None


def with_serving_cost(results: BenchResults, hourly: float | None) -> BenchResults:
    """The bench's results priced: $/1M output tokens at the SLO capacity (overall and per input
    length) and at peak.

    Always computed here, from the operator's price and the measured throughput: a figure a worker
    put in its report (older clients did) is replaced, so every status prices the same way.
    """
    at_capacity = dollars_per_million_tokens(hourly, capacity_throughput(results))
    at_peak = dollars_per_million_tokens(hourly, peak_throughput(results))
    by_length = [
        entry.model_copy(
            update={
                "dollars_per_million_tokens": _rounded(
                    dollars_per_million_tokens(hourly, entry.output_tokens_per_second)
                )
            }
        )
        for entry in results.capacity_by_input_length
    ]
    return results.model_copy(
        update={
            "dollars_per_million_tokens_at_capacity": _rounded(at_capacity),
            "dollars_per_million_tokens_at_peak": _rounded(at_peak),
            "capacity_by_input_length": by_length,
        }
    )


def _rounded(dollars: float | None) -> float | None:
    return None if dollars is None else round(dollars, 6)


def cost_by_input_length(
    cells: Sequence[Mapping[str, Any]], capacity: Mapping[str, Mapping[str, Any]], dollars_hour: float | None
) -> dict[str, dict[str, float | None]]:
    """$ per 1M output tokens per input length, at that length's SLO capacity and at its peak,
    from the full results' cells and capacity (as the bench client writes them)."""
    out: dict[str, dict[str, float | None]] = {}
    for length in sorted({int(c["inputLength"]) for c in cells}):
        rates = [c.get("outputTokensPerSecond") for c in cells if int(c["inputLength"]) == length]
        peak = max((r for r in rates if r), default=None)
        at_capacity = (capacity.get(str(length)) or {}).get("outputTokensPerSecondAtCapacity")
        out[str(length)] = {
            "dollarsPerMillionOutputTokensAtCapacity": dollars_per_million_tokens(dollars_hour, at_capacity),
            "dollarsPerMillionOutputTokensAtPeak": dollars_per_million_tokens(dollars_hour, peak),
            "peakOutputTokensPerSecond": peak,
        }
    return out
