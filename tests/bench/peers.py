"""Run a peer load generator (AIPerf) and accelbench's client against the same server and settings,
and return both tools' median TTFT and output throughput.

AIPerf is not a dependency of accelbench: point ACCELBENCH_PEER_AIPERF at its executable (a separate
venv: `python -m venv /tmp/peer-aiperf && /tmp/peer-aiperf/bin/pip install aiperf`). It needs a
tokenizer directory for its synthetic prompts; `--use-server-token-count` makes it count output
tokens from the server's usage like accelbench does (its default re-tokenizes the streamed text
with the client's tokenizer, which differs from the server's when they are not the same model).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from accelbench.workers.bench.main import main as bench_main


@dataclass(frozen=True)
class Figures:
    ttft_p50_ms: float
    output_tokens_per_second: float
    wall_seconds: float | None = None


@dataclass(frozen=True)
class Settings:
    url: str
    model_dir: str
    concurrency: int = 4
    requests: int = 40
    input_length: int = 128
    output_length: int = 30
    warmup: int = 4
    api: str = "completions"
    rate: float | None = None  # open loop when set


def run_accelbench(s: Settings, extra: list[str] | None = None) -> Figures:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        load = ["--rates", str(s.rate)] if s.rate else ["--concurrency", str(s.concurrency)]
        rc = bench_main(
            [
                "--endpoint", s.url, "--health-path", "/v1/models", "--tokenizer", s.model_dir,
                *load, "--input-lengths", str(s.input_length), "--output-length", str(s.output_length),
                "--requests", str(s.requests), "--warmup", str(s.warmup), "--api", s.api,
                "--no-capacity-search", "--out", str(out), *(extra or []),
            ],
            env={},
        )  # fmt: skip
        assert rc == 0
        cell = json.loads(out.read_text())["cells"][0]
    return Figures(cell["ttftMs"]["p50"], cell["outputTokensPerSecond"], cell["durationSeconds"])


def run_aiperf(executable: str, s: Settings, model: str) -> Figures:
    with tempfile.TemporaryDirectory() as tmp:
        load = ["--request-rate", str(s.rate)] if s.rate else ["--concurrency", str(s.concurrency)]
        subprocess.run(
            [
                executable, "profile", "--model", model, "--url", s.url,
                "--endpoint-type", "chat" if s.api == "chat" else "completions", "--streaming",
                "--tokenizer", s.model_dir, "--use-server-token-count", *load,
                "--request-count", str(s.requests), "--isl", str(s.input_length), "--isl-stddev", "0",
                "--osl", str(s.output_length), "--osl-stddev", "0",
                "--warmup-request-count", str(s.warmup), "--artifact-dir", tmp, "--ui-type", "none",
            ],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
        data = json.loads((Path(tmp) / "profile_export_aiperf.json").read_text())
    duration = data.get("benchmark_duration", {}).get("avg")
    return Figures(data["time_to_first_token"]["p50"], data["output_token_throughput"]["avg"], duration)


def run_guidellm(executable: str, s: Settings) -> Figures:
    """GuideLLM 0.8 (`guidellm run`, its kind=... options); completions API, closed loop only.

    It sends the prompt as token ids, which the OpenAI completions API allows. Figures: median
    TTFT of successful requests, and its mean output tokens/s over the run.
    """
    if s.rate or s.api != "completions":
        raise ValueError("this GuideLLM wrapper drives closed-loop completions only")
    data = f"kind=synthetic_text,prompt_tokens={s.input_length},output_tokens={s.output_length}"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "guidellm.json"
        subprocess.run(
            [
                executable, "run",
                "--backend", f"kind=openai_http,target={s.url}",
                "--profile", f"kind=concurrent,streams={s.concurrency}",
                "--constraint", f"kind=max_requests,count={s.requests}",
                "--data", data,
                "--tokenizer", f"kind=hf_auto,model={s.model_dir}",
                "--output", f"kind=json,path={out}", "--disable-console",
            ],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
        metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    ttft = metrics["time_to_first_token_ms"]["successful"]["percentiles"]["p50"]
    return Figures(ttft, metrics["output_tokens_per_second"]["successful"]["mean"])


def relative_gap(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)
