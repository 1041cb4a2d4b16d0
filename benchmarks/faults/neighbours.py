#!/usr/bin/env python3
"""Hostile neighbours (issue 14): everything a shared cluster puts next to runs, at once, on a real
control plane, and how fast the runs beside it are still observed.

What it does (every process it starts is stopped again, also on failure):

1. Starts a fresh local control plane whose kwok pods stay Running (the scale benchmark's "hold"
   profile) with --nodes H100 hosts and --nodes H200 hosts. Each host gets a pod CIDR on the
   loopback net (127.3.N.0/24 for H100, 127.4.N.0/24 for H200), so kwok gives pods addresses this
   machine answers on: one metrics server on 0.0.0.0:9090 (the rendered workers' metrics port)
   serves every pod, and tells them apart by the address a connection came in on.
2. Starts the operator as a Deployment would (default 5 s observation interval).
3. Baseline: --healthy runs on the H200 hosts, whose metrics answer at once (step = seconds since
   the server started). Measured per run: pod Running -> status Running (watches), and the lag of
   status.progress.step behind the step being served (sampled every second).
4. Hostile, all at once, in namespace `hostile` (Pod Security `restricted` enforced) unless said:
   --slow runs on the H100 hosts whose /metrics sends one byte per second and never finishes; a Gaudi
   run (its SYS_NICE capability is refused by `restricted`); a run with a mistyped priorityClassName;
   a run whose Job name is held by a Job someone else made; a held run next to a Running pod that
   wears its worker's labels; a run in namespace `team-quota` whose ResourceQuota allows no Job.
   Measured: seconds from apply to the condition that names each bad case; afterwards every foreign
   object is checked unchanged and unowned.
5. Again --healthy runs beside all that, measured as in 3: the ratio to the baseline is the cost of
   the neighbours.

    .venv/bin/python benchmarks/faults/neighbours.py --out benchmarks/faults/neighbours.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import localcluster  # noqa: E402

from accelbench.api.contract import (  # noqa: E402
    GAUGE_LOSS,
    GAUGE_STEP,
    GAUGE_TOTAL_STEPS,
    LABEL_NAME,
    METRICS_PORT,
)

GROUP, VERSION, FT = "accelbench.io", "v1alpha1", "finetunejobs"
SLOW_NET, FAST_NET = "127.3.", "127.4."  # kwok pod CIDRs: H100 hosts trickle, H200 hosts answer at once
HOSTILE, QUOTA_NS, GOOD = "hostile", "team-quota", "good"
BAD_CASE_LIMIT_S = 60.0  # issue 14: a clear condition within a minute for every bad case


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


scale = _load("scale_run", ROOT / "benchmarks/scale/run.py")


# --------------------------------------------------------------------------- the metrics server


class MetricsServer(threading.Thread):
    """One listener for every kwok pod. A connection to a SLOW_NET address gets one byte per second
    of a page that never ends; any other gets the progress gauges at once (step = seconds since the
    server started, so a reader can tell how stale a status is)."""

    def __init__(self, port: int = METRICS_PORT) -> None:
        super().__init__(daemon=True, name="metrics")
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.sock = socket.create_server(("0.0.0.0", port), backlog=512, reuse_port=False)
        self.slow_connections = 0
        self.fast_pages = 0

    def step(self) -> int:
        return int(time.monotonic() - self.started)

    def page(self) -> bytes:
        body = f"{GAUGE_STEP} {self.step()}\n{GAUGE_TOTAL_STEPS} 1000000\n{GAUGE_LOSS} 1.5\n".encode()
        return b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body

    def serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5)
            conn.recv(4096)
            if conn.getsockname()[0].startswith(SLOW_NET):
                self.slow_connections += 1
                for byte in self.page() * 1000:
                    if self.stop.wait(1.0):
                        return
                    conn.sendall(bytes([byte]))
            else:
                self.fast_pages += 1
                conn.sendall(self.page())

    def run(self) -> None:
        self.sock.settimeout(0.5)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


# --------------------------------------------------------------------------- cluster and objects


def nodes(count: int) -> list[dict[str, Any]]:
    """`count` H100 and `count` H200 kwok hosts from hack/nodepools.yaml, pod CIDRs on loopback."""
    spec = localcluster.load_node_pools(localcluster.DEFAULT_NODE_POOLS)
    wanted = {"a3-high-h100": SLOW_NET, "a3-ultra-h200": FAST_NET, "gaudi3": None}
    spec["pools"] = [
        dict(p, count=count if wanted[p["name"]] else 1) for p in spec["pools"] if p["name"] in wanted
    ]
    out = []
    for node in localcluster.build_pool_nodes(spec):
        pool, index = node["metadata"]["name"].rsplit("-", 1)
        net = wanted[pool]
        if net:
            node["spec"]["podCIDR"] = f"{net}{index}.0/24"
        out.append(node)
    return out


def finetune(name: str, namespace: str, accelerator: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body = scale.finetune_body(name, accelerator)
    body["metadata"]["namespace"] = namespace
    body["spec"].update(spec)
    return body


def until(check: Any, what: str, timeout: float, interval: float = 0.5) -> Any:
    """Poll `check` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(client.ApiException):
            if value := check():
                return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


class Observer:
    """Watches pods and FinetuneJobs in one namespace: when each run's pod went Running and when its
    status did (monotonic, first seen)."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.pod_running: dict[str, float] = {}
        self.status_running: dict[str, float] = {}
        self.stop = threading.Event()

    def on_pod(self, _type: str, obj: dict[str, Any]) -> None:
        name = (obj["metadata"].get("labels") or {}).get(LABEL_NAME)
        if name and (obj.get("status") or {}).get("phase") == "Running":
            self.pod_running.setdefault(name, time.monotonic())

    def on_run(self, _type: str, obj: dict[str, Any]) -> None:
        if (obj.get("status") or {}).get("phase") == "Running":
            self.status_running.setdefault(obj["metadata"]["name"], time.monotonic())

    def start(self) -> None:
        feeds = (
            (f"/api/v1/namespaces/{self.namespace}/pods", LABEL_NAME, self.on_pod),
            (f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{FT}", "", self.on_run),
        )
        for path, selector, handler in feeds:

            def loop(path: str = path, selector: str = selector, handler: Any = handler) -> None:
                for event_type, obj in self.api.watch(path, selector, self.stop):
                    handler(event_type, obj)

            threading.Thread(target=loop, daemon=True).start()


def measure_healthy(
    raw: Any, custom: client.CustomObjectsApi, server: MetricsServer, prefix: str, count: int, sample_s: float
) -> dict[str, Any]:
    """Create `count` runs on the H200 hosts; observation latency and progress lag, as percentiles."""
    observer = Observer(raw, GOOD)
    observer.start()
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, GOOD, FT, finetune(name, GOOD, {"type": "h200", "count": 1})
        )
    until(lambda: len(observer.status_running) >= count, f"{prefix}: every run Running", timeout=300)
    lags: list[float] = []
    sampling_ends = time.monotonic() + sample_s
    while time.monotonic() < sampling_ends:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, GOOD, FT)["items"]
        served = server.step()
        for obj in items:
            if obj["metadata"]["name"].startswith(prefix + "-"):
                step = ((obj.get("status") or {}).get("progress") or {}).get("step")
                lags.append(float(served - step) if step is not None else float("inf"))
        time.sleep(1.0)
    observer.stop.set()
    latencies = [
        observer.status_running[n] - observer.pod_running[n] for n in names if n in observer.pod_running
    ]
    return {
        "runs": count,
        "pod_running_to_status_running_s": scale.percentiles(latencies),
        "status_progress_lag_s": scale.percentiles([x for x in lags if x != float("inf")]),
        "progress_samples_without_progress": sum(1 for x in lags if x == float("inf")),
        "progress_samples": len(lags),
    }


def namespace(core: client.CoreV1Api, name: str, labels: dict[str, str] | None = None) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))


def squatter_job(name: str) -> client.V1Job:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels={"owner": "someone-else"}),
        spec=client.V1JobSpec(
            suspend=True,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    containers=[
                        client.V1Container(
                            name="c",
                            image="busybox",
                            security_context=client.V1SecurityContext(
                                allow_privilege_escalation=False,
                                run_as_non_root=True,
                                capabilities=client.V1Capabilities(drop=["ALL"]),
                                seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
                            ),
                        )
                    ],
                )
            ),
        ),
    )


def accelbench_labels(labels: dict[str, str]) -> dict[str, str]:
    """The labels the operator puts on a worker pod. Not the Job controller's own (controller-uid,
    job-name): a pod wearing those is adopted by the Job (and deleted while it is suspended)."""
    return {k: v for k, v in labels.items() if k.startswith("accelbench.io/")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="accelbench-neighbours-"))
    os.environ["ACCELBENCH_BIN_DIR"] = str(scale.hold_bin_dir(tmp))
    server = MetricsServer()
    server.start()
    cluster = localcluster.start_cluster(tmp / "cp", kwok_pod_stages="fast", timeout=180)
    operator = None
    try:
        api = cluster.api_client()
        raw = scale.Api(cluster.kubeconfig, 32)
        core, batch, custom = client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)
        pool = nodes(args.nodes)
        scale.create_nodes(raw, pool, 8)
        scale.wait_nodes(raw, len(pool), 120)
        kubectl = [str(localcluster.bin_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        subprocess.run(
            [*kubectl, "apply", "--server-side", "-f", str(ROOT / "crds")], check=True, capture_output=True
        )
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Established", "crd", "--all"], check=True, capture_output=True
        )
        namespace(core, HOSTILE, {"pod-security.kubernetes.io/enforce": "restricted"})
        namespace(core, QUOTA_NS)
        namespace(core, GOOD)
        operator = scale.Operator(cluster.kubeconfig, tmp, 5.0)
        operator.wait_ready()

        baseline = measure_healthy(raw, custom, server, "base", args.healthy, args.sample_seconds)
        print(f"baseline: {json.dumps(baseline)}", flush=True)

        # --- the neighbours, all at once
        quota = client.V1ResourceQuota(
            metadata=client.V1ObjectMeta(name="no-jobs"),
            spec=client.V1ResourceQuotaSpec(hard={"count/jobs.batch": "0"}),
        )
        core.create_namespaced_resource_quota(QUOTA_NS, quota)
        until(
            lambda: core.read_namespaced_resource_quota("no-jobs", QUOTA_NS).status.hard, "quota counted", 60
        )
        squatter = batch.create_namespaced_job(HOSTILE, squatter_job("squatted-train"))
        h100 = {"type": "h100", "count": 1}
        bad = {
            "ps-gaudi": (
                HOSTILE,
                finetune("ps-gaudi", HOSTILE, {"type": "gaudi3", "count": 1}),
                "Running",
                "FailedCreate",
            ),
            "bad-priority": (
                HOSTILE,
                finetune("bad-priority", HOSTILE, h100, scheduling={"priorityClassName": "gpu-hihg"}),
                "Running",
                "FailedCreate",
            ),
            "squatted": (HOSTILE, finetune("squatted", HOSTILE, h100), "Applied", "NameConflict"),
            "over-quota": (QUOTA_NS, finetune("over-quota", QUOTA_NS, h100), "Applied", "QuotaExceeded"),
        }
        applied: dict[str, float] = {}
        for i in range(args.slow):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, HOSTILE, FT, finetune(f"slow-{i}", HOSTILE, h100)
            )
        for name, (ns, body, _, _) in bad.items():
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, FT, body)
            applied[name] = time.monotonic()
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            HOSTILE,
            FT,
            finetune("spoofed", HOSTILE, {"type": "h200", "count": 1}, suspend=True),
        )
        shown: dict[str, dict[str, Any]] = {}

        def all_shown() -> bool:
            for name, (ns, _, type_, reason) in bad.items():
                if name in shown:
                    continue
                cond = condition(custom.get_namespaced_custom_object(GROUP, VERSION, ns, FT, name), type_)
                if cond.get("reason") == reason:
                    shown[name] = {
                        "seconds": round(time.monotonic() - applied[name], 1),
                        "condition": f"{type_}={cond['status']} {reason}",
                        "message": cond.get("message", "")[:300],
                    }
            return len(shown) == len(bad)

        until(all_shown, "a condition for every bad case", 180)
        spoof_job = until(
            lambda: batch.list_namespaced_job(HOSTILE, label_selector=f"{LABEL_NAME}=spoofed").items,
            "spoofed's Job",
            60,
        )[0]
        gaudi_node = core.list_node(label_selector="habana.ai/device.name=gaudi3").items[0].metadata.name
        spoof = client.V1Pod(
            metadata=client.V1ObjectMeta(
                name="spoofed-train-0-fake", labels=accelbench_labels(spoof_job.spec.template.metadata.labels)
            ),
            spec=client.V1PodSpec(
                node_name=gaudi_node,
                tolerations=[client.V1Toleration(operator="Exists")],
                security_context=client.V1PodSecurityContext(
                    run_as_non_root=True, seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault")
                ),
                containers=squatter_job("x").spec.template.spec.containers,
            ),
        )
        core.create_namespaced_pod(HOSTILE, spoof)
        until(
            lambda: (
                len([p for p in core.list_namespaced_pod(HOSTILE).items if p.status.phase == "Running"])
                > args.slow
            ),
            "slow workers and the spoofing pod Running",
            180,
        )
        time.sleep(15)  # several observation passes with the slow scrapes in flight

        beside = measure_healthy(raw, custom, server, "beside", args.healthy, args.sample_seconds)
        print(f"beside the neighbours: {json.dumps(beside)}", flush=True)

        # --- nothing foreign changed or owned; the held run stayed held
        after = batch.read_namespaced_job("squatted-train", HOSTILE)
        spoof_after = core.read_namespaced_pod("spoofed-train-0-fake", HOSTILE)
        managers = {
            m.manager
            for m in (after.metadata.managed_fields or []) + (spoof_after.metadata.managed_fields or [])
        }
        spoofed = custom.get_namespaced_custom_object(GROUP, VERSION, HOSTILE, FT, "spoofed")
        slow_phases = [
            (o.get("status") or {}).get("phase")
            for o in custom.list_namespaced_custom_object(GROUP, VERSION, HOSTILE, FT)["items"]
            if o["metadata"]["name"].startswith("slow-")
        ]
        checks = {
            "squatter_job_spec_unchanged": after.spec.template.spec == squatter.spec.template.spec,
            "squatter_job_unowned": not after.metadata.owner_references,
            "squatter_labels_unchanged": after.metadata.labels == {"owner": "someone-else"},
            "spoofing_pod_unowned": not spoof_after.metadata.owner_references,
            "operator_wrote_no_foreign_field": "accelbench-operator" not in managers,
            "spoofed_run_still_suspended": (spoofed.get("status") or {}).get("phase") == "Suspended",
            "slow_runs_all_running": slow_phases.count("Running") == args.slow,
            "operator_alive": operator.process.poll() is None,
        }
        p99_beside = (beside["pod_running_to_status_running_s"] or {}).get("p99")
        p99_base = (baseline["pod_running_to_status_running_s"] or {}).get("p99")
        return {
            "benchmark": "hostile neighbours (issue 14)",
            "command": "python "
            + " ".join([str(Path(sys.argv[0]).resolve().relative_to(ROOT)), *sys.argv[1:]]),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": scale.machine(),
            "config": vars(args),
            "bad_cases": shown,
            "bad_case_limit_s": BAD_CASE_LIMIT_S,
            "baseline": baseline,
            "beside_neighbours": beside,
            "observation_p99_ratio_beside_over_baseline": round(p99_beside / p99_base, 2)
            if p99_beside and p99_base
            else None,
            "slow_metric_connections_served": server.slow_connections,
            "checks": checks,
            "ok": all(checks.values())
            and all(c["seconds"] <= BAD_CASE_LIMIT_S for c in shown.values())
            and p99_beside is not None
            and p99_beside < 10.0,
        }
    finally:
        if operator is not None:
            operator.stop()
        cluster.stop()
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5, help="H100 hosts and H200 hosts each (8 GPUs a host)")
    parser.add_argument("--slow", type=int, default=40, help="runs whose /metrics sends a byte a second")
    parser.add_argument("--healthy", type=int, default=20, help="runs measured before and beside them")
    parser.add_argument("--sample-seconds", type=float, default=30.0, help="progress-lag sampling per set")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
