"""Client overhead: the highest open-loop request rate one client process sustains against a
zero-latency streaming server with p99 schedule lag under 1 ms, and the streamed tokens/s that is.

Same run, same server process (accelbench.workers.bench.nullserver, started here in its own
process), same settings for every tool: Poisson arrivals, OUTPUT_TOKENS one-token chunks per
answer, short prompts. A rate is sustained when p99 schedule lag < 1 ms, achieved request rate
>= 90 % of offered, and no errors.

Schedule lag: accelbench records it per request (actual send - scheduled send). AIPerf: from its
per-request export, request_start_ns - credit_issued_ns (credit = its timing manager's send order).
GuideLLM: from its per-request JSON records, request_start - targeted_start (see `guidellm`).

    .venv/bin/python benchmarks/client_overhead/run.py --aiperf /tmp/peer-aiperf/bin/aiperf \
        --tokenizer /tmp/tiny-llama --out benchmarks/client_overhead/results.json

On the device machine (see README.md): AIPerf installed from the carried wheels, run as a module,
a tokenizer made on the spot, results in $OUT:

    python3 benchmarks/client_overhead/run.py --aiperf 'python3 -m aiperf' --budget-s 500
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OUTPUT_TOKENS = 64
SECONDS_PER_RATE = 4.0
RATES = (100, 400, 800, 1600, 3200, 6400)


def child_env() -> dict[str, str]:
    """The package from this checkout (the device has no accelbench installed): operator/ first on
    PYTHONPATH, the rest (e.g. /tmp/site with the carried wheels) kept. No HF offline mode: AIPerf
    0.13 then looks a tokenizer up in the Hub cache only and fails on a local directory."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HUB_DISABLE_UPDATE_CHECK"] = "1"
    parts = [str(REPO / "operator"), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def aiperf_command(text: str) -> list[str]:
    """An executable path, or a command line such as 'python3 -m aiperf'."""
    return [text] if Path(text).exists() else shlex.split(text)


def version_of(command: list[str]) -> str | None:
    try:
        done = subprocess.run(
            [*command, "--version"], capture_output=True, text=True, timeout=120, env=child_env()
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout or done.stderr).strip().splitlines()[-1] if done.returncode == 0 else None


def make_tokenizer(directory: Path) -> str:
    """AIPerf builds its synthetic prompts with a tokenizer: the tests' tiny model dir (its BPE)."""
    code = "import sys; from accelbench.workers.testing import make_tiny_model; make_tiny_model(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(directory)], check=True, env=child_env(), timeout=300)
    return str(directory)


def accelbench(url: str, rate: float, count: int, transport: str, processes: str = "auto") -> dict:
    """This client as the bench pod runs it; open-loop sends spread over up to `processes`
    processes (one per 1,000 req/s: workers/bench/fanout.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [
            sys.executable, "-m", "accelbench.workers.bench", "--endpoint", url, "--health-path", "/health",
            "--no-server-tokenizer", "--rates", str(rate), "--requests", str(count),
            "--input-lengths", "32", "--output-length", str(OUTPUT_TOKENS), "--warmup", "8",
            "--no-capacity-search", "--transport", transport, "--client-processes", processes,
            "--out", str(out),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, timeout=600, env=child_env())
        doc = json.loads(out.read_text())
        cell = doc["cells"][0]
    calibration = (doc.get("clientOverhead") or {}).get("points") or [{}]
    return {
        "eventLoop": doc["generator"].get("eventLoop"),
        "maxSendingProcesses": doc["generator"].get("maxSendingProcesses"),
        "selfCalibration": calibration[0],
        "lagP50Ms": cell["scheduleLagMs"]["p50"],
        "lagP99Ms": cell["scheduleLagMs"]["p99"],
        # The delivery bar: planned send span / actual (1.0 on schedule), >= 0.995 to pass.
        "deliveredFraction": cell.get("deliveredFraction"),
        "achievedRequestsPerSecond": cell["achievedRequestsPerSecond"],
        "outputTokensPerSecond": cell["outputTokensPerSecond"],
        "ttftP50Ms": cell["ttftMs"]["p50"] if cell["ttftMs"] else None,
        "ttftP99Ms": cell["ttftMs"]["p99"] if cell["ttftMs"] else None,
        "errors": cell["errors"],
    }


def aiperf(
    exe: list[str], tokenizer: str, url: str, rate: float, count: int, workers: int | None = None
) -> dict:
    """AIPerf's own process layout: a timing manager issues credits, worker processes send (by default
    min(concurrency, 0.75 × CPUs − 1) of them), record processors parse. `workers` caps the senders."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            *exe, "profile", "--model", "zero", "--url", url, "--endpoint-type", "completions", "--streaming",
            "--tokenizer", tokenizer, "--use-server-token-count", "--request-rate", str(rate),
            "--request-count", str(count), "--isl", "32", "--isl-stddev", "0", "--osl", str(OUTPUT_TOKENS),
            "--osl-stddev", "0", "--warmup-request-count", "8", "--artifact-dir", tmp, "--ui-type", "none",
            *(["--workers-max", str(workers)] if workers else []),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, timeout=600, env=child_env())
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


def guidellm(exe: list[str], tokenizer: str, url: str, rate: float, count: int) -> dict:
    """GuideLLM 0.8 (`guidellm run`): Poisson profile at `rate`, `count` measured requests after 8
    warm-up ones (max_requests counts the warm-up too), streamed /v1/completions, synthetic 32-token
    prompts, max_tokens 64 (the zero server answers exactly that many one-token events).

    Schedule lag per request = `info.timings.request_start - info.timings.targeted_start` from the
    per-request records in its JSON (`benchmarks[0].requests.successful`), the pair behind its own
    `request_dispatch_delay`. Why it is our `sent - scheduled`: `targeted_start` is the arrival time
    the Poisson strategy drew for the request (AsyncPoissonStrategy.next_request_time: the shared
    offset plus an exponential gap), given to the worker before it sleeps until then
    (scheduler/worker.py `_process_next_graph_node`/`_schedule_request`); `request_start` is set by
    the openai_http backend at httpx's `send_request_headers.started` trace event (backends/openai/
    http.py `_trace_request_start`), i.e. when the request's first bytes go to the socket. Both are
    time.time() of the same host. Taken over the measured requests (request_start at or after the
    benchmark's start_time, which is the end of the warm-up).

    Two GuideLLM 0.8.1 quirks, recorded rather than hidden: its worker processes each seed
    random.Random(random_seed) alike, so the schedule repeats the same gaps once per worker and its
    actual rate (scheduledRequestsPerSecond, from the targets) can stray from the nominal one on short
    runs; and targets a worker computed before the scheduler set the Poisson offset start near -1.0
    s (the offset's initial value; a start-up race), not a Unix time: those requests are counted in
    badTargets and left out of the lag. TTFT is GuideLLM's own (first token - request_start).
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "guidellm.json"
        backend = {
            "kind": "openai_http", "target": url, "model": "zero", "request_format": "/v1/completions",
            "stream": True, "max_tokens": OUTPUT_TOKENS, "http2": False,
        }  # fmt: skip
        profile = {"kind": "poisson", "rate": rate, "warmup": {"value": 8, "mode": "requests"}}
        cmd = [
            *exe, "run", "--backend", json.dumps(backend), "--profile", json.dumps(profile),
            "--constraint", f"kind=max_requests,count={count + 8}",
            "--data", f"kind=synthetic_text,prompt_tokens=32,output_tokens={OUTPUT_TOKENS}",
            "--tokenizer", f"kind=hf_auto,model={tokenizer}", "--output", f"kind=json,path={out}",
            "--disable-console",
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, timeout=600, env=child_env())
        bench = json.loads(out.read_text())["benchmarks"][0]
    metrics = bench["metrics"]
    measured = [
        r["info"]["timings"]
        for r in bench["requests"]["successful"]
        if (r["info"]["timings"].get("request_start") or 0) >= bench["start_time"]
    ]
    good = [t for t in measured if (t.get("targeted_start") or 0) > 1e9]  # Unix times only
    lags = [(t["request_start"] - t["targeted_start"]) * 1e3 for t in good]
    targets = sorted(t["targeted_start"] for t in good)
    scheduled = (len(targets) - 1) / (targets[-1] - targets[0]) if len(targets) > 1 else None
    totals = metrics["request_totals"]
    return {
        "lagP50Ms": float(np.percentile(lags, 50)) if lags else None,
        "lagP99Ms": float(np.percentile(lags, 99)) if lags else None,
        "achievedRequestsPerSecond": metrics["requests_per_second"]["successful"]["mean"],
        "outputTokensPerSecond": metrics["output_tokens_per_second"]["successful"]["mean"],
        "ttftP50Ms": metrics["time_to_first_token_ms"]["successful"]["percentiles"]["p50"],
        "ttftP99Ms": metrics["time_to_first_token_ms"]["successful"]["percentiles"]["p99"],
        "errors": totals["errored"] + totals["incomplete"],
        "measuredRequests": totals["successful"],
        "lagRequests": len(lags),
        "badTargets": len(measured) - len(good),
        "scheduledRequestsPerSecond": scheduled,
        "workerProcesses": bench["scheduler_state"].get("num_processes"),
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
    p.add_argument("--aiperf", help="aiperf executable (separate venv) or command ('python3 -m aiperf')")
    p.add_argument(
        "--aiperf-workers", default="", help="also run AIPerf with --workers-max N for each N (a,b,...)"
    )
    p.add_argument("--guidellm", help="guidellm executable or command ('python3 -m guidellm')")
    p.add_argument("--tokenizer", help="tokenizer dir for the peers' prompts (default: a tiny one made here)")
    p.add_argument("--rates", default=",".join(str(r) for r in RATES))
    p.add_argument("--tools", default="raw,aiohttp,aiperf,guidellm", help="which of those tools to run")
    p.add_argument("--budget-s", type=float, default=None, help="start no run once this many seconds passed")
    p.add_argument("--pin", choices=("auto", "off"), default="auto", help="auto: server on its own CPUs")
    p.add_argument("--server-processes", type=int, default=1, help="zero-server processes (SO_REUSEPORT)")
    p.add_argument("--client-processes", default="auto", help="accelbench's --client-processes")
    default_out = Path(os.environ["OUT"]) / "results.json" if os.environ.get("OUT") else HERE / "results.json"
    p.add_argument("--out", default=str(default_out), help="default: $OUT/results.json, else here")
    args = p.parse_args()
    started = time.monotonic()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    wanted = {t.strip() for t in args.tools.split(",") if t.strip()}
    server_cmd = [
        sys.executable, "-m", "accelbench.workers.bench.nullserver", "--port", "0",
        "--processes", str(args.server_processes),
    ]  # fmt: skip
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    split = None
    taken = args.server_processes
    if args.pin == "auto" and len(cpus) >= 4 * taken:
        # The server on the first CPUs, the tools (this process's children) on the others, so the
        # server's work never preempts the measured client on its cores.
        try:
            os.sched_setaffinity(0, cpus[taken:])
            split = {"server": cpus[:taken], "clients": cpus[taken:]}
            pin = "import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')}); "
            pin += "os.execv(sys.argv[2], sys.argv[2:])"
            server_cmd = [sys.executable, "-c", pin, ",".join(map(str, cpus[:taken])), *server_cmd]
        except OSError as exc:
            print(f"no CPU pinning: {exc}", flush=True)
    server = subprocess.Popen(server_cmd, stdout=subprocess.PIPE, text=True)
    announced = (
        server.stdout.readline().split() if server.stdout else []
    )  # `listening <port>`, once it listens
    if len(announced) != 2:
        sys.exit(f"the null server did not start (exit {server.wait()})")
    url = f"http://127.0.0.1:{announced[1]}"
    tools: dict[str, Callable[[float, int], dict]] = {}
    if "raw" in wanted:
        tools["accelbench (raw transport)"] = lambda r, n: accelbench(url, r, n, "raw", args.client_processes)
    if "aiohttp" in wanted:
        tools["accelbench (aiohttp transport)"] = lambda r, n: accelbench(
            url, r, n, "aiohttp", args.client_processes
        )
    versions: dict[str, str | None] = {}
    scratch = tempfile.TemporaryDirectory()
    tokenizers: list[str] = []

    def tokenizer() -> str:
        if not tokenizers:
            tokenizers.append(args.tokenizer or make_tokenizer(Path(scratch.name) / "tiny-llama"))
        return tokenizers[0]

    if args.aiperf and "aiperf" in wanted:
        exe = aiperf_command(args.aiperf)
        versions["aiperf"] = version_of(exe)
        tok = tokenizer()
        for workers in (int(w) for w in args.aiperf_workers.split(",") if w.strip()):
            label = f"aiperf ({workers} worker{'s' if workers > 1 else ''})"
            tools[label] = lambda r, n, w=workers: aiperf(exe, tok, url, r, n, w)
        tools["aiperf"] = lambda r, n: aiperf(exe, tok, url, r, n)
    if args.guidellm and "guidellm" in wanted:
        gexe = aiperf_command(args.guidellm)
        versions["guidellm"] = version_of(gexe)
        gtok = tokenizer()
        tools["guidellm"] = lambda r, n: guidellm(gexe, gtok, url, r, n)
    time.sleep(1.0)
    results: dict[str, list[dict]] = {name: [] for name in tools}
    skipped: list[str] = []

    def write_doc(partial: bool) -> dict:
        summary = summarize(results)
        doc = {
            "what": "highest sustained open-loop rate, one client, zero-latency server (see summarize)",
            "partial": partial,
            "outputTokensPerRequest": OUTPUT_TOKENS,
            "secondsPerRate": SECONDS_PER_RATE,
            "serverProcesses": args.server_processes,
            "clientProcesses": args.client_processes,
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "loadavg_at_end": os.getloadavg(),
                "cpu_split": split,
            },
            "versions": versions,
            "startedAt": started_at,
            "seconds": round(time.monotonic() - started, 1),
            "skipped": skipped,
            "summary": summary,
            "runs": results,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
        return summary

    try:
        for name, fn in tools.items():
            for rate in (float(x) for x in args.rates.split(",")):
                if args.budget_s is not None and time.monotonic() - started > args.budget_s:
                    skipped.append(f"{name} at {rate:g} req/s (time budget)")
                    continue
                count = max(200, int(rate * SECONDS_PER_RATE))
                try:
                    r = fn(rate, count)
                except subprocess.SubprocessError as exc:
                    r = {"failed": str(exc)[:300]}
                    stderr = getattr(exc, "stderr", None)
                    if stderr:
                        r["stderrTail"] = stderr[-1500:].decode(errors="replace")
                r.update({"offeredRequestsPerSecond": rate, "requests": count})
                r["sustained"] = "failed" not in r and sustained(rate, r)
                r["sustainedAtP50"] = "failed" not in r and sustained(rate, r, "lagP50Ms")
                results[name].append(r)
                print(name, json.dumps(r), flush=True)
                write_doc(partial=True)  # a run cut short still leaves what it measured
                if (
                    not r["sustainedAtP50"]
                    and len(results[name]) >= 2
                    and not results[name][-2]["sustainedAtP50"]
                ):
                    break  # two failures in a row: higher rates will not pass either
    finally:
        server.terminate()
        server.wait(10)
        scratch.cleanup()
    print(json.dumps(write_doc(partial=False), indent=1))


if __name__ == "__main__":
    main()
