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
from test_operator import finetune


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # No worker runs in this module (every run is suspended or refused): paths need not exist.
    base = tmp_path_factory.mktemp("tiny-neighbours")
    return {"model": str(base / "model"), "data": str(base / "chat.jsonl")}


def ready(env: Env, name: str, namespace: str = "default") -> dict[str, Any] | None:
    obj = env.get(FT, name, namespace)
    ready = next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Applied"), None)
    return obj if ready is not None and ready["status"] == "True" else None


def reason_of(env: Env, name: str, type_: str, namespace: str = "default") -> str | None:
    conditions = env.get(FT, name, namespace).get("status", {}).get("conditions", [])
    return next((c["reason"] for c in conditions if c["type"] == type_), None)


def namespace(env: Env, name: str, labels: dict[str, str] | None = None) -> None:
    env.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))


def on_pool(name: str, ns: str, accelerator: dict[str, Any]) -> dict[str, Any]:
    """A run on a kwok pool: its pods are admitted or refused for real, no worker process runs."""
    body = finetune(name, accelerator)
    body["metadata"]["namespace"] = ns
    return body


def pods_in(env: Env, ns: str, name: str) -> list[Any]:
    return env.core.list_namespaced_pod(ns, label_selector=f"accelbench.io/name={name}").items


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
    wait_for(lambda: reason_of(env, "squatted", "Applied") == "NameConflict", what="NameConflict")
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


def test_a_pod_security_restricted_namespace_admits_gpu_workers_and_names_what_it_refuses(env: Env) -> None:
    """GPU workers meet the `restricted` Pod Security profile (non-root, no privilege escalation, all
    capabilities dropped, RuntimeDefault seccomp), so they run there. Gaudi workers add SYS_NICE,
    which `restricted` forbids: the run says so within a minute instead of Scheduling forever."""
    ns = "team-restricted"
    namespace(env, ns, {"pod-security.kubernetes.io/enforce": "restricted"})
    try:
        env.apply(on_pool("ps-gpu", ns, {"type": "h100", "count": 1}))
        env.apply(on_pool("ps-gaudi", ns, {"type": "gaudi3", "count": 1}))
        started = time.monotonic()
        wait_for(lambda: pods_in(env, ns, "ps-gpu") or None, what="GPU worker pod admitted")
        wait_for(
            lambda: reason_of(env, "ps-gaudi", "Running", ns) == "FailedCreate",
            timeout=60,
            what="FailedCreate for the Gaudi run",
        )
        print(f"Pod Security refusal shown {time.monotonic() - started:.1f} s after apply")
        message = env.get(FT, "ps-gaudi", ns)["status"]["message"]
        assert 'violates PodSecurity "restricted' in message and "SYS_NICE" in message, message
        assert pods_in(env, ns, "ps-gaudi") == []
    finally:
        env.kubectl("delete", "namespace", ns, "--wait=false")


def test_a_resource_quota_that_refuses_a_child_is_said_and_the_run_goes_on_once_it_is_lifted(
    env: Env,
) -> None:
    """A quota on Jobs refuses the operator's own create (QuotaExceeded, retried); lifted, the run is
    applied; a quota on pods then refuses the Job's pods (FailedCreate naming the quota)."""
    ns = "team-quota"
    namespace(env, ns)
    try:
        quota = client.V1ResourceQuota(
            metadata=client.V1ObjectMeta(name="no-jobs"),
            spec=client.V1ResourceQuotaSpec(hard={"count/jobs.batch": "0"}),
        )
        env.core.create_namespaced_resource_quota(ns, quota)
        # Admission refuses everything ("status unknown") until the quota controller has counted.
        wait_for(
            lambda: env.core.read_namespaced_resource_quota("no-jobs", ns).status.hard, what="quota counted"
        )
        env.apply(on_pool("over-quota", ns, {"type": "h100", "count": 1}))
        started = time.monotonic()
        wait_for(
            lambda: reason_of(env, "over-quota", "Applied", ns) == "QuotaExceeded",
            timeout=60,
            what="QuotaExceeded",
        )
        print(f"QuotaExceeded {time.monotonic() - started:.1f} s after apply")
        obj = env.get(FT, "over-quota", ns)
        assert "exceeded quota: no-jobs" in obj["status"]["message"]
        assert obj["status"].get("phase") in (None, "Pending")  # nothing ran: neither failed nor started

        pods_quota = client.V1ResourceQuota(
            metadata=client.V1ObjectMeta(name="no-pods"), spec=client.V1ResourceQuotaSpec(hard={"pods": "0"})
        )
        env.core.create_namespaced_resource_quota(ns, pods_quota)
        wait_for(lambda: env.core.read_namespaced_resource_quota("no-pods", ns).status.hard, what="counted")
        env.core.delete_namespaced_resource_quota("no-jobs", ns)
        lifted = time.monotonic()
        wait_for(
            lambda: reason_of(env, "over-quota", "Running", ns) == "FailedCreate",
            timeout=90,
            what="the Job applied once the quota was lifted, its pods refused by the next one",
        )
        print(
            f"applied, its pods' refusal shown {time.monotonic() - lifted:.1f} s after the quota was lifted"
        )
        assert "exceeded quota: no-pods" in env.get(FT, "over-quota", ns)["status"]["message"]
    finally:
        env.kubectl("delete", "namespace", ns, "--wait=false")


def accelbench_labels(labels: dict[str, str]) -> dict[str, str]:
    """The labels the operator puts on a worker pod. Not the Job controller's own (controller-uid,
    job-name): a pod wearing those is adopted by the Job (and deleted while it is suspended)."""
    return {k: v for k, v in labels.items() if k.startswith("accelbench.io/")}


def test_a_pod_wearing_a_workers_labels_is_not_taken_for_the_run(env: Env, tiny: dict[str, str]) -> None:
    """Pods are matched to a run by their Job's UID, never by labels: a Running pod that copies a
    held run's labels neither starts it nor is touched."""
    env.apply(run("spoofed", tiny, 4, suspend=True))
    wait_for(lambda: ready(env, "spoofed"), what="children applied")
    job = jobs_of(env, "spoofed")[0]
    node = env.core.list_node(label_selector="cloud.google.com/gke-accelerator=nvidia-h100-80gb").items[0]
    spoof = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="spoofed-train-0-fake", labels=accelbench_labels(job.spec.template.metadata.labels)
        ),
        spec=client.V1PodSpec(
            node_name=node.metadata.name,
            tolerations=[client.V1Toleration(operator="Exists")],
            containers=[client.V1Container(name="worker", image="busybox")],
        ),
    )
    env.core.create_namespaced_pod("default", spoof)
    wait_for(
        lambda: env.core.read_namespaced_pod("spoofed-train-0-fake", "default").status.phase == "Running",
        what="the spoofing pod Running",
    )
    env.kubectl("annotate", FT, "spoofed", "poke=1")  # wakes a pass over the run now
    time.sleep(3)
    obj = env.get(FT, "spoofed")
    assert obj["status"]["phase"] == "Suspended", str(obj["status"])
    assert not obj["status"].get("results") and not obj["status"].get("progress")
    after = env.core.read_namespaced_pod("spoofed-train-0-fake", "default")
    assert not after.metadata.owner_references
    assert "accelbench-operator" not in {m.manager for m in after.metadata.managed_fields or []}
    env.core.delete_namespaced_pod("spoofed-train-0-fake", "default", grace_period_seconds=0)
    env.kubectl("delete", FT, "spoofed")
