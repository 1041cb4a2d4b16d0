#!/usr/bin/env python3
"""Kueue admitting queued FinetuneJobs against a ClusterQueue quota (issue 17), on a control plane of
its own: the operator (event-driven, as shipped) and Kueue (built from its pinned Go module,
hack/kueue.py, webhooks on) side by side.

1. A fresh local control plane with kwok pods that stay Running (the scale benchmark's "hold"
   stages), --nodes A3 H100 hosts (8 GPUs each), the CRDs, the operator, Kueue.
2. A ResourceFlavor for the H100 pool, a ClusterQueue with --quota-gpus of nvidia.com/gpu, a
   LocalQueue.
3. --jobs FinetuneJobs of 2 H100s each naming the queue, POSTed from a thread pool. More GPUs are
   asked for than the quota holds, so quota/2 runs are admitted and the rest wait.
4. Watches on Workloads and pods record, from the first create: when the quota filled (quota/2
   Workloads holding quota), the most Workloads that ever held quota at once and the most pods that
   ever ran at once (both must stay within the quota), and how many runs said Queued.
5. --release admitted runs are deleted; the time until as many waiting ones are admitted.

    .venv/bin/python benchmarks/scale/kueue_quota.py --jobs 1000 --nodes 250 --quota-gpus 1600
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import kueue  # noqa: E402
import localcluster  # noqa: E402


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


scale = _load("scale_run_kueue", ROOT / "benchmarks/scale/run.py")

QUEUE, CQ, FLAVOR = "gpu-queue", "gpu-cq", "h100"
GPUS_PER_RUN = 2
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/default/workloads"


def true(obj: dict[str, Any], kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


class Watch:
    """Workloads holding quota and pods Running, as the watches see them, with their peaks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holding: set[str] = set()
        self.running: set[str] = set()
        self.max_holding = self.max_running = 0
        self.admitted_at: dict[str, float] = {}
        self.queued_runs: set[str] = set()
        self.stop = threading.Event()

    def on_workload(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            if kind != "DELETED" and true(obj, "QuotaReserved") and not true(obj, "Finished"):
                self.holding.add(name)
                self.admitted_at.setdefault(name, time.monotonic())
            else:
                self.holding.discard(name)
            self.max_holding = max(self.max_holding, len(self.holding))

    def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        deleting = obj["metadata"].get("deletionTimestamp")
        with self.lock:
            if kind != "DELETED" and not deleting and (obj.get("status") or {}).get("phase") == "Running":
                self.running.add(name)
            else:
                self.running.discard(name)
            self.max_running = max(self.max_running, len(self.running))

    def on_run(self, kind: str, obj: dict[str, Any]) -> None:
        conditions = (obj.get("status") or {}).get("conditions") or []
        if any(c.get("reason") == "Queued" for c in conditions):
            with self.lock:
                self.queued_runs.add(obj["metadata"]["name"])

    def start(self, api: Any) -> None:
        feeds = (
            (WORKLOADS, "", self.on_workload),
            (f"/api/v1/namespaces/{scale.NAMESPACE}/pods", scale.NAME_LABEL, self.on_pod),
            (
                f"/apis/{scale.GROUP}/{scale.VERSION}/namespaces/{scale.NAMESPACE}/{scale.PLURAL}",
                "",
                self.on_run,
            ),
        )
        for path, selector, handler in feeds:

            def loop(path: str = path, selector: str = selector, handler: Any = handler) -> None:
                for event_type, obj in api.watch(path, selector, self.stop):
                    handler(event_type, obj)

            threading.Thread(target=loop, daemon=True, name=f"watch {path}").start()

    def count(self) -> int:
        with self.lock:
            return len(self.admitted_at)


def queue_objects(quota_gpus: int) -> list[dict[str, Any]]:
    api = "kueue.x-k8s.io/v1beta2"
    return [
        {
            "apiVersion": api,
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR},
            "spec": {"nodeLabels": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}},
        },
        {
            "apiVersion": api,
            "kind": "ClusterQueue",
            "metadata": {"name": CQ},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": FLAVOR,
                                "resources": [{"name": "nvidia.com/gpu", "nominalQuota": quota_gpus}],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": api,
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": scale.NAMESPACE},
            "spec": {"clusterQueue": CQ},
        },
    ]


def wait(check: Any, timeout: float, what: str) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic()
        time.sleep(0.25)
    print(f"timed out waiting for {what}", flush=True)
    return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="accelbench-kueue-"))
    os.environ["ACCELBENCH_BIN_DIR"] = str(scale.hold_bin_dir(tmp))
    cluster = localcluster.start_cluster(tmp / "cp", kwok_pod_stages="fast", timeout=180)
    operator = queues = None
    watch = Watch()
    try:
        api = scale.Api(cluster.kubeconfig, pool=args.create_workers + 8)
        pools = {p["name"]: p for p in localcluster.load_node_pools()["pools"]}
        spec = {
            "defaults": localcluster.load_node_pools().get("defaults", {}),
            "pools": [{**pools["a3-high-h100"], "name": "kueue-h100", "count": args.nodes}],
        }
        nodes = localcluster.build_pool_nodes(spec)
        scale.create_nodes(api, nodes, workers=8)
        scale.wait_nodes(api, len(nodes), timeout=300)
        kubectl = [str(localcluster.bin_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        subprocess.run(
            [*kubectl, "apply", "--server-side", "-f", str(ROOT / "crds")], check=True, capture_output=True
        )
        operator = scale.Operator(cluster.kubeconfig, tmp, 5.0)
        operator.wait_ready()
        queues = kueue.start_kueue(
            tmp / "kueue", cluster.workdir, cluster.kubeconfig, localcluster.bin_dir() / "kubectl"
        )
        for obj in queue_objects(args.quota_gpus):
            subprocess.run(
                [*kubectl, "apply", "-f", "-"],
                input=json.dumps(obj),
                text=True,
                check=True,
                capture_output=True,
            )
        watch.start(api)
        admitted_target = args.quota_gpus // GPUS_PER_RUN
        jobs = [(f"ft-{i:05d}", {"type": "h100", "count": GPUS_PER_RUN}) for i in range(args.jobs)]
        print(f"creating {args.jobs} queued FinetuneJobs; the quota holds {admitted_target}", flush=True)
        t0 = time.monotonic()
        _, retries = scale.create_finetunejobs(api, jobs, args.create_workers, queueName=QUEUE)
        create_s = time.monotonic() - t0
        full_at = wait(lambda: watch.count() >= admitted_target, args.timeout, "the quota to fill")
        time.sleep(args.settle)  # anything admitted beyond the quota would show by now
        with watch.lock:
            admitted_before = set(watch.admitted_at)
        names = sorted(admitted_before)[: args.release]
        owners = []
        for wl in api.json("GET", WORKLOADS).get("items") or []:
            refs = [r["name"] for r in wl["metadata"].get("ownerReferences") or [] if r["kind"] == "Job"]
            if wl["metadata"]["name"] in names and refs:
                owners.append(refs[0].removesuffix("-train"))
        print(f"releasing {len(owners)} admitted runs", flush=True)
        t1 = time.monotonic()
        for run_name in owners:
            api.request(
                "DELETE",
                f"/apis/{scale.GROUP}/{scale.VERSION}/namespaces/{scale.NAMESPACE}/{scale.PLURAL}/{run_name}",
            ).read()
        refilled_at = wait(
            lambda: watch.count() >= admitted_target + len(owners),
            args.timeout,
            "freed quota to be re-admitted",
        )
        time.sleep(args.settle)
        with watch.lock:
            result = {
                "benchmark": "Kueue admitting queued FinetuneJobs against a quota (issue 17)",
                "command": " ".join(
                    ["python", str(Path(sys.argv[0]).resolve().relative_to(ROOT)), *sys.argv[1:]]
                ),
                "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "machine": scale.machine(),
                "versions": {**scale.versions(), "kueue": "v0.17.0"},
                "params": {k: v for k, v in vars(args).items() if k != "out"},
                "results": {
                    "create_s": round(create_s, 2),
                    "create_retries": retries,
                    "runs_the_quota_holds": admitted_target,
                    "quota_full_s": round(full_at - t0, 2) if full_at else None,
                    "max_workloads_holding_quota": watch.max_holding,
                    "max_pods_running": watch.max_running,
                    "within_quota": watch.max_holding <= admitted_target
                    and watch.max_running <= admitted_target,
                    "runs_that_said_queued": len(watch.queued_runs),
                    "released": len(owners),
                    "freed_quota_readmitted_s": round(refilled_at - t1, 2) if refilled_at else None,
                    "timed_out": full_at is None or refilled_at is None,
                },
                "peak_rss_mib": {
                    name: scale.snapshot({name: pid})[name]["hwm_mib"]
                    for name, pid in (
                        ("operator", operator.pid),
                        ("kueue", queues.process.pid if queues.process else 0),
                    )
                    if pid
                },
            }
        return result
    finally:
        watch.stop.set()
        if queues is not None:
            queues.stop()
        if operator is not None:
            operator.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=250, help="A3 H100 hosts (8 GPUs, 4 runs each)")
    parser.add_argument("--quota-gpus", type=int, default=1600)
    parser.add_argument(
        "--release", type=int, default=100, help="admitted runs deleted after the quota fills"
    )
    parser.add_argument("--settle", type=float, default=15.0)
    parser.add_argument("--create-workers", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "kueue-quota.json"
    )
    args = parser.parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["results"], indent=1))
    print(f"wrote {args.out}")
    return 0 if result["results"]["within_quota"] and not result["results"]["timed_out"] else 1


if __name__ == "__main__":
    sys.exit(main())
