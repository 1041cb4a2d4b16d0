"""Renderer: golden manifests per accelerator, strict Kubernetes schema checks, focused facts.

Regenerate the golden files after an intended change with
    UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_render.py
and review the diff like code.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import render_fixtures as fx
import yaml

from accelbench.api import Engine, FinetuneJob, InferenceBench
from accelbench.api.common import EnvVar, RunControl, Scheduling
from accelbench.api.contract import ENV_JOB, LABEL_ROLE, Role
from accelbench.api.payload import JobPayload
from accelbench.render import RenderError, render, render_finetune, render_inference
from accelbench.render.names import (
    client_job_name,
    finetune_children,
    inference_children,
    results_config_map_name,
    server_name,
    train_job_name,
    train_service_name,
)

GOLDEN_DIR = Path(__file__).parent / "golden"
# Validate against a recent release the package ships schemas for (GKE regular channel and newer).
KUBERNETES_VERSION = "1.35"
COMPLETION_INDEX_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def _dump(objects: list[dict[str, Any]]) -> str:
    # Unbounded width: the ACCELBENCH_JOB JSON stays on one line, so diffs stay readable.
    return yaml.safe_dump_all(objects, sort_keys=False, width=1 << 20)


def _render(case: str) -> list[dict[str, Any]]:
    resource, plan = fx.GOLDEN_CASES[case]()
    return render(resource, plan, fx.CATALOG).objects


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _job(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "Job" and o["metadata"]["name"] == name)


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


def _container(job: dict[str, Any]) -> dict[str, Any]:
    return _pod(job)["containers"][0]


def _env(job: dict[str, Any]) -> dict[str, Any]:
    """name -> value, or the fieldRef path for downward-API variables."""
    return {
        e["name"]: e.get("value", e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath"))
        for e in _container(job).get("env", [])
    }


# ---------------------------------------------------------------- golden files and schemas


@pytest.mark.parametrize("case", sorted(fx.GOLDEN_CASES))
def test_golden(case: str) -> None:
    path = GOLDEN_DIR / f"{case}.yaml"
    text = _dump(_render(case))
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path.name} missing; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} differs; rerun with UPDATE_GOLDEN=1 if intended"


@pytest.mark.parametrize("case", sorted(fx.GOLDEN_CASES))
def test_objects_validate_strictly(case: str) -> None:
    for obj in _render(case):
        # strict: unknown fields are errors, so a typo in a field name cannot slip through
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("case", sorted(fx.GOLDEN_CASES))
def test_objects_share_no_sub_objects(case: str) -> None:
    # a shared dict would show up as a YAML anchor, and mutating one child would change another
    assert "&id" not in _dump(_render(case))


def test_no_golden_file_is_orphaned() -> None:
    assert {p.stem for p in GOLDEN_DIR.glob("*.yaml")} <= set(fx.GOLDEN_CASES)


# ---------------------------------------------------------------- TPU


def test_tpu_pods_select_slice_and_request_four_chips_per_host() -> None:
    job, plan = fx.ft_tpu_v5p_multihost()
    pod = _pod(_job(render_finetune(job, plan, fx.CATALOG), "gemma-v5p16-train"))
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5p-slice"
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x2x2"
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["google.com/tpu"] == "4"
    assert resources["limits"]["google.com/tpu"] == "4"
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


# Every run's first children: where rank 0 reports (render/results.py).
RESULTS_KINDS = ["ConfigMap", "ServiceAccount", "Role", "RoleBinding"]


def test_rank0_reports_into_the_results_config_map_and_may_do_nothing_else() -> None:
    """The ConfigMap copy of the report outlives the pods and the Job (issue 14); the pods' one
    permission is to patch that ConfigMap. The user's ServiceAccount is bound, not shadowed."""
    job, plan = fx.ft_tpu_v5p_multihost()
    objects = render_finetune(job, plan, fx.CATALOG)
    config_map, account, role, binding = objects[:4]
    assert config_map["metadata"]["name"] == "gemma-v5p16-results" and "data" not in config_map
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["gemma-v5p16-results"],
            "verbs": ["patch"],
        }
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": fx.NAMESPACE}
    ]
    pod = _pod(objects[-1])
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert "automountServiceAccountToken" not in pod  # the token is how it reports
    env = _env(objects[-1])
    assert env["ACCELBENCH_RESULTS_CONFIGMAP"] == "gemma-v5p16-results"
    assert env["POD_NAMESPACE"] == "metadata.namespace"
    own = fx.finetune("own-sa", {"type": "h100", "count": 2}, serviceAccountName="trainer")
    objects = render_finetune(own, fx.ft_h100_x2()[1], fx.CATALOG)
    assert [o["kind"] for o in objects[:3]] == ["ConfigMap", "Role", "RoleBinding"]
    assert objects[2]["subjects"][0]["name"] == "trainer"


def test_multi_host_is_indexed_job_with_headless_service() -> None:
    job, plan = fx.ft_tpu_v5p_multihost()
    objects = render_finetune(job, plan, fx.CATALOG)
    assert [o["kind"] for o in objects] == [*RESULTS_KINDS, "Service", "Job"]
    service, train = objects[-2:]
    assert train["spec"]["completionMode"] == "Indexed"
    assert train["spec"]["completions"] == 2
    assert train["spec"]["parallelism"] == 2
    assert service["metadata"]["name"] == train_service_name("gemma-v5p16")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    # the Service must select exactly the training pods
    pod_labels = train["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert _pod(train)["subdomain"] == service["metadata"]["name"]


def test_multi_host_jax_env_points_at_rank_zero() -> None:
    job, plan = fx.ft_tpu_v5p_multihost()
    env = _env(_job(render_finetune(job, plan, fx.CATALOG), "gemma-v5p16-train"))
    assert env["JAX_COORDINATOR_ADDRESS"] == "gemma-v5p16-train-0.gemma-v5p16-train:8476"
    assert env["JAX_NUM_PROCESSES"] == "2"
    assert env["JAX_PROCESS_ID"] == COMPLETION_INDEX_PATH
    assert env["JOB_COMPLETION_INDEX"] == COMPLETION_INDEX_PATH


def test_single_host_has_no_service_subdomain_or_coordinator() -> None:
    job, plan = fx.ft_tpu_v5p_single()
    objects = render_finetune(job, plan, fx.CATALOG)
    assert [o["kind"] for o in objects] == [*RESULTS_KINDS, "Job"]
    train = objects[-1]
    assert train["spec"]["completions"] == train["spec"]["parallelism"] == 1
    assert "subdomain" not in _pod(train)
    assert "JAX_COORDINATOR_ADDRESS" not in _env(train)


def test_reservation_selects_the_reservation() -> None:
    job, plan = fx.ft_tpu_v5p_single()
    selector = _pod(render_finetune(job, plan, fx.CATALOG)[-1])["nodeSelector"]
    assert selector["cloud.google.com/reservation-name"] == "v5p-res-a"
    assert selector["cloud.google.com/reservation-affinity"] == "specific"
    assert "cloud.google.com/gke-spot" not in selector


def test_spot_selects_and_tolerates_spot_nodes() -> None:
    job, plan = fx.ft_tpu_v5p_multihost()
    pod = _pod(_job(render_finetune(job, plan, fx.CATALOG), "gemma-v5p16-train"))
    assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert any(t["key"] == "cloud.google.com/gke-spot" for t in pod["tolerations"])


def test_on_demand_has_no_capacity_labels() -> None:
    job, plan = fx.ft_h100_x2()
    selector = _pod(render_finetune(job, plan, fx.CATALOG)[-1])["nodeSelector"]
    assert selector == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}


def test_tpu_plan_without_topology_is_refused() -> None:
    job, _ = fx.ft_tpu_v5p_single()
    with pytest.raises(RenderError, match="topology"):
        render_finetune(job, fx.make_plan(fx.TPU_V5P, chips=4, topology=None), fx.CATALOG)


# ---------------------------------------------------------------- GPU, Gaudi, CPU


def test_torch_env_on_two_h100() -> None:
    job, plan = fx.ft_h100_x2()
    train = render_finetune(job, plan, fx.CATALOG)[-1]
    env = _env(train)
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["MASTER_PORT"] == "29500"
    assert env["NNODES"] == "1"
    assert env["NPROC_PER_NODE"] == "2"
    assert env["NODE_RANK"] == COMPLETION_INDEX_PATH
    assert _container(train)["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_multi_host_torch_master_is_rank_zero() -> None:
    job, _ = fx.ft_h100_x2()
    plan = fx.make_plan(fx.H100, chips=16, hosts=2)
    objects = render_finetune(job, plan, fx.CATALOG)
    env = _env(_job(objects, "gemma-h100x2-train"))
    assert env["MASTER_ADDR"] == "gemma-h100x2-train-0.gemma-h100x2-train"
    assert env["NNODES"] == "2"
    assert env["NPROC_PER_NODE"] == "8"
    assert _by_kind(objects, "Service")[0]["spec"]["ports"][0]["port"] == 29500


def test_nvidia_and_gaudi_get_memory_backed_shm() -> None:
    for case in (fx.ft_h100_x2, fx.ft_h200_x1, fx.ft_gaudi3_x8):
        job, plan = case()
        pod = _pod(render_finetune(job, plan, fx.CATALOG)[-1])
        assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    job, plan = fx.ft_tpu_v5p_single()
    pod = _pod(render_finetune(job, plan, fx.CATALOG)[-1])
    assert all(v["name"] != "dshm" for v in pod.get("volumes", []))


def test_gaudi_privileges_and_hugepages() -> None:
    job, plan = fx.ft_gaudi3_x8()
    train = render_finetune(job, plan, fx.CATALOG)[-1]
    pod = _pod(train)
    assert pod["hostIPC"] is True
    assert pod["nodeSelector"] == {"habana.ai/device.name": "gaudi3"}
    container = pod["containers"][0]
    assert container["securityContext"]["capabilities"]["add"] == ["SYS_NICE"]
    assert "runAsNonRoot" not in pod["securityContext"]
    assert pod["securityContext"]["runAsUser"] == 0  # explicit: the image ends as uid 1000
    for part in ("requests", "limits"):
        assert container["resources"][part]["habana.ai/gaudi"] == "8"
        assert container["resources"][part]["hugepages-2Mi"] == "95008Mi"
        # Kubernetes refuses huge pages without a memory (or cpu) request
        assert "memory" in container["resources"][part]


def test_gaudi_figures_in_the_install_guide_are_the_renderer_s() -> None:
    from accelbench.render.accelerator import GAUDI_HUGEPAGES_MI_PER_CARD

    guide = (Path(__file__).parents[2] / "docs" / "install-gaudi.md").read_text()
    per_host = 8 * GAUDI_HUGEPAGES_MI_PER_CARD
    assert f"{GAUDI_HUGEPAGES_MI_PER_CARD}Mi per card" in guide and f"{per_host}Mi for" in guide
    pages = per_host // 2
    assert f"hugepages={pages}" in guide and f"vm.nr_hugepages = {pages}" in guide
    assert f"{pages} pages" in guide
    # No other amount of Mi anywhere in the guide (an old figure left behind).
    assert set(re.findall(r"\b(\d{3,})Mi\b", guide)) == {str(GAUDI_HUGEPAGES_MI_PER_CARD), str(per_host)}


def test_non_gaudi_workers_run_as_non_root_with_no_capabilities() -> None:
    for case in (fx.ft_tpu_v5p_single, fx.ft_h100_x2, fx.ft_cpu_local):
        job, plan = case()
        pod = _pod(render_finetune(job, plan, fx.CATALOG)[-1])
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["fsGroup"] == 1000
        assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert "hostIPC" not in pod


def test_gs_inputs_get_a_cache_volume_and_pvc_inputs_none() -> None:
    from accelbench.api.contract import ENV_CACHE_DIR
    from accelbench.render.storage import CACHE_DIR

    _, plan = fx.ft_h100_x2()
    pvc_job = fx.finetune("pvc-run", {"type": "h100", "count": 2})
    gs_job = fx.finetune(
        "gs-run",
        {"type": "h100", "count": 2},
        model={"uri": "gs://bucket/models/gemma-3-27b-it", "family": "gemma3", "size": "27b"},
    )
    for job, cached in ((pvc_job, False), (gs_job, True)):
        pod = _pod(render_finetune(job, plan, fx.CATALOG)[-1])
        container = pod["containers"][0]
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        assert (CACHE_DIR in mounts) is cached
        assert (_env({"spec": {"template": {"spec": pod}}}).get(ENV_CACHE_DIR) == CACHE_DIR) is cached
        if cached:
            assert volumes[mounts[CACHE_DIR]] == {"name": mounts[CACHE_DIR], "emptyDir": {}}


def test_cpu_requests_no_accelerator() -> None:
    job, plan = fx.ft_cpu_local()
    pod = _pod(render_finetune(job, plan, fx.CATALOG)[-1])
    assert "resources" not in pod["containers"][0]
    assert "nodeSelector" not in pod
    assert "tolerations" not in pod


def test_resource_overrides_merge_over_device_requests() -> None:
    job, plan = fx.ft_h100_x2()
    resources = _container(render_finetune(job, plan, fx.CATALOG)[-1])["resources"]
    assert resources["requests"] == {"nvidia.com/gpu": "2", "cpu": "48", "memory": "400Gi"}
    assert resources["limits"] == {"nvidia.com/gpu": "2", "memory": "600Gi"}


def test_user_env_is_appended_and_replaces_same_name() -> None:
    job, plan = fx.ft_h100_x2()
    names = [e["name"] for e in _container(render_finetune(job, plan, fx.CATALOG)[-1])["env"]]
    assert names[-1] == "NCCL_DEBUG"
    override = job.model_copy(deep=True)
    override.spec.env = [EnvVar(name="MASTER_PORT", value="23456")]
    env = _container(render_finetune(override, plan, fx.CATALOG)[-1])["env"]
    assert [e["value"] for e in env if e["name"] == "MASTER_PORT"] == ["23456"]


# ---------------------------------------------------------------- Job control


def test_job_control_fields() -> None:
    job, plan = fx.ft_tpu_v5p_multihost()
    train = _job(render_finetune(job, plan, fx.CATALOG), "gemma-v5p16-train")
    spec = train["spec"]
    assert spec["activeDeadlineSeconds"] == 21600
    assert "ttlSecondsAfterFinished" not in spec  # the operator deletes it after storing the result
    assert spec["suspend"] is False
    # one slice-level failure takes every host down; maxRetries counts whole-slice retries
    assert spec["backoffLimit"] == job.spec.max_retries * plan.hosts
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert rules[1]["action"] == "FailJob"
    assert rules[1]["onExitCodes"] == {"containerName": "worker", "operator": "In", "values": [3]}
    pod = _pod(train)
    assert pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "accelbench.workers.finetune"]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]


def test_single_host_backoff_limit_is_max_retries() -> None:
    job, plan = fx.ft_h200_x1()
    assert render_finetune(job, plan, fx.CATALOG)[-1]["spec"]["backoffLimit"] == 1


def test_kueue_queue_suspends_and_labels_the_job() -> None:
    job, plan = fx.ft_h200_x1()
    train = render_finetune(job, plan, fx.CATALOG)[-1]
    assert train["spec"]["suspend"] is True
    assert train["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "a3-ultra"
    # the queue label belongs on the Job only: Kueue admits the Job, not its pods
    assert "kueue.x-k8s.io/queue-name" not in train["spec"]["template"]["metadata"]["labels"]


def test_spec_suspend_suspends_without_queue_label() -> None:
    job, plan = fx.ft_cpu_local()
    train = render_finetune(job, plan, fx.CATALOG)[-1]
    assert train["spec"]["suspend"] is True
    assert "kueue.x-k8s.io/queue-name" not in train["metadata"]["labels"]


def test_image_defaults_to_catalog_and_spec_overrides() -> None:
    job, plan = fx.ft_tpu_v5p_single()
    assert _container(render_finetune(job, plan, fx.CATALOG)[-1])["image"] == fx.TPU_V5P.images.jax
    job.spec.image = "example.com/custom:1"
    assert _container(render_finetune(job, plan, fx.CATALOG)[-1])["image"] == "example.com/custom:1"


def test_execution_knobs_reach_the_worker_env() -> None:
    """flashAttention chooses JAX's attention path; spec.gaudi sets Gaudi's lazy mode and HPU graphs."""
    from accelbench.api.finetune import GaudiOptions, Training

    job, plan = fx.ft_tpu_v5p_single()
    assert _env(render_finetune(job, plan, fx.CATALOG)[-1])["ACCELBENCH_JAX_ATTENTION"] == "auto"
    plain = job.model_copy(
        update={"spec": job.spec.model_copy(update={"training": Training(flash_attention=False)})}
    )
    assert _env(render_finetune(plain, plan, fx.CATALOG)[-1])["ACCELBENCH_JAX_ATTENTION"] == "xla"
    job, plan = fx.ft_gaudi3_x8()
    eager = job.model_copy(
        update={"spec": job.spec.model_copy(update={"gaudi": GaudiOptions(lazy_mode=False)})}
    )
    env = _env(_job(render_finetune(eager, plan, fx.CATALOG), "llama-gaudi3-train"))
    assert (env["PT_HPU_LAZY_MODE"], env["ACCELBENCH_HPU_GRAPHS"]) == ("0", "0")
    assert "ACCELBENCH_JAX_ATTENTION" not in env  # a PyTorch worker reads flashAttention itself
    graphs = job.model_copy(
        update={"spec": job.spec.model_copy(update={"gaudi": GaudiOptions(hpu_graphs=True)})}
    )
    env = _env(_job(render_finetune(graphs, plan, fx.CATALOG), "llama-gaudi3-train"))
    assert (env["PT_HPU_LAZY_MODE"], env["ACCELBENCH_HPU_GRAPHS"]) == ("1", "1")
    with pytest.raises(ValueError, match=r"hpuGraphs needs gaudi\.lazyMode"):
        GaudiOptions(hpu_graphs=True, lazy_mode=False)


def test_missing_image_is_a_render_error() -> None:
    job, _ = fx.ft_gaudi3_x8()
    plan = fx.make_plan(fx.GAUDI3, chips=8, framework="jax")  # no JAX image for Gaudi
    with pytest.raises(RenderError, match=r"set spec\.image"):
        render_finetune(job, plan, fx.CATALOG)


def test_pvc_uris_become_volumes_with_output_writable() -> None:
    job, plan = fx.ft_tpu_v5p_single()
    pod = _pod(render_finetune(job, plan, fx.CATALOG)[-1])
    claims = {
        v["persistentVolumeClaim"]["claimName"]: v["persistentVolumeClaim"]["readOnly"]
        for v in pod["volumes"]
    }
    assert claims == {"models": True, "datasets": True, "checkpoints": False}
    mounts = {m["mountPath"]: m["readOnly"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts == {"/mnt/pvc/models": True, "/mnt/pvc/datasets": True, "/mnt/pvc/checkpoints": False}


def test_local_paths_get_no_volumes() -> None:
    job, plan = fx.ft_cpu_local()
    pod = _pod(render_finetune(job, plan, fx.CATALOG)[-1])
    assert "volumes" not in pod
    assert "volumeMounts" not in pod["containers"][0]


# ---------------------------------------------------------------- ownership, names, payload


@pytest.mark.parametrize("case", sorted(fx.GOLDEN_CASES))
def test_every_object_is_owned_by_the_resource(case: str) -> None:
    resource, _ = fx.GOLDEN_CASES[case]()
    for obj in _render(case):
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "accelbench.io/v1alpha1",
                "kind": resource.kind,
                "name": resource.metadata.name,
                "uid": fx.UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert obj["metadata"]["namespace"] == fx.NAMESPACE
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == resource.metadata.name


def test_unsaved_resource_renders_without_owner_and_in_default_namespace() -> None:
    _, plan = fx.ft_cpu_local()
    job = fx.finetune("preview", {"type": "cpu"}, uid=None, namespace=None)
    train = render_finetune(job, plan, fx.CATALOG)[-1]
    assert "ownerReferences" not in train["metadata"]
    assert train["metadata"]["namespace"] == "default"
    kubernetes_validate.validate(train, KUBERNETES_VERSION, strict=True)


RENDER_ALL = """
import json, sys
sys.path.insert(0, sys.argv[1])
import render_fixtures as fx
from accelbench.render import render
out = {}
for case, make in sorted(fx.GOLDEN_CASES.items()):
    resource, plan = make()
    out[case] = render(resource, plan, fx.CATALOG).objects
print(json.dumps(out, sort_keys=False))
"""


def test_rendering_is_deterministic_across_processes() -> None:
    """Byte-identical output in fresh interpreters with different hash seeds: no set or dict order,
    clock or randomness leaks into a child (server-side apply would see a change on every pass)."""
    import subprocess
    import sys

    def rendered(seed: str) -> str:
        env = {**os.environ, "PYTHONHASHSEED": seed}
        here = str(Path(__file__).parent)
        done = subprocess.run(
            [sys.executable, "-c", RENDER_ALL, here], env=env, capture_output=True, text=True, check=True
        )
        return done.stdout

    first, second = rendered("1"), rendered("2")
    assert first == second
    assert json.loads(first) == {case: _render(case) for case in sorted(fx.GOLDEN_CASES)}


def test_child_names() -> None:
    assert train_job_name("x") == "x-train"
    assert train_service_name("x") == "x-train"
    assert server_name("x") == "x-server"
    assert client_job_name("x") == "x-client"
    assert results_config_map_name("x") == "x-results"
    assert finetune_children("x", multi_host=True).service == "x-train"
    assert finetune_children("x", multi_host=False).service is None
    assert inference_children("x", external=True).server is None
    assert inference_children("x", external=True).job == "x-client"  # the client reports
    objects = _render("inference-vllm-h100-x2")
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert names == {
        ("ConfigMap", "gemma-serve-h100-results"),
        ("ServiceAccount", "gemma-serve-h100-client"),
        ("Role", "gemma-serve-h100-client"),
        ("RoleBinding", "gemma-serve-h100-client"),
        ("Service", "gemma-serve-h100-server"),
        ("Job", "gemma-serve-h100-server"),
        ("Job", "gemma-serve-h100-client"),
    }


def test_longest_name_keeps_pod_hostnames_within_63_characters() -> None:
    name = "a" * 52  # the API's limit
    job = fx.finetune(name, {"type": "tpu-v5p", "topology": "2x2x2"})
    _, plan = fx.ft_tpu_v5p_multihost()
    train = _job(render_finetune(job, plan, fx.CATALOG), train_job_name(name))
    assert len(f"{train['metadata']['name']}-{plan.hosts - 1}") <= 63


@pytest.mark.parametrize("case", sorted(fx.GOLDEN_CASES))
def test_the_render_record_names_what_was_rendered(case: str) -> None:
    """status.children comes from this record: each name it gives is an object of the right kind
    and role, and the reporting Job is the one whose pods run accelbench's own code."""
    resource, plan = fx.GOLDEN_CASES[case]()
    rendered = render(resource, plan, fx.CATALOG)
    kinds = {(o["kind"], o["metadata"]["name"]): o for o in rendered.objects}
    children = rendered.children
    report_job = kinds[("Job", children.job)]
    assert "accelbench.workers" in str(report_job["spec"]["template"]["spec"]["containers"][0]["command"])
    if children.server:
        assert kinds[("Job", children.server)]["metadata"]["labels"][LABEL_ROLE] == Role.SERVER
    if children.service:
        assert ("Service", children.service) in kinds
    if children.results_config_map:
        assert ("ConfigMap", children.results_config_map) in kinds
    rendered_jobs = {name for kind, name in kinds if kind == "Job"}
    assert rendered_jobs == {n for n in (children.job, children.server, children.client) if n}


@pytest.mark.parametrize("case", ["finetune-tpu-v5p-2x2x2-multihost", "inference-vllm-tpu-v6e-2x4"])
def test_job_env_parses_back_into_the_api_model(case: str) -> None:
    resource, plan = fx.GOLDEN_CASES[case]()
    objects = render(resource, plan, fx.CATALOG).objects
    role_job = next(o for o in objects if o["kind"] == "Job" and "accelbench.workers" in str(o))
    payload = JobPayload.model_validate_json(_env(role_job)[ENV_JOB])
    parsed = payload.resource()
    assert isinstance(parsed, (FinetuneJob, InferenceBench))
    job_only = set(RunControl.JOB_ONLY_FIELDS)  # at their defaults: the Job reads them, the worker not
    assert parsed.spec.model_dump(exclude=job_only) == resource.spec.model_dump(exclude=job_only)
    assert all(getattr(parsed.spec, f) == type(parsed.spec).model_fields[f].default for f in job_only)
    assert parsed.metadata.uid == fx.UID
    assert parsed.metadata.namespace == fx.NAMESPACE
    assert payload.plan == plan.worker_plan()
    assert payload.plan.chips_per_host == plan.chips_per_host and payload.plan.hosts == plan.hosts
    # What the pod must not re-derive: the resolved framework, the chips' peak and the price.
    assert payload.plan.framework == plan.framework
    assert payload.plan.peak_tflops_per_chip == plan.peak_tflops_per_chip > 0
    assert payload.plan.dollars_per_chip_hour == plan.dollars_per_chip_hour


def test_render_dispatch_refuses_other_types() -> None:
    _, plan = fx.ft_cpu_local()
    with pytest.raises(TypeError):
        render(object(), plan, fx.CATALOG)  # type: ignore[arg-type]


# ---------------------------------------------------------------- inference


def test_vllm_on_tpu_v6e() -> None:
    objects = _render("inference-vllm-tpu-v6e-2x4")
    server = _job(objects, "gemma-serve-v6e-server")
    container = _container(server)
    assert container["image"] == "vllm/vllm-tpu:v0.10.1"
    command = container["command"]
    assert command[:3] == ["vllm", "serve", "/models/models/gemma-3-27b-it"]
    assert command[command.index("--tensor-parallel-size") + 1] == "8"
    assert command[command.index("--max-model-len") + 1] == "20480"
    assert "--kv-cache-dtype" not in command
    assert container["resources"]["limits"]["google.com/tpu"] == "8"
    assert _pod(server)["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x4"
    # 2400 s readiness timeout at a 10 s period
    assert container["startupProbe"]["failureThreshold"] == 240
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert {"name": "pvc-0", "mountPath": "/models/models", "readOnly": True} in container["volumeMounts"]


def test_vllm_on_two_h100() -> None:
    objects = _render("inference-vllm-h100-x2")
    command = _container(_job(objects, "gemma-serve-h100-server"))["command"]
    assert command[command.index("--tensor-parallel-size") + 1] == "2"
    assert command[command.index("--kv-cache-dtype") + 1] == "fp8"
    # default context: the longest prompt plus the output
    assert command[command.index("--max-model-len") + 1] == str(16384 + 256)
    assert command[-1] == "--enable-chunked-prefill"


def test_server_service_targets_the_server_pods() -> None:
    objects = _render("inference-vllm-h100-x2")
    service = _by_kind(objects, "Service")[0]
    server = _job(objects, "gemma-serve-h100-server")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"][0]["port"] == 8000
    assert service["spec"]["selector"].items() <= server["spec"]["template"]["metadata"]["labels"].items()
    client = _job(objects, "gemma-serve-h100-client")
    assert not service["spec"]["selector"].items() <= client["spec"]["template"]["metadata"]["labels"].items()


def test_queued_bench_suspends_server_and_client_but_queues_only_the_server() -> None:
    objects = _render("inference-vllm-h100-x2")
    server = _job(objects, "gemma-serve-h100-server")
    client = _job(objects, "gemma-serve-h100-client")
    assert server["spec"]["suspend"] is True
    assert server["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "a3-serving"
    assert client["spec"]["suspend"] is True
    assert "kueue.x-k8s.io/queue-name" not in client["metadata"]["labels"]


def test_queued_bench_client_runs_once_the_server_is_admitted() -> None:
    from accelbench.render import render_inference

    resource, plan = fx.GOLDEN_CASES["inference-vllm-h100-x2"]()
    objects = render_inference(resource, plan, fx.CATALOG, server_admitted=True)
    assert _job(objects, "gemma-serve-h100-client")["spec"]["suspend"] is False
    assert _job(objects, "gemma-serve-h100-server")["spec"]["suspend"] is True  # Kueue's to clear
    held = resource.model_copy(update={"spec": resource.spec.model_copy(update={"suspend": True})})
    objects = render_inference(held, plan, fx.CATALOG, server_admitted=True)
    assert _job(objects, "gemma-serve-h100-client")["spec"]["suspend"] is True  # the user's hold wins


def test_tgi_on_gaudi3() -> None:
    objects = _render("inference-tgi-gaudi3-x8")
    server = _job(objects, "llama-serve-gaudi3-server")
    container = _container(server)
    command = container["command"]
    assert command[0] == "text-generation-launcher"
    assert command[command.index("--model-id") + 1] == "/models/models/llama-3.1-70b"
    assert command[command.index("--num-shard") + 1] == "8"
    assert command[command.index("--sharded") + 1] == "true"
    assert command[command.index("--max-input-tokens") + 1] == "16384"
    assert command[command.index("--max-total-tokens") + 1] == str(16384 + 256)
    env = _env(server)
    assert env["PT_HPU_ENABLE_LAZY_COLLECTIVES"] == "true"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert _pod(server)["hostIPC"] is True
    assert container["resources"]["limits"]["habana.ai/gaudi"] == "8"


def test_client_runs_on_cpu_with_endpoint_and_results_rbac() -> None:
    objects = _render("inference-vllm-tpu-v6e-2x4")
    client = _job(objects, "gemma-serve-v6e-client")
    pod = _pod(client)
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "accelbench.workers.bench"]
    assert "tolerations" not in pod
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert not any("tpu" in key or "gpu" in key for key in container["resources"]["limits"])
    env = _env(client)
    assert env["ACCELBENCH_ENDPOINT"] == "http://gemma-serve-v6e-server.ml-bench.svc:8000"
    assert env["ACCELBENCH_RESULTS_CONFIGMAP"] == "gemma-serve-v6e-results"
    assert env["ACCELBENCH_READY_TIMEOUT_SECONDS"] == "2400"
    assert pod["serviceAccountName"] == "gemma-serve-v6e-client"
    role = _by_kind(objects, "Role")[0]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["gemma-serve-v6e-results"],
            "verbs": ["patch"],
        }
    ]
    config_map = _by_kind(objects, "ConfigMap")[0]
    assert "data" not in config_map


def test_external_endpoint_renders_no_server() -> None:
    objects = _render("inference-external")
    assert [o["kind"] for o in objects] == ["ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Job"]
    client = objects[-1]
    env = _env(client)
    assert env["ACCELBENCH_ENDPOINT"] == "https://llm.internal.example.com"
    assert env["ACCELBENCH_HEALTH_PATH"] == "/v1/models"
    assert _container(client)["image"] == "ghcr.io/accelbench/bench:0.2.0"


def test_multi_host_serving_is_refused() -> None:
    bench, _ = fx.ib_vllm_tpu_v6e()
    plan = fx.make_plan(fx.TPU_V6E, chips=16, hosts=4, topology="4x4")
    with pytest.raises(RenderError, match="not supported"):
        render_inference(bench, plan, fx.CATALOG)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.TGI])
def test_object_store_model_is_fetched_by_an_init_container_for_every_engine(engine: Engine) -> None:
    """One behaviour for every engine: the bench image's workers.storage copies the model into an
    emptyDir first (as the pod's ServiceAccount, with the server's env), the engine gets that path,
    and a fetch exit INVALID_CONFIG ends the server Job at once."""
    from accelbench.api.common import EnvVar
    from accelbench.api.objects import cache_path
    from accelbench.render.storage import CACHE_DIR, FETCH_CONTAINER

    bench, plan = fx.ib_vllm_h100_x2() if engine == Engine.VLLM else fx.ib_tgi_gaudi3()
    uri = "s3://acme-models/gemma-3-27b-it"
    bench.spec.model.uri = uri
    bench.spec.service_account_name = "model-reader"
    bench.spec.server.env = [EnvVar(name="AWS_ENDPOINT_URL_S3", value="https://s3.example")]
    server = _job(render_inference(bench, plan, fx.CATALOG), f"{bench.metadata.name}-server")
    pod = _pod(server)
    command = _container(server)["command"]
    local = cache_path(CACHE_DIR, uri)
    assert local == "/var/cache/accelbench/s3/acme-models/gemma-3-27b-it"
    assert local in command and uri not in command and "runai_streamer" not in command
    (fetch,) = pod["initContainers"]
    assert fetch["name"] == FETCH_CONTAINER
    assert fetch["command"] == [
        "python",
        "-m",
        "accelbench.workers.storage",
        "fetch",
        uri,
        "--cache",
        CACHE_DIR,
    ]
    assert fetch["env"] == [{"name": "AWS_ENDPOINT_URL_S3", "value": "https://s3.example"}]
    assert pod["serviceAccountName"] == "model-reader"
    mounts = {m["name"]: m for m in _container(server)["volumeMounts"]}
    assert mounts["object-cache"] == {"name": "object-cache", "mountPath": CACHE_DIR, "readOnly": True}
    assert fetch["volumeMounts"] == [{"name": "object-cache", "mountPath": CACHE_DIR}]
    rules = server["spec"]["podFailurePolicy"]["rules"]
    assert {
        "action": "FailJob",
        "onExitCodes": {"containerName": FETCH_CONTAINER, "operator": "In", "values": [3]},
    } in rules
    assert not [r for r in rules if r.get("onExitCodes", {}).get("containerName") == "server"]
    kubernetes_validate.validate(server, KUBERNETES_VERSION, strict=True)


def test_jetstream_is_tpu_only_with_tcp_probes() -> None:
    bench, plan = fx.ib_vllm_tpu_v6e()
    bench.spec.server.engine = Engine.JETSTREAM
    server = _job(render_inference(bench, plan, fx.CATALOG), "gemma-serve-v6e-server")
    container = _container(server)
    assert container["command"][:2] == ["jpt", "serve"]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "http"}
    kubernetes_validate.validate(server, KUBERNETES_VERSION, strict=True)
    gpu, gpu_plan = fx.ib_vllm_h100_x2()
    gpu.spec.server.engine = Engine.JETSTREAM
    with pytest.raises(RenderError, match="TPU only"):
        render_inference(gpu, gpu_plan, fx.CATALOG)


def test_user_scheduling_merges_over_the_catalog() -> None:
    job, plan = fx.ft_tpu_v5p_multihost()
    job.spec.scheduling = Scheduling.model_validate(
        {
            "nodeSelector": {"team": "ml", "cloud.google.com/gke-tpu-topology": "2x2x2"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "batch-low",
        }
    )
    pod = render_finetune(job, plan, fx.CATALOG)[-1]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["team"] == "ml"
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5p-slice"
    assert {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert any(t["key"] == "google.com/tpu" for t in pod["tolerations"])
    assert pod["priorityClassName"] == "batch-low"


def test_gaudi_hugepages_are_whole_2mi_pages() -> None:
    job, plan = fx.ft_gaudi3_x8()
    container = render_finetune(job, plan, fx.CATALOG)[-1]["spec"]["template"]["spec"]["containers"][0]
    amount = container["resources"]["requests"]["hugepages-2Mi"]
    assert amount.endswith("Mi") and int(amount[:-2]) % 2 == 0


def test_env_from_a_secret_and_the_pods_service_account() -> None:
    """A secret reaches the worker through the kubelet (valueFrom), never as a value the operator
    holds; the pods run as the ServiceAccount the spec names (the Workload Identity / IRSA identity)."""
    _, plan = fx.ft_h100_x2()
    job = fx.finetune(
        "with-secret",
        {"type": "h100", "count": 2},
        env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        serviceAccountName="trainer",
    )
    pod = _pod(render_finetune(job, plan, fx.CATALOG)[-1])
    (entry,) = [e for e in pod["containers"][0]["env"] if e["name"] == "HF_TOKEN"]
    assert entry == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert pod["serviceAccountName"] == "trainer"
    unnamed = _pod(render_finetune(fx.finetune("plain", {"type": "h100", "count": 2}), plan, fx.CATALOG)[-1])
    assert unnamed["serviceAccountName"] == "plain-train"  # the run's own, which may only report
    with pytest.raises(ValueError, match="exactly one of secretKeyRef, configMapKeyRef"):
        fx.finetune("bad", {"type": "h100", "count": 2}, env=[{"name": "X", "valueFrom": {}}])
    with pytest.raises(ValueError, match="value or valueFrom, not both"):
        fx.finetune(
            "bad",
            {"type": "h100", "count": 2},
            env=[{"name": "X", "value": "1", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
        )


def test_bench_output_and_env_reach_the_client_which_runs_as_the_users_account() -> None:
    """spec.output goes to the client (it uploads the results); spec.env to every pod of the bench,
    server.env only to the engine; with spec.serviceAccountName the client runs as the user's account
    (the one Workload Identity / IRSA maps to the bucket) and the Role binds that account."""
    from accelbench.api.common import EnvVar
    from accelbench.api.contract import ENV_OUTPUT_URI
    from accelbench.api.inference import BenchOutput

    bench, plan = fx.ib_vllm_h100_x2()
    bench.spec.model.uri = "gs://models/gemma"
    bench.spec.output = BenchOutput(uri="gs://results/gemma-h100")
    bench.spec.env = [EnvVar(name="STORE", value="everywhere")]
    bench.spec.server.env = [EnvVar(name="ENGINE_ONLY", value="1")]
    objects = render_inference(bench, plan, fx.CATALOG)
    name = bench.metadata.name
    client, server = _job(objects, f"{name}-client"), _job(objects, f"{name}-server")
    assert _env(client)[ENV_OUTPUT_URI] == "gs://results/gemma-h100"
    assert _env(client)["STORE"] == "everywhere" and "ENGINE_ONLY" not in _env(client)
    assert {"STORE", "ENGINE_ONLY"} <= set(_env(server))
    fetch_env = {e["name"] for e in _pod(server)["initContainers"][0]["env"]}
    assert fetch_env == {"STORE", "ENGINE_ONLY"}
    assert _pod(client)["serviceAccountName"] == f"{name}-client"  # its own, by default
    assert any(o["kind"] == "ServiceAccount" for o in objects)

    bench.spec.service_account_name = "results-writer"
    objects = render_inference(bench, plan, fx.CATALOG)
    assert _pod(_job(objects, f"{name}-client"))["serviceAccountName"] == "results-writer"
    assert not any(o["kind"] == "ServiceAccount" for o in objects)  # the user's account is not ours
    binding = next(o for o in objects if o["kind"] == "RoleBinding")
    assert binding["subjects"][0]["name"] == "results-writer"
    with pytest.raises(ValueError, match="gs://BUCKET/PATH or s3://BUCKET/PATH"):
        BenchOutput(uri="pvc://results/x")


def test_the_server_job_always_has_a_deadline_of_its_own() -> None:
    """It never ends by itself: with the operator gone it must not hold chips forever."""
    from accelbench.render.inference import server_deadline

    accel = {"type": "h100", "count": 1}
    bench = fx.inference("deadline", accel, {"engine": "vllm"})
    assert server_deadline(bench) == 6 * 3600
    shorter = fx.inference("deadline", accel, {"engine": "vllm"}, activeDeadlineSeconds=600)
    assert server_deadline(shorter) == 600
    own = fx.inference(
        "deadline", accel, {"engine": "vllm", "deadlineSeconds": 3600}, activeDeadlineSeconds=7200
    )
    assert server_deadline(own) == 3600


def test_env_from_and_pull_secrets_reach_every_pod_by_name_only() -> None:
    """Whole Secrets (envFrom) and registry Secrets (imagePullSecrets) go to every container and pod
    of both kinds as references: the rendered objects and the payload hold names, never values."""
    from accelbench.api.common import EnvFromSource, PullSecret

    secrets = {
        "envFrom": [
            {"secretRef": {"name": "s3-keys"}, "prefix": "S3_"},
            {"configMapRef": {"name": "endpoints"}},
        ],
        "imagePullSecrets": [{"name": "registry"}],
    }
    _, plan = fx.ft_h100_x2()
    job = fx.finetune("with-secrets", {"type": "h100", "count": 2}, **secrets)
    bench, bench_plan = fx.ib_vllm_h100_x2()
    bench.spec.model.uri = "gs://models/gemma"  # a fetch init container too
    bench.spec.env_from = [EnvFromSource.model_validate(e) for e in secrets["envFrom"]]
    bench.spec.image_pull_secrets = [PullSecret(name="registry")]
    jobs = [o for o in render_finetune(job, plan, fx.CATALOG) if o["kind"] == "Job"]
    jobs += [o for o in render_inference(bench, bench_plan, fx.CATALOG) if o["kind"] == "Job"]
    assert len(jobs) == 3
    for rendered in jobs:
        pod = _pod(rendered)
        assert pod["imagePullSecrets"] == [{"name": "registry"}]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            assert container["envFrom"] == secrets["envFrom"], container["name"]
    with pytest.raises(ValueError, match="exactly one of secretRef, configMapRef"):
        fx.finetune("bad", {"type": "h100", "count": 2}, envFrom=[{"prefix": "X"}])
    with pytest.raises(ValueError, match="exactly one of secretRef, configMapRef"):
        EnvFromSource.model_validate({"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}})


def test_the_engine_runs_as_uid_1000_with_a_writable_home_unless_it_must_be_root() -> None:
    """The restricted Pod Security profile: non-root, no escalation, no capabilities, seccomp; the
    engine's caches go to an emptyDir HOME. spec.server.runAsRoot and Gaudi are the exceptions."""
    bench, plan = fx.ib_vllm_h100_x2()
    server = _pod(_job(render_inference(bench, plan, fx.CATALOG), f"{bench.metadata.name}-server"))
    assert (
        server["securityContext"]["runAsNonRoot"] is True and server["securityContext"]["runAsUser"] == 1000
    )
    container = server["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HOME"] == "/home/engine" and env["XDG_CACHE_HOME"] == "/home/engine/.cache"
    assert {"name": "engine-home", "mountPath": "/home/engine"} in container["volumeMounts"]
    assert {"name": "engine-home", "emptyDir": {}} in server["volumes"]

    bench.spec.server.run_as_root = True
    root = _pod(_job(render_inference(bench, plan, fx.CATALOG), f"{bench.metadata.name}-server"))
    assert "runAsNonRoot" not in root["securityContext"] and "HOME" not in _env(
        _job(render_inference(bench, plan, fx.CATALOG), f"{bench.metadata.name}-server")
    )
    gaudi, gaudi_plan = fx.ib_tgi_gaudi3()
    habana = _pod(_job(render_inference(gaudi, gaudi_plan, fx.CATALOG), f"{gaudi.metadata.name}-server"))
    assert habana["securityContext"]["runAsUser"] == 0
