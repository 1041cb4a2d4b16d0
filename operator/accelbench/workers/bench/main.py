"""`python -m accelbench.workers.bench`: the InferenceBench client pod's entry point.

Configuration comes from the env the operator renders (render/inference.py; names in
api.contract): the JobPayload (spec and plan), the endpoint, its health path and readiness
timeout, the results ConfigMap and the pod's namespace, the termination log. Command-line flags
override it, for local runs (`--endpoint http://127.0.0.1:8000 --concurrency 1,4 --out r.json`).

The client measures; it prices nothing. The full results carry the plan's price as given (chips,
$/chip-hour, source) so the HTML report can price per input length with accelbench.cost, as the
operator prices the status.

Exit codes (api.contract.ExitCode): OK, ERROR (server never ready, every request failed),
INVALID_CONFIG (the Job does not retry it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from ... import __version__
from ...api.contract import (
    ENV_ENDPOINT,
    ENV_HEALTH_PATH,
    ENV_JOB,
    ENV_OUTPUT_URI,
    ENV_READY_TIMEOUT,
    ENV_TOKENIZER_DIR,
    RESULTS_CONFIGMAP_KEY,
    ExitCode,
)
from ...api.errors import describe
from ...api.inference import InferenceBenchSpec, RequestApi, Slo, Workload
from ...api.payload import JobPayload
from .. import storage
from ..metrics import BenchMetrics, metrics_port, start_metrics_server
from ..report import write_report
from .calibration import calibrate, limited_rates
from .client import discover_model, make_session, probe, wait_ready
from .fanout import PER_PROCESS_RATE, usable_cpus
from .prompts import ApproxTokenizer, LocalTokenizer, PromptFactory, Tokenizer, probe_server_tokenizer
from .results import (
    RESULTS_SCHEMA_VERSION,
    bench_results,
    fit_configmap,
    upload_results,
    worker_report,
    write_local,
)
from .runner import Runner, RunSettings
from .sweep import run_sweep

log = logging.getLogger("accelbench.bench")


class ConfigError(ValueError):
    pass


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m accelbench.workers.bench", description=__doc__.split("\n")[0])
    p.add_argument("--job", help=f"job payload: JSON text or @file (default: ${ENV_JOB})")
    p.add_argument("--endpoint", help=f"server base URL (default: ${ENV_ENDPOINT})")
    p.add_argument("--health-path", help=f"health path (default: ${ENV_HEALTH_PATH}; none: TCP connect)")
    p.add_argument("--ready-timeout", type=float, help="seconds to wait for the server")
    p.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    p.add_argument("--tokenizer", help="local tokenizer directory when the server has no /tokenize")
    p.add_argument("--no-server-tokenizer", action="store_true", help="do not use the engine's /tokenize")
    p.add_argument("--api", choices=[a.value for a in RequestApi])
    p.add_argument("--input-lengths", type=_ints)
    p.add_argument("--output-length", type=int)
    p.add_argument("--concurrency", type=_ints, help="closed-loop levels, e.g. 1,4,16 (empty string: none)")
    p.add_argument("--rates", type=_floats, help="open-loop Poisson request rates per second")
    p.add_argument("--requests", type=int, help="requests per cell")
    p.add_argument("--seconds", type=float, help="seconds per cell")
    p.add_argument("--warmup", type=int, help="warm-up requests before each cell (excluded)")
    p.add_argument("--slo-ttft-ms", type=float)
    p.add_argument("--slo-tpot-ms", type=float)
    p.add_argument("--slo-e2e-ms", type=float)
    p.add_argument("--slo-attainment", type=float, default=None)
    p.add_argument("--no-capacity-search", action="store_true")
    p.add_argument(
        "--no-client-calibration",
        action="store_true",
        help="skip measuring this client against a null server at the open-loop rates first",
    )
    p.add_argument("--max-concurrency", type=int, default=1024, help="capacity search ceiling")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--extra-body", default="{}", help="JSON merged into every request body")
    p.add_argument("--dollars-per-chip-hour", type=float)
    p.add_argument("--chips", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--transport", choices=["raw", "aiohttp"], default="raw", help="HTTP client for the measured requests"
    )
    p.add_argument(
        "--event-loop",
        choices=["auto", "uvloop", "asyncio"],
        default="auto",
        help="auto: uvloop when it is installed (fewer microseconds per network read), else asyncio's",
    )
    p.add_argument(
        "--client-processes",
        default="auto",
        help="most processes an open-loop cell's sends are spread over (auto: the CPUs this pod may use); "
        f"a rate gets one per {PER_PROCESS_RATE:g} req/s",
    )
    p.add_argument("--out", help="also write the full results JSON here")
    return p


def client_processes(text: str) -> int:
    if text == "auto":
        return usable_cpus()
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"--client-processes: 'auto' or a positive integer, not {text!r}")
    return value


def load_payload(args: argparse.Namespace, env: dict[str, str]) -> JobPayload | None:
    """The operator's payload (--job TEXT or @FILE, else the env var); None for a bare local run."""
    text = args.job if args.job is not None else env.get(ENV_JOB)
    if not text:
        return None
    if text.startswith("@"):
        with open(text[1:]) as f:
            text = f.read()
    try:
        payload = JobPayload.model_validate_json(text)
    except ValidationError as exc:
        raise ConfigError(f"{ENV_JOB} is not a valid job payload: {describe(exc)}") from None
    if not isinstance(payload.spec, InferenceBenchSpec):
        raise ConfigError(f"the bench client runs an InferenceBench, not a {payload.kind}")
    return payload


def resolve_workload(
    spec: InferenceBenchSpec | None, args: argparse.Namespace
) -> tuple[Workload, Slo | None, bool]:
    """Workload and SLO: the spec's, with command-line overrides applied and validated again."""
    workload = (spec.workload if spec else Workload()).model_dump()
    overrides = {
        "api": args.api,
        "input_lengths": args.input_lengths,
        "output_length": args.output_length,
        "concurrency": args.concurrency,
        "request_rates": args.rates,
        "requests_per_point": args.requests,
        "seconds_per_point": args.seconds,
        "warmup_requests": args.warmup,
    }
    workload.update({k: v for k, v in overrides.items() if v is not None})
    if args.rates is not None and args.concurrency is None:
        workload["concurrency"] = []  # --rates alone means an open-loop-only run
    slo = spec.slo.model_dump() if spec and spec.slo else {}
    for key, value in (
        ("ttft_ms", args.slo_ttft_ms),
        ("tpot_ms", args.slo_tpot_ms),
        ("e2e_ms", args.slo_e2e_ms),
        ("attainment", args.slo_attainment),
    ):
        if value is not None:
            slo[key] = value
    try:
        wl = Workload.model_validate(workload)
        bounded = any(slo.get(k) for k in ("ttft_ms", "tpot_ms", "e2e_ms"))
        slo_model = Slo.model_validate(slo) if bounded else None
    except ValueError as exc:
        raise ConfigError(f"invalid workload or slo: {exc}") from None
    search = (spec.capacity_search if spec else True) and not args.no_capacity_search
    return wl, slo_model, search


def served_name(payload: JobPayload | None) -> str | None:
    """The name requests ask for when the engine serves a LoRA adapter (its /v1/models lists the
    base model first, which is not what was trained)."""
    spec = payload.spec if payload else None
    adapter = spec.model.adapter if isinstance(spec, InferenceBenchSpec) else None
    return adapter.name if adapter is not None else None


def price_given(payload: JobPayload | None, args: argparse.Namespace) -> dict[str, Any] | None:
    """The price the results carry as an input (the plan's, or the command line's); None if unknown."""
    plan = payload.plan if payload else None
    if args.dollars_per_chip_hour is not None:
        dollars, source = args.dollars_per_chip_hour, "command line"
    elif plan is not None:
        dollars, source = plan.dollars_per_chip_hour, plan.price_source
    else:
        return None
    chips = args.chips or (plan.chips if plan else 1)
    return {"dollarsPerChipHour": dollars, "chips": chips, "priceSource": source}


async def pick_tokenizer(session, base_url: str, model: str, args: argparse.Namespace) -> Tokenizer:
    if not args.no_server_tokenizer:
        tok = await probe_server_tokenizer(session, base_url, model)
        if tok is not None:
            return tok
    local = args.tokenizer or os.environ.get(ENV_TOKENIZER_DIR)
    if local and os.path.isdir(local):
        return LocalTokenizer(local)
    log.warning("no exact tokenizer (server /tokenize or --tokenizer): input lengths are approximate")
    return ApproxTokenizer()


async def supports_ignore_eos(session, settings: RunSettings) -> bool:
    """Whether the server accepts ignore_eos/min_tokens. Strict servers (transformers serve)
    answer 4xx to unknown fields; then requests go without them, and answers that stop at EOS
    show up per cell as outputTokens.requestsShort."""
    if not settings.ignore_eos:
        return False
    from .openai import chat_body, completions_body

    build = chat_body if settings.api == "chat" else completions_body
    body = build(settings.model, "hello", 2, True, **settings.extra_body)
    status, text = await probe(session, settings.url, body)
    if status == 200:
        return True
    log.warning(
        "server refused ignore_eos/min_tokens (HTTP %s: %s): sending without them", status, text[:200]
    )
    return False


def versions() -> dict[str, str]:
    import aiohttp

    return {"accelbench": __version__, "python": platform.python_version(), "aiohttp": aiohttp.__version__}


async def run(args: argparse.Namespace, env: dict[str, str]) -> tuple[dict, Any]:
    payload = load_payload(args, env)
    workload, slo, search = resolve_workload(payload.spec if payload else None, args)  # type: ignore[arg-type]
    # Progress gauges from the start, so "0 of N cells" shows while the server is still loading.
    planned = len(workload.input_lengths) * (len(workload.concurrency) + len(workload.request_rates))
    progress = BenchMetrics(planned)
    port = metrics_port(env)
    server = start_metrics_server(port, progress) if port is not None else None
    try:
        return await measure(args, env, payload, workload, slo, search, progress)
    finally:
        if server is not None:
            server.stop()


async def measure(
    args: argparse.Namespace,
    env: dict[str, str],
    payload: JobPayload | None,
    workload: Workload,
    slo: Slo | None,
    search: bool,
    progress: BenchMetrics,
) -> tuple[dict, Any]:
    base_url = (args.endpoint or env.get(ENV_ENDPOINT) or "").rstrip("/")
    if not base_url:
        raise ConfigError(f"no endpoint: set {ENV_ENDPOINT} or --endpoint")
    health = args.health_path if args.health_path is not None else env.get(ENV_HEALTH_PATH)
    timeout = args.ready_timeout or float(env.get(ENV_READY_TIMEOUT) or 1800)
    ready = await wait_ready(base_url, health or None, timeout)
    if not ready.ready:
        raise TimeoutError(f"server {base_url} not ready after {ready.seconds:.0f} s ({ready.detail})")
    log.info("server ready after %.1f s", ready.seconds)
    async with make_session(4) as session:
        model = args.model or served_name(payload) or await discover_model(session, base_url)
        tokenizer = await pick_tokenizer(session, base_url, model, args)
        prompts = PromptFactory(tokenizer, seed=args.seed)
        await prompts.prepare(max(workload.input_lengths))
        settings = RunSettings(
            base_url=base_url,
            model=model,
            api=workload.api.value,
            output_length=workload.output_length,
            ignore_eos=workload.ignore_eos,
            request_timeout_s=args.request_timeout,
            extra_body=json.loads(args.extra_body),
            warmup_requests=workload.warmup_requests,
            seed=args.seed,
            transport=args.transport,
            max_processes=client_processes(args.client_processes),
            uvloop=loop_name(asyncio.get_running_loop()) == "uvloop",
        )
        ignore_eos = await supports_ignore_eos(session, settings)
        settings.ignore_eos = ignore_eos
        runner = Runner(settings, prompts)
        try:
            calibration = None
            if workload.request_rates and not args.no_client_calibration:
                calibration = await calibrate(runner, workload.request_rates, max(workload.input_lengths))
            sweep = await run_sweep(runner, workload, slo, search, args.max_concurrency, progress.on_cell)
        finally:
            runner.close()
    price = price_given(payload, args)
    if calibration is not None:  # a rate the client could not deliver: its cells say so
        limited = limited_rates(calibration)
        for cell in sweep.cells:
            if cell.get("requestRate") is not None:
                cell["clientLimited"] = cell["requestRate"] in limited
    compact = bench_results(sweep.cells, sweep.capacity, ready.seconds)
    compact.price_source = price["priceSource"] if price else None
    compact.client_overhead = calibration
    full = {
        "schemaVersion": RESULTS_SCHEMA_VERSION,
        "generator": {
            "name": "accelbench.workers.bench",
            "transport": args.transport,
            "eventLoop": loop_name(asyncio.get_running_loop()),
            "maxSendingProcesses": settings.max_processes,
            "ratePerSendingProcess": PER_PROCESS_RATE,
            **versions(),
        },
        "resource": payload.metadata.to_wire() if payload else {},
        "endpoint": base_url,
        "model": model,
        "api": workload.api.value,
        "workload": workload.to_wire(),
        "slo": slo.to_wire() if slo else None,
        "tokenizer": {
            "source": tokenizer.source,
            "exact": tokenizer.exact,
            "promptsOffTarget": prompts.inexact,
        },
        "serverStartupSeconds": ready.seconds,
        "ignoreEos": {"requested": workload.ignore_eos, "sent": ignore_eos},
        "definitions": {
            "ttft": "first token event - scheduled send time",
            "tpot": "(e2e - ttft) / (server output tokens - 1)",
            "itl": "per token: chunk gap / tokens in the chunk",
            "attainment": "share of all requests (errors included) meeting every SLO bound",
        },
        "cells": sweep.cells,
        "capacity": {str(k): v for k, v in sweep.capacity.items()},
        "clientOverhead": calibration.to_wire() if calibration else None,
        "price": price,
        "summary": compact.to_wire(),
    }
    if sweep.cells and all(c["completed"] == 0 for c in sweep.cells):
        raise RuntimeError(f"every request failed: {sweep.cells[0]['errorsByType']}")
    return full, compact


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop the client runs on (None: asyncio's default). Every send and every network
    read goes through it, so its per-callback cost bounds the rate one process can drive."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("--event-loop uvloop: uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def main(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    env = dict(os.environ) if env is None else env
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    try:
        with asyncio.Runner(loop_factory=loop_factory(args.event_loop)) as runner:
            full, compact = runner.run(run(args, env))
    except ConfigError as exc:
        log.error("%s", exc)
        write_report(worker_report(None, time.perf_counter() - started, versions(), exc), env=env)
        return ExitCode.INVALID_CONFIG
    except Exception as exc:
        log.exception("bench failed")
        write_report(worker_report(None, time.perf_counter() - started, versions(), exc), env=env)
        return ExitCode.ERROR
    write_local(full, args.out)
    results = {RESULTS_CONFIGMAP_KEY: fit_configmap(full)}
    report = worker_report(compact, time.perf_counter() - started, versions())
    output = env.get(ENV_OUTPUT_URI)
    if output:
        try:
            upload_results(full, report, output)
        except storage.OutputError as exc:
            # Measured, but not where the spec says: not retried (that would measure again).
            failed = storage.OutputError(f"the bench finished but {exc}")
            log.error("%s", failed)
            error = worker_report(None, time.perf_counter() - started, versions(), failed)
            write_report(error, env=env, extra=results)
            return ExitCode.INVALID_CONFIG
    write_report(report, env=env, extra=results)
    print(json.dumps(full["summary"], indent=1))
    return ExitCode.OK
