#!/usr/bin/env python3
"""Scale benchmark: many FinetuneJobs across many simulated accelerator nodes on a real control plane.

What it does, in order (every process it starts is stopped again, also on failure):

1. Starts a fresh local control plane (hack/localcluster.py: etcd, kube-apiserver,
   kube-controller-manager, kube-scheduler, kwok) in a temporary directory.
2. Creates --nodes kwok nodes from the pool shapes of hack/nodepools.yaml: 50 % A3 H100 hosts
   (8 GPUs), 25 % TPU v5p hosts (4 chips, single-host slice 2x2x1), 25 % Gaudi3 hosts (8 cards).
3. Installs the CRDs and starts the operator as a subprocess
   (`python -m accelbench.controller --metrics-port P`, ACCELBENCH_OBSERVE_INTERVAL=S).
4. Creates --jobs FinetuneJobs (single-host shapes, interleaved) from a thread pool and measures,
   from the first create: when every child Job exists, when every pod is Running (the cluster's
   own lower bound) and when every FinetuneJob's status.phase is Running or later.
5. Keeps everything running for --steady-seconds to measure the operator's idle cost with that
   many resources, then records CPU seconds (utime+stime from /proc/<pid>/stat) and peak RSS
   (VmHWM) of the operator and of every control-plane component.

Pod lifecycle: kwok's "fast" profile moves a Job pod Running -> Succeeded in the same pass and
"general" after 1-6 s (its default delays; our rendered pods carry no per-pod delay annotation), so
with either the operator would mostly see finished Jobs. The default profile here, "hold", is the
repo's "fast" stages without the pod-complete stage: pods become Running at once and stay Running,
like hours-long training runs. It is written to a private binary directory (symlinks to the cached
binaries plus the derived stages file) handed to localcluster through ACCELBENCH_BIN_DIR.

    .venv/bin/python benchmarks/scale/run.py --jobs 1000 --nodes 500
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime as dt
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from accelbench.api.contract import LABEL_NAME as NAME_LABEL

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import localcluster  # noqa: E402

GROUP, VERSION, PLURAL = "accelbench.io", "v1alpha1", "finetunejobs"
NAMESPACE = "default"
CLK_TCK = os.sysconf("SC_CLK_TCK")
RUNNING_OR_LATER = ("Running", "Succeeded")
COMPONENTS = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok")


# --------------------------------------------------------------------------- workload shapes


@dataclass(frozen=True)
class Shape:
    """One accelerator pool and the single-host FinetuneJob shape placed on it."""

    key: str
    pool: str  # pool in hack/nodepools.yaml whose labels, taints and capacity are used
    share: float  # fraction of --nodes
    accelerator: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)  # overrides of the pool's labels


SHAPES = (
    Shape("h100", "a3-high-h100", 0.50, {"type": "h100", "count": 2}),
    # GKE labels a node with its slice's topology; a single-host v5p slice is 2x2x1, and the
    # operator's nodeSelector asks for exactly the job's topology.
    Shape(
        "tpu-v5p",
        "tpu-v5p-2x2x2",
        0.25,
        {"type": "tpu-v5p", "topology": "2x2x1"},
        {"cloud.google.com/gke-tpu-topology": "2x2x1", "cloud.google.com/gke-nodepool": "tpu-v5p-2x2x1"},
    ),
    Shape("gaudi3", "gaudi3", 0.25, {"type": "gaudi3", "count": 4}),
)


def finetune_body(name: str, accelerator: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FinetuneJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"uri": "gs://bucket/models/llama-3.1-8b", "family": "llama", "size": "8b"},
            "dataset": {"uri": "gs://bucket/data/chat.jsonl"},
            "method": {"type": "lora", "rank": 16},
            "training": {"seqLength": 1024, "globalBatchSize": 8, "maxSteps": 10},
            "accelerator": accelerator,
            **spec,
        },
    }
    return body


def rendered_requests(accelerator: dict[str, Any]) -> dict[str, str]:
    """The pod requests the operator renders for this shape (its own planner and renderer)."""
    from accelbench.api import parse_resource
    from accelbench.catalog import load_catalog
    from accelbench.controller.children import build_children

    body = finetune_body("probe", accelerator)
    body["metadata"]["uid"] = "probe"
    _, rendered = build_children(parse_resource(body), load_catalog())
    job = next(o for o in rendered.objects if o["kind"] == "Job")
    requests: dict[str, str] = {}
    for container in job["spec"]["template"]["spec"]["containers"]:
        requests.update((container.get("resources") or {}).get("requests") or {})
    return requests


def pods_per_host(requests: dict[str, str], allocatable: dict[str, str]) -> int:
    fits = []
    for resource, amount in requests.items():
        want = parse_quantity(amount)
        if want <= 0:
            continue
        fits.append(int(parse_quantity(allocatable.get(resource, "0")) // want))
    return min([*fits, 110])  # 110 = the pool's pods capacity


def plan_workload(nodes: int, jobs: int) -> dict[str, Any]:
    """Node pools for --nodes, and how many jobs of each shape (proportional to free slots)."""
    spec = localcluster.load_node_pools()
    pools = {p["name"]: p for p in spec["pools"]}
    counts = [int(nodes * s.share) for s in SHAPES]
    counts[0] += nodes - sum(counts)
    out_pools, per_shape = [], []
    for shape, count in zip(SHAPES, counts, strict=True):
        base = pools[shape.pool]
        pool = {
            **base,
            "name": f"scale-{shape.key}",
            "count": count,
            "labels": {**base.get("labels", {}), **shape.labels},
        }
        capacity = {**spec.get("defaults", {}).get("capacity", {}), **pool.get("capacity", {})}
        allocatable = {**capacity, **pool.get("allocatable", {})}
        requests = rendered_requests(shape.accelerator)
        per_host = pods_per_host(requests, allocatable)
        out_pools.append(pool)
        per_shape.append(
            {
                "shape": shape.key,
                "accelerator": shape.accelerator,
                "nodes": count,
                "pod_requests": requests,
                "pods_per_host": per_host,
                "slots": count * per_host,
            }
        )
    slots = sum(s["slots"] for s in per_shape)
    # Largest-remainder split of min(jobs, slots) proportional to slots; any excess waits.
    placeable = min(jobs, slots)
    raw = [placeable * s["slots"] / slots if slots else 0 for s in per_shape]
    alloc = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - alloc[i], reverse=True)[: placeable - sum(alloc)]:
        alloc[i] += 1
    alloc[0] += jobs - placeable  # the ones that cannot fit queue on the largest pool
    for s, n in zip(per_shape, alloc, strict=True):
        s["jobs"] = n
    return {
        "spec": {"defaults": spec.get("defaults", {}), "pools": out_pools},
        "shapes": per_shape,
        "slots": slots,
        "expected_running": placeable,
    }


def job_list(plan: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    shapes = [s["accelerator"] for s in plan["shapes"] for _ in range(s["jobs"])]
    random.Random(0).shuffle(shapes)  # interleave accelerators, deterministically
    return [(f"ft-{i:05d}", acc) for i, acc in enumerate(shapes)]


# --------------------------------------------------------------------------- kwok profile


def hold_bin_dir(tmp: Path) -> Path:
    """A binary dir whose kwok-stages-fast.yaml never completes pods (see the module docstring)."""
    src = localcluster.ensure_binaries()
    out = tmp / "bin"
    out.mkdir()
    for entry in src.iterdir():
        if entry.name != "kwok-stages-fast.yaml":
            (out / entry.name).symlink_to(entry.resolve())
    stages = [
        doc
        for doc in yaml.safe_load_all((src / "kwok-stages-fast.yaml").read_text())
        if doc and doc["metadata"]["name"] != "pod-complete"
    ]
    (out / "kwok-stages-fast.yaml").write_text(yaml.safe_dump_all(stages, sort_keys=False))
    return out


# --------------------------------------------------------------------------- process stats


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime (fields 14, 15)


def proc_status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    return 0


def snapshot(pids: dict[str, int]) -> dict[str, dict[str, float]]:
    out = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            out[name] = {
                "cpu_s": round(proc_cpu_seconds(pid), 2),
                "rss_mib": round(proc_status_kib(pid, "VmRSS") / 1024, 1),
                "hwm_mib": round(proc_status_kib(pid, "VmHWM") / 1024, 1),
            }
    return out


def cpu_delta(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> dict[str, float]:
    return {k: round(b[k]["cpu_s"] - a[k]["cpu_s"], 2) for k in b if k in a}


class Sampler(threading.Thread):
    """Once a second: CPU seconds and RSS of every process, for the timeline in the results."""

    def __init__(self, pids: dict[str, int], t0: Callable[[], float]) -> None:
        super().__init__(daemon=True)
        self.pids, self.t0, self.samples = pids, t0, []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(1.0):
            snap = snapshot(self.pids)
            self.samples.append(
                {
                    "t": round(time.monotonic() - self.t0(), 1),
                    **{k: [v["cpu_s"], v["rss_mib"]] for k, v in snap.items()},
                }
            )


# --------------------------------------------------------------------------- raw API access


class Api:
    """JSON in and out through the kubernetes client's transport (TLS, client certs), no models."""

    def __init__(self, kubeconfig: Path, pool: int) -> None:
        cfg = client.Configuration()
        kube_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = pool
        self.client = client.ApiClient(cfg)

    def request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        timeout: Any = 30.0,
        content_type: str = "application/json",
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if hasattr(self.client, "param_serialize"):  # kubernetes >= 37 (openapi-generator 7)
            serialized = self.client.param_serialize(
                method=method, resource_path=path, query_params=query or [], header_params=headers, body=body
            )
            return self.client.call_api(*serialized, _request_timeout=timeout)
        # Older clients: the REST layer itself, which leaves the status to us when not preloading.
        self.client.update_params_for_auth(headers, query or [], ["BearerToken"])
        return self.client.rest_client.request(
            method,
            self.client.configuration.host + path,
            query_params=query or [],
            headers=headers,
            body=body,
            _preload_content=False,
            _request_timeout=timeout,
        )

    def json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        resp = self.request(method, path, **kw)
        data = resp.read()
        if not 200 <= resp.status < 300:
            raise ApiException(http_resp=resp)
        return json.loads(data) if data else {}

    def watch(self, path: str, selector: str, stop: threading.Event) -> Iterator[tuple[str, dict[str, Any]]]:
        """List, then watch from that resourceVersion; re-list when the watch ends or expires."""
        while not stop.is_set():
            try:
                query = [("labelSelector", selector)] if selector else []
                page = self.json("GET", path, query=query, timeout=60)
                for item in page.get("items") or []:
                    yield "LISTED", item
                rv = page["metadata"]["resourceVersion"]
                while not stop.is_set():
                    q = [*query, ("watch", "true"), ("resourceVersion", rv)]
                    q += [("allowWatchBookmarks", "true"), ("timeoutSeconds", "60")]
                    resp = self.request("GET", path, query=q, timeout=(10, 90))
                    if resp.status != 200:
                        raise ApiException(http_resp=resp)
                    for line in getattr(resp, "response", resp):  # the urllib3 response
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            raise RuntimeError(event["object"].get("message", "watch error"))
                        rv = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            yield event["type"], event["object"]
                        if stop.is_set():
                            return
            except Exception as exc:  # expired resourceVersion, timeouts: re-list
                if not stop.is_set():
                    print(f"watch {path}: {type(exc).__name__}: {exc}; re-listing", file=sys.stderr)
                    time.sleep(0.5)


# --------------------------------------------------------------------------- tracking


class Tracker:
    """First-seen times (monotonic) per FinetuneJob name, fed by three watches."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.job_seen: dict[str, float] = {}
        self.pod_running: dict[str, float] = {}
        self.phase_first: dict[str, dict[str, float]] = {}
        self.phase: dict[str, str] = {}
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def on_job(self, _type: str, obj: dict[str, Any]) -> None:
        name = (obj["metadata"].get("labels") or {}).get(NAME_LABEL)
        if name:
            with self.lock:
                self.job_seen.setdefault(name, time.monotonic())

    def on_pod(self, _type: str, obj: dict[str, Any]) -> None:
        name = (obj["metadata"].get("labels") or {}).get(NAME_LABEL)
        if name and (obj.get("status") or {}).get("phase") in RUNNING_OR_LATER:
            with self.lock:
                self.pod_running.setdefault(name, time.monotonic())

    def on_finetune(self, _type: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        phase = (obj.get("status") or {}).get("phase") or "None"
        with self.lock:
            self.phase[name] = phase
            self.phase_first.setdefault(name, {}).setdefault(phase, time.monotonic())

    def start(self, api: Api) -> None:
        feeds = (
            (f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", NAME_LABEL, self.on_job),
            (f"/api/v1/namespaces/{NAMESPACE}/pods", NAME_LABEL, self.on_pod),
            (f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}", "", self.on_finetune),
        )
        for path, selector, handler in feeds:

            def loop(path: str = path, selector: str = selector, handler: Any = handler) -> None:
                for event_type, obj in api.watch(path, selector, self.stop):
                    handler(event_type, obj)

            thread = threading.Thread(target=loop, daemon=True, name=f"watch {path}")
            thread.start()
            self.threads.append(thread)

    def running_at(self, name: str) -> float | None:
        firsts = self.phase_first.get(name, {})
        times = [firsts[p] for p in RUNNING_OR_LATER if p in firsts]
        return min(times) if times else None

    def counts(self) -> dict[str, int]:
        with self.lock:
            by_phase: dict[str, int] = {}
            for phase in self.phase.values():
                by_phase[phase] = by_phase.get(phase, 0) + 1
            return {
                "jobs": len(self.job_seen),
                "pods_running": len(self.pod_running),
                "running_or_later": sum(1 for n in self.phase_first if self.running_at(n) is not None),
                **{f"phase_{k}": v for k, v in sorted(by_phase.items())},
            }


def percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    v = sorted(values)

    def pct(p: float) -> float:
        return round(v[min(len(v) - 1, round(p / 100 * (len(v) - 1)))], 2)

    return {"p50": pct(50), "p90": pct(90), "p99": pct(99), "max": round(v[-1], 2)}


# --------------------------------------------------------------------------- operator


class Operator:
    def __init__(self, kubeconfig: Path, logdir: Path, observe_interval: float) -> None:
        self.metrics_port = localcluster.free_port()
        self.health_port = localcluster.free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "ACCELBENCH_OBSERVE_INTERVAL": str(observe_interval),
            "POD_NAMESPACE": NAMESPACE,
        }
        self.log = logdir / "operator.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "accelbench.controller",
                    "--metrics-port",
                    str(self.metrics_port),
                    "--liveness",
                    f"http://127.0.0.1:{self.health_port}/healthz",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
            )
        self.pid = self.process.pid

    def wait_ready(self, timeout: float = 120.0) -> None:
        def ok() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"operator exited with {self.process.returncode}; see {self.log}")
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                return r.status == 200

        localcluster.wait_until(ok, "operator liveness", timeout)

    def metrics(self) -> dict[str, float]:
        """The operator's own reconcile counters and time, its API requests and rate-limit waits."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith(
                (
                    "accelbench_reconciles_total",
                    "accelbench_reconcile_duration_seconds_sum",
                    "accelbench_api_requests_total",
                    "accelbench_api_throttled_seconds",
                )
            ):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
            if line.startswith("accelbench_reconcile_duration_seconds_count"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# --------------------------------------------------------------------------- phases


def create_nodes(api: Api, nodes: list[dict[str, Any]], workers: int) -> None:
    def one(node: dict[str, Any]) -> None:
        node = dict(node)
        status = node.pop("status")
        api.json("POST", "/api/v1/nodes", body=node)
        name = node["metadata"]["name"]
        api.json(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, nodes))


def wait_nodes(api: Api, count: int, timeout: float) -> None:
    def ready() -> bool:
        items = api.json("GET", "/api/v1/nodes", timeout=60).get("items") or []
        good = 0
        for node in items:
            conds = (node.get("status") or {}).get("conditions") or []
            taints = (node.get("spec") or {}).get("taints") or []
            is_ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
            if is_ready and not any(t["key"].startswith("node.kubernetes.io/") for t in taints):
                good += 1
        return good >= count

    localcluster.wait_until(ready, f"{count} nodes Ready", timeout)


def create_finetunejobs(
    api: Api, jobs: list[tuple[str, dict[str, Any]]], workers: int, **spec: Any
) -> tuple[dict[str, float], int]:
    """POST every FinetuneJob from a thread pool; returns monotonic create-returned times and retries."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
    created: dict[str, float] = {}
    retries = 0
    lock = threading.Lock()

    def one(item: tuple[str, dict[str, Any]]) -> None:
        nonlocal retries
        name, accelerator = item
        for attempt in range(10):
            resp = api.request("POST", path, body=finetune_body(name, accelerator, **spec))
            resp.read()
            if 200 <= resp.status < 300 or resp.status == 409:
                created[name] = time.monotonic()
                return
            if resp.status in (429, 500, 503, 504) and attempt < 9:
                with lock:
                    retries += 1
                time.sleep(0.2 * (attempt + 1))
                continue
            raise ApiException(http_resp=resp)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, jobs))
    return created, retries


def machine() -> dict[str, Any]:
    cpu_model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError):
        mem_kib = proc_status_kib_meminfo()
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def proc_status_kib_meminfo() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return 0


def versions() -> dict[str, str]:
    out = {}
    kubectl = localcluster.bin_dir() / "kubectl"
    with contextlib.suppress(Exception):
        done = subprocess.run(
            [str(kubectl), "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30
        )
        out["kubectl"] = json.loads(done.stdout)["clientVersion"]["gitVersion"]
    with contextlib.suppress(Exception):
        import kopf

        out["kopf"] = getattr(kopf, "__version__", "?")
    out["kubernetes_python"] = client.__version__ if hasattr(client, "__version__") else "?"
    return out


# --------------------------------------------------------------------------- main


def api_requests(op_metrics: dict[str, float], runs: int) -> dict[str, Any]:
    """The operator's API requests per run by method, and how many the apiserver answered 429."""
    per_method: dict[str, float] = {}
    throttled = 0.0
    for key, value in op_metrics.items():
        if not key.startswith("accelbench_api_requests_total{"):
            continue
        labels = dict(part.split("=", 1) for part in key[key.index("{") + 1 : -1].split(","))
        method, code = labels["method"].strip('"'), labels["code"].strip('"')
        per_method[method] = per_method.get(method, 0.0) + value
        throttled += value if code == "429" else 0.0
    return {
        "per_run_by_method": {m: round(v / runs, 2) for m, v in sorted(per_method.items())},
        "writes_per_run": round(sum(v for m, v in per_method.items() if m != "GET") / runs, 2),
        "answered_429": int(throttled),
        "waited_in_rate_limit_s": op_metrics.get("accelbench_api_throttled_seconds"),
    }


def _peer_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("scale_peer", Path(__file__).resolve().parent / "peer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_peer(
    api: Api,
    cluster: localcluster.Cluster,
    kubectl: list[str],
    tmp: Path,
    count: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The same number of runs through KubeRay on the same control plane (benchmarks/scale/peer.py),
    measured the same way; accelbench's runs stay Running meanwhile."""
    peer = _peer_module()
    kuberay = peer.KubeRay(cluster.kubeconfig, kubectl, tmp)
    tracker = peer.RayTracker()
    try:
        kuberay.wait_ready()
        time.sleep(2.0)
        pids = {"kuberay": kuberay.pid, **{n: cluster.pids[n] for n in COMPONENTS}}
        tracker.start(api, NAMESPACE)
        before = snapshot(pids)
        names = [f"ray-{i:05d}" for i in range(count)]
        print(f"peer: creating {count} RayClusters with {args.create_workers} threads ...")
        t0 = time.monotonic()
        created = peer.create_rayclusters(api, names, NAMESPACE, args.create_workers)
        create_s = time.monotonic() - t0
        deadline, last_print = t0 + args.timeout, 0.0
        while time.monotonic() < deadline:
            c = tracker.counts()
            if min(c.values()) >= count:
                break
            if time.monotonic() - last_print >= 10:
                print(f"  peer t={time.monotonic() - t0:6.1f}s {c}", flush=True)
                last_print = time.monotonic()
            time.sleep(0.25)
        done_at = snapshot(pids)
        time.sleep(args.settle_seconds)
        steady_from = snapshot(pids)
        time.sleep(args.steady_seconds)
        steady_to = snapshot(pids)
        final_counts = tracker.counts()
        with tracker.lock:
            pod_lat = [tracker.pod_seen[n] - created[n] for n in created if n in tracker.pod_seen]
            ready_lat = [tracker.ready[n] - created[n] for n in created if n in tracker.ready]
            result = {
                "operator": "KubeRay ray-operator v1.5.0 (reconcile concurrency 1, QPS 100, burst 200)",
                "runs": count,
                "create_s": round(create_s, 2),
                "all_head_pods_exist_s": peer.summary(tracker.pod_seen, t0),
                "all_pods_running_s": peer.summary(tracker.pod_running, t0),
                "all_ready_s": peer.summary(tracker.ready, t0),
                "timed_out": min(final_counts.values()) < count,
                "final_counts": final_counts,
                "head_pod_latency_from_own_create_s": percentiles(pod_lat),
                "ready_latency_from_own_create_s": percentiles(ready_lat),
                "cpu_seconds_burst": cpu_delta(before, done_at),
                "steady_state_cpu_percent": {
                    k: round(v / args.steady_seconds * 100, 1)
                    for k, v in cpu_delta(steady_from, steady_to).items()
                },
                "peak_rss_mib": {k: v["hwm_mib"] for k, v in steady_to.items()},
            }
        print(f"peer: {peer.dump({k: v for k, v in result.items() if not isinstance(v, dict)})}")
        return result
    finally:
        tracker.stop.set()
        kuberay.stop()


def ratios(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, float | None]:
    """accelbench / KubeRay, each measured from its own first create on the same control plane."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a is not None and b else None

    results = ours["results"]
    return {
        "child_exists_time": ratio(results["all_child_jobs_exist_s"], peer["all_head_pods_exist_s"]),
        "pods_running_time": ratio(results["all_pods_running_s"], peer["all_pods_running_s"]),
        "status_running_time": ratio(results["all_finetunejobs_running_s"], peer["all_ready_s"]),
        "burst_cpu_seconds": ratio(
            ours["cpu_seconds"]["burst_first_create_to_all_running"].get("operator"),
            peer["cpu_seconds_burst"].get("kuberay"),
        ),
        "idle_cpu": ratio(
            ours["steady_state_cpu_percent"].get("operator"), peer["steady_state_cpu_percent"].get("kuberay")
        ),
        "peak_rss": ratio(ours["peak_rss_mib"].get("operator"), peer["peak_rss_mib"].get("kuberay")),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = plan_workload(args.nodes, args.jobs)
    jobs = job_list(plan)
    for s in plan["shapes"]:
        print(
            f"shape {s['shape']} {s['accelerator']}: {s['nodes']} nodes x {s['pods_per_host']} pods/host "
            f"= {s['slots']} slots, {s['jobs']} jobs"
        )
    if plan["expected_running"] < args.jobs:
        print(f"note: only {plan['expected_running']} of {args.jobs} jobs fit at once; the rest wait")
    # Findings on the shapes as rendered (not used for the run): does a full-host shape fit a host?
    full_host = {}
    pool_spec = {p["name"]: p for p in plan["spec"]["pools"]}
    defaults = plan["spec"]["defaults"].get("capacity", {})
    for key, acc in (
        ("h100 count 8", {"type": "h100", "count": 8}),
        ("gaudi3 count 8", {"type": "gaudi3", "count": 8}),
    ):
        pool = pool_spec["scale-h100" if key.startswith("h100") else "scale-gaudi3"]
        cap = {**defaults, **pool.get("capacity", {})}
        req = rendered_requests(acc)
        full_host[key] = {
            "pod_requests": req,
            "pods_per_host": pods_per_host(req, {**cap, **pool.get("allocatable", {})}),
        }

    tmp = Path(tempfile.mkdtemp(prefix="accelbench-scale-"))
    if args.kwok_profile == "hold":
        os.environ["ACCELBENCH_BIN_DIR"] = str(hold_bin_dir(tmp))
        profile = "fast"  # the file of that name in the private bin dir is the hold variant
    else:
        profile = args.kwok_profile
    cluster: localcluster.Cluster | None = None
    operator: Operator | None = None
    tracker = Tracker()
    sampler: Sampler | None = None
    t0_box = [time.monotonic()]
    try:
        started = time.monotonic()
        cluster = localcluster.start_cluster(tmp / "cp", kwok_pod_stages=profile, timeout=180)
        atexit.register(cluster.stop)
        api = Api(cluster.kubeconfig, pool=max(args.create_workers, 8) + 4)
        boot_s = time.monotonic() - started

        nodes = localcluster.build_pool_nodes(plan["spec"])
        started = time.monotonic()
        create_nodes(api, nodes, workers=8)
        wait_nodes(api, len(nodes), timeout=300)
        nodes_s = time.monotonic() - started
        print(f"control plane up in {boot_s:.1f}s; {len(nodes)} nodes Ready in {nodes_s:.1f}s")

        kubectl = [str(localcluster.bin_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        subprocess.run(
            [*kubectl, "apply", "--server-side", "-f", str(ROOT / "crds")], check=True, capture_output=True
        )
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"],
            check=True,
            capture_output=True,
        )

        operator = Operator(cluster.kubeconfig, tmp, args.observe_interval)
        operator.wait_ready()
        time.sleep(2.0)  # let kopf's watches settle so startup is not part of the measurement
        pids = {"operator": operator.pid, **{n: cluster.pids[n] for n in COMPONENTS}}
        tracker.start(api)
        sampler = Sampler({**pids, "benchmark": os.getpid()}, lambda: t0_box[0])
        before = snapshot({**pids, "benchmark": os.getpid()})

        print(f"creating {len(jobs)} FinetuneJobs with {args.create_workers} threads ...")
        t0 = time.monotonic()
        t0_box[0] = t0
        sampler.start()
        created, retries = create_finetunejobs(api, jobs, args.create_workers)
        create_s = time.monotonic() - t0
        print(
            f"created {len(created)} in {create_s:.1f}s ({len(created) / create_s:.0f}/s, {retries} retries)"
        )

        t_jobs = t_pods = t_running = None
        deadline = t0 + args.timeout
        last_print = 0.0
        while time.monotonic() < deadline:
            c = tracker.counts()
            now = time.monotonic()
            with tracker.lock:
                if t_jobs is None and c["jobs"] >= len(jobs):
                    t_jobs = max(tracker.job_seen.values()) - t0
                if t_pods is None and c["pods_running"] >= plan["expected_running"]:
                    t_pods = sorted(tracker.pod_running.values())[plan["expected_running"] - 1] - t0
                if t_running is None and c["running_or_later"] >= plan["expected_running"]:
                    times = sorted(t for n in tracker.phase_first if (t := tracker.running_at(n)) is not None)
                    t_running = times[plan["expected_running"] - 1] - t0
            if now - last_print >= 10:
                load = os.getloadavg()[0]
                print(f"  t={now - t0:6.1f}s {c} load={load:.1f}", flush=True)
                last_print = now
            if t_jobs is not None and t_running is not None and t_pods is not None:
                break
            time.sleep(0.25)
        done_at = snapshot({**pids, "benchmark": os.getpid()})
        burst_end = time.monotonic()
        print(
            f"all Jobs at {t_jobs}s, all pods Running at {t_pods}s, all FinetuneJobs Running at {t_running}s"
        )

        time.sleep(args.settle_seconds)  # the passes still queued when the last run said Running
        steady_from = snapshot(pids)
        time.sleep(args.steady_seconds)
        steady_to = snapshot(pids)
        steady = {
            k: round(v / args.steady_seconds * 100, 1) for k, v in cpu_delta(steady_from, steady_to).items()
        }
        print(f"steady state CPU % over {args.steady_seconds}s: {steady}")

        final = snapshot({**pids, "benchmark": os.getpid()})
        op_metrics = {}
        with contextlib.suppress(Exception):
            op_metrics = operator.metrics()
        sampler.stop_event.set()

        with tracker.lock:
            job_lat = [tracker.job_seen[n] - created[n] for n in created if n in tracker.job_seen]
            job_from_t0 = [tracker.job_seen[n] - t0 for n in created if n in tracker.job_seen]
            pod_from_t0 = [tracker.pod_running[n] - t0 for n in created if n in tracker.pod_running]
            run_lat = [r - created[n] for n in created if (r := tracker.running_at(n)) is not None]
            run_from_t0 = [r - t0 for n in created if (r := tracker.running_at(n)) is not None]
            lag = [
                r - tracker.pod_running[n]
                for n in created
                if (r := tracker.running_at(n)) is not None and n in tracker.pod_running
            ]
        counts = tracker.counts()
        op_log = operator.log.read_text(errors="replace") if operator.log.exists() else ""
        ours = {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": machine(),
            "versions": versions(),
            "params": {
                "jobs": args.jobs,
                "nodes": args.nodes,
                "observe_interval_s": args.observe_interval,
                "kwok_profile": args.kwok_profile,
                "create_workers": args.create_workers,
                "steady_seconds": args.steady_seconds,
                "settle_seconds": args.settle_seconds,
            },
            "workload": {k: plan[k] for k in ("shapes", "slots", "expected_running")},
            "full_host_shapes_on_these_pools": full_host,
            "setup_s": {"control_plane": round(boot_s, 1), "nodes_ready": round(nodes_s, 1)},
            "results": {
                "create_s": round(create_s, 2),
                "create_rate_per_s": round(len(created) / create_s, 1),
                "create_retries": retries,
                "all_child_jobs_exist_s": round(t_jobs, 2) if t_jobs is not None else None,
                "all_pods_running_s": round(t_pods, 2) if t_pods is not None else None,
                "all_finetunejobs_running_s": round(t_running, 2) if t_running is not None else None,
                "timed_out": t_running is None or t_jobs is None,
                "final_counts": counts,
                "child_job_latency_from_own_create_s": percentiles(job_lat),
                "child_job_time_from_first_create_s": percentiles(job_from_t0),
                "pod_running_time_from_first_create_s": percentiles(pod_from_t0),
                "running_latency_from_own_create_s": percentiles(run_lat),
                "running_time_from_first_create_s": percentiles(run_from_t0),
                "status_lag_after_pod_running_s": percentiles(lag),
            },
            "cpu_seconds": {
                "burst_first_create_to_all_running": cpu_delta(before, done_at),
                "burst_wall_s": round(burst_end - t0, 2),
                "total_since_process_start": {k: v["cpu_s"] for k, v in final.items()},
            },
            "steady_state_cpu_percent": steady,
            "peak_rss_mib": {k: v["hwm_mib"] for k, v in final.items()},
            "operator_metrics": op_metrics,
            "operator_api_requests": api_requests(op_metrics, len(jobs)),
            "operator_log": {
                "lines": op_log.count("\n"),
                "errors": op_log.count("[ERROR"),
                "warnings": op_log.count("[WARNING"),
            },
            "timeline": sampler.samples,
        }
        if args.peer == "kuberay":
            ours["peer"] = run_peer(api, cluster, kubectl, tmp, len(jobs), args)
            ours["ratio_to_peer"] = ratios(ours, ours["peer"])
        return ours
    finally:
        tracker.stop.set()
        if sampler is not None:
            sampler.stop_event.set()
        if operator is not None:
            operator.stop()
            if args.keep_logs:
                (args.out / "logs").mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(OSError):
                    (args.out / "logs" / "operator.log").write_bytes(operator.log.read_bytes()[-2_000_000:])
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument(
        "--observe-interval",
        type=float,
        default=float(os.environ.get("ACCELBENCH_OBSERVE_INTERVAL", "5")),
        help="ACCELBENCH_OBSERVE_INTERVAL for the operator (default 5, the operator's default)",
    )
    parser.add_argument("--kwok-profile", choices=("hold", "fast", "general"), default="hold")
    parser.add_argument("--create-workers", type=int, default=16)
    parser.add_argument("--steady-seconds", type=float, default=30.0)
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=30.0,
        help="wait this long after every run is Running before the idle window starts (the passes "
        "and progress reads queued by the last status changes); the same for the peer",
    )
    parser.add_argument("--timeout", type=float, default=1500.0, help="give up waiting after this many s")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument(
        "--name", default=None, help="results file name (default results-<jobs>x<nodes>.json)"
    )
    parser.add_argument("--keep-logs", action="store_true", help="copy the operator log to OUT/logs")
    parser.add_argument(
        "--peer",
        choices=("kuberay", "none"),
        default="kuberay",
        help="after accelbench, the same number of runs through a Go operator on the same control plane",
    )
    args = parser.parse_args(argv)
    if args.out.suffix == ".json":  # a file (the test suite's form), else a directory
        args.out, args.name = args.out.parent, args.out.name
    args.out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    path = args.out / (args.name or f"results-{args.jobs}x{args.nodes}.json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: v for k, v in result["results"].items() if not isinstance(v, dict)}
    print(json.dumps(summary, indent=1))
    burst = result["cpu_seconds"]["burst_first_create_to_all_running"]
    print(f"operator CPU s (burst): {burst.get('operator')}")
    print(f"peak RSS MiB: {result['peak_rss_mib']}")
    if "ratio_to_peer" in result:
        print(f"accelbench / KubeRay: {result['ratio_to_peer']}")
    print(f"wrote {path}")
    timed_out = result["results"]["timed_out"] or result.get("peer", {}).get("timed_out", False)
    return 0 if not timed_out else 1


if __name__ == "__main__":
    sys.exit(main())
