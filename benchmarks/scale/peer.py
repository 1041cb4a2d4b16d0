"""The Go peer of the scale benchmark (issue 17): KubeRay's ray-operator, built from its pinned Go
module by hack/build-servers.sh (.servers/kuberay, CRDs in .servers/kuberay-crds), on the same
control plane as accelbench, turning RayClusters into pods.

Why KubeRay: it is a controller-runtime operator of the same kind as ours (a custom resource per
run, made into pods and Services, status written back) and publishes its own scale figures. The
Kubeflow training-operator v1.8 waits for webhook certificates issued to an in-cluster Service
before it reconciles anything, which nothing here can route to.

Each RayCluster is a head group only (one pod: the same one-pod-per-run shape as a single-host
FinetuneJob), its pod tolerating the pools' taints and asking 100m CPU. KubeRay runs as shipped:
reconcile concurrency 1, client QPS 100 / burst 200 (its defaults), leader election off.
Measured like the accelbench phase: from the first create, when every head pod exists (the
children), when every head pod is Running, when every RayCluster's status.state is "ready"; the
operator's CPU seconds and peak RSS.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SERVERS = REPO / ".servers"
BINARY = SERVERS / "kuberay"
CRDS = SERVERS / "kuberay-crds"
RAY_GROUP, RAY_VERSION, RAY_PLURAL = "ray.io", "v1", "rayclusters"
CLUSTER_LABEL = "ray.io/cluster"  # KubeRay labels every pod of a RayCluster with its name
READY = "ready"


def missing() -> list[str]:
    return [str(p) for p in (BINARY, CRDS) if not p.exists()]


def raycluster(name: str, namespace: str) -> dict[str, Any]:
    resources = {"cpu": "100m", "memory": "256Mi"}
    return {
        "apiVersion": f"{RAY_GROUP}/{RAY_VERSION}",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "rayVersion": "2.46.0",
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {
                    "spec": {
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [
                            {
                                "name": "ray-head",
                                "image": "rayproject/ray:2.46.0",
                                "resources": {"requests": resources, "limits": resources},
                            }
                        ],
                    }
                },
            },
        },
    }


class KubeRay:
    def __init__(self, kubeconfig: Path, kubectl: list[str], logdir: Path) -> None:
        self.kubectl = kubectl
        files = sorted(CRDS.glob("*.yaml"))
        subprocess.run(
            [*kubectl, "apply", "--server-side", *[a for f in files for a in ("-f", str(f.resolve()))]],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                *kubectl,
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                f"crd/{RAY_PLURAL}.{RAY_GROUP}",
            ],
            check=True,
            capture_output=True,
        )
        import localcluster

        self.health_port = localcluster.free_port()
        self.log = logdir / "kuberay.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    str(BINARY),
                    f"--metrics-addr=127.0.0.1:{localcluster.free_port()}",
                    f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
                    "--enable-leader-election=false",
                ],
                env={**os.environ, "KUBECONFIG": str(kubeconfig)},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.pid = self.process.pid

    def wait_ready(self, timeout: float = 120.0) -> None:
        import localcluster

        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"kuberay exited with {self.process.returncode}; see {self.log}")
            return localcluster.http_ok(f"http://127.0.0.1:{self.health_port}/readyz")

        localcluster.wait_until(ready, "kuberay /readyz", timeout)

    def stop(self) -> None:
        import localcluster

        localcluster.stop_process(self.process)


class RayTracker:
    """First-seen times (monotonic) per RayCluster: its head pod, the pod Running, state ready."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pod_seen: dict[str, float] = {}
        self.pod_running: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.stop = threading.Event()

    def on_pod(self, _type: str, obj: dict[str, Any]) -> None:
        name = (obj["metadata"].get("labels") or {}).get(CLUSTER_LABEL)
        if not name:
            return
        now = time.monotonic()
        with self.lock:
            self.pod_seen.setdefault(name, now)
            if (obj.get("status") or {}).get("phase") == "Running":
                self.pod_running.setdefault(name, now)

    def on_cluster(self, _type: str, obj: dict[str, Any]) -> None:
        if (obj.get("status") or {}).get("state") == READY:
            with self.lock:
                self.ready.setdefault(obj["metadata"]["name"], time.monotonic())

    def start(self, api: Any, namespace: str) -> None:
        feeds = (
            (f"/api/v1/namespaces/{namespace}/pods", CLUSTER_LABEL, self.on_pod),
            (f"/apis/{RAY_GROUP}/{RAY_VERSION}/namespaces/{namespace}/{RAY_PLURAL}", "", self.on_cluster),
        )
        for path, selector, handler in feeds:

            def loop(path: str = path, selector: str = selector, handler: Any = handler) -> None:
                for event_type, obj in api.watch(path, selector, self.stop):
                    handler(event_type, obj)

            threading.Thread(target=loop, daemon=True, name=f"watch {path}").start()

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {
                "head_pods": len(self.pod_seen),
                "running": len(self.pod_running),
                "ready": len(self.ready),
            }


def create_rayclusters(api: Any, names: list[str], namespace: str, workers: int) -> dict[str, float]:
    from concurrent.futures import ThreadPoolExecutor

    created: dict[str, float] = {}
    path = f"/apis/{RAY_GROUP}/{RAY_VERSION}/namespaces/{namespace}/{RAY_PLURAL}"

    def one(name: str) -> None:
        for attempt in range(5):
            resp = api.request("POST", path, body=raycluster(name, namespace))
            if resp.status in (200, 201):
                created[name] = time.monotonic()
                return
            if resp.status != 429 and resp.status < 500:
                raise RuntimeError(f"create {name}: {resp.status} {resp.read()[:300]!r}")
            time.sleep(0.2 * (attempt + 1))
        raise RuntimeError(f"create {name}: gave up")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, names))
    return created


def summary(values: dict[str, float], t0: float) -> float | None:
    return round(max(values.values()) - t0, 2) if values else None


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1)
