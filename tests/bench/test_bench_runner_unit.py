"""Pure parts of the drivers: the Poisson schedule and the collector pause around a cell."""

from __future__ import annotations

import gc
import itertools
import random
import statistics

import pytest

from accelbench.workers.bench.runner import collector_paused, poisson_schedule


def test_poisson_schedule_starts_at_zero_and_has_the_rate() -> None:
    offsets = poisson_schedule(200.0, 20_000, random.Random(1))
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert offsets[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1 / 200.0, rel=0.03)
    assert statistics.pstdev(gaps) == pytest.approx(1 / 200.0, rel=0.05)  # exponential: sd = mean


def test_collector_paused_inside_a_cell_and_restored_after() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a failing cell still gives the collector back")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
