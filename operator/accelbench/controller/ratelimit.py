"""Client-side rate limit of the operator's API requests (issue 17).

A token bucket like client-go's: `qps` tokens a second, at most `burst` saved. Every request takes
one, waiting when none is left, so a backlog (the operator started with thousands of resources, a
resync) is spread at `qps` instead of arriving at the apiserver at once, where API Priority and
Fairness would answer 429s. A 429 that comes back anyway carries Retry-After: every request then
waits that long (`pause`), not only the one refused.

Pure but for the clock and the sleep, both injectable (the unit tests drive a fake clock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAX_PAUSE_S = 30.0  # a Retry-After above this is capped: a pass requeues rather than hang


class TokenBucket:
    def __init__(
        self,
        qps: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"qps must be > 0 and burst >= 1 (got qps={qps}, burst={burst})")
        self.qps, self.burst = qps, burst
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._stamp = clock()
        self._paused_until = 0.0
        self.waited_s = 0.0  # total time requests waited here (exported as a metric)

    def _refill(self) -> float:
        """Add the tokens earned since the last call (lock held); the clock's now."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now
        return now

    def _reserve(self) -> float:
        """Take a token now (the balance may go negative); how long the caller must wait for it."""
        with self._lock:
            now = self._refill()
            self._tokens -= 1.0
            wait = max(-self._tokens / self.qps if self._tokens < 0 else 0.0, self._paused_until - now)
            self.waited_s += wait
            return wait

    def acquire(self) -> float:
        """Wait for a token; the seconds waited."""
        wait = self._reserve()
        if wait > 0:
            self._sleep(wait)
        return wait

    def try_acquire(self) -> bool:
        """Take a token if one is there now; never waits (for work that can be left to later)."""
        with self._lock:
            now = self._refill()
            if self._tokens < 1.0 or now < self._paused_until:
                return False
            self._tokens -= 1.0
            return True

    def pause(self, seconds: float) -> None:
        """The server asked for a pause (429 Retry-After): every request waits it out."""
        with self._lock:
            until = self._clock() + min(max(seconds, 0.0), MAX_PAUSE_S)
            self._paused_until = max(self._paused_until, until)


def retry_after_seconds(value: str | None, default: float = 1.0) -> float:
    """A Retry-After header's seconds (the apiserver sends an integer); `default` when absent or odd."""
    try:
        return max(0.0, float(value)) if value is not None else default
    except ValueError:
        return default
