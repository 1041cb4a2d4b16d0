"""Closed-loop and open-loop drivers: who sends what when.

Closed loop: N workers, each sending its next request as soon as its previous one ended. There is
no semaphore in front of the server: the pool holds exactly N connections, so what the server
queues shows up in its latencies and nothing waits inside the client.

Open loop: Poisson arrivals at a rate. Send times are drawn up front; each request is started at
its scheduled time whatever is still in flight (unbounded pool), and TTFT/E2E count from the
scheduled time, so a late client shows up as latency and as schedule lag, never as a quietly
lower offered load.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import random
import time
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field

import aiohttp

from .client import make_session, settle, stream_request
from .fanout import Fleet, Share, deal, processes_for
from .openai import chat_body, completions_body
from .prompts import Prompt, PromptFactory
from .rawhttp import RawSession
from .records import RequestRecord

# asyncio sleeps through epoll, whose timeout has 1 ms granularity and rounds up: a send would be
# up to ~1 ms late. The dispatcher sleeps until SPIN_SECONDS before the send time and yields in a
# tight loop for the rest. 2 ms costs little CPU at the rates where it matters.
SPIN_SECONDS = 0.002


def poisson_schedule(rate: float, count: int, rng: random.Random) -> list[float]:
    """Send offsets (s) of `count` Poisson arrivals at `rate`/s, the first at 0."""
    offsets = [0.0]
    for _ in range(count - 1):
        offsets.append(offsets[-1] + rng.expovariate(rate))
    return offsets[:count]


async def sleep_until(when: float, spin: float = SPIN_SECONDS) -> None:
    clock = time.perf_counter
    delay = when - clock()
    if delay > spin:
        await asyncio.sleep(delay - spin)
    while clock() < when:
        await asyncio.sleep(0)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No garbage-collector pass inside a measured cell.

    A full collection walks every tracked object (the cell's records and event lists among them)
    and stops the one thread that sends and reads everything: milliseconds of schedule lag at high
    rates. Reference counting still frees almost everything at once; the few reference cycles a
    cell makes wait for the collection after it (measured: none for refused connections, under one
    object per timed-out request)."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.collect()


@dataclass
class RunSettings:
    base_url: str
    model: str
    api: str = "completions"  # or chat
    output_length: int = 128
    ignore_eos: bool = True
    request_timeout_s: float = 600.0
    extra_body: dict = field(default_factory=dict)
    warmup_requests: int = 4
    seed: int = 0
    spin_s: float = SPIN_SECONDS
    transport: str = "raw"  # raw (rawhttp.py, the default: lower overhead) or aiohttp
    # Open loop: the most processes a cell's sends are spread over (fanout.py); 1 sends from here.
    max_processes: int = 1
    uvloop: bool = False  # the sending children's event loop (the parent's is chosen by main)

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + self.path

    def body(self, prompt: Prompt) -> bytes:
        build = chat_body if self.api == "chat" else completions_body
        payload = build(self.model, prompt.text, self.output_length, self.ignore_eos, **self.extra_body)
        return json.dumps(payload, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Request:
    body: bytes
    input_tokens: int


class Sender:
    """One cell's connections and the call that sends a request over them."""

    def __init__(self, settings: RunSettings, pool_size: int) -> None:
        self.settings = settings
        if settings.transport == "aiohttp":
            self.session: RawSession | aiohttp.ClientSession = make_session(pool_size)
        else:
            self.session = RawSession(settings.base_url)

    async def __aenter__(self) -> Sender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    async def send(self, body: bytes, record: RequestRecord) -> None:
        s = self.settings
        if isinstance(self.session, RawSession):
            await self.session.stream(s.path, body, record, s.request_timeout_s)
        else:
            await stream_request(self.session, s.url, body, record, s.request_timeout_s)

    def send_now(self, body: bytes, record: RequestRecord) -> Awaitable[None]:
        """Start a request in this turn of the event loop (raw transport on an idle connection:
        written before this returns); await the result to have it finished."""
        s = self.settings
        if isinstance(self.session, RawSession):
            return self.session.send_now(s.path, body, record, s.request_timeout_s)
        return asyncio.ensure_future(stream_request(self.session, s.url, body, record, s.request_timeout_s))


class Runner:
    def __init__(self, settings: RunSettings, prompts: PromptFactory) -> None:
        self.settings = settings
        self.prompts = prompts
        self._rng = random.Random(settings.seed)
        self._fleet: Fleet | None = None

    def close(self) -> None:
        """End the sending children, if any were started."""
        if self._fleet is not None:
            self._fleet.close()
            self._fleet = None

    def fleet(self, size: int) -> Fleet:
        """Children for a fanned-out cell, started once and reused; grown when a cell needs more."""
        if self._fleet is None or self._fleet.size < size:
            self.close()
            self._fleet = Fleet(self.settings, size, self.settings.uvloop)
        return self._fleet

    async def requests(self, input_length: int, count: int) -> list[Request]:
        """Prompts are built before a cell starts: tokenizing is not part of any timing."""
        out = []
        for _ in range(count):
            prompt = await self.prompts.build(input_length)
            out.append(Request(self.settings.body(prompt), prompt.tokens))
        return out

    async def warm_up(self, sender: Sender, input_length: int, parallel: int) -> None:
        """Warm-up requests (excluded): connections opened, the engine's shapes compiled."""
        if self.settings.warmup_requests <= 0:
            return
        reqs = await self.requests(input_length, self.settings.warmup_requests)
        await self._closed(sender, reqs, max(1, min(parallel, len(reqs))), None)

    async def closed_loop(
        self, input_length: int, concurrency: int, count: int, seconds: float | None = None
    ) -> list[RequestRecord]:
        reqs = await self.requests(input_length, count)
        async with Sender(self.settings, concurrency) as sender:
            await self.warm_up(sender, input_length, concurrency)
            with collector_paused():
                deadline = None if seconds is None else time.perf_counter() + seconds
                records = await self._closed(sender, reqs, concurrency, deadline)
        return [settle(r) for r in records]

    async def _closed(
        self, sender: Sender, reqs: Sequence[Request], concurrency: int, deadline: float | None
    ) -> list[RequestRecord]:
        records: list[RequestRecord] = []
        pending = iter(reqs)
        clock = time.perf_counter

        async def worker() -> None:
            for req in pending:
                now = clock()
                if deadline is not None and now >= deadline:
                    return
                record = RequestRecord(scheduled=now, input_tokens=req.input_tokens)
                records.append(record)
                await sender.send(req.body, record)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return records

    async def open_loop(self, input_length: int, rate: float, count: int) -> list[RequestRecord]:
        reqs = await self.requests(input_length, count)
        schedule = poisson_schedule(rate, count, self._rng)
        settings = self.settings
        processes = processes_for(rate, settings.max_processes)
        if processes > 1:
            return await self._fanned_out(input_length, schedule, reqs, processes)
        records: list[RequestRecord] = []
        async with Sender(settings, 0) as sender:
            await self.warm_up(sender, input_length, settings.warmup_requests)
            with collector_paused():
                pending = []
                start = time.perf_counter() + 0.01
                for offset, req in zip(schedule, reqs, strict=True):
                    when = start + offset
                    await sleep_until(when, settings.spin_s)
                    record = RequestRecord(scheduled=when, input_tokens=req.input_tokens)
                    records.append(record)
                    pending.append(sender.send_now(req.body, record))
                await asyncio.gather(*pending)
        return [settle(r) for r in records]

    async def _fanned_out(
        self, input_length: int, schedule: Sequence[float], reqs: Sequence[Request], processes: int
    ) -> list[RequestRecord]:
        """The same schedule and requests, sent by `processes` children (fanout.py). Each child warms
        its own connections first, with prompts of its own (a measured prompt sent early would be a
        prefix-cache hit)."""
        per_child = -(-self.settings.warmup_requests // processes)  # ceil; 0 stays 0
        warmup = [r.body for r in await self.requests(input_length, per_child * processes)]
        shares = [
            Share(
                offsets=list(offsets),
                bodies=[r.body for r in part],
                input_tokens=[r.input_tokens for r in part],
                warmup_bodies=warm,
            )
            for offsets, part, warm in zip(
                deal(schedule, processes), deal(reqs, processes), deal(warmup, processes), strict=True
            )
        ]
        return await self.fleet(processes).open_loop(shares)
