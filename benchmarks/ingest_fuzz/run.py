#!/usr/bin/env python3
"""Bad numbers never reach status (issue 15): generated worker reports and metrics pages through the
operator's ingestion, then each accepted result as a server-side dry-run status write on a real
kube-apiserver (hack/localcluster.py, the CRDs of crds/).

Reports start from valid finetune and bench reports; each gets 1-3 fields replaced by odd values
(NaN, infinities, +-1e30, 1e308, 2^70, negative numbers, wrong types, long strings) or an unknown field
added, or is replaced by garbage text. Pages are Prometheus text with the progress gauges at odd
values. Counted: exceptions out of ingestion (must be 0), reports accepted, and dry-run status writes
the apiserver rejected (must be 0: a rejected write is a status that freezes).

    .venv/bin/python benchmarks/ingest_fuzz/run.py --out benchmarks/ingest_fuzz/results.json
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import localcluster  # noqa: E402

from accelbench.api.contract import GAUGE_LOSS, GAUGE_MFU, GAUGE_STEP, GAUGE_TOKENS_PER_SECOND  # noqa: E402
from accelbench.controller.ingest import ingest  # noqa: E402
from accelbench.controller.progress import parse_progress  # noqa: E402

GROUP, VERSION, NS = "accelbench.io", "v1alpha1", "default"

FINETUNE_REPORT: dict[str, Any] = {
    "schemaVersion": 1,
    "kind": "finetune",
    "ok": True,
    "framework": "jax",
    "device": "NVIDIA H200",
    "chips": 2,
    "finetune": {
        "steps": 50,
        "trainedTokens": 1_000_000,
        "tokensPerSecond": 4200.0,
        "tokensPerSecondPerChip": 2100.0,
        "mfu": 0.38,
        "flopsPerToken": 6e9,
        "peakTflopsPerChip": 989.0,
        "firstLoss": 2.0,
        "finalLoss": 0.9,
        "evalLoss": 1.0,
        "perplexity": 2.7,
        "lossHistory": [2.0, 1.1, 0.9],
    },
    "timings": {"totalSeconds": 900.0, "setupSeconds": 30.0, "trainSeconds": 600.0},
    "memory": {"peakBytesPerChip": 80_000_000_000, "capacityBytesPerChip": 141_000_000_000},
}
BENCH_REPORT: dict[str, Any] = {
    "schemaVersion": 1,
    "kind": "bench",
    "ok": True,
    "bench": {
        "cells": [
            {
                "inputLength": 512,
                "concurrency": 4,
                "outputTokensPerSecond": 400.0,
                "requestsPerSecond": 3.1,
                "ttftP50Ms": 50.0,
                "ttftP99Ms": 90.0,
                "tpotP50Ms": 9.0,
                "e2eP99Ms": 1200.0,
                "attainment": 0.99,
                "errors": 0,
            }
        ],
        "capacityConcurrency": 4,
        "peakOutputTokensPerSecond": 400.0,
        "dollarsPerMillionTokensAtCapacity": 3.4,
        "serverStartupSeconds": 40.0,
    },
}
SEEDS = (
    ("FinetuneJob", "finetunejobs", FINETUNE_REPORT),
    ("InferenceBench", "inferencebenches", BENCH_REPORT),
)
ODD_VALUES: list[Any] = [
    float("nan"), float("inf"), -float("inf"), -1e30, 1e30, 1e308, -1, 0, 2**70, -(2**70), 2**63, 1.5, 1e19,
    "x" * 300, "", None, True, [], {}, [1.0, float("nan")], {"k": 2**64}, 0.5, 7,
]  # fmt: skip
GARBAGE = ["", "Traceback (most recent call last):", "[1,2]", "null", '{"schemaVersion": 1}', "{" * 50]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        out.append((*prefix, key))
        out += _paths(value, (*prefix, key))
    return out


def _set(report: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = report
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def mutated_report(rng: random.Random, seed: dict[str, Any]) -> str:
    """A seed report with 1-3 fields replaced or added, as the JSON text a worker could write (NaN
    and Infinity included: Python's json writes them)."""
    if rng.random() < 0.02:
        return rng.choice(GARBAGE)
    report = json.loads(json.dumps(seed))
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_paths(report))
        if rng.random() < 0.1:
            path = (*path[:-1], "unknownField")
        try:
            _set(report, path, copy.deepcopy(rng.choice(ODD_VALUES)))  # never shared: no cycles
        except (KeyError, IndexError, TypeError):
            continue
    return json.dumps(report)


def mutated_page(rng: random.Random) -> str:
    gauges = [GAUGE_STEP, GAUGE_LOSS, GAUGE_MFU, GAUGE_TOKENS_PER_SECOND]
    values = ["NaN", "+Inf", "-Inf", "-1", "0", "1e19", "9.3e18", "3", "0.4", "1e308", "-1e30", "12", "x"]
    lines = [f"{g} {rng.choice(values)}" for g in gauges if rng.random() < 0.8]
    return "\n".join(lines) + "\n"


def body(kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"uri": "gs://bucket/models/m", "family": "llama", "size": "8b"}}
    if kind == "FinetuneJob":
        spec |= {"dataset": {"uri": "gs://bucket/data/d.jsonl"}, "accelerator": {"type": "h100", "count": 1}}
    else:
        spec |= {"accelerator": {"type": "h100", "count": 1}, "server": {"engine": "vllm"}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, "spec": spec}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="accelbench-ingest-fuzz-"))
    cluster = localcluster.start_cluster(tmp / "cp", timeout=180)
    try:
        api = cluster.api_client()
        kubectl = [str(localcluster.bin_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        subprocess.run(
            [*kubectl, "apply", "--server-side", "-f", str(ROOT / "crds")], check=True, capture_output=True
        )
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Established", "crd", "--all"], check=True, capture_output=True
        )
        custom = client.CustomObjectsApi(api)
        for kind, plural, _ in SEEDS:
            custom.create_namespaced_custom_object(GROUP, VERSION, NS, plural, body(kind, "fuzz"))
        counts = {"reports": 0, "accepted": 0, "exceptions": 0, "pages": 0, "pages_accepted": 0}
        rejected: list[str] = []

        def write(plural: str, status: dict[str, Any]) -> None:
            try:
                custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, NS, plural, "fuzz", {"status": status}, dry_run="All"
                )
            except client.ApiException as exc:
                rejected.append(f"{exc.status}: {str(exc.body)[:300]} <- {json.dumps(status)[:300]}")

        started = time.monotonic()
        with ThreadPoolExecutor(args.writers) as pool:
            futures = []
            for _ in range(args.reports):
                kind, plural, seed = rng.choice(SEEDS)
                text = mutated_report(rng, seed)
                counts["reports"] += 1
                try:
                    got = ingest(text, kind, generation=1)
                except Exception:  # ingest promises a condition for anything; count a broken promise
                    counts["exceptions"] += 1
                    continue
                status: dict[str, Any] = {"conditions": [got.condition.to_wire()]}
                if got.valid and got.results is not None:
                    counts["accepted"] += 1
                    status["results"] = got.results.to_wire()
                futures.append(pool.submit(write, plural, status))
            now = dt.datetime.now(dt.UTC)
            for _ in range(args.pages):
                counts["pages"] += 1
                try:
                    progress = parse_progress(mutated_page(rng), now)
                except Exception:
                    counts["exceptions"] += 1
                    continue
                if progress is not None:
                    counts["pages_accepted"] += 1
                    futures.append(pool.submit(write, "finetunejobs", {"progress": progress}))
            for future in futures:
                future.result()
        elapsed = time.monotonic() - started
        return {
            "benchmark": "ingestion fuzz with dry-run status writes (issue 15)",
            "command": "python "
            + " ".join([str(Path(sys.argv[0]).resolve().relative_to(ROOT)), *sys.argv[1:]]),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, no GPU",
            "config": {k: v for k, v in vars(args).items() if k != "out"},
            **counts,
            "status_writes": len(futures),
            "rejected_status_writes": len(rejected),
            "rejected_examples": rejected[:10],
            "seconds": round(elapsed, 1),
            "ok": counts["exceptions"] == 0 and not rejected,
        }
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=100_000)
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--writers", type=int, default=16, help="dry-run status writes in flight")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
