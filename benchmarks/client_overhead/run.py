"""Client overhead: the highest open-loop request rate one client process sustains against a
zero-latency streaming server with p99 schedule lag under 1 ms, and the streamed tokens/s that is.

Same run, same server process (zero_server.py, started here in its own process), same settings for
every tool: Poisson arrivals, OUTPUT_TOKENS one-token chunks per answer, short prompts. A rate is
sustained when p99 schedule lag < 1 ms, achieved request rate >= 90 % of offered, and no errors.

Schedule lag: accelbench records it per request (actual send - scheduled send). AIPerf: from its
per-request export, request_start_ns - credit_issued_ns (credit = its timing manager's send order).

    .venv/bin/python benchmarks/client_overhead/run.py --aiperf /tmp/peer-aiperf/bin/aiperf \
        --tokenizer /tmp/tiny-llama --out benchmarks/client_overhead/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
OUTPUT_TOKENS = 64
SECONDS_PER_RATE = 4.0
RATES = (100, 400, 800, 1600, 3200, 6400)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelbench(url: str, rate: float, count: int, transport: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [
            sys.executable, "-m", "accelbench.workers.bench", "--endpoint", url, "--health-path", "/health",
            "--no-server-tokenizer", "--rates", str(rate), "--requests", str(count),
            "--input-lengths", "32", "--output-length", str(OUTPUT_TOKENS), "--warmup", "8",
            "--no-capacity-search", "--transport", transport, "--out", str(out),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        cell = json.loads(out.read_text())["cells"][0]
    return {
        "lagP50Ms": cell["scheduleLagMs"]["p50"],
        "lagP99Ms": cell["scheduleLagMs"]["p99"],
        "achievedRequestsPerSecond": cell["achievedRequestsPerSecond"],
        "outputTokensPerSecond": cell["outputTokensPerSecond"],
        "ttftP50Ms": cell["ttftMs"]["p50"] if cell["ttftMs"] else None,
        "ttftP99Ms": cell["ttftMs"]["p99"] if cell["ttftMs"] else None,
        "errors": cell["errors"],
    }


def aiperf(exe: str, tokenizer: str, url: str, rate: float, count: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            exe, "profile", "--model", "zero", "--url", url, "--endpoint-type", "completions", "--streaming",
            "--tokenizer", tokenizer, "--use-server-token-count", "--request-rate", str(rate),
            "--request-count", str(count), "--isl", "32", "--isl-stddev", "0", "--osl", str(OUTPUT_TOKENS),
            "--osl-stddev", "0", "--warmup-request-count", "8", "--artifact-dir", tmp, "--ui-type", "none",
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        data = json.loads((Path(tmp) / "profile_export_aiperf.json").read_text())
        lags = []
        for line in (Path(tmp) / "profile_export.jsonl").read_text().splitlines():
            meta = json.loads(line).get("metadata", {})
            if meta.get("benchmark_phase") == "profiling" and meta.get("request_start_ns"):
                lags.append((meta["request_start_ns"] - meta["credit_issued_ns"]) / 1e6)
    errors = sum(e.get("count", 0) for e in data.get("error_summary") or [])
    return {
        "lagP50Ms": float(np.percentile(lags, 50)) if lags else None,
        "lagP99Ms": float(np.percentile(lags, 99)) if lags else None,
        "achievedRequestsPerSecond": data["request_throughput"]["avg"],
        "outputTokensPerSecond": data["output_token_throughput"]["avg"],
        "ttftP50Ms": data["time_to_first_token"]["p50"],
        "ttftP99Ms": data["time_to_first_token"]["p99"],
        "errors": errors,
    }


def sustained(rate: float, r: dict, lag_key: str = "lagP99Ms") -> bool:
    """The issue's bar is p99 lag < 1 ms; on a shared 2-core machine OS scheduling alone breaks it,
    so the p50 variant is recorded too (clearly labelled) to still rank the tools."""
    return (
        r["errors"] == 0
        and r[lag_key] is not None
        and r[lag_key] < 1.0
        and r["achievedRequestsPerSecond"] >= 0.9 * rate
    )


def best_sustained(runs: list[dict], key: str = "sustained") -> dict | None:
    ok = [r for r in runs if r[key]]
    if not ok:
        return None
    best = max(ok, key=lambda r: r["offeredRequestsPerSecond"])
    return {
        "requestsPerSecond": best["offeredRequestsPerSecond"],
        "outputTokensPerSecond": best["outputTokensPerSecond"],
    }


def summarize(results: dict[str, list[dict]]) -> dict:
    """Best rate per tool under three bars: the issue's (p99 lag < 1 ms), p50 lag < 1 ms, and
    throughput only (achieved >= 90 % of offered, no errors, lag ignored)."""
    for runs in results.values():
        for r in runs:
            r["keepsUp"] = (
                "failed" not in r
                and r["errors"] == 0
                and (r["achievedRequestsPerSecond"] >= 0.9 * r["offeredRequestsPerSecond"])
            )
    return {
        bar: {name: best_sustained(rs, key) for name, rs in results.items()}
        for bar, key in (
            ("p99LagUnder1ms", "sustained"),
            ("p50LagUnder1ms", "sustainedAtP50"),
            ("keepsUp", "keepsUp"),
        )
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--aiperf", help="aiperf executable (separate venv)")
    p.add_argument("--tokenizer", help="tokenizer dir for aiperf's synthetic prompts")
    p.add_argument("--rates", default=",".join(str(r) for r in RATES))
    p.add_argument("--out", default=str(HERE / "results.json"))
    args = p.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, str(HERE / "zero_server.py"), "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    time.sleep(1.0)
    tools = {
        "accelbench (raw transport)": lambda r, n: accelbench(url, r, n, "raw"),
        "accelbench (aiohttp transport)": lambda r, n: accelbench(url, r, n, "aiohttp"),
    }
    if args.aiperf:
        tools["aiperf"] = lambda r, n: aiperf(args.aiperf, args.tokenizer, url, r, n)
    results: dict[str, list[dict]] = {name: [] for name in tools}
    try:
        for name, fn in tools.items():
            for rate in (float(x) for x in args.rates.split(",")):
                count = max(200, int(rate * SECONDS_PER_RATE))
                try:
                    r = fn(rate, count)
                except subprocess.SubprocessError as exc:
                    r = {"failed": str(exc)[:300]}
                r.update({"offeredRequestsPerSecond": rate, "requests": count})
                r["sustained"] = "failed" not in r and sustained(rate, r)
                r["sustainedAtP50"] = "failed" not in r and sustained(rate, r, "lagP50Ms")
                results[name].append(r)
                print(name, json.dumps(r), flush=True)
                if (
                    not r["sustainedAtP50"]
                    and len(results[name]) >= 2
                    and not results[name][-2]["sustainedAtP50"]
                ):
                    break  # two failures in a row: higher rates will not pass either
    finally:
        server.terminate()
        server.wait(10)
    summary = summarize(results)
    doc = {
        "what": "highest sustained open-loop rate, one client process, zero-latency server (see summarize)",
        "outputTokensPerRequest": OUTPUT_TOKENS,
        "secondsPerRate": SECONDS_PER_RATE,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_at_end": os.getloadavg(),
        },
        "summary": summary,
        "runs": results,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
