"""The local control plane's simulated kubelet ends a deleted pod the way a kubelet does, so a
namespace holding a running Job goes. kwok's stock stages force-delete such a pod while it still
says Running; a Job with a podFailurePolicy (every Job the operator makes has one) counts only
Failed pods, keeps its tracking finalizer on the pod, and namespace deletion (pods before Jobs)
never ends: the lifecycle fuzz saw a namespace Terminating for minutes. hack/kwok-stages-kubelet.yaml
is the fix; this test fails without it."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_env import wait_for
from kubernetes import client

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import localcluster  # noqa: E402


def _scale() -> Any:
    spec = importlib.util.spec_from_file_location("scale_run_kubelet", ROOT / "benchmarks/scale/run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """A control plane whose kwok pods stay Running (the scale benchmark's "hold" stages), and the
    name of one kwok node."""
    tmp = tmp_path_factory.mktemp("kwok-kubelet")
    saved = os.environ.get("ACCELBENCH_BIN_DIR")
    os.environ["ACCELBENCH_BIN_DIR"] = str(_scale().hold_bin_dir(tmp))
    try:
        cluster = localcluster.start_cluster(tmp / "cp", kwok_pod_stages="fast", timeout=180)
    finally:
        if saved is None:
            os.environ.pop("ACCELBENCH_BIN_DIR")
        else:
            os.environ["ACCELBENCH_BIN_DIR"] = saved
    try:
        api = cluster.api_client()
        nodes = localcluster.create_node_pools(api)
        localcluster.wait_nodes_ready(api, nodes)
        yield api, nodes[0]
    finally:
        cluster.stop()


def running_job(namespace: str, node: str) -> client.V1Job:
    """A Job shaped like the operator's: restartPolicy Never and a podFailurePolicy."""
    return client.V1Job(
        metadata=client.V1ObjectMeta(name="held"),
        spec=client.V1JobSpec(
            backoff_limit=0,
            pod_failure_policy=client.V1PodFailurePolicy(
                rules=[
                    client.V1PodFailurePolicyRule(
                        action="Ignore",
                        on_pod_conditions=[
                            client.V1PodFailurePolicyOnPodConditionsPattern(
                                type="DisruptionTarget", status="True"
                            )
                        ],
                    )
                ]
            ),
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    node_name=node,
                    containers=[client.V1Container(name="worker", image="worker:test")],
                )
            ),
        ),
    )


def test_a_namespace_with_a_running_job_pod_is_gone_within_a_minute(held: tuple[Any, str]) -> None:
    api, node = held
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    ns = "held-run"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    batch.create_namespaced_job(ns, running_job(ns, node))
    pods = wait_for(
        lambda: [p for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running"],
        timeout=60,
        what="the Job's pod Running",
    )
    assert "batch.kubernetes.io/job-tracking" in (pods[0].metadata.finalizers or [])
    started = time.monotonic()
    core.delete_namespace(ns)

    def gone() -> bool:
        try:
            core.read_namespace(ns)
        except client.ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, timeout=60, interval=1, what=f"namespace {ns} gone")
    print(f"namespace with a running Job pod gone {time.monotonic() - started:.1f} s after delete")
