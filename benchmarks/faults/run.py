#!/usr/bin/env python3
"""Kill loop: real tiny runs while the operator is SIGKILLed and the apiserver frozen (issue 14).

What it does (every process it starts is stopped again, also on failure):

1. Starts a fresh local control plane (hack/localcluster.py), the local executor (hack/localexec.py:
   pods on the local-exec node run as real processes) and the operator.
2. Creates --finetunejobs tiny LoRA FinetuneJobs and --benches tiny InferenceBenches
   (`transformers serve` + the load generator), all at once.
3. Until every resource is terminal: SIGKILLs the operator every --kill-every seconds (uniform in the
   range) and restarts it at once; --freezes times, SIGSTOPs the kube-apiserver for --freeze-seconds
   (uniform) and SIGCONTs it. A watcher records every Job UID per resource (list + watch, relisted
   after each break) and every phase and progress time it sees.
4. Checks and writes --out: resources lost (not terminal, or not Succeeded with a valid result),
   duplicate runs (a second Job UID for a run), phase regressions, results that differ from what
   the worker reported (each worker's termination message on the executor's disk, ingested the way
   the operator does; a bench's full results in its results ConfigMap), runs whose progress moved.

    .venv/bin/python benchmarks/faults/run.py --finetunejobs 20 --benches 5
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from accelbench.api.contract import LABEL_NAME, RESULTS_CONFIGMAP_KEY
from accelbench.api.status import BenchResults
from accelbench.controller.ingest import ingest
from accelbench.cost import with_serving_cost
from accelbench.workers.testing import make_chat_dataset, make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import localcluster  # noqa: E402

GROUP, VERSION, NS = "accelbench.io", "v1alpha1", "default"
TERMINAL = ("Succeeded", "Failed")
ORDER = {"Pending": 0, "Scheduling": 1, "Suspended": 1, "Running": 2, "Succeeded": 3, "Failed": 3}


def finetune(name: str, model: Path, data: Path, steps: int) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples/quickstart/finetune-tiny-cpu.yaml").read_text())
    body["metadata"] = {"name": name, "namespace": NS}
    body["spec"]["model"]["uri"] = str(model)
    body["spec"]["dataset"]["uri"] = str(data)
    body["spec"]["training"]["maxSteps"] = steps
    return body


def bench(name: str, model: Path, port: int = 8000) -> dict[str, Any]:
    """The quickstart bench. Its server listens on `port`: the local executor runs every pod on this
    one host, so servers that run at once need ports of their own."""
    body = yaml.safe_load((ROOT / "examples/quickstart/inference-tiny-cpu.yaml").read_text())
    body["metadata"] = {"name": name, "namespace": NS}
    body["spec"]["model"]["uri"] = str(model)
    body["spec"]["server"]["port"] = port
    return body


class Watcher(threading.Thread):
    """Job UIDs per resource, from list + watch, relisting after every break (the apiserver freezes)."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(daemon=True)
        self.batch = client.BatchV1Api(api)
        self.uids: dict[tuple[str, str], set[str]] = defaultdict(set)  # (resource, job name) -> UIDs
        self.stop = threading.Event()

    def _see(self, job: Any) -> None:
        owner = (job.metadata.labels or {}).get(LABEL_NAME)
        if owner:
            self.uids[(owner, job.metadata.name)].add(job.metadata.uid)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                listed = self.batch.list_namespaced_job(NS, label_selector=LABEL_NAME, _request_timeout=10)
                for job in listed.items:
                    self._see(job)
                stream = watch.Watch().stream(
                    self.batch.list_namespaced_job,
                    NS,
                    label_selector=LABEL_NAME,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=30,
                    _request_timeout=40,
                )
                for event in stream:
                    self._see(event["object"])
                    if self.stop.is_set():
                        break
            except Exception:  # a frozen or restarting apiserver: list again
                time.sleep(1)


class Poller(threading.Thread):
    """Every resource's phase history and progress times, read every 2 s."""

    def __init__(self, api: client.ApiClient, names: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.custom = client.CustomObjectsApi(api)
        self.names = names  # name -> plural
        self.phases: dict[str, list[str]] = defaultdict(list)
        self.progress: dict[str, set[str]] = defaultdict(set)
        self.last: dict[str, dict[str, Any]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(2.0):
            for name, plural in self.names.items():
                try:
                    obj = self.custom.get_namespaced_custom_object(
                        GROUP, VERSION, NS, plural, name, _request_timeout=5
                    )
                except Exception:
                    continue
                status = obj.get("status") or {}
                phase = status.get("phase")
                if phase and (not self.phases[name] or self.phases[name][-1] != phase):
                    self.phases[name].append(phase)
                stamp = (status.get("progress") or {}).get("updatedAt")
                if stamp and phase == "Running":
                    self.progress[name].add(stamp)
                self.last[name] = obj

    def done(self) -> bool:
        return len(self.last) == len(self.names) and all(
            (o.get("status") or {}).get("phase") in TERMINAL for o in self.last.values()
        )


def regressions(history: list[str]) -> list[str]:
    """Phase moves backwards (Running -> Pending, Succeeded -> anything): each one named."""
    found = []
    for before, after in itertools.pairwise(history):
        if before in TERMINAL or (ORDER.get(after, 0) < ORDER.get(before, 0) and after != "Suspended"):
            found.append(f"{before} -> {after}")
    return found


def reported_results(execdir: Path, name: str, kind: str, dollars_per_hour: float) -> dict[str, Any] | None:
    """What the worker reported: rank 0's termination message on the executor's disk, ingested (and
    a bench's serving cost added) the way the operator does it."""
    for podir in sorted((execdir / NS).glob(f"{name}-{'train' if kind == 'FinetuneJob' else 'client'}-*")):
        for path in sorted(podir.glob("termination-log*")):
            results = ingest(path.read_text(errors="replace"), kind).results
            if isinstance(results, BenchResults):
                results = with_serving_cost(results, dollars_per_hour)
            if results is not None:
                return results.to_wire()
    return None


class Operator:
    def __init__(self, kubeconfig: Path, logdir: Path) -> None:
        self.kubeconfig, self.logdir, self.starts = kubeconfig, logdir, 0
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.starts += 1
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "POD_NAMESPACE": NS,
            "ACCELBENCH_OBSERVE_INTERVAL": "2",
        }
        log = (self.logdir / f"operator-{self.starts}.log").open("wb")
        argv = [sys.executable, "-m", "accelbench.controller", "--metrics-port", "0"]
        self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def kill(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="accelbench-faults-"))
    cluster = localcluster.start_cluster(tmp / "cp")
    executor: subprocess.Popen[bytes] | None = None
    operator = Operator(cluster.kubeconfig, tmp)
    watcher: Watcher | None = None
    poller: Poller | None = None
    try:
        api = cluster.api_client()
        localcluster.wait_nodes_ready(api, localcluster.create_node_pools(api))
        executor = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "hack/localexec.py"),
                f"--kubeconfig={cluster.kubeconfig}",
                f"--workdir={tmp / 'exec'}",
            ],
            stdout=(tmp / "localexec.log").open("wb"),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        kubectl = [str(localcluster.bin_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        subprocess.run(
            [*kubectl, "apply", "--server-side", "-f", str(ROOT / "crds")], check=True, capture_output=True
        )
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Established", "crd", "--all"], check=True, capture_output=True
        )
        model = make_tiny_model(tmp / "model", family="llama")
        data = make_chat_dataset(tmp / "chat.jsonl", n=64)

        names: dict[str, str] = {}
        bodies = [finetune(f"ft-{i:02d}", model, data, args.steps) for i in range(args.finetunejobs)]
        bodies += [bench(f"ib-{i:02d}", model, localcluster.free_port()) for i in range(args.benches)]
        watcher = Watcher(api)
        watcher.start()
        operator.start()
        custom = client.CustomObjectsApi(api)
        for body in bodies:
            plural = "finetunejobs" if body["kind"] == "FinetuneJob" else "inferencebenches"
            custom.create_namespaced_custom_object(GROUP, VERSION, NS, plural, body)
            names[body["metadata"]["name"]] = plural
        poller = Poller(api, names)
        poller.start()

        started = time.monotonic()
        kills, freezes, frozen_s = 0, [], 0.0
        freeze_at = sorted(rng.uniform(20, args.freeze_window) for _ in range(args.freezes))
        next_kill = started + rng.uniform(*args.kill_every)
        while not poller.done():
            now = time.monotonic()
            if now - started > args.timeout:
                break
            if freeze_at and now - started >= freeze_at[0]:
                freeze_at.pop(0)
                length = rng.uniform(*args.freeze_seconds)
                os.kill(cluster.pids["kube-apiserver"], signal.SIGSTOP)
                time.sleep(length)
                os.kill(cluster.pids["kube-apiserver"], signal.SIGCONT)
                freezes.append(round(length, 1))
                frozen_s += length
                print(f"[{now - started:6.0f} s] apiserver frozen {length:.0f} s", flush=True)
            elif now >= next_kill:
                operator.kill()
                operator.start()
                kills += 1
                next_kill = time.monotonic() + rng.uniform(*args.kill_every)
                print(f"[{now - started:6.0f} s] operator SIGKILLed and restarted ({kills})", flush=True)
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        time.sleep(5)  # the watcher's last events
        return verify(args, poller, watcher, api, tmp / "exec", kills, freezes, frozen_s, elapsed)
    finally:
        for thread in (watcher, poller):
            if thread is not None:
                thread.stop.set()
        operator.stop()
        if executor is not None:
            executor.terminate()
            try:
                executor.wait(20)
            except subprocess.TimeoutExpired:
                executor.kill()
        cluster.stop()
        print(f"logs: {tmp}")


def verify(
    args: argparse.Namespace,
    poller: Poller,
    watcher: Watcher,
    api: client.ApiClient,
    execdir: Path,
    kills: int,
    freezes: list[float],
    frozen_s: float,
    elapsed: float,
) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    lost, mismatched, regressed = [], [], {}
    for name, plural in poller.names.items():
        obj = poller.last.get(name) or {}
        status = obj.get("status") or {}
        kind = "FinetuneJob" if plural == "finetunejobs" else "InferenceBench"
        valid = any(
            c.get("type") == "ResultValid" and c.get("status") == "True" for c in status.get("conditions", [])
        )
        if status.get("phase") != "Succeeded" or not valid:
            lost.append(f"{name}: {status.get('phase')} {status.get('message', '')[:200]}")
            continue
        # The status must hold exactly what rank 0 (a bench: its load generator) reported.
        cost = status.get("cost") or {}
        per_hour = float(cost.get("chips", 0)) * float(cost.get("dollarsPerChipHour", 0.0))
        reported = reported_results(execdir, name, kind, per_hour)
        if reported != status.get("results"):
            mismatched.append(f"{name}: status {status.get('results')} != reported {reported}")
        if kind == "InferenceBench":  # and the full results are kept beside it
            try:
                json.loads(core.read_namespaced_config_map(f"{name}-results", NS).data[RESULTS_CONFIGMAP_KEY])
            except (ApiException, KeyError, TypeError, ValueError) as exc:
                mismatched.append(f"{name}: results ConfigMap unreadable: {exc}")
        moves = regressions(poller.phases[name])
        if moves:
            regressed[name] = moves
    duplicates = {f"{r}/{j}": sorted(u) for (r, j), u in watcher.uids.items() if len(u) > 1}
    progressed = sum(1 for name in poller.names if len(poller.progress[name]) >= 2)
    return {
        "command": "benchmarks/faults/run.py " + " ".join(sys.argv[1:]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, no GPU",
        "resources": {"finetunejobs": args.finetunejobs, "inferencebenches": args.benches},
        "faults": {
            "operator_sigkills": kills,
            "apiserver_freezes_s": freezes,
            "apiserver_frozen_total_s": round(frozen_s, 1),
        },
        "elapsed_s": round(elapsed, 1),
        "resources_lost": len(lost),
        "duplicate_runs": len(duplicates),
        "phase_regressions": len(regressed),
        "results_not_as_reported": len(mismatched),
        "runs_whose_progress_moved_while_running": progressed,
        "details": {
            "lost": lost,
            "duplicates": duplicates,
            "regressions": regressed,
            "mismatched": mismatched,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--finetunejobs", type=int, default=20)
    parser.add_argument("--benches", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--kill-every", type=float, nargs=2, default=(5.0, 30.0))
    parser.add_argument("--freezes", type=int, default=3)
    parser.add_argument("--freeze-seconds", type=float, nargs=2, default=(30.0, 120.0))
    parser.add_argument("--freeze-window", type=float, default=300.0, help="freezes start within this many s")
    parser.add_argument("--timeout", type=float, default=2400.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    ok = not (
        result["resources_lost"]
        or result["duplicate_runs"]
        or result["phase_regressions"]
        or result["results_not_as_reported"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
