"""Status derivation from recorded Job/Pod JSON (tests/unit/recorded), one fixture per reason, and the
observer pass that turns an observation into a status patch."""

from __future__ import annotations

import copy
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from accelbench.api.contract import COMPLETION_INDEX_KEY
from accelbench.api.status import Children, Phase
from accelbench.controller.children import select_pods
from accelbench.controller.observe import Observation, observe, rank0_pod, termination_message
from accelbench.controller.reconcile import observe_resource
from accelbench.controller.status import (
    Price,
    applied_status,
    billing_clock,
    derive_status,
    invalid_spec_status,
    spec_invalid,
    status_patch,
)

RECORDED = Path(__file__).parent / "recorded"
NOW = datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text())


def job_time(case: dict[str, Any], field: str, seconds: float = 0.0) -> datetime:
    """A time the Job controller wrote on the recorded Job (startTime, completionTime), plus `seconds`."""
    stamp = datetime.fromisoformat(case["job"]["status"][field].replace("Z", "+00:00"))
    return stamp + timedelta(seconds=seconds)


def job_condition_time(case: dict[str, Any], type_: str) -> str:
    return next(c for c in case["job"]["status"]["conditions"] if c["type"] == type_)["lastTransitionTime"]


def observed(name: str) -> Observation:
    case = recorded(name)
    return observe(case["job"], case["pods"])


# --- observe: one recorded case per reason ------------------------------------------------------


def test_no_job_is_pending() -> None:
    obs = observe(None, [])
    assert obs.phase == "Pending"
    assert not obs.terminal


def test_running() -> None:
    case = recorded("finetune_running")
    obs = observe(case["job"], case["pods"])
    assert (obs.phase, obs.reason) == ("Running", "Running")
    assert obs.start_time == case["job"]["status"]["startTime"]
    assert {c.type: c.status for c in obs.conditions} == {"Scheduled": "True", "Running": "True"}


def test_unschedulable_carries_the_scheduler_message() -> None:
    obs = observed("finetune_unschedulable")
    assert (obs.phase, obs.reason) == ("Scheduling", "Unschedulable")
    assert "Insufficient google.com/tpu" in obs.message
    scheduled = next(c for c in obs.conditions if c.type == "Scheduled")
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")


def test_image_pull_back_off() -> None:
    obs = observed("synthetic_finetune_image_pull")
    assert (obs.phase, obs.reason) == ("Scheduling", "ImagePullBackOff")
    assert "worker-jax:0.1.0-typo" in obs.message
    scheduled = next(c for c in obs.conditions if c.type == "Scheduled")
    assert scheduled.status == "True"  # the pod is on a node; the image is the problem


def test_err_image_pull_maps_to_image_pull_back_off() -> None:
    case = recorded("synthetic_finetune_image_pull")
    pods = [p for p in case["pods"] if p["metadata"]["name"].endswith("m4q9d")]
    obs = observe(case["job"], pods)
    assert obs.reason == "ImagePullBackOff"
    assert "ErrImagePull" in obs.message


def test_oom_killed_beats_the_generic_backoff_reason() -> None:
    obs = observed("synthetic_finetune_oom")
    assert (obs.phase, obs.reason) == ("Failed", "OOMKilled")
    assert obs.exit_code == 137
    assert "backoff limit" in obs.message
    assert obs.completion_time == "2026-05-04T10:11:06Z"  # failed Jobs have no completionTime
    failed = next(c for c in obs.conditions if c.type == "Failed")
    assert (failed.status, failed.reason) == ("True", "OOMKilled")


def test_container_failed_with_exit_code() -> None:
    obs = observed("finetune_exit1")
    assert (obs.phase, obs.reason, obs.exit_code) == ("Failed", "ContainerFailed", 1)
    assert "exited with code 1" in obs.message


def test_backoff_limit_exceeded_without_pods_left() -> None:
    case = recorded("finetune_exit1")
    obs = observe(case["job"], [])
    assert (obs.phase, obs.reason) == ("Failed", "BackoffLimitExceeded")


def test_deadline_exceeded() -> None:
    case = recorded("finetune_deadline")
    obs = observe(case["job"], case["pods"])
    assert (obs.phase, obs.reason) == ("Failed", "DeadlineExceeded")
    # A failed Job has no completionTime: the Failed condition says when it ended.
    assert obs.completion_time == job_condition_time(case, "Failed")


def test_preempted_while_the_replacement_waits_for_a_node() -> None:
    obs = observed("synthetic_finetune_preempted")
    # The replacement pod is unschedulable right now: that is what blocks; the preemption is noted.
    assert (obs.phase, obs.reason) == ("Scheduling", "Unschedulable")
    assert any("PreemptionByScheduler" in note for note in obs.notes)


def test_preempted_by_node_shutdown_before_a_replacement_exists() -> None:
    obs = observed("synthetic_finetune_node_shutdown")
    assert (obs.phase, obs.reason) == ("Scheduling", "Preempted")
    assert "node shutdown" in obs.message


def test_preempted_when_the_job_gave_up() -> None:
    case = recorded("synthetic_finetune_node_shutdown")
    job = copy.deepcopy(recorded("finetune_exit1")["job"])
    obs = observe(job, case["pods"])
    assert (obs.phase, obs.reason) == ("Failed", "Preempted")


def test_queued_in_kueue() -> None:
    obs = observed("finetune_queued")
    assert (obs.phase, obs.reason) == ("Suspended", "Queued")
    assert "tpu-queue" in obs.message


def test_a_bench_whose_server_waits_in_kueue_says_so_not_that_its_client_is_suspended() -> None:
    """Seen with real Kueue: only the server Job is queued; the client Job is held (suspended, no
    queue label) until the server is admitted, and the bench read "the Job is suspended"."""
    from accelbench.controller.observe import observe_server

    queued = recorded("finetune_queued")["job"]
    server = copy.deepcopy(queued)
    server["metadata"]["name"] = "bench-server"
    obs = observe_server(server, [])
    assert obs is not None and (obs.phase, obs.reason) == ("Suspended", "Queued")
    assert "tpu-queue" in obs.message
    admitted = copy.deepcopy(server)
    admitted["spec"]["suspend"] = False
    admitted["status"].pop("conditions", None)
    assert observe_server(admitted, []) is None  # the client's own state then tells the phase


def test_suspended() -> None:
    obs = observed("finetune_suspended")
    assert (obs.phase, obs.reason) == ("Suspended", "Suspended")


def test_succeeded_with_rank0_termination_message() -> None:
    case = recorded("finetune_complete")
    obs = observe(case["job"], case["pods"])
    assert (obs.phase, obs.reason) == ("Succeeded", "Completed")
    assert obs.completion_time == case["job"]["status"]["completionTime"]
    assert obs.termination_message is not None
    assert json.loads(obs.termination_message)["kind"] == "finetune"


def test_rank0_is_index_zero_not_the_first_pod() -> None:
    case = recorded("finetune_complete")
    index = {p["metadata"]["annotations"][COMPLETION_INDEX_KEY]: p for p in case["pods"]}
    assert rank0_pod(list(reversed(case["pods"])), "gemma-lora-train") is index["0"]
    assert rank0_pod(case["pods"], "gemma-lora-train") is index["0"]
    assert termination_message(index["1"]) is None  # index 1 wrote nothing


def test_success_criteria_met_is_not_terminal_yet() -> None:
    obs = observed("synthetic_finetune_finishing")
    assert obs.phase == "Running"
    assert "finishing" in obs.message


def test_bench_server_crash_loop_is_visible_while_the_client_runs() -> None:
    obs = observed("synthetic_bench_server_crashloop")
    assert (obs.phase, obs.reason) == ("Running", "OOMKilled")
    assert "vllm" in obs.message


def test_bench_cost_starts_with_the_server() -> None:
    obs = observed("synthetic_bench_complete")
    assert obs.phase == "Succeeded"
    assert obs.start_time == "2026-05-04T10:00:02Z"  # the server pod, before the client Job
    assert obs.termination_message is not None and '"kind":"bench"' in obs.termination_message


# --- children -------------------------------------------------------------------------------------


OWNER: dict[str, Any] = {
    "apiVersion": "accelbench.io/v1alpha1",
    "kind": "InferenceBench",
    "metadata": {"name": "serve", "namespace": "team-a", "uid": "u-1"},
}


def test_pods_of_the_reporting_job_and_of_the_server() -> None:
    children = Children(job="serve-client", client="serve-client", server="serve-server")
    pods = recorded("synthetic_bench_complete")["pods"]
    assert len(select_pods(pods, children)) == 2
    assert len(select_pods(pods, children.model_copy(update={"server": None}))) == 1
    stranger = {"metadata": {"name": "serve-server-x", "labels": {"job-name": "other"}}}
    assert select_pods([stranger], children) == []  # a name prefix alone is not membership


# --- status composition ---------------------------------------------------------------------------

PRICED: dict[str, Any] = {
    "phase": "Pending",
    "observedGeneration": 1,
    "conditions": [
        {
            "type": "Applied",
            "status": "True",
            "reason": "ChildrenCreated",
            "lastTransitionTime": "2026-05-04T09:59:59Z",
            "observedGeneration": 1,
        }
    ],
    "children": {"job": "gemma-lora-train", "service": "gemma-lora-train"},
    "accelerator": "tpu-v5p 2x2x2",
    "cost": {"dollars": 0.0, "chips": 8, "hours": 0.0, "dollarsPerChipHour": 4.2, "priceSource": "catalog"},
}


def body_with(status: dict[str, Any], kind: str = "FinetuneJob", name: str = "gemma-lora") -> dict[str, Any]:
    return {
        "apiVersion": "accelbench.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "team-a", "generation": 1, "uid": "u-1"},
        "spec": {},
        "status": status,
    }


def test_running_status_costs_to_the_minute() -> None:
    case = recorded("finetune_running")
    obs = observe(case["job"], case["pods"])
    now = job_time(case, "startTime", 3600 + 42)
    status = derive_status(PRICED, obs, generation=1, now=now)
    assert status["phase"] == "Running"
    # whole minutes since the start while running (42 s dropped), x 8 chips x $4.20
    billed = 3600 / 3600
    assert status["cost"]["dollars"] == pytest.approx(8 * 4.20 * billed, abs=1e-4)
    types = [c["type"] for c in status["conditions"]]
    assert types == ["Applied", "Scheduled", "Running"]
    assert status["conditions"][0]["lastTransitionTime"] == "2026-05-04T09:59:59Z"


def test_an_unpriced_run_bills_hours_and_shows_no_dollars() -> None:
    """Gaudi 3 without a price: applied with no $ rate, and a finished run shows its chip-hours with
    the dollars absent (unavailable), never $0."""
    applied = applied_status(
        {},
        plan_status={"chips": 8},
        accelerator="gaudi3 x8",
        children=Children(job="g3-train"),
        price=Price(8, None, "catalog gaudi3 on-demand, Unpriced"),
        generation=1,
        now=NOW,
    )
    assert applied["cost"]["chips"] == 8 and "dollars" not in applied["cost"]
    assert "dollarsPerChipHour" not in applied["cost"]
    case = recorded("finetune_complete")
    current = {**PRICED, **applied, "children": PRICED["children"]}
    status = derive_status(current, observe(case["job"], case["pods"]), generation=1, now=NOW)
    assert status["phase"] == "Succeeded"
    assert status["cost"]["hours"] > 0 and "dollars" not in status["cost"]


def test_unchanged_world_gives_an_empty_patch() -> None:
    obs = observed("finetune_running")
    first = derive_status(PRICED, obs, generation=1, now=NOW)
    current = {**PRICED, **first}
    second = derive_status(current, obs, generation=1, now=datetime(2026, 5, 4, 12, 0, 30, tzinfo=UTC))
    assert status_patch(current, second) == {}


def test_a_wider_billing_step_moves_a_running_cost_less_often_never_a_final_one() -> None:
    """Issue 17: a fleet of 1,000 Running runs billed by the minute wrote ~17 statuses a second."""
    obs = observed("finetune_running")
    tick = job_time(recorded("finetune_running"), "startTime", 3600)  # a step boundary: 6 x 600 s
    first = derive_status(PRICED, obs, generation=1, now=tick, billing_step_s=600)
    current = {**PRICED, **first}
    for minutes in (1, 5, 9):
        later = tick + timedelta(minutes=minutes, seconds=59)
        assert (
            status_patch(current, derive_status(current, obs, generation=1, now=later, billing_step_s=600))
            == {}
        )
    moved = derive_status(current, obs, generation=1, now=tick + timedelta(minutes=10), billing_step_s=600)
    assert moved["cost"]["hours"] > first["cost"]["hours"]
    at = datetime(2026, 5, 4, 12, 17, 31, tzinfo=UTC)
    assert billing_clock(at, terminal=False) == datetime(2026, 5, 4, 12, 17, tzinfo=UTC)
    assert billing_clock(at, terminal=False, step_s=600) == datetime(2026, 5, 4, 12, 10, tzinfo=UTC)
    assert billing_clock(at, terminal=False, step_s=1) == datetime(
        2026, 5, 4, 12, 17, tzinfo=UTC
    )  # a minute at least
    # Steps count from the run's start: a run that started at 12:16:58 is not billed at 12:17:00
    # (an extra write two seconds in) but at 12:17:58, a full minute later.
    started = "2026-05-04T12:16:58Z"
    assert billing_clock(at, terminal=False, start=started) == datetime(2026, 5, 4, 12, 16, 58, tzinfo=UTC)
    assert billing_clock(at + timedelta(seconds=27), terminal=False, start=started) == datetime(
        2026, 5, 4, 12, 17, 58, tzinfo=UTC
    )
    assert billing_clock(at, terminal=False, start="2026-05-04T13:00:00Z") == datetime(
        2026, 5, 4, 12, 17, tzinfo=UTC
    )  # a start after now (clock skew) falls back to the wall clock
    assert billing_clock(at, terminal=True, step_s=600) == at


def test_observer_pass_ingests_once_and_fills_results() -> None:
    case = recorded("finetune_complete")
    now = job_time(case, "completionTime", 60)
    update = observe_resource(body_with(dict(PRICED)), [case["job"]], case["pods"], now)
    assert update is not None
    patch = update.patch
    assert patch["phase"] == "Succeeded"
    assert patch["results"]["tokensPerSecond"] == 5120.0  # 4 significant digits in status
    assert patch["completionTime"] == case["job"]["status"]["completionTime"]
    # startTime -> completionTime, x 8 chips x $4.20 (the clock stops at completion)
    ran = (job_time(case, "completionTime") - job_time(case, "startTime")).total_seconds() / 3600
    assert patch["cost"]["dollars"] == pytest.approx(round(8 * 4.20 * ran, 4), abs=1e-4)
    result_valid = next(c for c in patch["conditions"] if c["type"] == "ResultValid")
    assert result_valid["status"] == "True"
    assert [e[1] for e in update.events] == ["Completed"]

    after = body_with({**PRICED, **patch})
    again = observe_resource(after, [case["job"]], case["pods"], now + timedelta(minutes=5))
    assert again is None  # final: nothing is derived again


def test_garbage_report_is_a_condition_and_the_phase_stays() -> None:
    case = recorded("finetune_complete")
    for pod in case["pods"]:
        for cs in pod["status"]["containerStatuses"]:
            if "message" in cs["state"]["terminated"]:
                cs["state"]["terminated"]["message"] = '{"schemaVersion": 1, "kind": "finet'
    update = observe_resource(body_with(dict(PRICED)), [case["job"]], case["pods"], NOW)
    assert update is not None
    assert update.patch["phase"] == "Succeeded"
    assert "results" not in update.patch
    result_valid = next(c for c in update.patch["conditions"] if c["type"] == "ResultValid")
    assert (result_valid["status"], result_valid["reason"]) == ("False", "ResultInvalid")
    assert ("Warning", "ResultInvalid") in [(e[0], e[1]) for e in update.events]


def _with_report(case: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(report)
    for pod in case["pods"]:
        for cs in pod["status"]["containerStatuses"]:
            if "message" in cs["state"]["terminated"]:
                cs["state"]["terminated"]["message"] = text
    return case


def test_worker_error_turns_success_into_failure_and_stays_so() -> None:
    report = {
        "schemaVersion": 1,
        "kind": "finetune",
        "ok": False,
        "error": {"type": "E", "message": "bad data"},
    }
    case = _with_report(recorded("finetune_complete"), report)
    update = observe_resource(body_with(dict(PRICED)), [case["job"]], case["pods"], NOW)
    assert update is not None
    assert update.patch["phase"] == "Failed"
    failed = next(c for c in update.patch["conditions"] if c["type"] == "Failed")
    assert (failed["reason"], failed["message"]) == ("WorkerError", "E: bad data")
    assert not any(c["type"] == "Succeeded" for c in update.patch["conditions"])

    after = body_with({**PRICED, **update.patch})
    again = observe_resource(after, [case["job"]], case["pods"], NOW)
    assert again is None


def test_missing_report_waits_for_the_grace_period_then_is_missing() -> None:
    case = recorded("finetune_complete")
    for pod in case["pods"]:
        for cs in pod["status"]["containerStatuses"]:
            cs["state"]["terminated"].pop("message", None)
    soon = job_time(case, "completionTime", 10)  # inside the 20 s grace for a late termination message
    early = observe_resource(body_with(dict(PRICED)), [case["job"]], case["pods"], soon)
    assert early is not None and not any(c["type"] == "ResultValid" for c in early.patch["conditions"])
    late = job_time(case, "completionTime", 60)
    late = observe_resource(body_with(dict(PRICED)), [case["job"]], case["pods"], late)
    assert late is not None
    result_valid = next(c for c in late.patch["conditions"] if c["type"] == "ResultValid")
    assert result_valid["reason"] == "ResultMissing"


def test_bench_results_get_serving_cost() -> None:
    case = recorded("synthetic_bench_complete")
    status = {
        **PRICED,
        "children": {"job": "serve-client", "client": "serve-client", "server": "serve-server"},
        "cost": {
            "dollars": 0.0,
            "chips": 2,
            "hours": 0.0,
            "dollarsPerChipHour": 11.06,
            "priceSource": "catalog",
        },
    }
    update = observe_resource(body_with(status, "InferenceBench", "serve"), [case["job"]], case["pods"], NOW)
    assert update is not None
    results = update.patch["results"]
    # $22.12/h; capacity 8: slowest cell 540 tok/s -> 22.12 / (540 x 3600) x 1e6
    assert results["dollarsPerMillionTokensAtCapacity"] == pytest.approx(11.378601, abs=1e-6)
    assert results["dollarsPerMillionTokensAtPeak"] == pytest.approx(8.904992, abs=1e-6)
    # 10:00:02 -> 10:35:00 on 2 chips at $11.06
    assert update.patch["cost"]["dollars"] == pytest.approx(2 * 11.06 * (34 * 60 + 58) / 3600, abs=1e-3)


def test_finished_run_whose_job_was_cleaned_up_is_left_alone() -> None:
    done = {**PRICED, "phase": "Succeeded"}
    assert observe_resource(body_with(done), [], [], NOW) is None


def test_nothing_to_observe_before_children_exist() -> None:
    assert observe_resource(body_with({}), [], [], NOW) is None


def test_phase_transition_events() -> None:
    case = recorded("finetune_unschedulable")
    update = observe_resource(body_with(dict(PRICED)), [case["job"]], case["pods"], NOW)
    assert update is not None
    assert update.events[0][:2] == ("Warning", "Unschedulable")
    assert update.events[0][2].startswith("Pending -> Scheduling")


# --- spec refused, children applied ---------------------------------------------------------------


def test_invalid_spec_status_and_recovery() -> None:
    refused = invalid_spec_status({}, "method lora needs a rank", 1, NOW)
    assert refused["phase"] == "Failed"
    assert refused["conditions"][0]["reason"] == "InvalidSpec"
    assert spec_invalid(refused, 1)
    assert not spec_invalid(refused, 2)  # an edited spec is looked at again
    assert observe_resource(body_with(refused), [], [], NOW) is None

    fixed = applied_status(
        refused,
        plan_status={"chips": 8},
        accelerator="tpu-v5p 2x2x2",
        children=Children(job="g-train"),
        price=Price(8, 4.2, "catalog"),
        generation=2,
        now=NOW,
    )
    assert fixed["phase"] == "Pending"
    assert fixed["conditions"][0]["status"] == "True"
    assert fixed["cost"]["dollarsPerChipHour"] == 4.2


def test_applied_status_keeps_a_running_phase() -> None:
    running = {**PRICED, "phase": "Running", "startTime": "2026-05-04T10:00:00Z"}
    again = applied_status(
        running,
        plan_status={"chips": 8},
        accelerator="tpu-v5p 2x2x2",
        children=Children(job="gemma-lora-train"),
        price=Price(8, 4.2, "catalog"),
        generation=1,
        now=NOW,
    )
    assert "phase" not in again


# --- handler wiring with small fakes (no apiserver, no kopf loop) ---------------------------------


def test_kueue_owns_suspend_once_the_job_exists() -> None:
    from accelbench.controller.children import leave_suspend_to_kueue

    job = {
        "kind": "Job",
        "metadata": {"name": "g-train", "labels": {"kueue.x-k8s.io/queue-name": "tpu"}},
        "spec": {"suspend": True, "parallelism": 2},
    }
    waiting = {"g-train": {"spec": {"suspend": True}}}
    admitted = {"g-train": {"spec": {"suspend": False}}}
    assert leave_suspend_to_kueue(job, {})["spec"]["suspend"] is True  # created suspended
    # Re-applied before admission: still ours, still true (left out, server-side apply would unset it
    # and the Job would start without Kueue's admission: seen in the e2e suite).
    assert leave_suspend_to_kueue(job, waiting)["spec"] == {"parallelism": 2, "suspend": True}
    assert leave_suspend_to_kueue(job, admitted)["spec"] == {"parallelism": 2}  # Kueue's now
    plain = {**job, "metadata": {"name": "g-train"}}
    assert leave_suspend_to_kueue(plain, admitted)["spec"]["suspend"] is True  # the user's own suspend


def _job_body(name: str, suspend: bool) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"suspend": suspend}}


def test_client_of_a_queued_bench_is_resumed_only_after_the_server_is_admitted() -> None:
    from accelbench.controller.reconcile import client_to_resume

    spec = {"queueName": "a3-serving"}
    status = {"phase": "Suspended", "children": {"server": "b-server", "client": "b-client"}}
    queued = [_job_body("b-server", True), _job_body("b-client", True)]
    admitted = [_job_body("b-server", False), _job_body("b-client", True)]
    assert client_to_resume(spec, status, queued) is None
    assert client_to_resume(spec, status, admitted) == "b-client"
    running = [_job_body("b-server", False), _job_body("b-client", False)]
    assert client_to_resume(spec, status, running) is None  # already resumed
    assert client_to_resume({**spec, "suspend": True}, status, admitted) is None  # held by the user
    assert client_to_resume({}, status, admitted) is None  # not queued: the render decides alone
    assert client_to_resume(spec, {**status, "phase": "Failed"}, admitted) is None
    assert client_to_resume(spec, {"phase": "Pending"}, admitted) is None  # children not known yet


def _bench_with_failed_server(
    message: str,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """An InferenceBench whose server's fetch init container exited 3 (podFailurePolicy failed its Job)
    while the client Job still waits for the endpoint."""
    owner = {"labels": {"accelbench.io/name": "serve"}}
    client_job = {"metadata": {"name": "serve-client", **owner}, "status": {"active": 1}}
    server_job = {
        "metadata": {"name": "serve-server", **owner},
        "status": {
            "failed": 1,
            "conditions": [
                {"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": "exit 3"}
            ],
        },
    }
    server_pod = {
        "metadata": {
            "name": "serve-server-0-abcde",
            "labels": {"batch.kubernetes.io/job-name": "serve-server", **owner["labels"]},
            "creationTimestamp": "2026-05-04T11:59:00Z",
        },
        "spec": {"nodeName": "gpu-0"},
        "status": {
            "phase": "Failed",
            "startTime": "2026-05-04T11:59:01Z",
            "initContainerStatuses": [
                {
                    "name": "fetch-model",
                    "state": {"terminated": {"exitCode": 3, "reason": "Error", "message": message}},
                }
            ],
            "containerStatuses": [{"name": "server", "state": {"waiting": {"reason": "PodInitializing"}}}],
        },
    }
    status = {
        **PRICED,
        "children": {"job": "serve-client", "client": "serve-client", "server": "serve-server"},
    }
    return body_with(status, kind="InferenceBench", name="serve"), [client_job, server_job], [server_pod]


def test_a_bench_whose_server_cannot_fetch_its_model_fails_with_the_fetchs_reason() -> None:
    """Not a readiness timeout half an hour later: the fetch's own reason and object, at once; then
    the waiting client is stopped (only once that status is stored)."""
    from accelbench.controller.reconcile import client_to_stop

    body, jobs, pods = _bench_with_failed_server(
        "ObjectNotFound: s3://models/gemma: no such object or prefix"
    )
    assert client_to_stop(body["status"], jobs) is None  # stored status not terminal yet
    update = observe_resource(body, jobs, pods, NOW)
    assert update is not None
    assert (update.patch["phase"], update.reason) == ("Failed", "ObjectNotFound")
    assert "fetch-model: s3://models/gemma: no such object" in update.message
    failed = next(c for c in update.patch["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ObjectNotFound"
    stored = {**body["status"], **update.patch}
    assert client_to_stop(stored, jobs) == "serve-client"
    done = [{**jobs[0], "status": {"conditions": [{"type": "Complete", "status": "True"}]}}, jobs[1]]
    assert client_to_stop(stored, done) is None  # a finished client is left alone


def test_a_stored_outcome_never_moves_back_when_its_jobs_go() -> None:
    """Seen in e2e: the operator deleted the failed server, a pass then saw the client still running
    and no server, and the phase went Failed -> Running -> (client gone) JobDeleted."""
    body, jobs, pods = _bench_with_failed_server("ObjectNotFound: s3://models/gemma: no such object")
    update = observe_resource(body, jobs, pods, NOW)
    assert update is not None and update.patch["phase"] == "Failed"
    stored = body_with({**body["status"], **update.patch}, kind="InferenceBench", name="serve")
    for remaining in ([jobs[0]], []):  # the server gone, then the client too
        assert observe_resource(stored, remaining, [], NOW + timedelta(seconds=5)) is None


def test_an_engine_failure_without_a_named_reason_is_the_generic_container_failure() -> None:
    body, jobs, pods = _bench_with_failed_server("Traceback (most recent call last): ...")
    update = observe_resource(body, jobs, pods, NOW)
    assert update is not None
    assert (update.patch["phase"], update.reason) == ("Failed", "ContainerFailed")


# --- vanishing children and the operator's own cleanup (issue 14) --------------------------------


def test_a_job_that_vanished_mid_run_fails_the_run_instead_of_going_back_to_pending() -> None:
    """Running, then the Job is gone (deleted by hand, or with the operator down): Failed with
    JobDeleted and ResultMissing after the grace, never Pending, and never applied again."""
    from accelbench.controller.reconcile import job_vanished

    status = {**PRICED, "phase": "Running", "startTime": "2026-05-04T10:00:00Z"}
    assert job_vanished(status, [], NOW)
    update = observe_resource(body_with(status), [], [], NOW)
    assert update is not None
    assert (update.patch["phase"], update.reason) == ("Failed", "JobDeleted")
    assert "not started again" in update.message
    assert next(c for c in update.patch["conditions"] if c["type"] == "Failed")["reason"] == "JobDeleted"
    later = {**status, **update.patch}
    again = observe_resource(body_with(later), [], [], NOW + timedelta(minutes=1))
    assert again is None  # terminal: nothing moves any more
    result = next(c for c in update.patch["conditions"] if c["type"] == "ResultValid")
    assert (result["status"], result["reason"]) == ("False", "ResultMissing")


def test_a_job_not_yet_in_the_index_right_after_the_apply_is_waited_for() -> None:
    from accelbench.controller.reconcile import job_vanished

    applied = datetime(2026, 5, 4, 9, 59, 59, tzinfo=UTC)  # PRICED's Ready time
    assert observe_resource(body_with(dict(PRICED)), [], [], applied + timedelta(seconds=5)) is None
    assert not job_vanished(PRICED, [], applied + timedelta(seconds=5))
    assert job_vanished(PRICED, [], applied + timedelta(seconds=61))  # never showed up: deleted
    present = [{"metadata": {"name": "gemma-lora-train"}}]
    assert not job_vanished(PRICED, present, applied + timedelta(hours=1))


def test_jobs_are_cleaned_after_the_ttl_only_once_the_result_is_stored() -> None:
    from accelbench.controller.reconcile import jobs_to_clean

    ended = datetime(2026, 5, 4, 11, 0, 0, tzinfo=UTC)
    jobs = [{"metadata": {"name": "gemma-lora-train"}}, {"metadata": {"name": "someone-else"}}]
    done = {**PRICED, "phase": "Succeeded", "completionTime": "2026-05-04T11:00:00Z"}
    stored = {
        **done,
        "conditions": [
            *done["conditions"],
            {"type": "ResultValid", "status": "True", "reason": "ResultValid"},
        ],
    }
    ttl = {"ttlSecondsAfterFinished": 0}
    assert jobs_to_clean(ttl, done, jobs, ended + timedelta(hours=1)) == []  # result not stored yet
    assert jobs_to_clean(ttl, stored, jobs, ended) == ["gemma-lora-train"]  # TTL 0: right away, ours only
    assert jobs_to_clean({"ttlSecondsAfterFinished": 600}, stored, jobs, ended + timedelta(seconds=599)) == []
    assert jobs_to_clean({}, stored, jobs, ended + timedelta(days=9)) == []  # no TTL: kept
    running = {**stored, "phase": "Running"}
    assert jobs_to_clean(ttl, running, jobs, ended + timedelta(days=9)) == []


def test_cost_sums_every_segment_of_a_suspended_and_resumed_run_and_never_decreases() -> None:
    """A suspend (spec.suspend, a Kueue preemption) clears the Job's startTime and a resume sets a new
    one: the hours billed before are kept and the new segment adds to them (a running cost is billed
    to the minute, hence the tolerance)."""
    case = recorded("finetune_running")
    first = observe(case["job"], case["pods"])
    start = job_time(case, "startTime")
    one_hour = derive_status(PRICED, first, generation=1, now=start + timedelta(hours=1))
    assert one_hour["cost"]["hours"] == pytest.approx(1.0, abs=0.05)

    at = (start + timedelta(hours=1, minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ")  # the Job's Suspended time
    suspended = Observation(phase=Phase.SUSPENDED, reason="Suspended", message="suspended", suspended_at=at)
    paused = derive_status({**PRICED, **one_hour}, suspended, generation=1, now=start + timedelta(hours=3))
    assert paused["cost"]["hours"] == pytest.approx(1.5, abs=0.05)  # billed until the suspend, not since
    assert paused["startTime"] is None

    resumed_at = start + timedelta(hours=5)
    resumed = dataclasses.replace(first, start_time=resumed_at.strftime("%Y-%m-%dT%H:%M:%SZ"))
    later = derive_status({**PRICED, **paused}, resumed, generation=1, now=resumed_at + timedelta(hours=2))
    # 1.5 h before the suspend + 2 h since the resume
    assert later["cost"]["hours"] == pytest.approx(3.5, abs=0.05)
    assert later["cost"]["earlierHours"] == pytest.approx(1.5, abs=0.05)

    # The same segment seen with an earlier start (a server pod before the Job) is no new segment.
    seen_earlier = (resumed_at - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    earlier_view = dataclasses.replace(resumed, start_time=seen_earlier)
    again = derive_status(
        {**PRICED, **later}, earlier_view, generation=1, now=resumed_at + timedelta(hours=2)
    )
    assert again["cost"]["earlierHours"] == pytest.approx(1.5, abs=0.05)


def test_an_end_seen_after_the_minute_it_preceded_never_lowers_the_bill() -> None:
    """Seen in the lifecycle fuzz: the run was billed to the minute it was seen running in, and the
    Job's end, delivered by the watch a moment later, was stamped a second before that minute."""
    case = recorded("finetune_running")
    running = observe(case["job"], case["pods"])
    start = job_time(case, "startTime")
    seen = start + timedelta(hours=1, seconds=20)
    billed = derive_status(PRICED, running, generation=1, now=seen)
    minute = seen.replace(second=0, microsecond=0)
    ended_at = (minute - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ended = dataclasses.replace(running, phase=Phase.FAILED, reason="Failed", completion_time=ended_at)
    final = derive_status({**PRICED, **billed}, ended, generation=1, now=seen + timedelta(seconds=5))
    assert final["completionTime"] == ended_at
    assert final["cost"]["hours"] >= billed["cost"]["hours"]
    assert final["cost"]["dollars"] >= billed["cost"]["dollars"]


def test_no_sequence_of_observations_lowers_the_bill() -> None:
    """Seeded random walks through running, suspended (with and without the Job's Suspended time),
    resumed and ended observations a few seconds apart, each derived from the status before: the
    dollars never go down. It found a bill floored on the rounded hours whose dollars rounded
    lower ($0.1152 -> $0.1151; the lifecycle fuzz saw $0.0069 -> $0.0068)."""
    import random

    case = recorded("finetune_running")
    running = observe(case["job"], case["pods"])
    start = job_time(case, "startTime")

    def stamp(t: datetime) -> str:
        return t.strftime("%Y-%m-%dT%H:%M:%SZ")

    rng = random.Random(0)
    for _ in range(2000):
        current: dict[str, Any] = dict(PRICED)
        now, segment_start, shown = start, start, 0.0
        for _ in range(8):
            now += timedelta(seconds=rng.uniform(0, 3))
            step = rng.choice(["running", "suspended", "suspended-unstamped", "ended", "resumed"])
            if step == "resumed":
                segment_start = now - timedelta(seconds=rng.uniform(0, 2))
            earlier = stamp(now - timedelta(seconds=rng.uniform(0, 2)))
            obs = {
                "running": dataclasses.replace(running, start_time=stamp(segment_start)),
                "resumed": dataclasses.replace(running, start_time=stamp(segment_start)),
                "suspended": Observation(Phase.SUSPENDED, "Suspended", "s", suspended_at=earlier),
                "suspended-unstamped": Observation(Phase.SUSPENDED, "Suspended", "s"),
                "ended": dataclasses.replace(
                    running,
                    phase=Phase.FAILED,
                    reason="Failed",
                    start_time=stamp(segment_start),
                    completion_time=earlier,
                ),
            }[step]
            derived = derive_status(current, obs, generation=1, now=now)
            current = {k: v for k, v in {**current, **derived}.items() if v is not None}
            dollars = current["cost"]["dollars"]
            assert dollars >= shown, (step, shown, dollars)
            shown = dollars


def test_a_running_run_never_goes_back_to_scheduling() -> None:
    """Seen in the kill loop: the pod had finished and the Job was not Complete yet ("waiting for the
    Job's pods"); a preempted pod being re-created reads the same. The phase stays Running."""
    from accelbench.controller.reconcile import never_back_to_waiting

    waiting = Observation(phase=Phase.SCHEDULING, reason="Scheduling", message="waiting for the Job's pods")
    assert never_back_to_waiting({"phase": "Running"}, waiting).phase == Phase.RUNNING
    assert never_back_to_waiting({"phase": "Running"}, waiting).message == "waiting for the Job's pods"
    assert never_back_to_waiting({"phase": "Pending"}, waiting).phase == Phase.SCHEDULING
    suspended = dataclasses.replace(waiting, phase=Phase.SUSPENDED)
    assert never_back_to_waiting({"phase": "Running"}, suspended).phase == Phase.SUSPENDED


# --- the report copy in the results ConfigMap (issue 14) ----------------------------------------

WITH_RESULTS = {
    **PRICED,
    "children": {**PRICED["children"], "resultsConfigMap": "gemma-lora-results"},
}


def _stored_report(ok: bool = True, finished_at: str | None = "2026-05-04T11:00:00Z") -> str:
    report: dict[str, Any] = {"schemaVersion": 1, "kind": "finetune", "ok": ok, "chips": 8}
    if ok:
        report["finetune"] = {
            "steps": 10,
            "trainedTokens": 1000,
            "tokensPerSecond": 50.0,
            "tokensPerSecondPerChip": 6.25,
        }
    else:
        report["error"] = {"type": "ObjectNotFound", "message": "gs://b/model: no such object"}
    if finished_at:
        report["finishedAt"] = finished_at
    return json.dumps(report)


class Reader:
    """A results ConfigMap holding `text`, counting the reads the pass makes."""

    def __init__(self, text: str | None) -> None:
        self.text, self.reads = text, []

    def __call__(self, name: str) -> str | None:
        self.reads.append(name)
        return self.text


def test_pods_gone_after_completion_the_report_is_read_from_the_results_config_map() -> None:
    case = recorded("finetune_complete")
    reader = Reader(_stored_report())
    soon = job_time(case, "completionTime", 10)
    early = observe_resource(body_with(dict(WITH_RESULTS)), [case["job"]], [], soon, read_stored=reader)
    assert early is not None and reader.reads == []  # within the grace: the message may still come
    late = job_time(case, "completionTime", 60)
    update = observe_resource(body_with(dict(WITH_RESULTS)), [case["job"]], [], late, read_stored=reader)
    assert update is not None and reader.reads == ["gemma-lora-results"]
    assert update.patch["phase"] == "Succeeded"
    assert update.patch["results"]["tokensPerSecond"] == 50.0
    valid = next(c for c in update.patch["conditions"] if c["type"] == "ResultValid")
    assert valid["status"] == "True" and "ConfigMap gemma-lora-results" in valid["message"]


def test_a_termination_message_present_never_reads_the_config_map() -> None:
    case = recorded("finetune_complete")
    reader = Reader(None)
    late = job_time(case, "completionTime", 60)
    update = observe_resource(
        body_with(dict(WITH_RESULTS)), [case["job"]], case["pods"], late, read_stored=reader
    )
    assert update is not None and update.patch["phase"] == "Succeeded" and reader.reads == []


def test_a_job_deleted_after_rank0_stored_its_report_succeeded_when_the_report_says() -> None:
    """The operator down across completion and the Job deleted by hand: the ConfigMap copy is the
    result, and the run ended when the worker wrote it (billed to then, not to when it was found)."""
    status = {**WITH_RESULTS, "phase": "Running", "startTime": "2026-05-04T10:00:00Z"}
    update = observe_resource(body_with(status), [], [], NOW, read_stored=Reader(_stored_report()))
    assert update is not None
    assert (update.patch["phase"], update.reason) == ("Succeeded", "Completed")
    assert "was deleted before its completion was observed" in update.message
    assert update.patch["completionTime"] == "2026-05-04T11:00:00Z"
    assert update.patch["cost"]["hours"] == pytest.approx(1.0)
    assert update.patch["results"]["tokensPerSecond"] == 50.0
    assert not any(c["type"] == "Failed" for c in update.patch["conditions"])
    # A finishedAt outside the billed span (a worker clock ahead) is held to it.
    ahead = observe_resource(
        body_with(status), [], [], NOW, read_stored=Reader(_stored_report(finished_at="2027-01-01T00:00:00Z"))
    )
    assert ahead is not None and ahead.patch["completionTime"] == "2026-05-04T12:00:00Z"


def test_a_job_deleted_after_the_worker_reported_an_error_failed_for_that_error() -> None:
    status = {**WITH_RESULTS, "phase": "Running", "startTime": "2026-05-04T10:00:00Z"}
    update = observe_resource(body_with(status), [], [], NOW, read_stored=Reader(_stored_report(ok=False)))
    assert update is not None
    assert (update.patch["phase"], update.reason) == ("Failed", "ObjectNotFound")
    none = observe_resource(body_with(status), [], [], NOW, read_stored=Reader(None))
    assert none is not None and (none.patch["phase"], none.reason) == ("Failed", "JobDeleted")
    missing = next(c for c in none.patch["conditions"] if c["type"] == "ResultValid")
    assert "none is in ConfigMap gemma-lora-results" in missing["message"]


# --- kstatus (issue 16): Ready only once the run succeeded ----------------------------------------


@pytest.mark.parametrize(
    ("phase", "applied", "failed", "expected"),
    [
        (
            None,
            None,
            None,
            {
                "Ready": ("False", "Pending"),
                "Reconciling": ("True", "Pending"),
                "Stalled": ("False", "Progressing"),
            },
        ),
        (
            "Pending",
            ("True", "ChildrenCreated"),
            None,
            {"Ready": ("False", "Pending"), "Reconciling": ("True", "Pending")},
        ),
        (
            "Running",
            ("True", "ChildrenCreated"),
            None,
            {"Ready": ("False", "Running"), "Reconciling": ("True", "Running")},
        ),
        (
            "Suspended",
            ("True", "ChildrenCreated"),
            None,
            {"Reconciling": ("True", "Suspended"), "Stalled": ("False", "Progressing")},
        ),
        (
            "Succeeded",
            ("True", "ChildrenCreated"),
            None,
            {
                "Ready": ("True", "Completed"),
                "Reconciling": ("False", "Done"),
                "Stalled": ("False", "Progressing"),
            },
        ),
        (
            "Failed",
            ("True", "ChildrenCreated"),
            ("True", "OOMKilled"),
            {
                "Ready": ("False", "OOMKilled"),
                "Stalled": ("True", "OOMKilled"),
                "Reconciling": ("False", "Done"),
            },
        ),
        ("Failed", ("False", "InvalidSpec"), None, {"Stalled": ("True", "InvalidSpec")}),
        (
            None,
            ("False", "NameConflict"),
            None,
            {"Stalled": ("True", "NameConflict"), "Reconciling": ("False", "Done")},
        ),
        (
            None,
            ("False", "QuotaExceeded"),
            None,
            {"Reconciling": ("True", "QuotaExceeded"), "Stalled": ("False", "Progressing")},
        ),
        (
            "Running",
            ("False", "ApplyRejected"),
            None,
            {"Reconciling": ("True", "ApplyRejected"), "Ready": ("False", "ApplyRejected")},
        ),
    ],
)
def test_kstatus_conditions_follow_the_phase(
    phase: str | None,
    applied: tuple[str, str] | None,
    failed: tuple[str, str] | None,
    expected: dict[str, tuple[str, str]],
) -> None:
    from accelbench.controller.status import kstatus_conditions

    conditions = []
    if applied:
        conditions.append(
            {
                "type": "Applied",
                "status": applied[0],
                "reason": applied[1],
                "lastTransitionTime": "2026-05-04T10:00:00Z",
            }
        )
    if failed:
        conditions.append(
            {
                "type": "Failed",
                "status": failed[0],
                "reason": failed[1],
                "lastTransitionTime": "2026-05-04T10:00:00Z",
            }
        )
    status = (
        {"phase": phase, "conditions": conditions, "message": "m"} if phase else {"conditions": conditions}
    )
    got = {c["type"]: (c["status"], c["reason"]) for c in kstatus_conditions(status, 4, NOW)["conditions"]}
    for type_, value in expected.items():
        assert got[type_] == value, (type_, got)
    again = kstatus_conditions(
        {**status, **kstatus_conditions(status, 4, NOW)}, 4, NOW + timedelta(minutes=5)
    )
    first = kstatus_conditions(status, 4, NOW)
    assert again == first  # nothing changed: no write, the transition times stay


def test_a_status_computed_whole_deletes_the_map_keys_it_no_longer_has() -> None:
    """A merge patch merges maps: a campaign's `waiting` once kept every cell that ever waited."""
    current = {"waiting": {"a": "maxConcurrent 2", "b": "budget"}, "totals": {"cells": 2, "running": 1}}
    desired = {"waiting": {"b": "budget"}, "totals": {"cells": 2, "running": 0}}
    assert status_patch(current, desired, whole_maps=True) == {
        "waiting": {"a": None, "b": "budget"},
        "totals": {"cells": 2, "running": 0},
    }
    assert status_patch(current, desired) == desired  # a run's status: maps merged as before
    assert status_patch(current, {"waiting": {}}, whole_maps=True) == {"waiting": {"a": None, "b": None}}


def test_a_young_job_without_pods_leaves_the_applied_status_until_its_pods_come() -> None:
    """Issue 17: one write a run less. Until the Job is POD_CREATE_GRACE old, a Pending run whose Job
    has no pods yet keeps what the apply wrote; a suspended Job, an old one, or any pod moves it on."""
    case = recorded("finetune_running")
    job = copy.deepcopy(case["job"])
    created = datetime.fromisoformat(job["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    young, old = created + timedelta(seconds=3), created + timedelta(seconds=20)
    assert observe_resource(body_with(dict(PRICED)), [job], [], young) is None
    assert observe_resource(body_with(dict(PRICED)), [job], [], old) is not None  # past the grace
    assert observe_resource(body_with(dict(PRICED)), [job], case["pods"], young) is not None
    suspended = {**job, "spec": {**job["spec"], "suspend": True}}
    assert observe_resource(body_with(dict(PRICED)), [suspended], [], young) is not None
    scheduling = {**PRICED, "phase": "Scheduling"}  # observed before: a lost pod is reported
    assert observe_resource(body_with(scheduling), [job], [], young) is not None
