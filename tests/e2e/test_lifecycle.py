"""A paid run is never lost, frozen or run twice when its children vanish (issue 14).

Real worker runs on the local-exec node; the faults are what a user or a cluster does: a TTL of 0,
`kubectl delete job` mid-run, the operator down across a run's completion, a bench client deleted.
Each ends in a truthful terminal status with at most one Job UID per run, and no Job is ever
created again for a run that started."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_env import Env, wait_for

from accelbench.workers.testing import make_chat_dataset, make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
FT = "finetunejobs"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("tiny-lifecycle")
    return {
        "model": str(make_tiny_model(base / "model", family="llama")),
        "data": str(make_chat_dataset(base / "chat.jsonl", n=48)),
    }


def run(name: str, tiny: dict[str, str], steps: int, **spec: Any) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples/quickstart/finetune-tiny-cpu.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["model"]["uri"] = tiny["model"]
    body["spec"]["dataset"]["uri"] = tiny["data"]
    body["spec"]["training"]["maxSteps"] = steps
    body["spec"].update(spec)
    return body


def jobs_of(env: Env, name: str) -> list[Any]:
    return env.batch.list_namespaced_job("default", label_selector=f"accelbench.io/name={name}").items


def phase_of(env: Env, name: str, plural: str = FT) -> str | None:
    return env.get(plural, name).get("status", {}).get("phase")


def terminal(env: Env, name: str, plural: str = FT, timeout: float = 240) -> dict[str, Any]:
    return wait_for(
        lambda: (o := env.get(plural, name)).get("status", {}).get("phase") in ("Succeeded", "Failed") and o,
        timeout=timeout,
        what=f"{name} terminal",
    )


def completed(env: Env, job: str) -> bool:
    conditions = env.batch.read_namespaced_job(job, "default").status.conditions or []
    return any(c.type == "Complete" and c.status == "True" for c in conditions)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


def test_ttl_zero_keeps_the_result_and_the_operator_cleans_up_after_storing_it(
    env: Env, tiny: dict[str, str]
) -> None:
    """The reported bug: TTL 0 deleted the Job before the operator saw it complete, and the run went
    back to Pending forever. Now the Job carries no TTL; the operator deletes it after the result is in
    status, and a restart afterwards creates nothing."""
    env.apply(run("ttl-zero", tiny, 4, ttlSecondsAfterFinished=0))
    obj = terminal(env, "ttl-zero")
    assert obj["status"]["phase"] == "Succeeded", str(obj["status"])
    assert obj["status"]["results"]["steps"] == 4
    wait_for(lambda: not jobs_of(env, "ttl-zero"), timeout=60, what="the operator's cleanup of the Job")
    env.operator.restart()
    time.sleep(8)  # the resume handler and a few observer passes (1 s apart here) have run
    assert not jobs_of(env, "ttl-zero")  # not re-created
    after = env.get(FT, "ttl-zero")["status"]
    assert after["phase"] == "Succeeded" and after["results"] == obj["status"]["results"]


@contextlib.contextmanager
def operator_away(env: Env, away: bool) -> Iterator[None]:
    """The fault happens with the operator stopped (and it starts again after), or running."""
    if away:
        env.operator.stop()
    try:
        yield
    finally:
        if away:
            env.operator.start()


@pytest.mark.parametrize("away", [False, True], ids=["operator-running", "operator-down"])
def test_a_job_deleted_mid_run_fails_the_run_and_is_never_created_again(
    env: Env, tiny: dict[str, str], away: bool
) -> None:
    name = f"deleted-mid-run-{int(away)}"
    env.apply(run(name, tiny, 100_000))
    wait_for(lambda: phase_of(env, name) == "Running", timeout=120, what="Running")
    with operator_away(env, away):
        env.kubectl("delete", "job", f"{name}-train", "--wait=false")
        wait_for(lambda: not jobs_of(env, name), timeout=60, what="the Job gone")
    obj = terminal(env, name, timeout=60)
    assert obj["status"]["phase"] == "Failed"
    failed = condition(obj, "Failed")
    assert failed["reason"] == "JobDeleted" and "not started again" in failed["message"], failed
    assert condition(obj, "ResultValid")["reason"] == "ResultMissing"
    env.operator.restart()  # a restart must not re-create it either
    time.sleep(8)
    assert not [j for j in jobs_of(env, name) if not j.metadata.deletion_timestamp]
    assert phase_of(env, name) == "Failed"


@pytest.mark.parametrize("away", [False, True], ids=["operator-running", "operator-down"])
def test_pods_deleted_after_completion_keep_the_result(env: Env, tiny: dict[str, str], away: bool) -> None:
    """Pod garbage collection (or a reclaimed node) after the run ended. Observed before: the result
    is in status and stays. Gone before the operator could read the termination message: the result
    comes from rank 0's copy in the results ConfigMap, and says so; never a second Job."""
    name = f"pods-gone-{int(away)}"
    env.apply(run(name, tiny, 4))
    wait_for(lambda: phase_of(env, name) == "Running", timeout=120, what="Running")
    (job,) = jobs_of(env, name)
    with operator_away(env, away):
        wait_for(lambda: completed(env, job.metadata.name), timeout=180, what="the Job complete")
        if not away:
            stored = terminal(env, name)
        env.kubectl("delete", "pods", "-l", f"job-name={job.metadata.name}", "--wait=true")
    obj = terminal(env, name, timeout=120)
    assert obj["status"]["phase"] == "Succeeded", str(obj["status"])
    if away:  # the message is waited for REPORT_GRACE after the Job's completion, then the ConfigMap read
        obj = wait_for(lambda: (o := env.get(FT, name))["status"].get("results") and o, what="results")
        valid = condition(obj, "ResultValid")
        assert valid["status"] == "True" and f"ConfigMap {name}-results" in valid["message"], valid
        assert obj["status"]["results"]["steps"] == 4
    else:
        time.sleep(5)
        after = env.get(FT, name)["status"]
        assert after["results"] == stored["status"]["results"] and after["results"]["steps"] == 4
    assert {j.metadata.uid for j in jobs_of(env, name)} <= {job.metadata.uid}


def test_a_job_deleted_after_completion_with_the_operator_down_keeps_its_result(
    env: Env, tiny: dict[str, str]
) -> None:
    """The operator down across completion, and the Job (with its pods and their termination
    messages) deleted before it is back: the run Succeeded, its result from the ConfigMap copy, its
    cost billed to when the worker reported, not to when the operator came back."""
    name = "deleted-after-done"
    env.apply(run(name, tiny, 4))
    wait_for(lambda: phase_of(env, name) == "Running", timeout=120, what="Running")
    (job,) = jobs_of(env, name)
    with operator_away(env, True):
        wait_for(lambda: completed(env, job.metadata.name), timeout=180, what="the Job complete")
        ended = env.batch.read_namespaced_job(job.metadata.name, "default").status.completion_time
        env.kubectl("delete", "job", job.metadata.name, "--wait=true")
        time.sleep(5)  # billed until found: these seconds must not be
    obj = terminal(env, name, timeout=120)
    status = obj["status"]
    assert (status["phase"], condition(obj, "Succeeded")["reason"]) == ("Succeeded", "Completed"), status
    assert "stored its report" in status["message"] and "deleted" in status["message"]
    assert status["results"]["steps"] == 4
    assert f"ConfigMap {name}-results" in condition(obj, "ResultValid")["message"]
    finished = datetime.fromisoformat(status["completionTime"].replace("Z", "+00:00"))
    assert finished <= ended + timedelta(seconds=1), (finished, ended)  # the report precedes the Job's end
    env.operator.restart()
    time.sleep(8)
    assert not jobs_of(env, name)  # never created again
    assert env.get(FT, name)["status"]["results"] == status["results"]


def test_a_bench_whose_client_pod_is_gone_keeps_its_full_result(env: Env, tiny: dict[str, str]) -> None:
    """The same for an InferenceBench: the client's report (every swept cell) from the ConfigMap."""
    name = "bench-pods-gone"
    body = yaml.safe_load((ROOT / "examples/quickstart/inference-tiny-cpu.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["model"]["uri"] = tiny["model"]
    body["spec"]["workload"].update({"inputLengths": [16], "concurrency": [1, 2], "requestsPerPoint": 4})
    env.apply(body)
    wait_for(lambda: phase_of(env, name, "inferencebenches") == "Running", timeout=180, what="Running")
    with operator_away(env, True):
        wait_for(lambda: completed(env, f"{name}-client"), timeout=240, what="the client complete")
        env.kubectl("delete", "pods", "-l", f"job-name={name}-client", "--wait=true")
    obj = wait_for(
        lambda: (o := env.get("inferencebenches", name))["status"].get("results") and o,
        timeout=120,
        what="results",
    )
    assert obj["status"]["phase"] == "Succeeded", str(obj["status"])
    assert f"ConfigMap {name}-results" in condition(obj, "ResultValid")["message"]
    data = env.core.read_namespaced_config_map(f"{name}-results", "default").data
    assert set(data) == {"report.json", "results.json"}
    swept = [c["concurrency"] for c in json.loads(data["results.json"])["cells"]]
    assert [c["concurrency"] for c in obj["status"]["results"]["cells"]] == swept and {1, 2} <= set(swept)


def test_a_run_that_completes_while_the_operator_is_down_is_observed_once_it_is_back(
    env: Env, tiny: dict[str, str]
) -> None:
    env.apply(run("down-across", tiny, 6, ttlSecondsAfterFinished=0))
    wait_for(lambda: phase_of(env, "down-across") == "Running", timeout=120, what="Running")
    (job,) = jobs_of(env, "down-across")
    env.operator.stop()
    try:
        wait_for(lambda: completed(env, job.metadata.name), timeout=180, what="completion, operator down")
    finally:
        env.operator.start()
    obj = terminal(env, "down-across")
    assert obj["status"]["phase"] == "Succeeded", str(obj["status"])
    assert obj["status"]["results"]["steps"] == 6
    wait_for(lambda: not jobs_of(env, "down-across"), timeout=60, what="cleanup after the result was stored")


@pytest.mark.parametrize("away", [False, True], ids=["operator-running", "operator-down"])
def test_a_deleted_bench_client_fails_the_bench_and_stops_its_server(
    env: Env, tiny: dict[str, str], away: bool
) -> None:
    name = f"client-gone-{int(away)}"
    body = yaml.safe_load((ROOT / "examples/quickstart/inference-tiny-cpu.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["model"]["uri"] = tiny["model"]
    body["spec"]["workload"].update({"inputLengths": [16], "concurrency": [1], "requestsPerPoint": 200})
    env.apply(body)
    wait_for(lambda: phase_of(env, name, "inferencebenches") == "Running", timeout=180, what="Running")
    with operator_away(env, away):
        env.kubectl("delete", "job", f"{name}-client", "--wait=false")
    back = time.monotonic()  # the client is gone and the operator is up (again, or throughout)
    obj = terminal(env, name, plural="inferencebenches", timeout=60)
    assert (obj["status"]["phase"], condition(obj, "Failed")["reason"]) == ("Failed", "JobDeleted")
    wait_for(lambda: not jobs_of(env, name), timeout=30, what="the server Job stopped")
    how = "the operator came back" if away else "the client went"
    print(f"server Job stopped {time.monotonic() - back:.1f} s after {how}")


def test_cost_keeps_the_hours_before_a_suspend_and_adds_the_resumed_segment(
    env: Env, tiny: dict[str, str]
) -> None:
    """Suspend (as a Kueue preemption does) and resume: the Job gets a new startTime, and the cost
    keeps every hour billed before it; it never decreases."""
    env.apply(run("suspend-resume", tiny, 100_000))
    wait_for(lambda: phase_of(env, "suspend-resume") == "Running", timeout=120, what="Running")
    time.sleep(3)
    patch = ["patch", f"{FT}/suspend-resume", "--type=merge", "-p"]
    env.kubectl(*patch, '{"spec": {"suspend": true}}')
    suspended = wait_for(
        lambda: (o := env.get(FT, "suspend-resume")).get("status", {}).get("phase") == "Suspended" and o,
        timeout=60,
        what="Suspended",
    )
    before = suspended["status"]["cost"]["hours"]
    assert before > 0
    env.kubectl(*patch, '{"spec": {"suspend": false}}')
    resumed = wait_for(
        lambda: (
            (o := env.get(FT, "suspend-resume")).get("status", {}).get("phase") == "Running"
            and o["status"].get("startTime")
            and o
        ),
        timeout=120,
        what="Running again",
    )
    cost = resumed["status"]["cost"]
    assert cost["earlierHours"] == pytest.approx(before, abs=1e-6) and cost["hours"] >= before
    assert len(jobs_of(env, "suspend-resume")) == 1  # the same Job, resumed
    env.kubectl("delete", f"{FT}/suspend-resume", "--wait=false")
