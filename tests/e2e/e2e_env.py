"""One real local control plane per test session, the operator as a subprocess, the local executor.

Everything here is real: kube-apiserver, etcd, controller-manager (Job controller, garbage
collector), scheduler, kwok for the simulated accelerator pools, and `hack/localexec.py` running
pods on the local-exec node as processes. Built binaries are cached under ~/.cache/accelbench.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import localcluster  # noqa: E402

from accelbench.api.contract import (  # noqa: E402
    ENV_OPERATOR_METRICS_PORT,
    ENV_OPERATOR_OBSERVE_INTERVAL,
    ENV_POD_NAMESPACE,
)

GROUP, VERSION = "accelbench.io", "v1alpha1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.e2e)


@dataclass
class Env:
    cluster: localcluster.Cluster
    api: client.ApiClient
    workdir: Path
    operator: OperatorProcess

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(localcluster.bin_dir() / "kubectl"), f"--kubeconfig={self.cluster.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done

    def apply(self, manifest: dict[str, Any] | str, check: bool = True) -> subprocess.CompletedProcess[str]:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        return self.kubectl("apply", "-f", "-", stdin=text, check=check)

    def get(self, plural: str, name: str, namespace: str = "default") -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)


class OperatorProcess:
    """`python -m accelbench.controller` against the local cluster; restartable."""

    def __init__(
        self, kubeconfig: Path, logdir: Path, args: tuple[str, ...] = (), name: str = "operator"
    ) -> None:
        self.kubeconfig = kubeconfig
        self.logdir = logdir
        self.args = args
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.metrics_port = localcluster.free_port()
        self.namespace = "default"  # where it reads its price ConfigMap (POD_NAMESPACE)
        self.extra_env: dict[str, str] = {}  # e.g. the chart's settings, once it runs as the chart's pod

    def start(self) -> None:
        self.starts += 1
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            ENV_OPERATOR_OBSERVE_INTERVAL: "1",
            ENV_OPERATOR_METRICS_PORT: str(self.metrics_port),
            ENV_POD_NAMESPACE: self.namespace,
            **self.extra_env,
        }
        log = (self.logdir / f"{self.name}-{self.starts}.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "accelbench.controller", "--verbose", *self.args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logdir.glob(f"{self.name}-*.log")))


@pytest.fixture(scope="session")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    workdir = tmp_path_factory.mktemp("cluster")
    cluster = localcluster.start_cluster(workdir / "cp")
    api = cluster.api_client()
    nodes = localcluster.create_node_pools(api)
    localcluster.wait_nodes_ready(api, nodes)
    executor = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "hack" / "localexec.py"),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--workdir={workdir / 'localexec'}",
        ],
        stdout=(workdir / "localexec.log").open("wb"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    operator = OperatorProcess(cluster.kubeconfig, workdir)
    e = Env(cluster, api, workdir, operator)
    try:  # everything started above is stopped below, also when set-up itself fails
        e.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        e.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        operator.start()
        yield e
    finally:
        operator.stop()
        executor.terminate()
        try:
            executor.wait(20)
        except subprocess.TimeoutExpired:
            executor.kill()
        cluster.stop()


def wait_for(check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.5, what: str = "") -> Any:
    """Poll until `check` returns something truthy; fail with what was last seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except client.ApiException as exc:
            last = exc
            if exc.status != 404:
                raise
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or check}: last saw {last!r}")


def run_benchmark(
    script: str, args: list[str], out: Path, timeout: float = 600
) -> tuple[dict[str, Any], int]:
    """Run a benchmark script (its own control plane) with `--out=out`; its JSON result and exit code.
    Fails with the script's output tail when it wrote no result."""
    done = subprocess.run(
        [sys.executable, str(ROOT / script), *args, f"--out={out}"],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.returncode
