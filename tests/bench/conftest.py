"""Fixtures: the calibrated fake server, run in its own process so its timing is not shared with
the client's event loop (one Python thread cannot serve and measure at the same time honestly)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def fake_server() -> Iterator[str]:
    """TTFT 50 ms, 10 ms between chunks, chunks of 1, 3, 2 tokens in turn."""
    with serve(["--ttft", "0.05", "--gap", "0.01", "--chunk-tokens", "1,3,2"]) as url:
        yield url
