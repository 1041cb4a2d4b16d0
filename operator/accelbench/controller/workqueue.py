"""A work queue of resource keys, the shape controllers built on client-go use, on asyncio.

- A key is queued at most once however many events name it (a burst of pod events is one pass).
- A key is handled by one worker at a time; a key added while it is being handled is handled
  again right after (nothing an event said is lost, and two passes never race on one resource).
- `add_after` wakes a key later (a grace period, the next progress read); only the earliest
  wake-up per key is kept, so a resource never piles up timers.
- `backoff` is the delay after a failed pass: 1 s doubling to 5 min, reset by `forget`.
- A key added with `first=True` (a run whose spec is not applied yet) is handed out before the
  other queued keys, FIRST_SHARE of every FIRST_SHARE + 1: while a thousand runs start, creating
  the children of the ones still waiting comes before recording the pods of the ones already going,
  yet those are never starved for the whole backlog (5,000 runs: minutes).

Everything runs on one event loop thread, so no locks are needed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 300.0
FIRST_SHARE = 4


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._first: deque[K] = deque()
        self._rest: deque[K] = deque()
        self._count = asyncio.Semaphore(0)  # one per queued key
        self._firsts_in_a_row = 0
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._again: set[K] = set()  # added while active: handle again when done
        self._again_first: set[K] = set()  # ... and ahead of the rest
        self._wakeups: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def scheduled(self) -> int:
        """Keys waiting on a timed wake-up (add_after)."""
        return len(self._wakeups)

    def add(self, key: K, first: bool = False) -> None:
        if key in self._active:
            self._again.add(key)
            if first:
                self._again_first.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            (self._first if first else self._rest).append(key)
            self._count.release()
        elif first and key not in self._first:
            self._rest.remove(key)  # rare (a spec edit of a queued run); O(queue) is fine
            self._first.append(key)

    def add_after(self, key: K, delay_s: float) -> None:
        """Add `key` in `delay_s` seconds, unless an earlier wake-up is already set."""
        if delay_s <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay_s
        earlier = self._wakeups.get(key)
        if earlier is not None:
            if earlier[0] <= when:
                return
            earlier[1].cancel()
        self._wakeups[key] = (when, loop.call_at(when, self._wake, key))

    def waiting(self, key: K, within_s: float) -> bool:
        """A timed wake-up is set for `key`, due within `within_s` seconds."""
        wakeup = self._wakeups.get(key)
        return wakeup is not None and wakeup[0] - asyncio.get_running_loop().time() <= within_s

    def _wake(self, key: K) -> None:
        self._wakeups.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        await self._count.acquire()
        if self._first and (self._firsts_in_a_row < FIRST_SHARE or not self._rest):
            key = self._first.popleft()
            self._firsts_in_a_row += 1
        else:
            key = self._rest.popleft()
            self._firsts_in_a_row = 0
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._again:
            self._again.discard(key)
            first = key in self._again_first
            self._again_first.discard(key)
            self.add(key, first)

    def backoff(self, key: K) -> float:
        """The delay before retrying `key` after one more failure."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        return min(BACKOFF_BASE_S * 2**failures, BACKOFF_MAX_S)

    def forget(self, key: K) -> None:
        """A pass succeeded: the next failure starts the backoff from the beginning."""
        self._failures.pop(key, None)

    def drop(self, key: K) -> None:
        """The resource is gone: no wake-up or backoff of it stays behind."""
        self._failures.pop(key, None)
        wakeup = self._wakeups.pop(key, None)
        if wakeup is not None:
            wakeup[1].cancel()
