"""A paid run is never lost, frozen or run twice when its children vanish (issue 14, first slice).

Real worker runs on the local-exec node; the faults are what a user or a cluster does: a TTL of 0,
`kubectl delete job` mid-run, the operator down across a run's completion, a bench client deleted.
Each ends in a truthful terminal status with at most one Job UID per run, and no Job is ever
created again for a run that started."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
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
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
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
def test_pods_deleted_after_completion_keep_the_result_or_say_it_is_missing(
    env: Env, tiny: dict[str, str], away: bool
) -> None:
    """Pod garbage collection (or a reclaimed node) after the run ended. Observed before: the result
    is in status and stays. Gone before the operator could read it: Succeeded (the Job says so) with
    ResultMissing saying why; never a second Job."""
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
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    if away:  # the report is waited for REPORT_GRACE after the Job's completion, then called missing
        valid = wait_for(
            lambda: next(
                (c for c in env.get(FT, name)["status"].get("conditions", []) if c["type"] == "ResultValid"),
                None,
            ),
            timeout=60,
            what="ResultValid",
        )
        assert (valid["status"], valid["reason"]) == ("False", "ResultMissing"), valid
    else:
        time.sleep(5)
        after = env.get(FT, name)["status"]
        assert after["results"] == stored["status"]["results"] and after["results"]["steps"] == 4
    assert {j.metadata.uid for j in jobs_of(env, name)} <= {job.metadata.uid}


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
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
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
