"""Open-loop sends spread over several processes (fanout.py): the same schedule and requests as one
process would send, against the real null server (its own processes, SO_REUSEPORT), and a dead
sending process fails the cell instead of hanging it."""

from __future__ import annotations

import asyncio
import random

import pytest

from accelbench.workers.bench.calibration import null_server
from accelbench.workers.bench.fanout import deal, processes_for, usable_cpus
from accelbench.workers.bench.prompts import ApproxTokenizer, PromptFactory
from accelbench.workers.bench.records import request_metrics
from accelbench.workers.bench.runner import Runner, RunSettings, poisson_schedule
from accelbench.workers.bench.stats import CellKey, aggregate_cell

pytestmark = pytest.mark.timeout(120)


def test_processes_follow_the_rate_up_to_the_limit() -> None:
    assert processes_for(10.0, 16) == 1
    assert processes_for(1000.0, 16) == 1
    assert processes_for(1001.0, 16) == 2
    assert processes_for(5000.0, 16) == 5
    assert processes_for(50_000.0, 16) == 16
    assert processes_for(5000.0, 1) == 1
    assert usable_cpus() >= 1


def test_dealt_shares_together_are_the_schedule() -> None:
    schedule = poisson_schedule(5000.0, 10_001, random.Random(3))
    shares = deal(schedule, 4)
    assert [len(s) for s in shares] == [2501, 2500, 2500, 2500]
    assert sorted(x for s in shares for x in s) == schedule
    # Each share is the schedule thinned: about a quarter of the rate, none of it bunched.
    for share in shares:
        assert (len(share) - 1) / (share[-1] - share[0]) == pytest.approx(1250.0, rel=0.05)


def _runner(url: str, processes: int, warmup: int = 2) -> Runner:
    settings = RunSettings(
        base_url=url, model="null", output_length=8, warmup_requests=warmup, max_processes=processes, seed=7
    )
    return Runner(settings, PromptFactory(ApproxTokenizer(), seed=7))


async def _cell(processes: int, rate: float, count: int) -> tuple[list, list[float]]:
    async with null_server(processes=2) as url:
        runner = _runner(url, processes)
        try:
            records = await runner.open_loop(16, rate, count)
        finally:
            runner.close()
    planned = poisson_schedule(rate, count, random.Random(7))
    return records, planned


def test_a_fanned_out_cell_sends_the_whole_schedule_from_two_processes() -> None:
    rate, count = 1500.0, 1500  # two processes (one per 1,000 req/s), one second of arrivals
    records, planned = asyncio.run(_cell(2, rate, count))
    assert len(records) == count
    assert all(r.ok for r in records), {r.error for r in records}
    start = records[0].scheduled
    offsets = [r.scheduled - start for r in records]
    assert offsets == pytest.approx(planned, abs=1e-9)  # the one schedule, every arrival, in order
    cell = aggregate_cell(CellKey(16, request_rate=rate), [request_metrics(r) for r in records], None, 8)
    assert cell["completed"] == count and cell["errors"] == 0
    # Loose: this 2-core machine runs the null server beside both senders.
    assert cell["deliveredFraction"] > 0.9, cell["deliveredFraction"]
    assert cell["outputTokens"]["server"] == 8 * count


def test_a_dead_sending_process_fails_the_cell_rather_than_hanging_it() -> None:
    async def go() -> None:
        async with null_server() as url:
            runner = _runner(url, 2, warmup=0)
            try:
                await runner.open_loop(16, 1500.0, 300)  # starts the children
                fleet = runner.fleet(2)
                fleet._procs[1].kill()
                fleet._procs[1].join(5)
                with pytest.raises(RuntimeError, match="load-generator process"):
                    await runner.open_loop(16, 1500.0, 300)
            finally:
                runner.close()

    asyncio.run(go())
