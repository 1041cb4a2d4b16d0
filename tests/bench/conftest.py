"""Fixtures of the bench-client suite (helpers in bench_helpers.py, imported by name)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from bench_helpers import StallWatch, scheduling_jitter_ms, serve


@pytest.fixture(scope="module")
def fake_server() -> Iterator[str]:
    """TTFT 50 ms, 10 ms between chunks, chunks of 1, 3, 2 tokens in turn."""
    with serve(["--ttft", "0.05", "--gap", "0.01", "--chunk-tokens", "1,3,2"]) as url:
        yield url


@pytest.fixture
def measure_jitter() -> Iterator[Callable[[], float]]:
    """The machine's scheduling jitter in ms (bench_helpers): call it after the workload; it measures
    again and returns the largest value seen since the test started, including the longest stall of
    the whole machine while the workload ran (StallWatch: a VM stall lands on a few requests, after
    which a probe sees a quiet machine again)."""
    seen = [scheduling_jitter_ms()]
    watch = [StallWatch()]

    def now() -> float:
        seen.append(watch[0].stop())
        watch[0] = StallWatch()
        seen.append(scheduling_jitter_ms())
        return max(seen)

    yield now
    watch[0].stop()
