"""What a real cluster puts next to a run (issue 14): objects with a child's name, a same-named
predecessor, pods refused at admission, and the operator away while resources or namespaces go.

Each bad case ends in a condition that names it; no foreign object is changed or adopted; no
resource carries a finalizer, so nothing waits for the operator."""

from __future__ import annotations

import time
from typing import Any

import pytest
from e2e_env import Env, wait_for
from kubernetes import client
from test_lifecycle import FT, jobs_of, run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # No worker runs in this module (every run is suspended or refused): paths need not exist.
    base = tmp_path_factory.mktemp("tiny-neighbours")
    return {"model": str(base / "model"), "data": str(base / "chat.jsonl")}


def ready(env: Env, name: str, namespace: str = "default") -> dict[str, Any] | None:
    obj = env.get(FT, name, namespace)
    ready = next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Ready"), None)
    return obj if ready is not None and ready["status"] == "True" else None


def reason_of(env: Env, name: str, type_: str) -> str | None:
    conditions = env.get(FT, name).get("status", {}).get("conditions", [])
    return next((c["reason"] for c in conditions if c["type"] == type_), None)


def gone(env: Env, name: str) -> bool:
    try:
        env.get(FT, name)
    except client.ApiException as exc:
        return exc.status == 404
    return False


def test_no_finalizer_so_deleting_a_run_or_its_namespace_never_waits_for_the_operator(
    env: Env, tiny: dict[str, str]
) -> None:
    env.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team-gone")))
    for namespace in ("default", "team-gone"):
        body = run("no-finalizer", tiny, 4, suspend=True)
        body["metadata"]["namespace"] = namespace
        env.apply(body)
        obj = wait_for(lambda ns=namespace: ready(env, "no-finalizer", ns), what=f"children in {namespace}")
        assert not obj["metadata"].get("finalizers")
    env.operator.stop()
    try:
        env.kubectl("delete", FT, "no-finalizer", "--wait=false")
        env.kubectl("delete", "namespace", "team-gone", "--wait=false")
        started = time.monotonic()
        wait_for(lambda: gone(env, "no-finalizer"), timeout=30, what="resource deleted")
        wait_for(
            lambda: "team-gone" not in {n.metadata.name for n in env.core.list_namespace().items},
            timeout=120,
            what="namespace deleted",
        )
        print(f"resource and namespace gone {time.monotonic() - started:.1f} s after delete, operator down")
    finally:
        env.operator.start()


def test_an_object_holding_a_childs_name_is_never_touched_and_the_run_waits_for_it(
    env: Env, tiny: dict[str, str]
) -> None:
    """A Job the user made, named like the run's child: NameConflict within a minute, the Job is left
    exactly as it was, and the run goes on by itself once the user removes it."""
    foreign = client.V1Job(
        metadata=client.V1ObjectMeta(name="squatted-train", labels={"owner": "someone-else"}),
        spec=client.V1JobSpec(
            suspend=True,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never", containers=[client.V1Container(name="c", image="busybox")]
                )
            ),
        ),
    )
    created = env.batch.create_namespaced_job("default", foreign)
    env.apply(run("squatted", tiny, 4, suspend=True))
    started = time.monotonic()
    wait_for(lambda: reason_of(env, "squatted", "Ready") == "NameConflict", what="NameConflict")
    print(f"NameConflict {time.monotonic() - started:.1f} s after apply")
    obj = env.get(FT, "squatted")
    assert "Job/squatted-train already exists" in obj["status"]["message"]
    after = env.batch.read_namespaced_job("squatted-train", "default")
    # Untouched: the operator wrote no field (the Job controller updates the status of its own Jobs).
    managers = {m.manager for m in after.metadata.managed_fields or []}
    assert "accelbench-operator" not in managers, managers
    assert after.spec.template.spec.containers[0].image == created.spec.template.spec.containers[0].image
    assert not after.metadata.owner_references and after.metadata.labels == {"owner": "someone-else"}

    env.batch.delete_namespaced_job("squatted-train", "default", propagation_policy="Background")
    wait_for(lambda: ready(env, "squatted"), timeout=90, what="run applied after the name was freed")
    job = env.batch.read_namespaced_job("squatted-train", "default")
    assert [r.uid for r in job.metadata.owner_references] == [env.get(FT, "squatted")["metadata"]["uid"]]
    env.kubectl("delete", FT, "squatted")


def test_a_run_recreated_under_the_same_name_never_adopts_its_predecessors_job(
    env: Env, tiny: dict[str, str]
) -> None:
    env.apply(run("reborn", tiny, 4, suspend=True))
    first = wait_for(lambda: ready(env, "reborn"), what="first incarnation applied")
    old_uid = first["metadata"]["uid"]
    env.kubectl("delete", FT, "reborn", "--wait=false")
    env.apply(run("reborn", tiny, 4, suspend=True))  # at once: the old Job may still be there
    second = wait_for(
        lambda: (o := ready(env, "reborn")) is not None and o["metadata"]["uid"] != old_uid and o,
        timeout=90,
        what="second incarnation applied",
    )
    jobs = wait_for(
        lambda: [j for j in jobs_of(env, "reborn") if not j.metadata.deletion_timestamp] or None,
        what="the new Job",
    )
    owners = {r.uid for j in jobs for r in j.metadata.owner_references}
    assert owners == {second["metadata"]["uid"]}
    env.kubectl("delete", FT, "reborn")


def test_pods_refused_at_admission_show_as_a_condition_within_a_minute(
    env: Env, tiny: dict[str, str]
) -> None:
    """A mistyped priorityClassName: the apiserver refuses every pod of the Job; the Job controller's
    FailedCreate Event becomes the run's condition instead of Scheduling forever."""
    body = run("bad-priority", tiny, 4)
    body["spec"]["scheduling"]["priorityClassName"] = "gpu-hihg"
    env.apply(body)
    started = time.monotonic()
    wait_for(
        lambda: reason_of(env, "bad-priority", "Running") == "FailedCreate", timeout=60, what="FailedCreate"
    )
    obj = env.get(FT, "bad-priority")
    print(f"FailedCreate condition {time.monotonic() - started:.1f} s after apply")
    assert obj["status"]["phase"] == "Scheduling"
    assert "gpu-hihg" in obj["status"]["message"]

    # Started (the Job's startTime is in status): its spec is what it measures, so admission refuses an
    # edit, with the field and the way out; holding it (suspend) stays possible.
    assert obj["status"].get("startTime")
    edit = env.kubectl(
        "patch", FT, "bad-priority", "--type=merge", "-p", '{"spec":{"training":{"maxSteps":8}}}', check=False
    )
    assert edit.returncode != 0
    assert "spec.training cannot change once the run has started" in edit.stderr, edit.stderr
    env.kubectl("patch", FT, "bad-priority", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    env.kubectl("delete", FT, "bad-priority")
