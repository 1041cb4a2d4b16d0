"""A real engine on CPU: `transformers serve` with a tiny random-weight model, driven end to end.

transformers serve (transformers 5, extra `serving`) refuses unknown request fields (ignore_eos,
min_tokens): the client detects that and sends without them. It streams a token whose text is
held back (split UTF-8) as an empty chunk and ends without [DONE]; the server's usage count is
still exact, which is what TPOT uses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench_helpers import free_port

from accelbench.workers.bench.main import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None,
        reason="transformers serve needs `pip install 'transformers[serving]'`",
    ),
]


@contextlib.contextmanager
def transformers_serve(model_dir: str) -> Iterator[str]:
    port = free_port()
    exe = Path(sys.executable).with_name("transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [str(exe), "serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("transformers serve did not start") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_transformers_serve_end_to_end(tmp_path: Path, api: str) -> None:
    from accelbench.workers.testing import make_tiny_model

    model = str(make_tiny_model(tmp_path / "tiny"))
    out = tmp_path / "r.json"
    with transformers_serve(model) as url:
        args = ["--endpoint", url, "--health-path", "/health", "--tokenizer", model, "--api", api]
        args += ["--concurrency", "1,2", "--input-lengths", "16,64", "--output-length", "12"]
        args += ["--requests", "6", "--warmup", "1", "--no-capacity-search", "--out", str(out)]
        assert main(args, env={}) == 0
    full = json.loads(out.read_text())
    assert full["ignoreEos"] == {"requested": True, "sent": False}
    assert full["tokenizer"]["source"] == "local" and full["tokenizer"]["exact"]
    for cell in full["cells"]:
        assert cell["errors"] == 0 and cell["completed"] == 6
        assert cell["outputTokens"]["server"] > 0 and cell["tpotMs"]["p50"] > 0
        if api == "completions":  # exact input length, as the server counted it
            assert cell["inputTokensMean"] == cell["inputLength"]
        else:  # the chat template adds its tokens on the server side
            assert cell["inputTokensMean"] > cell["inputLength"]
