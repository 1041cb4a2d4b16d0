"""Cost math, checked against numbers worked out by hand."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from accelbench.api.status import BenchCell, BenchResults, InputLengthCapacity
from accelbench.cost import (
    capacity_throughput,
    compute_cost,
    dollars_per_million_tokens,
    elapsed_hours,
    parse_time,
    with_serving_cost,
)

NOW = datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)


def test_finished_job_cost() -> None:
    # 1 h 30 min on 8 chips at $4.20/chip-hour: 8 x 1.5 x 4.20 = $50.40
    cost = compute_cost(
        chips=8,
        dollars_per_chip_hour=4.20,
        price_source="catalog: tpu-v5p on-demand (2026-04-01)",
        start="2026-05-04T10:00:00Z",
        end="2026-05-04T11:30:00Z",
        now=NOW,
    )
    assert cost is not None
    assert cost.hours == pytest.approx(1.5)
    assert cost.dollars == pytest.approx(50.40)
    assert cost.price_source.startswith("catalog")
    assert cost.to_wire()["dollarsPerChipHour"] == 4.20


def test_running_job_is_costed_to_now() -> None:
    # started 10:15, now 12:00 -> 1.75 h x 2 chips x $11.06 = $38.71
    cost = compute_cost(
        chips=2,
        dollars_per_chip_hour=11.06,
        price_source="custom",
        start="2026-05-04T10:15:00Z",
        end=None,
        now=NOW,
    )
    assert cost is not None
    assert cost.dollars == pytest.approx(38.71)


def test_not_started_has_no_cost_and_skew_never_goes_negative() -> None:
    assert (
        compute_cost(chips=1, dollars_per_chip_hour=1, price_source="x", start=None, end=None, now=NOW)
        is None
    )
    assert elapsed_hours("2026-05-04T12:00:10Z", None, NOW) == 0.0


def test_parse_time_accepts_z_and_offsets_and_rejects_garbage() -> None:
    assert parse_time("2026-05-04T10:00:00Z") == datetime(2026, 5, 4, 10, tzinfo=UTC)
    assert parse_time("2026-05-04T12:00:00+02:00") == datetime(2026, 5, 4, 10, tzinfo=UTC)
    assert parse_time("yesterday") is None
    assert parse_time(None) is None


def test_dollars_per_million_tokens() -> None:
    # $22.12/h at 1000 tok/s: 22.12 / 3.6e6 x 1e6 = $6.1444...
    assert dollars_per_million_tokens(22.12, 1000.0) == pytest.approx(6.144444, rel=1e-6)
    # $3.60/h at 1 tok/s: 3.6 / 3600 x 1e6 = $1000
    assert dollars_per_million_tokens(3.60, 1.0) == pytest.approx(1000.0)
    assert dollars_per_million_tokens(10.0, 0.0) is None
    assert dollars_per_million_tokens(10.0, None) is None


def _bench(**extra: object) -> BenchResults:
    return BenchResults(
        cells=[
            BenchCell(input_length=512, concurrency=8, output_tokens_per_second=720.0),
            BenchCell(input_length=4096, concurrency=8, output_tokens_per_second=540.0),
            BenchCell(input_length=512, concurrency=32, output_tokens_per_second=1800.0),
        ],
        capacity_concurrency=8,
        **extra,  # type: ignore[arg-type]
    )


def test_serving_cost_at_capacity_uses_slowest_input_length_and_peak_uses_the_best() -> None:
    results = _bench()
    assert capacity_throughput(results) == 540.0
    # 2 x H100 at $11.06 = $22.12/h; capacity: 22.12 / (540 x 3600) x 1e6 = 11.378601
    # peak: 22.12 / (1800 x 3600) x 1e6 = 3.413580
    filled = with_serving_cost(results, 22.12)
    assert filled.dollars_per_million_tokens_at_capacity == pytest.approx(11.378601, abs=1e-6)
    assert filled.dollars_per_million_tokens_at_peak == pytest.approx(3.413580, abs=1e-6)


def test_serving_cost_replaces_a_figure_a_worker_wrote() -> None:
    """One owner per formula: the operator's price and formula win over a (older) worker's figure."""
    priced = with_serving_cost(_bench(), 22.12)
    results = _bench(dollars_per_million_tokens_at_capacity=1.0)
    assert with_serving_cost(results, 22.12) == priced
    assert priced.dollars_per_million_tokens_at_capacity != 1.0


def test_serving_cost_without_capacity_leaves_capacity_empty() -> None:
    results = BenchResults(cells=[BenchCell(input_length=512, concurrency=1, output_tokens_per_second=100.0)])
    filled = with_serving_cost(results, 3.6)
    assert filled.dollars_per_million_tokens_at_capacity is None
    assert filled.dollars_per_million_tokens_at_peak == pytest.approx(10.0)


def test_each_input_lengths_capacity_is_priced_at_its_own_throughput() -> None:
    """The study's question, "how many long-prompt users does each setup carry, at what cost", is
    answered per input length: a short prompt's capacity and price are not the long one's."""
    results = _bench(
        capacity_by_input_length=[
            InputLengthCapacity(input_length=512, capacity_concurrency=32, output_tokens_per_second=1800.0),
            InputLengthCapacity(input_length=4096, capacity_concurrency=8, output_tokens_per_second=540.0),
            InputLengthCapacity(input_length=16384, capacity_concurrency=None, first_failing_concurrency=1),
        ]
    )
    priced = with_serving_cost(results, 22.12).capacity_by_input_length
    # 22.12 / (1800 x 3600) x 1e6 = 3.413580; 22.12 / (540 x 3600) x 1e6 = 11.378601
    assert [p.dollars_per_million_tokens for p in priced] == [
        pytest.approx(3.413580, abs=1e-6),
        pytest.approx(11.378601, abs=1e-6),
        None,  # no level met the SLO: no price, never $0
    ]
    assert [p.capacity_concurrency for p in priced] == [32, 8, None]


def test_an_unpriced_accelerator_counts_hours_but_never_shows_dollars() -> None:
    """No price known (Gaudi 3 in the catalog): the hours are real, the dollars are unavailable, not $0,
    and nothing priced per token is made up from them."""
    cost = compute_cost(
        chips=8,
        dollars_per_chip_hour=None,
        price_source="catalog gaudi3 on-demand, Unpriced",
        start="2026-05-04T10:00:00Z",
        end="2026-05-04T11:00:00Z",
        now=NOW,
    )
    assert cost is not None and cost.hours == pytest.approx(1.0) and cost.dollars is None
    wire = cost.to_wire()
    assert "dollars" not in wire and "dollarsPerChipHour" not in wire and wire["chips"] == 8
    assert dollars_per_million_tokens(None, 1000.0) is None
    filled = with_serving_cost(_bench(), None)
    assert filled.dollars_per_million_tokens_at_capacity is None
    assert filled.dollars_per_million_tokens_at_peak is None
