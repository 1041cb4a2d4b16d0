"""Serving benchmark on one GPU: `transformers serve` with a random-weight Llama-3.2-1B-shaped model,
driven by accelbench's load generator and by AIPerf with the same settings, in one command.

    python3 benchmarks/serving_h200/run.py --budget-s 480          # the device: one H200
    python benchmarks/serving_h200/run.py --tiny --device cpu \\
        --aiperf /tmp/peer-aiperf/bin/aiperf                        # here: tests the script

Steps (each child in its own process; what they print goes to run.log):
1. make_model.py writes the model dir (catalog llama 1b, bf16, random weights on the GPU; a
   tokenizer covering the whole vocabulary; no EOS so every answer runs to max_tokens) and reports
   the versions of what runs.
2. `transformers serve MODEL --device cuda --dtype bfloat16 --continuous-batching` starts on the
   first half of the CPUs (the load generators get the other half); start-up is the time until
   /health answers 200 (the model is loaded before the server listens); then one short request is
   timed on its own (the continuous-batching manager starts on the first request).
3. Per input length: an unmeasured warm-up burst at the largest levels; accelbench's sweep over
   --concurrency (closed loop) and its SLO capacity search (doubling up to --max-concurrency, then
   bisection), in one `python -m accelbench.workers.bench`; AIPerf (`aiperf profile`) at each sweep
   level with the same request count, warm-up, input and output lengths, streaming completions,
   server token counts. Which tool goes first alternates between input lengths.
4. results.json, results.md (tables, and the two tools' agreement per level), run.log and
   server.log in --out ($OUT on the device, else benchmarks/serving_h200/results), rewritten after
   every step, so a run cut short still leaves what it measured. No step starts once --budget-s
   (less a reserve for stopping the server) is near.

Standard library only; the children use the device image's torch/transformers and the wheels that
benchmarks/device_setup.sh installs. The package runs from this checkout (operator/ on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STARTED = time.monotonic()
RESERVE_S = 15.0  # kept back from --budget-s for stopping the server and writing the results
MIN_STEP_S = 25.0  # no step is started with less than this left
METRICS = ("ttftP50Ms", "ttftP90Ms", "tpotP50Ms", "e2eP50Ms", "outputTokensPerSecond", "requestsPerSecond")


def elapsed() -> float:
    return time.monotonic() - STARTED


# --------------------------------------------------------------------------------------------------
# Logging, processes


class Log:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")

    def say(self, message: str) -> None:
        line = f"[{elapsed():6.1f}s] {message}"
        print(line, flush=True)
        with self.path.open("a") as f:
            f.write(line + "\n")

    def tail(self, chars: int = 2000) -> str:
        data = self.path.read_bytes()
        return data[-chars:].decode(errors="replace")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO / "operator"), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.update(
        HF_HUB_OFFLINE="1", HF_HUB_DISABLE_UPDATE_CHECK="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1"
    )
    env.update(extra or {})
    return env


def aiperf_env() -> dict[str, str]:
    """AIPerf's own environment (another venv here; PYTHONPATH=/tmp/site on the device), without
    operator/ and without HF offline mode: AIPerf 0.13 in offline mode looks a tokenizer up in the
    Hub cache only, so a local directory fails ("Repo id must be in the form ..."); online, a local
    path needs no network."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HUB_DISABLE_UPDATE_CHECK="1", HF_HUB_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1")
    return env


def descendants(pid: int) -> list[int]:
    """Process ids below `pid` (Linux /proc), so they can be ended one by one."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = entry.read_text()
            ppid = int(text.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def end_process_tree(proc: subprocess.Popen[bytes], grace_s: float = 0.0) -> None:
    """Stop a child we started and every process it started, by id (SIGTERM first when grace_s)."""
    if proc.poll() is None and grace_s > 0:
        family = [proc.pid, *descendants(proc.pid)]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
        for pid in family[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


@dataclass
class Done:
    returncode: int | None
    seconds: float
    timed_out: bool


def run_child(argv: list[str], log: Log, title: str, timeout: float, env: dict[str, str]) -> Done:
    log.say(f"{title}: {shlex.join(argv)} (timeout {timeout:.0f}s)")
    tick = time.monotonic()
    with log.path.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        timed_out = False
        try:
            proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            end_process_tree(proc, grace_s=3)
        except BaseException:
            end_process_tree(proc)
            raise
    return Done(proc.returncode, time.monotonic() - tick, timed_out)


def command_output(argv: list[str], timeout: float = 20) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine_info() -> dict[str, Any]:
    query = "name,driver_version,memory.total,clocks.max.sm,power.limit"
    gpus = command_output(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"])
    mem = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        first = Path("/proc/meminfo").read_text().splitlines()[0].split()
        mem = f"{int(first[1]) / 2**20:.0f} GiB (MemTotal at start)"
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "cpus": os.cpu_count(),
        "memory": mem,
        "loadavg_at_start": os.getloadavg(),
        "gpus": gpus.splitlines() if gpus else [],
        "nvidia_smi": (command_output(["nvidia-smi"]) or "")[:6000],
    }


class GpuSampler:
    """nvidia-smi every 500 ms in the background: GPU utilization, memory and power per step."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.thread: threading.Thread | None = None
        self.samples: list[tuple[float, float, float, float]] = []  # unix time, util %, MiB, W

    def start(self) -> None:
        query = "--query-gpu=timestamp,utilization.gpu,memory.used,power.draw"
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", query, "--format=csv,noheader,nounits", "-lms", "500"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError:
            return
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            parts = [p.strip() for p in raw.decode(errors="replace").split(",")]
            try:
                stamp = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                values = [float(p) if p not in ("[N/A]", "N/A", "") else float("nan") for p in parts[1:4]]
            except (ValueError, IndexError):
                continue
            self.samples.append((stamp, values[0], values[1], values[2]))

    def stop(self) -> None:
        if self.proc is not None:
            end_process_tree(self.proc)

    def window(self, start: float, end: float) -> dict[str, float] | None:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if not inside:
            return None

        def good(column: int) -> list[float]:
            return [s[column] for s in inside if s[column] == s[column]]  # NaN: "[N/A]"

        def mean(column: int) -> float | None:
            values = good(column)
            return round(sum(values) / len(values), 1) if values else None

        return {
            "samples": len(inside),
            "utilizationMeanPct": mean(1),
            "utilizationMaxPct": max(good(1), default=None),
            "memoryMaxMiB": max(good(2), default=None),
            "powerMeanW": mean(3),
        }


# --------------------------------------------------------------------------------------------------
# Settings


@dataclass
class Settings:
    size: str
    device: str
    dtype: str
    input_lengths: list[int]
    output_length: int
    concurrency: list[int]
    requests: int
    warmup: int
    slo_ttft_ms: float
    slo_tpot_ms: float
    max_concurrency: int
    continuous_batching: bool
    cell_deadline_s: float
    serve_args: list[str] = field(default_factory=list)

    def requests_at(self, concurrency: int) -> int:
        """As accelbench's sweep does with --requests: at least two per worker."""
        return max(self.requests, 2 * concurrency)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    default_out = os.environ.get("OUT") or str(HERE / "results")
    p.add_argument("--out", default=default_out, help="results dir (default: $OUT, else ./results)")
    p.add_argument("--work", default="/tmp/accelbench-serving-bench", help="model dir, artifacts (kept)")
    p.add_argument("--budget-s", type=float, default=480, help="the whole run ends by about this (s)")
    p.add_argument("--tiny", action="store_true", help="the catalog's tiny llama, small sweep (CPU test)")
    p.add_argument("--size", help="catalog llama size (default 1b; --tiny: tiny)")
    p.add_argument("--device", default="cuda", help="cuda | cpu (transformers serve --device)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--input-lengths", help="comma-separated (default 128,1024; --tiny 32,128)")
    p.add_argument("--output-length", type=int, help="tokens per answer (default 128; --tiny 16)")
    p.add_argument("--concurrency", help="sweep levels, both tools (default 1,8,32; --tiny 1,4)")
    p.add_argument("--requests", type=int, help="per level, at least 2x the level (default 12; --tiny 8)")
    p.add_argument("--cell-deadline-s", type=float, default=60, help="accelbench sends nothing new after")
    p.add_argument("--warmup", type=int, help="warm-up requests per level, both tools (default 2; tiny 1)")
    p.add_argument("--slo-ttft-ms", type=float, help="capacity search bound (default 1000; --tiny 3000)")
    p.add_argument("--slo-tpot-ms", type=float, help="capacity search bound (default 50; --tiny 300)")
    p.add_argument("--max-concurrency", type=int, help="capacity search ceiling (default 128; tiny 8)")
    p.add_argument("--no-capacity-search", action="store_true")
    p.add_argument(
        "--no-server-warmup",
        dest="server_warmup",
        action="store_false",
        help="skip the unmeasured burst at the largest levels before each input length",
    )
    p.add_argument(
        "--no-continuous-batching", action="store_true", help="serve without --continuous-batching"
    )
    p.add_argument("--serve-arg", action="append", default=[], help="extra transformers serve argument")
    p.add_argument("--server-python", default=sys.executable, help="python for the model and server")
    p.add_argument("--aiperf", help="aiperf executable or command (default: this python -m aiperf)")
    p.add_argument("--no-aiperf", action="store_true")
    p.add_argument("--pin", choices=("auto", "off"), default="auto", help="server / clients on separate CPUs")
    args = p.parse_args(argv)
    tiny = args.tiny
    args.size = args.size or ("tiny" if tiny else "1b")
    args.input_lengths = args.input_lengths or ("32,128" if tiny else "128,1024")
    args.output_length = args.output_length or (16 if tiny else 128)
    args.concurrency = args.concurrency or ("1,4" if tiny else "1,8,32")
    args.requests = args.requests or (8 if tiny else 12)
    args.warmup = args.warmup if args.warmup is not None else (1 if tiny else 2)
    args.slo_ttft_ms = args.slo_ttft_ms or (3000.0 if tiny else 1000.0)
    args.slo_tpot_ms = args.slo_tpot_ms or (300.0 if tiny else 50.0)
    args.max_concurrency = args.max_concurrency or (8 if tiny else 128)
    if args.device == "cpu" and not any(a.startswith("--cb-") for a in args.serve_arg):
        # On the CPU the batching manager sizes its KV cache from free RAM (17 GB for the tiny
        # model here): a fixed small cache instead.
        args.serve_arg += ["--cb-num-blocks", "256"]
    return args


# --------------------------------------------------------------------------------------------------
# Server


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    argv: list[str]
    log_file: Any


PIN = """import os, sys
try:
    os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
except OSError:
    pass
os.execvp(sys.argv[2], sys.argv[2:])
"""


def split_cpus(mode: str) -> tuple[list[int], list[int]] | None:
    """(server CPUs, client CPUs): the server on the first half of the CPUs this process may use,
    the load generators (this process and its children) on the rest, so a client that spins (AIPerf's
    timing manager keeps a core busy) does not take CPU time from the server. None: no pinning."""
    if mode == "off" or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return cpus[:half], cpus[half:]


def start_server(
    args: argparse.Namespace, s: Settings, model_dir: str, out: Path, log: Log, cpus: list[int] | None
) -> tuple[Server, dict[str, Any]]:
    port = free_port()
    argv = [
        args.server_python, "-m", "transformers.cli.transformers", "serve", model_dir,
        "--host", "127.0.0.1", "--port", str(port), "--device", s.device, "--dtype", s.dtype,
        "--log-level", "info",
    ]  # fmt: skip
    if s.continuous_batching:
        argv.append("--continuous-batching")
    argv += s.serve_args
    info: dict[str, Any] = {"command": shlex.join(argv), "cpus": cpus}
    if cpus:
        argv = [sys.executable, "-c", PIN, ",".join(map(str, cpus)), *argv]
    log.say(f"server: {shlex.join(argv)}")
    log_file = (out / "server.log").open("ab")
    tick = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=child_env(), stdout=log_file, stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}", argv, log_file)
    deadline = tick + min(300.0, max(30.0, args.budget_s - elapsed() - RESERVE_S))
    while True:
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except (OSError, urllib.error.URLError):
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"transformers serve exited with {proc.returncode} (see server.log)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"transformers serve not ready after {time.monotonic() - tick:.0f}s")
        time.sleep(0.25)
    info["startupSeconds"] = round(time.monotonic() - tick, 2)
    log.say(f"server ready after {info['startupSeconds']}s at {server.url}")
    # The first request starts the continuous-batching manager (KV cache allocation): timed alone.
    body = {"model": model_dir, "prompt": "Hello there, how are you today?", "max_tokens": 8}
    request = urllib.request.Request(
        server.url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    tick = time.monotonic()
    first_timeout = max(10.0, min(300.0, args.budget_s - RESERVE_S - elapsed()))
    with urllib.request.urlopen(request, timeout=first_timeout) as resp:
        answer = json.loads(resp.read())
    info["firstRequestSeconds"] = round(time.monotonic() - tick, 2)
    info["firstRequestUsage"] = answer.get("usage")
    log.say(f"first request (8 tokens) took {info['firstRequestSeconds']}s: {answer.get('usage')}")
    tick = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as resp:
        resp.read()
    info["secondRequestSeconds"] = round(time.monotonic() - tick, 3)
    return server, info


def stop_server(server: Server) -> None:
    end_process_tree(server.proc, grace_s=10)
    server.log_file.close()


# --------------------------------------------------------------------------------------------------
# The two load generators


def accelbench_step(
    s: Settings,
    url: str,
    model_dir: str,
    length: int,
    work: Path,
    log: Log,
    timeout: float,
    search: bool,
    warmup_only: bool = False,
) -> dict[str, Any]:
    """accelbench's sweep (and capacity search) at one input length. warmup_only: a short burst
    at the largest levels instead, not measured, so neither tool meets a cold server (CUDA graphs
    of new batch sizes, allocator growth) in its first cells."""
    name = f"warmup-{length}" if warmup_only else f"accelbench-{length}"
    path = work / f"{name}.json"
    path.unlink(missing_ok=True)
    levels = sorted({max(s.concurrency), s.max_concurrency}) if warmup_only else s.concurrency
    argv = [
        sys.executable, "-m", "accelbench.workers.bench", "--endpoint", url, "--health-path", "/health",
        "--ready-timeout", "60", "--model", model_dir, "--tokenizer", model_dir, "--no-server-tokenizer",
        "--api", "completions", "--input-lengths", str(length),
        "--output-length", str(min(16, s.output_length) if warmup_only else s.output_length),
        "--concurrency", ",".join(map(str, levels)), "--requests", "1" if warmup_only else str(s.requests),
        "--warmup", "0" if warmup_only else str(s.warmup), "--slo-ttft-ms", str(s.slo_ttft_ms),
        "--slo-tpot-ms", str(s.slo_tpot_ms), "--max-concurrency", str(s.max_concurrency),
        "--request-timeout", "300", "--out", str(path),
        "--seconds", str(s.cell_deadline_s),  # with --requests: a deadline per cell, not a duration
    ]  # fmt: skip
    if not search or warmup_only:
        argv.append("--no-capacity-search")
    done = run_child(argv, log, name.replace("-", " in="), timeout, child_env())
    step: dict[str, Any] = {"seconds": round(done.seconds, 1), "returncode": done.returncode}
    if path.is_file():
        full = json.loads(path.read_text())
        step.update(
            cells=full["cells"],
            capacity=full.get("capacity"),
            ignoreEos=full.get("ignoreEos"),
            tokenizer=full.get("tokenizer"),
            generator=full.get("generator"),
        )
        step["status"] = "ok"
    else:
        step["status"] = "timeout" if done.timed_out else "failed"
        step["error"] = log.tail(1500)
    return step


def aiperf_command(args: argparse.Namespace) -> list[str] | None:
    if args.no_aiperf:
        return None
    if args.aiperf:
        return [args.aiperf] if Path(args.aiperf).exists() else shlex.split(args.aiperf)
    if importlib.util.find_spec("aiperf") is None:
        return None
    return [sys.executable, "-m", "aiperf"]


def aiperf_figures(data: dict[str, Any]) -> dict[str, Any]:
    def stat(key: str, p: str) -> float | None:
        value = (data.get(key) or {}).get(p)
        return float(value) if value is not None else None

    def avg(key: str) -> float | None:
        return stat(key, "avg")

    errors = sum(int(e.get("count", 0)) for e in data.get("error_summary") or [])
    return {
        "ttftP50Ms": stat("time_to_first_token", "p50"),
        "ttftP90Ms": stat("time_to_first_token", "p90"),
        "ttftP99Ms": stat("time_to_first_token", "p99"),
        "tpotP50Ms": stat("inter_token_latency", "p50"),
        "tpotP90Ms": stat("inter_token_latency", "p90"),
        "e2eP50Ms": stat("request_latency", "p50"),
        "outputTokensPerSecond": avg("output_token_throughput"),
        "requestsPerSecond": avg("request_throughput"),
        "inputTokensMean": avg("input_sequence_length"),
        "outputTokensMean": avg("output_sequence_length"),
        "completed": avg("request_count"),
        "errors": errors,
        "durationSeconds": avg("benchmark_duration"),
    }


def aiperf_step(
    s: Settings,
    exe: list[str],
    url: str,
    model_dir: str,
    length: int,
    concurrency: int,
    work: Path,
    log: Log,
    timeout: float,
) -> dict[str, Any]:
    artifacts = work / f"aiperf-{length}-c{concurrency}"
    if artifacts.exists():
        for path in sorted(artifacts.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    count = s.requests_at(concurrency)
    argv = [
        *exe, "profile", "--model", model_dir, "--url", url, "--endpoint-type", "completions",
        "--streaming", "--tokenizer", model_dir, "--use-server-token-count",
        "--concurrency", str(concurrency), "--request-count", str(count),
        "--isl", str(length), "--isl-stddev", "0", "--osl", str(s.output_length), "--osl-stddev", "0",
        "--warmup-request-count", str(s.warmup), "--random-seed", "0", "--artifact-dir", str(artifacts),
        "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry",
    ]  # fmt: skip
    done = run_child(argv, log, f"aiperf in={length} c={concurrency}", timeout, aiperf_env())
    step: dict[str, Any] = {
        "concurrency": concurrency,
        "requests": count,
        "seconds": round(done.seconds, 1),
        "returncode": done.returncode,
    }
    export = artifacts / "profile_export_aiperf.json"
    if done.returncode == 0 and export.is_file():
        step["figures"] = aiperf_figures(json.loads(export.read_text()))
        step["status"] = "ok"
    else:
        step["status"] = "timeout" if done.timed_out else "failed"
        step["error"] = log.tail(1500)
    return step


# --------------------------------------------------------------------------------------------------
# Comparison and report


def accelbench_figures(cell: dict[str, Any]) -> dict[str, Any]:
    def stat(key: str, p: str) -> float | None:
        block = cell.get(key)
        return float(block[p]) if block else None

    completed = cell["completed"] or 0
    server_tokens = (cell.get("outputTokens") or {}).get("server") or 0
    return {
        "ttftP50Ms": stat("ttftMs", "p50"),
        "ttftP90Ms": stat("ttftMs", "p90"),
        "ttftP99Ms": stat("ttftMs", "p99"),
        "tpotP50Ms": stat("tpotMs", "p50"),
        "tpotP90Ms": stat("tpotMs", "p90"),
        "e2eP50Ms": stat("e2eMs", "p50"),
        "outputTokensPerSecond": cell["outputTokensPerSecond"],
        "requestsPerSecond": cell["requestsPerSecond"],
        "inputTokensMean": cell.get("inputTokensMean"),
        "outputTokensMean": server_tokens / completed if completed else None,
        "completed": completed,
        "errors": cell["errors"],
        "durationSeconds": cell["durationSeconds"],
    }


def gap(a: float | None, b: float | None) -> float | None:
    """(accelbench - aiperf) / aiperf."""
    if a is None or b is None or b == 0:
        return None
    return (a - b) / abs(b)


def compare(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for length, entry in results["lengths"].items():
        ours = entry.get("accelbench") or {}
        sweep = {c["concurrency"]: c for c in ours.get("cells") or [] if c.get("phase") == "sweep"}
        for peer in entry.get("aiperf") or []:
            cell = sweep.get(peer["concurrency"])
            if peer.get("status") != "ok" or cell is None:
                continue
            a, b = accelbench_figures(cell), peer["figures"]
            rows.append(
                {
                    "inputLength": int(length),
                    "concurrency": peer["concurrency"],
                    "accelbench": a,
                    "aiperf": b,
                    "gap": {m: gap(a.get(m), b.get(m)) for m in METRICS},
                    "gpuUtilizationPct": (peer.get("gpu") or {}).get("utilizationMeanPct"),
                }
            )
    return rows


def agreement_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in METRICS:
        gaps = [abs(r["gap"][metric]) for r in rows if r["gap"].get(metric) is not None]
        out[metric] = {"cells": len(gaps), "maxAbsGap": max(gaps) if gaps else None}
    return out


def fmt(value: float | None, spec: str = ",.1f") -> str:
    return "–" if value is None else f"{value:{spec}}"


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:+.1f} %"


def markdown(results: dict[str, Any]) -> str:
    meta, server = results["meta"], results.get("server") or {}
    model = (results.get("build") or {}).get("model") or {}
    versions = (results.get("build") or {}).get("versions") or {}
    machine = meta["machine"]
    shape = model.get("shape") or {}
    lines = [
        f"# Serving benchmark: transformers serve, accelbench vs AIPerf ({meta['mode']})",
        "",
        f"- date: {meta['date']}; command: `{meta['command']}`; {meta.get('seconds', '?')} s in all",
        f"- machine: {machine['cpus']} CPUs, {machine['memory']}; "
        f"GPU: {'; '.join(machine['gpus']) or 'none'}",
        f"- python {(results.get('build') or {}).get('python', '?')}: "
        + ", ".join(f"{k} {v}" for k, v in versions.items() if v),
        f"- model: random-weight llama {meta['settings']['size']} ({model.get('reference', '?')}): "
        f"{shape.get('layers')} layers, hidden {shape.get('hidden')}, {shape.get('heads')} heads / "
        f"{shape.get('kv_heads')} kv, vocab {shape.get('vocab')}, "
        f"{fmt((model.get('parameters') or 0) / 1e9, '.3f')} B parameters, {meta['settings']['dtype']}",
        f"- server: `{server.get('command', '?')}`",
        f"- server start-up (process start to /health 200, model loaded): "
        f"{fmt(server.get('startupSeconds'), '.1f')} s; first request (8 tokens, starts the batching "
        f"manager): {fmt(server.get('firstRequestSeconds'), '.2f')} s; second: "
        f"{fmt(server.get('secondRequestSeconds'), '.3f')} s",
        f"- workload: completions API, streaming, output {meta['settings']['output_length']} tokens "
        f"(no EOS in the model: every answer runs to max_tokens), closed loop, requests per level "
        f"max({meta['settings']['requests']}, 2 × concurrency), {meta['settings']['warmup']} warm-up "
        f"requests per level; SLO TTFT ≤ {meta['settings']['slo_ttft_ms']:g} ms, TPOT ≤ "
        f"{meta['settings']['slo_tpot_ms']:g} ms at 90 % attainment",
        "",
        "## accelbench sweep and capacity search",
        "",
        "| input | conc. | phase | requests | TTFT p50 / p90 / p99 ms | TPOT p50 / p90 ms | E2E p50 ms | "
        "out tok/s | req/s | SLO met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for length, entry in results["lengths"].items():
        ours = entry.get("accelbench") or {}
        for cell in ours.get("cells") or []:
            f = accelbench_figures(cell)
            lines.append(
                f"| {length} | {cell['concurrency']} | {cell.get('phase')} | {cell['completed']}"
                f"{'' if not cell['errors'] else ' (+' + str(cell['errors']) + ' errors)'} | "
                f"{fmt(f['ttftP50Ms'])} / {fmt(f['ttftP90Ms'])} / {fmt(f['ttftP99Ms'])} | "
                f"{fmt(f['tpotP50Ms'], '.2f')} / {fmt(f['tpotP90Ms'], '.2f')} | "
                f"{fmt(f['e2eP50Ms'], ',.0f')} | "
                f"{fmt(f['outputTokensPerSecond'], ',.0f')} | {fmt(f['requestsPerSecond'], '.2f')} | "
                f"{'yes' if cell.get('sloMet') else 'no'} |"
            )
    lines += ["", "Capacity (largest concurrency meeting the SLO):", ""]
    for length, entry in results["lengths"].items():
        cap = ((entry.get("accelbench") or {}).get("capacity") or {}).get(str(length))
        if cap:
            lines.append(
                f"- input {length}: capacity {cap['capacityConcurrency']}, first failing "
                f"{cap['firstFailingConcurrency']} (binding: {cap['bindingConstraint']}), "
                f"{fmt(cap['outputTokensPerSecondAtCapacity'], ',.0f')} output tok/s at capacity; "
                f"levels {cap['levelsMeasured']}"
            )
        else:
            lines.append(f"- input {length}: no capacity result")
    rows = results.get("comparison") or []
    lines += [
        "",
        "## Agreement: accelbench vs AIPerf at the same levels",
        "",
        "Each cell: accelbench / AIPerf (gap = (accelbench − AIPerf) / AIPerf).",
        "",
        "| input | conc. | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | E2E p50 ms | output tok/s | req/s | "
        "mean in / out tokens | GPU util % |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, b, g = r["accelbench"], r["aiperf"], r["gap"]

        def cell(metric: str, spec: str = ",.1f", a: dict = a, b: dict = b, g: dict = g) -> str:
            return f"{fmt(a.get(metric), spec)} / {fmt(b.get(metric), spec)} ({pct(g.get(metric))})"

        tokens = (
            f"{fmt(a.get('inputTokensMean'), '.0f')}/{fmt(a.get('outputTokensMean'), '.0f')} vs "
            f"{fmt(b.get('inputTokensMean'), '.0f')}/{fmt(b.get('outputTokensMean'), '.0f')}"
        )
        lines.append(
            f"| {r['inputLength']} | {r['concurrency']} | {cell('ttftP50Ms')} | {cell('ttftP90Ms')} | "
            f"{cell('tpotP50Ms', '.2f')} | {cell('e2eP50Ms', ',.0f')} | "
            f"{cell('outputTokensPerSecond', ',.0f')} | "
            f"{cell('requestsPerSecond', '.2f')} | {tokens} | {fmt(r.get('gpuUtilizationPct'), '.0f')} |"
        )
    summary = results.get("agreement") or {}
    if summary:
        lines += ["", "Largest |gap| over the compared cells: " + ", ".join(
            f"{m} {pct(v['maxAbsGap'])[1:] if v['maxAbsGap'] is not None else '–'} ({v['cells']} cells)"
            for m, v in summary.items()
        )]  # fmt: skip
    problems = results.get("problems") or []
    if problems:
        lines += ["", "## Not measured / failed", ""] + [f"- {p}" for p in problems]
    lines += [
        "",
        "## Definitions",
        "",
        "- accelbench: TTFT = first streamed token event − scheduled send; TPOT = (E2E − TTFT) / "
        "(server output tokens − 1); out tok/s = server output tokens / (last end − first send).",
        "- AIPerf 0.13: time_to_first_token, inter_token_latency ((request latency − TTFT) / (output "
        "tokens − 1)), request_latency, output_token_throughput (over its benchmark duration); "
        "`--use-server-token-count`, so both count tokens from the server's usage.",
        "- GPU util %: mean nvidia-smi utilization.gpu (500 ms samples) while AIPerf ran that level "
        "(its start-up included); per accelbench step it is in results.json.",
    ]
    return "\n".join(lines) + "\n"


def write_results(out: Path, results: dict[str, Any]) -> None:
    results["meta"]["seconds"] = round(elapsed(), 1)
    results["comparison"] = compare(results)
    results["agreement"] = agreement_summary(results["comparison"])
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (out / "results.md").write_text(markdown(results))


def cap_file(path: Path, limit: int = 8 * 2**20) -> None:
    """Keep a log under `limit` bytes (what comes back from $OUT is limited): head and tail."""
    if path.is_file() and path.stat().st_size > limit:
        data = path.read_bytes()
        path.write_bytes(data[: limit // 4] + b"\n[... cut ...]\n" + data[-(limit * 3 // 4) :])


# --------------------------------------------------------------------------------------------------
# Main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    s = Settings(
        size=args.size,
        device=args.device,
        dtype=args.dtype,
        input_lengths=[int(x) for x in args.input_lengths.split(",") if x.strip()],
        output_length=args.output_length,
        concurrency=[int(x) for x in args.concurrency.split(",") if x.strip()],
        requests=args.requests,
        warmup=args.warmup,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
        max_concurrency=args.max_concurrency,
        continuous_batching=not args.no_continuous_batching,
        cell_deadline_s=args.cell_deadline_s,
        serve_args=list(args.serve_arg),
    )
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "server.log").write_bytes(b"")
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = Log(out / "run.log")
    command = shlex.join([Path(sys.executable).name, *sys.argv]) if argv is None else shlex.join(argv)
    results: dict[str, Any] = {
        "meta": {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": command,
            "mode": f"{s.size} on {s.device}",
            "budget_s": args.budget_s,
            "settings": s.__dict__,
            "machine": machine_info(),
        },
        "lengths": {},
        "problems": [],
    }
    log.say(f"serving benchmark: llama {s.size} on {s.device}, out {out}, work {work}")
    log.say(f"machine: {results['meta']['machine']['gpus'] or 'no GPU'}, {os.cpu_count()} CPUs")
    exe = aiperf_command(args)
    if exe is None:
        results["problems"].append(
            "AIPerf not run: " + ("--no-aiperf" if args.no_aiperf else "not importable")
        )
    results["meta"]["aiperf_command"] = shlex.join(exe) if exe else None
    if exe and args.aiperf:
        results["meta"]["aiperf_version"] = command_output([*exe, "--version"], timeout=120)
    sampler = GpuSampler()
    sampler.start()

    def left() -> float:
        return args.budget_s - RESERVE_S - elapsed()

    server: Server | None = None
    try:
        # 1. The model dir (and the versions of what runs).
        spec = {
            "dir": str(work / f"llama-{s.size}-{s.dtype}"),
            "family": "llama",
            "size": s.size,
            "dtype": s.dtype,
            "device": s.device,
            "max_positions": max(4096, max(s.input_lengths) + s.output_length + 64),
        }
        (work / "model-spec.json").write_text(json.dumps(spec))
        built_path = work / "model-built.json"
        built_path.unlink(missing_ok=True)
        make = [
            args.server_python,
            str(HERE / "make_model.py"),
            str(work / "model-spec.json"),
            str(built_path),
        ]
        done = run_child(make, log, "model", min(300.0, left()), child_env())
        if not built_path.is_file():
            results["problems"].append(f"model not built (exit {done.returncode}): {log.tail(1500)}")
            write_results(out, results)
            return 1
        results["build"] = json.loads(built_path.read_text())
        results["build"]["wallSeconds"] = round(done.seconds, 1)
        model_dir = results["build"]["model"]["dir"]
        log.say(f"model: {results['build']['model']} [{done.seconds:.0f}s]")
        write_results(out, results)

        # 2. The server.
        split = split_cpus(args.pin)
        if split:
            try:
                os.sched_setaffinity(0, split[1])  # inherited by both load generators
                log.say(f"CPUs: server {split[0]}, load generators {split[1]}")
            except OSError as exc:
                log.say(f"no CPU pinning: {exc}")
                split = None
        results["meta"]["cpu_split"] = {"server": split[0], "clients": split[1]} if split else None
        server, results["server"] = start_server(args, s, model_dir, out, log, split[0] if split else None)
        write_results(out, results)

        # 3. Per input length: both tools, the first one alternating.
        for index, length in enumerate(s.input_lengths):
            entry: dict[str, Any] = results["lengths"].setdefault(str(length), {"aiperf": []})
            order = ["accelbench", "aiperf"] if index % 2 == 0 else ["aiperf", "accelbench"]
            entry["order"] = order
            if args.server_warmup and left() >= MIN_STEP_S:
                tick = time.time()
                warm = accelbench_step(s, server.url, model_dir, length, work, log, left(), False, True)
                entry["warmup"] = {
                    "status": warm["status"],
                    "seconds": warm["seconds"],
                    "levels": [c["concurrency"] for c in warm.get("cells") or []],
                    "gpu": sampler.window(tick, time.time()),
                }
                log.say(f"warm-up in={length}: {warm['status']} [{warm['seconds']}s]")
            for tool in order:
                if tool == "accelbench":
                    if left() < MIN_STEP_S:
                        results["problems"].append(f"accelbench in={length}: skipped, time budget")
                        continue
                    tick = time.time()
                    step = accelbench_step(
                        s, server.url, model_dir, length, work, log, left(), not args.no_capacity_search
                    )
                    step["gpu"] = sampler.window(tick, time.time())
                    entry["accelbench"] = step
                    if step["status"] != "ok":
                        results["problems"].append(f"accelbench in={length}: {step['status']}")
                    log.say(f"accelbench in={length}: {step['status']} [{step['seconds']}s]")
                elif exe is not None:
                    for c in s.concurrency:
                        if left() < MIN_STEP_S:
                            results["problems"].append(f"aiperf in={length} c={c}: skipped, time budget")
                            continue
                        tick = time.time()
                        peer = aiperf_step(s, exe, server.url, model_dir, length, c, work, log, left())
                        peer["gpu"] = sampler.window(tick, time.time())
                        entry["aiperf"].append(peer)
                        figures = peer.get("figures") or {}
                        log.say(
                            f"aiperf in={length} c={c}: {peer['status']}, ttft p50 "
                            f"{fmt(figures.get('ttftP50Ms'))} ms, "
                            f"{fmt(figures.get('outputTokensPerSecond'))} tok/s [{peer['seconds']}s]"
                        )
                        if peer["status"] != "ok":
                            results["problems"].append(f"aiperf in={length} c={c}: {peer['status']}")
                write_results(out, results)
    except Exception as exc:  # recorded; the results so far are still written
        results["problems"].append(f"{type(exc).__name__}: {exc}")
        log.say(f"ERROR {type(exc).__name__}: {exc}")
    finally:
        if server is not None:
            stop_server(server)
        sampler.stop()
        results["meta"]["gpu_whole_run"] = sampler.window(0, time.time())
        results["meta"]["loadavg_at_end"] = os.getloadavg()
        write_results(out, results)
        cap_file(out / "server.log")
        cap_file(out / "run.log")
    log.say("")
    print((out / "results.md").read_text())
    log.say(f"results in {out}: results.json, results.md, run.log, server.log ({elapsed():.0f}s)")
    return 0 if not results["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
