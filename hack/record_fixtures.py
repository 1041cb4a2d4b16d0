"""Record the Job/Pod fixtures of tests/unit/recorded/ from a real control plane.

    .venv/bin/python hack/record_fixtures.py [--out tests/unit/recorded]

Starts a fresh local control plane (hack/localcluster.py: etcd, kube-apiserver, the real Job
controller and scheduler, kwok pools) and the local executor (hack/localexec.py), renders a
FinetuneJob's train Job with the operator's own planner and renderer, drives it into each state
below, and writes what the API server then returns for the Job and its pods (managedFields
dropped). The worker is replaced by a one-line command that behaves like it in that state
(writes a WorkerReport to the termination log, exits 1, sleeps), because the states are about
Kubernetes, not about training.

States the kubelet alone produces (image pull back-off, OOMKilled, node shutdown, crash loops),
transient ones (SuccessCriteriaMet while pods terminate) and preemption are not recorded here:
their fixtures are named synthetic_* and say which Kubernetes source their shape follows
(tests/unit/recorded/README.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import localcluster  # noqa: E402

from accelbench.api import parse_resource  # noqa: E402
from accelbench.api.contract import ENV_COMPLETION_INDEX, ENV_TERMINATION_LOG, JOB_NAME_LABELS  # noqa: E402
from accelbench.api.report import FinetuneMetrics, ReportKind, Timings, WorkerReport  # noqa: E402
from accelbench.catalog import load_catalog  # noqa: E402
from accelbench.controller.children import build_children  # noqa: E402

NAMESPACE = "team-a"
NAME = "gemma-lora"
LOCAL_EXEC = {"accelbench.io/local-exec": "true"}

# What rank 0 reports in the "complete" state (tests read these figures back through ingestion).
REPORT = WorkerReport(
    kind=ReportKind.FINETUNE,
    ok=True,
    framework="jax",
    device="TPU v5p",
    chips=8,
    finetune=FinetuneMetrics(
        steps=40,
        trained_tokens=1_310_720,
        tokens_per_second=5120.0,
        tokens_per_second_per_chip=640.0,
        mfu=0.412,
        first_loss=2.31,
        final_loss=1.12,
    ),
    timings=Timings(total_seconds=300.0, train_seconds=256.0),
).to_termination_message()


def manifest(accelerator: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "accelbench.io/v1alpha1",
        "kind": "FinetuneJob",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "6f1d2c1e-3b7a-4c55-9a0e-0c1f5e7b9d21"},
        "spec": {
            "model": {"uri": "/models/gemma-3-1b", "family": "gemma3", "size": "1b"},
            "dataset": {"uri": "/data/chat.jsonl"},
            "accelerator": accelerator,
            "maxRetries": 0,
            **spec,
        },
    }


def rendered_job(body: dict[str, Any]) -> dict[str, Any]:
    """The train Job exactly as the operator renders it for `body`."""
    _, rendered = build_children(parse_resource(body), load_catalog())
    job = next(o for o in rendered.objects if o["kind"] == "Job")
    job["metadata"].pop("ownerReferences", None)  # no FinetuneJob object exists in this cluster
    return job


def on_local_exec(job: dict[str, Any], script: str, hosts: int = 1) -> dict[str, Any]:
    """Run `script` (Python) as the worker on the local-exec node, over `hosts` indexes."""
    job = copy.deepcopy(job)
    job["spec"]["completions"] = job["spec"]["parallelism"] = hosts
    pod = job["spec"]["template"]["spec"]
    pod["nodeSelector"] = {**pod.get("nodeSelector", {}), **LOCAL_EXEC}
    pod["containers"][0]["command"] = ["python", "-c", script]
    return job


def report_from_rank0(exit_code: int = 0) -> str:
    return (
        "import os, sys\n"
        f"if os.environ['{ENV_COMPLETION_INDEX}'] == '0':\n"
        f"    open(os.environ['{ENV_TERMINATION_LOG}'], 'w').write({REPORT!r})\n"
        f"sys.exit({exit_code})\n"
    )


class Recorder:
    def __init__(self, api: client.ApiClient, out: Path) -> None:
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self.out = out

    def create(self, job: dict[str, Any]) -> None:
        self.batch.create_namespaced_job(NAMESPACE, job)

    def snapshot(self, job_name: str) -> dict[str, Any]:
        # Raw JSON, as the operator's watches deliver it (the client's models would rewrite times).
        job = json.loads(self.batch.read_namespaced_job(job_name, NAMESPACE, _preload_content=False).data)
        selector = f"{JOB_NAME_LABELS[0]}={job_name}"
        pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=selector, _preload_content=False)
        items = sorted(json.loads(pods.data)["items"], key=lambda p: p["metadata"]["name"])
        for obj in (job, *items):
            obj["metadata"].pop("managedFields", None)
        return {"job": job, "pods": items}

    def wait(self, job_name: str, done: Callable[[dict[str, Any]], bool], timeout: float = 90.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            case = self.snapshot(job_name)
            if done(case):
                return case
            time.sleep(0.5)
        case = self.snapshot(job_name)
        pods = [(p["metadata"]["name"], p.get("status")) for p in case["pods"]]
        raise TimeoutError(f"{job_name}: state not reached: job {case['job'].get('status')}, pods {pods}")

    def save(self, name: str, case: dict[str, Any], how: str) -> None:
        case = {"recorded": {"by": "hack/record_fixtures.py", "state": how}, **case}
        (self.out / f"{name}.json").write_text(json.dumps(case, indent=2) + "\n")
        print(f"recorded {name}: {how}")

    def delete(self, job_name: str) -> None:
        self.batch.delete_namespaced_job(job_name, NAMESPACE, propagation_policy="Foreground")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.batch.read_namespaced_job(job_name, NAMESPACE)
            except client.ApiException as exc:
                if exc.status == 404:
                    return
            time.sleep(0.5)


def job_condition(case: dict[str, Any], type_: str) -> bool:
    return any(
        c["type"] == type_ and c["status"] == "True"
        for c in (case["job"].get("status") or {}).get("conditions") or []
    )


def pods_running(case: dict[str, Any], count: int) -> bool:
    return sum((p.get("status") or {}).get("phase") == "Running" for p in case["pods"]) >= count


def record_all(rec: Recorder) -> None:
    cpu = rendered_job(manifest({"type": "cpu"}))
    name = cpu["metadata"]["name"]

    rec.create(on_local_exec(cpu, "import time; time.sleep(600)", hosts=2))
    rec.save("finetune_running", rec.wait(name, lambda c: pods_running(c, 2)), "both indexes running")
    rec.delete(name)

    rec.create(on_local_exec(cpu, report_from_rank0(0), hosts=2))
    rec.save(
        "finetune_complete",
        rec.wait(name, lambda c: job_condition(c, "Complete")),
        "Complete; index 0 wrote the WorkerReport, index 1 nothing",
    )
    rec.delete(name)

    rec.create(on_local_exec(cpu, "import sys; sys.exit(1)"))
    rec.save("finetune_exit1", rec.wait(name, lambda c: job_condition(c, "Failed")), "exit 1, backoffLimit 0")
    rec.delete(name)

    deadline = copy.deepcopy(cpu)
    deadline["spec"]["activeDeadlineSeconds"] = 3
    rec.create(on_local_exec(deadline, "import time; time.sleep(600)"))
    rec.save(
        "finetune_deadline", rec.wait(name, lambda c: job_condition(c, "Failed")), "activeDeadlineSeconds 3"
    )
    rec.delete(name)

    suspended = rendered_job(manifest({"type": "cpu"}, suspend=True))
    rec.create(on_local_exec(suspended, "pass"))
    rec.save(
        "finetune_suspended", rec.wait(name, lambda c: job_condition(c, "Suspended")), "spec.suspend: true"
    )
    rec.delete(name)

    queued = rendered_job(manifest({"type": "cpu"}, queueName="tpu-queue"))
    rec.create(on_local_exec(queued, "pass"))
    rec.save(
        "finetune_queued",
        rec.wait(name, lambda c: job_condition(c, "Suspended")),
        "created suspended with the Kueue queue label (no Kueue admits it)",
    )
    rec.delete(name)

    # More chips per host than any simulated v5p host has: the real scheduler says why not.
    tpu = rendered_job(
        manifest(
            {"type": "tpu-v5p", "topology": "2x2x2"},
            resources={"requests": {"google.com/tpu": "16"}, "limits": {"google.com/tpu": "16"}},
        )
    )

    def unschedulable(case: dict[str, Any]) -> bool:
        return len(case["pods"]) == 2 and all(
            any(c.get("reason") == "Unschedulable" for c in (p.get("status") or {}).get("conditions") or [])
            for p in case["pods"]
        )

    rec.create(tpu)
    rec.save(
        "finetune_unschedulable", rec.wait(tpu["metadata"]["name"], unschedulable), "16 TPU chips per host"
    )
    rec.delete(tpu["metadata"]["name"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "tests" / "unit" / "recorded"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="record-fixtures-") as tmp:
        work = Path(tmp)
        cluster = localcluster.start_cluster(work / "cp")
        executor = None
        try:
            api = cluster.api_client()
            localcluster.wait_nodes_ready(api, localcluster.create_node_pools(api))
            client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
            executor = subprocess.Popen(
                [sys.executable, str(HERE / "localexec.py"), f"--kubeconfig={cluster.kubeconfig}",
                 f"--workdir={work / 'localexec'}"],
                stdout=(work / "localexec.log").open("wb"),
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )  # fmt: skip
            record_all(Recorder(api, out))
        finally:
            if executor is not None:
                executor.terminate()
                executor.wait(20)
            cluster.stop()


if __name__ == "__main__":
    main()
