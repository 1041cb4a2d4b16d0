"""The calibrated fake server, run in its own process so its timing is not shared with the client's
event loop (one Python thread cannot serve and measure at the same time honestly), and the
machine's scheduling jitter, which the timing tests scale their tolerances by."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(args: list[str], script: Path = HERE / "fakeserver.py", health: str = "/health") -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script), "--port", str(port), *args])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url + health, timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"fake server on {port} did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:  # a HANG request keeps aiohttp's graceful stop waiting
            proc.kill()
            proc.wait(5)


def scheduling_jitter_ms(probe_s: float = 0.1) -> float:
    """How long a runnable thread waits for a CPU on this machine right now, in ms: the longest
    stall of a busy loop that reads the clock for `probe_s` seconds (each stall is time another
    process held the CPU it needed).

    Timing tests add a couple of these to their tolerances, so a quiet machine is held to the
    tight bar (stalls ≈ 0.05 ms) and a loaded one gets the slack its scheduler actually takes,
    measured rather than guessed from the core count. (A sleeping thread's oversleep does not show
    contention: the scheduler favours wakers.) Benchmark-grade bars (p99 schedule lag < 1 ms, peer
    agreement within 1-2 %) live in benchmarks/client_overhead with committed results.
    """
    longest = 0.0
    start = last = time.perf_counter()
    while last - start < probe_s:
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
    return longest * 1000.0


# A process of its own sleeps 2 ms at a time and keeps its longest oversleep: a stall of the whole
# machine (a VM descheduled by its host, memory compaction) delays its wake-ups too. In another
# process so the client's own work (its GIL) never counts as a stall of the machine.
_WATCH = (
    "import sys, threading, time\n"
    "longest, stop = 0.0, threading.Event()\n"
    "threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()\n"
    "while not stop.is_set():\n"
    "    t = time.perf_counter(); time.sleep(0.002)\n"
    "    longest = max(longest, time.perf_counter() - t - 0.002)\n"
    "print(longest * 1000.0, flush=True)\n"
)


class StallWatch:
    """The longest machine stall, in ms, from start() to stop() (see _WATCH)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WATCH], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def stop(self) -> float:
        out, _ = self.process.communicate("", timeout=10)
        try:
            return float(out.strip() or 0.0)
        except ValueError:
            return 0.0


def bench_env(job: dict, url: str, termination_log: Path, **extra: str) -> dict[str, str]:
    """The env the rendered client pod gets: the job, the server, its health path, where to report."""
    import json

    return {
        "ACCELBENCH_JOB": json.dumps(job),
        "ACCELBENCH_ENDPOINT": url,
        "ACCELBENCH_HEALTH_PATH": "/health",
        "ACCELBENCH_READY_TIMEOUT_SECONDS": "30",
        "ACCELBENCH_TERMINATION_LOG": str(termination_log),
        **extra,
    }
