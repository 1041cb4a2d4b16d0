"""The operator's client-side rate limit (controller/ratelimit.py), on a fake clock."""

from __future__ import annotations

import pytest

from accelbench.controller.ratelimit import MAX_PAUSE_S, TokenBucket, retry_after_seconds
from accelbench.controller.state import DEFAULT_API_BURST, DEFAULT_API_QPS, api_limiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_burst_passes_at_once_then_requests_are_spread_at_qps() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=10, burst=5, clock=clock, sleep=clock.sleep)
    waits = [bucket.acquire() for _ in range(25)]
    assert waits[:5] == [0.0] * 5
    assert all(w == pytest.approx(0.1) for w in waits[5:])  # one every 1/qps after the burst
    assert clock.now - 100.0 == pytest.approx(2.0)  # 20 beyond the burst at 10/s
    assert bucket.waited_s == pytest.approx(2.0)


def test_idle_time_refills_the_bucket_up_to_the_burst_only() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=10, burst=5, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        bucket.acquire()
    clock.now += 60  # a minute idle saves 600 tokens' worth, but only 5 are kept
    assert [bucket.acquire() for _ in range(6)] == [0.0] * 5 + [pytest.approx(0.1)]


def test_try_acquire_takes_a_token_only_when_one_is_there_and_never_waits() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=2, burst=3, clock=clock, sleep=clock.sleep)
    assert [bucket.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert clock.slept == [] and bucket.waited_s == 0.0
    clock.now += 0.4  # 0.8 of a token
    assert not bucket.try_acquire()
    clock.now += 0.1
    assert bucket.try_acquire() and not bucket.try_acquire()
    bucket.pause(5)
    clock.now += 3  # tokens again, but the server asked for a pause
    assert not bucket.try_acquire()


def test_a_429_pauses_every_request_for_its_retry_after_capped() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=100, burst=100, clock=clock, sleep=clock.sleep)
    bucket.pause(3)
    assert bucket.acquire() == pytest.approx(3.0)
    assert bucket.acquire() == 0.0  # the pause is over for the next one
    bucket.pause(3600)
    assert bucket.acquire() == pytest.approx(MAX_PAUSE_S)


def test_retry_after_is_read_leniently() -> None:
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds(None) == 1.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 1.0
    assert retry_after_seconds("-5") == 0.0


def test_the_limit_comes_from_the_chart_env_and_refuses_nonsense() -> None:
    default = api_limiter({})
    assert (default.qps, default.burst) == (DEFAULT_API_QPS, DEFAULT_API_BURST)
    chosen = api_limiter({"ACCELBENCH_API_QPS": "20", "ACCELBENCH_API_BURST": "30"})
    assert (chosen.qps, chosen.burst) == (20.0, 30)
    with pytest.raises(ValueError, match="ACCELBENCH_API_QPS='0'"):
        api_limiter({"ACCELBENCH_API_QPS": "0"})
    with pytest.raises(ValueError, match="ACCELBENCH_API_BURST='many'"):
        api_limiter({"ACCELBENCH_API_BURST": "many"})
