"""Runs queued in real Kueue (issue 17): Kueue built from its pinned Go module (hack/build-servers.sh),
its webhooks registered with the apiserver (hack/kueue.py), admitting the Jobs of FinetuneJobs and
InferenceBenches that name a queue (spec.queueName).

- A queued InferenceBench: only its server Job carries the queue label; while its LocalQueue does
  not exist the run says Suspended/Queued and its client Job waits suspended; once the queue exists
  Kueue admits the server, and the operator resumes the client after it; the bench succeeds.
- A GPU quota of one: three one-GPU FinetuneJobs on the kwok H100 pool are admitted one at a time
  (never two Workloads holding quota at once), each waiting run says Queued, all succeed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import kueue
import pytest
import yaml
from e2e_env import ROOT, Env, localcluster, wait_for
from kubernetes import client
from test_operator import finetune

from accelbench.workers.testing import make_chat_dataset, make_tiny_model

KUEUE = ("kueue.x-k8s.io", "v1beta2")
NS = "default"


@pytest.fixture(scope="module")
def queues(env: Env) -> Iterator[kueue.Kueue]:
    missing = kueue.kueue_missing()
    if missing:  # under CI=true a skip fails the run anyway; say what to do
        pytest.fail(f"{', '.join(missing)} missing from {kueue.SERVERS}: run `make servers`")
    started = kueue.start_kueue(
        env.workdir / "kueue", env.cluster.workdir, env.cluster.kubeconfig, localcluster.bin_dir() / "kubectl"
    )
    try:
        for doc in (
            flavor("local", {}),
            flavor("h100", {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}),
            cluster_queue("cpu-cq", "local", {"cpu": "64", "memory": "256Gi"}),
            cluster_queue("gpu-cq", "h100", {"nvidia.com/gpu": "1"}),
            local_queue("gpu-queue", "gpu-cq"),
        ):
            env.apply(doc)
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("tiny-kueue")
    return {
        "model": str(make_tiny_model(base / "model", family="llama")),
        "data": str(make_chat_dataset(base / "chat.jsonl", n=48)),
    }


def flavor(name: str, labels: dict[str, str]) -> dict[str, Any]:
    spec = {"nodeLabels": labels} if labels else {}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": spec,
    }


def cluster_queue(name: str, flavor_name: str, quota: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": sorted(quota),
                    "flavors": [
                        {
                            "name": flavor_name,
                            "resources": [{"name": r, "nominalQuota": q} for r, q in sorted(quota.items())],
                        }
                    ],
                }
            ],
        },
    }


def local_queue(name: str, cq: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterQueue": cq},
    }


def workloads(env: Env) -> list[dict[str, Any]]:
    return env.custom.list_namespaced_custom_object(*KUEUE, NS, "workloads")["items"]


def is_true(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions") or []
    )


def owner_job(workload: dict[str, Any]) -> str | None:
    return next(
        (r["name"] for r in workload["metadata"].get("ownerReferences") or [] if r["kind"] == "Job"), None
    )


def admitted_to(workload: dict[str, Any]) -> str | None:
    return ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")


def status_of(env: Env, plural: str, name: str) -> dict[str, Any]:
    return env.get(plural, name).get("status") or {}


def test_a_queued_bench_waits_for_its_queue_and_kueue_admits_its_server(
    env: Env, queues: kueue.Kueue, tiny: dict[str, str]
) -> None:
    body = yaml.safe_load((ROOT / "examples/quickstart/inference-tiny-cpu.yaml").read_text())
    body["metadata"]["name"] = "queued-bench"
    body["spec"]["model"]["uri"] = tiny["model"]
    body["spec"]["queueName"] = "cpu-queue"  # created below, after the bench
    body["spec"]["workload"].update({"inputLengths": [16], "concurrency": [1], "requestsPerPoint": 2})
    env.apply(body)
    waiting = wait_for(
        lambda: (s := status_of(env, "inferencebenches", "queued-bench")).get("phase") == "Suspended" and s,
        timeout=60,
        what="the bench Suspended while its queue does not exist",
    )
    assert "cpu-queue" in waiting["message"], waiting
    server = env.batch.read_namespaced_job("queued-bench-server", NS)
    client_job = env.batch.read_namespaced_job("queued-bench-client", NS)
    assert server.spec.suspend is True and server.metadata.labels["kueue.x-k8s.io/queue-name"] == "cpu-queue"
    assert client_job.spec.suspend is True and "kueue.x-k8s.io/queue-name" not in client_job.metadata.labels
    pending = wait_for(
        lambda: next((w for w in workloads(env) if owner_job(w) == "queued-bench-server"), None),
        timeout=30,
        what="Kueue's Workload for the server Job",
    )
    assert not is_true(pending, "QuotaReserved"), pending["status"]

    env.apply(local_queue("cpu-queue", "cpu-cq"))
    wait_for(
        lambda: env.batch.read_namespaced_job("queued-bench-client", NS).spec.suspend is False,
        timeout=60,
        what="the client resumed after Kueue admitted the server",
    )
    admitted = next(w for w in workloads(env) if owner_job(w) == "queued-bench-server")
    assert admitted_to(admitted) == "cpu-cq"
    assert not [w for w in workloads(env) if owner_job(w) == "queued-bench-client"]  # not queued itself
    obj = wait_for(
        lambda: (
            (s := status_of(env, "inferencebenches", "queued-bench")).get("phase") in ("Succeeded", "Failed")
            and s
        ),
        timeout=300,
        what="the queued bench terminal",
    )
    assert obj["phase"] == "Succeeded", obj
    assert obj["results"]["cells"]


def test_a_gpu_quota_of_one_admits_one_finetune_at_a_time(env: Env, queues: kueue.Kueue) -> None:
    names = [f"queued-ft-{i}" for i in range(3)]
    holding: list[int] = []  # Workloads holding quota, at each poll
    seen_queued: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                # Only the GPU queue's Workloads: the bench test's server Workload lingers a moment
                # in the CPU queue after its Job is deleted (Kueue's finalizer), still QuotaReserved.
                items = [w for w in workloads(env) if admitted_to(w) == "gpu-cq"]
                holding.append(
                    sum(1 for w in items if is_true(w, "QuotaReserved") and not is_true(w, "Finished"))
                )
                for name in names:
                    obj = env.get("finetunejobs", name)
                    if any(
                        c.get("reason") == "Queued" for c in obj.get("status", {}).get("conditions") or []
                    ):
                        seen_queued.add(name)
            except client.ApiException:
                pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    for name in names:
        env.apply(finetune(name, {"type": "h100", "count": 1}, queueName="gpu-queue"))
    watcher.start()
    try:
        for name in names:
            obj = wait_for(
                lambda n=name: (
                    (s := status_of(env, "finetunejobs", n)).get("phase") in ("Succeeded", "Failed") and s
                ),
                timeout=180,
                what=f"{name} terminal",
            )
            assert obj["phase"] == "Succeeded", obj
    finally:
        stop.set()
        watcher.join(5)
    assert holding and max(holding) == 1, (
        f"Workloads holding the one-GPU quota at once: {max(holding or [0])}"
    )
    admitted = [w for w in workloads(env) if (owner_job(w) or "").startswith("queued-ft-")]
    assert len(admitted) == 3 and all(admitted_to(w) == "gpu-cq" for w in admitted)
    assert seen_queued, "no run said it was Queued while another held the quota"
