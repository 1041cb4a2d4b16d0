"""Open-loop sends from several processes, for rates past what one event loop sends on time.

One client process keeps p99 send lag under 1 ms to about 1,600 req/s (benchmarks/client_overhead,
device host); past that its one thread is the bottleneck. So a cell's schedule is split: the parent
draws the one Poisson schedule and builds every request body (the very requests one process would
send), arrival k goes to process k mod P, and each child sends its share from its own event loop
over its own keep-alive connections. The P subsequences together are the original schedule, send
time for send time. Children start against one start time on CLOCK_MONOTONIC (time.perf_counter
on Linux: the same clock in every process of the host), after all of them have warmed their
connections, and return their records settled (the SSE parse is spread over the children too).

The children are spawned once per Runner and reused for every cell, so a sweep pays the start-up
once; `Fleet.close` ends them (they are daemons, so they also die with the parent).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from .client import settle
from .records import RequestRecord

if TYPE_CHECKING:
    from .runner import RunSettings

# The rate one process is asked to carry: below the ~1,600 req/s where one process last held p99
# lag < 1 ms, so a share never sits at one process's edge.
PER_PROCESS_RATE = 1000.0
# Between the last child reporting ready and the first send: time for the start message to reach
# every child (a pipe write and a wake-up each).
START_LEAD_S = 0.05


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota (a pod's
    limit: the mask of a container still lists every CPU of the node)."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count)


def processes_for(rate: float, limit: int, per_process: float = PER_PROCESS_RATE) -> int:
    """Sending processes for an open-loop rate: enough that each carries at most `per_process`,
    never more than `limit`."""
    return max(1, min(limit, math.ceil(rate / per_process)))


def deal(items: Sequence, parts: int) -> list[list]:
    """Item k to part k mod `parts`: each part a thinned copy of the schedule, evenly loaded."""
    return [list(items[i::parts]) for i in range(parts)]


@dataclass(frozen=True)
class Share:
    """One child's part of a cell: send offsets (s from the common start), bodies, prompt sizes."""

    offsets: list[float]
    bodies: list[bytes]
    input_tokens: list[int]
    warmup_bodies: list[bytes]


class Fleet:
    """P child processes, each with its own event loop and connections to the server."""

    def __init__(self, settings: RunSettings, processes: int, uvloop: bool) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a running event loop
        self.size = processes
        self._conns: list[Connection] = []
        self._procs = []
        for _ in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=child_main, args=(child, settings, uvloop), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    async def open_loop(self, shares: Sequence[Share]) -> list[RequestRecord]:
        """Run one cell: each share sent from its own child (the first len(shares) of them) against
        one start time."""
        assert 0 < len(shares) <= self.size
        conns = self._conns[: len(shares)]
        try:
            for conn, share in zip(conns, shares, strict=True):
                await asyncio.to_thread(conn.send, share)
            for conn in conns:
                await _expect(conn, "ready")
            start = time.perf_counter() + START_LEAD_S
            for conn in conns:
                conn.send(start)
        except OSError:  # a broken pipe: the child is gone
            raise RuntimeError("a load-generator process died") from None
        records: list[RequestRecord] = []
        for conn in conns:
            records.extend(await _expect(conn, list))
        records.sort(key=lambda r: r.scheduled)
        return records

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        for conn in self._conns:
            conn.close()


async def _expect(conn: Connection, what: object) -> object:
    """The child's next message; a child's failure or death is raised here, not waited on."""
    try:
        msg = await asyncio.to_thread(conn.recv)
    except EOFError:
        raise RuntimeError("a load-generator process died") from None
    if isinstance(msg, BaseException):
        raise RuntimeError(f"a load-generator process failed: {msg!r}") from msg
    if (isinstance(what, type) and not isinstance(msg, what)) or (isinstance(what, str) and msg != what):
        raise RuntimeError(f"a load-generator process answered {type(msg).__name__}, not {what}")
    return msg


def child_main(conn: Connection, settings: RunSettings, uvloop: bool) -> None:
    factory = None
    if uvloop:
        try:
            import uvloop as uv

            factory = uv.new_event_loop
        except ImportError:
            pass
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_serve(conn, settings))


async def _serve(conn: Connection, settings: RunSettings) -> None:
    from .runner import Sender, collector_paused, sleep_until

    async with Sender(settings, 0) as sender:
        while True:
            share = conn.recv()  # nothing is in flight between cells: blocking here costs nothing
            if share is None:
                return
            try:
                now = time.perf_counter()
                warm = [(b, RequestRecord(scheduled=now, warmup=True)) for b in share.warmup_bodies]
                await asyncio.gather(*(sender.send(body, record) for body, record in warm))
                conn.send("ready")
                start = conn.recv()
                records: list[RequestRecord] = []
                with collector_paused():
                    pending = []
                    sends = zip(share.offsets, share.bodies, share.input_tokens, strict=True)
                    for offset, body, tokens in sends:
                        when = start + offset
                        await sleep_until(when, settings.spin_s)
                        record = RequestRecord(scheduled=when, input_tokens=tokens)
                        records.append(record)
                        pending.append(sender.send_now(body, record))
                    await asyncio.gather(*pending)
                conn.send([settle(r) for r in records])
            except Exception as exc:  # reported to the parent, which fails the cell
                conn.send(RuntimeError(f"{type(exc).__name__}: {exc}"))  # picklable whatever it was
