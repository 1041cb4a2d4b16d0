"""The loop's work queue: one pass per burst, never two at once per key, the earliest wake-up wins."""

from __future__ import annotations

import asyncio

from accelbench.controller.workqueue import BACKOFF_MAX_S, FIRST_SHARE, WorkQueue


def test_a_burst_of_events_is_one_pass_and_an_event_during_a_pass_is_another() -> None:
    async def scenario() -> list[str]:
        queue: WorkQueue[str] = WorkQueue()
        for _ in range(5):
            queue.add("a")
        queue.add("b")
        assert len(queue) == 2
        key = await queue.get()
        assert key == "a"
        queue.add("a")  # an event while "a" is being handled
        assert len(queue) == 1  # not queued twice: it waits for the pass to end
        queue.done("a")
        order = [await queue.get(), await queue.get()]
        return order

    assert asyncio.run(scenario()) == ["b", "a"]


def test_a_run_to_apply_goes_ahead_of_the_queued_observations() -> None:
    async def scenario() -> list[str]:
        queue: WorkQueue[str] = WorkQueue()
        for key in ("seen-1", "seen-2", "new-1", "seen-3"):
            queue.add(key, first=key.startswith("new"))
        queue.add("seen-2", first=True)  # its spec was edited while it waited: moved ahead
        queue.add("new-1")  # a later plain event keeps it ahead
        active = await queue.get()
        assert active == "new-1"
        queue.add("new-1", first=True)  # an edit during its pass: next pass ahead too
        queue.done("new-1")
        return [active] + [await queue.get() for _ in range(len(queue))]

    assert asyncio.run(scenario()) == ["new-1", "seen-2", "new-1", "seen-1", "seen-3"]


def test_runs_to_apply_never_starve_the_observations_for_the_whole_backlog() -> None:
    async def scenario() -> list[str]:
        queue: WorkQueue[str] = WorkQueue()
        queue.add("seen")
        for i in range(10):
            queue.add(f"new-{i}", first=True)
        return [await queue.get() for _ in range(11)]

    order = asyncio.run(scenario())
    assert order.index("seen") == FIRST_SHARE  # after FIRST_SHARE runs to apply, one observation
    assert [k for k in order if k != "seen"] == [f"new-{i}" for i in range(10)]


def test_only_the_earliest_wake_up_is_kept() -> None:
    async def scenario() -> tuple[float, int]:
        queue: WorkQueue[str] = WorkQueue()
        loop = asyncio.get_running_loop()
        start = loop.time()
        queue.add_after("a", 5.0)
        queue.add_after("a", 0.05)  # earlier: replaces
        queue.add_after("a", 3.0)  # later: ignored
        await queue.get()
        waited = loop.time() - start
        queue.done("a")
        await asyncio.sleep(0.1)
        return waited, len(queue)

    waited, left = asyncio.run(scenario())
    assert waited < 1.0 and left == 0


def test_the_resync_leaves_out_what_a_timer_will_pass_before_the_next_resync() -> None:
    """Issue 17: 1,000 Running runs each got a resync pass beside their own timed one."""
    from accelbench.controller.loop import RESYNC_S, Controller

    async def scenario() -> list[str]:
        controller = Controller.__new__(Controller)  # the queue and the key list only
        controller.queue = WorkQueue()
        controller.known = lambda: ["running", "ttl-tomorrow", "idle"]  # type: ignore[method-assign]
        controller.queue.add_after("running", RESYNC_S / 2)  # its periodic pass comes first
        controller.queue.add_after("ttl-tomorrow", 86_400.0)  # too far off to stand for the resync
        return controller.resync_keys()

    assert asyncio.run(scenario()) == ["ttl-tomorrow", "idle"]


def test_backoff_doubles_to_a_cap_and_resets() -> None:
    queue: WorkQueue[str] = WorkQueue()
    delays = [queue.backoff("a") for _ in range(12)]
    assert delays[:3] == [1.0, 2.0, 4.0] and delays[-1] == BACKOFF_MAX_S
    queue.forget("a")
    assert queue.backoff("a") == 1.0


def test_periodic_passes_of_a_large_fleet_are_spread_and_retries_never_are() -> None:
    from accelbench.controller.loop import PERIODIC_MAX_S, PERIODIC_PASSES_PER_S, spread
    from accelbench.controller.reconciler import RUNNING_PASS_S

    assert spread(RUNNING_PASS_S, scheduled=10) == RUNNING_PASS_S  # a small fleet keeps its pace
    assert spread(RUNNING_PASS_S, scheduled=1000) == 1000 / PERIODIC_PASSES_PER_S
    assert spread(RUNNING_PASS_S, scheduled=100_000) == PERIODIC_MAX_S  # a running cost lags at most this
    assert spread(0.5, scheduled=100_000) == 0.5  # a conflict retry, the look after an apply
    assert spread(300.0, scheduled=10) == 300.0  # a TTL far off is not brought closer
