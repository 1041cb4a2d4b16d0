"""Cost: chips x hours x $/chip-hour, and serving $/1M output tokens. Pure arithmetic, no clock.

Hours run from when the Job (or, for a bench, its server) started to when it finished, or to `now`
while it runs. The price is the plan's: catalog on-demand/spot, a ConfigMap override, or custom.
"""

from __future__ import annotations

from datetime import UTC, datetime

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


def compute_cost(
    *,
    chips: int,
    dollars_per_chip_hour: float,
    price_source: str,
    start: str | None,
    end: str | None,
    now: datetime,
) -> Cost | None:
    hours = elapsed_hours(start, end, now)
    if hours is None:
        return None
    return Cost(
        dollars=round(chips * hours * dollars_per_chip_hour, 4),
        chips=chips,
        hours=round(hours, 6),
        dollars_per_chip_hour=dollars_per_chip_hour,
        price_source=price_source,
    )


def dollars_per_million_tokens(
    dollars_per_hour: float, output_tokens_per_second: float | None
) -> float | None:
    """$/hour / tokens/hour * 1e6; None when nothing was produced (no finite price per token)."""
    if not output_tokens_per_second or output_tokens_per_second <= 0:
        return None
    return dollars_per_hour / (output_tokens_per_second * SECONDS_PER_HOUR) * 1e6


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


def with_serving_cost(results: BenchResults, dollars_per_hour: float) -> BenchResults:
    """Fill the $/1M token fields the worker left empty (it does not know the price book)."""
    update: dict[str, float | None] = {}
    if results.dollars_per_million_tokens_at_capacity is None:
        value = dollars_per_million_tokens(dollars_per_hour, capacity_throughput(results))
        if value is not None:
            update["dollars_per_million_tokens_at_capacity"] = round(value, 6)
    if results.dollars_per_million_tokens_at_peak is None:
        value = dollars_per_million_tokens(dollars_per_hour, peak_throughput(results))
        if value is not None:
            update["dollars_per_million_tokens_at_peak"] = round(value, 6)
    return results.model_copy(update=update) if update else results
