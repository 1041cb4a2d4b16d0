"""FinetuneJob -> results ConfigMap + rank 0's RBAC + (headless Service when multi-host) + Indexed Job.

Worker exit codes are api.contract.ExitCode; the Job's podFailurePolicy fails the Job at once on
INVALID_CONFIG (retrying the same input cannot succeed) and retries ERROR and kills (137; the
controller reads the container's reason to tell OOM apart). Pods evicted by a disruption
(preemption, drain, Spot reclaim) are ignored, not counted.

Env of the training container (names in api.contract), user spec.env last, replacing same names:

    ENV_JOB                the JobPayload: spec and the worker's plan (render/payload.py)
    ENV_PVC_ROOT           where pvc://CLAIM/PATH is mounted: $ENV_PVC_ROOT/CLAIM/PATH
    ENV_CACHE_DIR          an emptyDir for gs:// and s3:// inputs and outputs (only when there are any)
    ENV_METRICS_PORT       the Prometheus port the worker serves (named `metrics`)
    ENV_TERMINATION_LOG    where the compact WorkerReport goes
    ENV_RESULTS_CONFIGMAP, ENV_POD_NAMESPACE   where rank 0 writes the full report (render/results.py)
    ENV_COMPLETION_INDEX   this host's index 0..hosts-1
    jax:     JAX_COORDINATOR_ADDRESS (<job>-0.<service>:8476, multi-host only),
             JAX_NUM_PROCESSES (= hosts), JAX_PROCESS_ID (= the index)
    pytorch: MASTER_ADDR (<job>-0.<service>, or 127.0.0.1 on one host), MASTER_PORT=29500,
             NNODES (= hosts), NPROC_PER_NODE (= chips per host), NODE_RANK (= the index)

On TPU, GKE also injects TPU_WORKER_ID and TPU_WORKER_HOSTNAMES for a multi-host Indexed Job with a
subdomain; jax.distributed.initialize() prefers those and the JAX_* values agree with them.
"""

from __future__ import annotations

from typing import Any

from ..api import FinetuneJob
from ..api.contract import (
    ENV_COMPLETION_INDEX,
    ENV_HPU_GRAPHS,
    ENV_HPU_LAZY_MODE,
    ENV_JAX_ATTENTION,
    ENV_JAX_COORDINATOR,
    ENV_JAX_PROCESS_ID,
    ENV_JAX_PROCESSES,
    ENV_JOB,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_METRICS_PORT,
    ENV_NNODES,
    ENV_NODE_RANK,
    ENV_NPROC_PER_NODE,
    ENV_PVC_ROOT,
    ENV_TERMINATION_LOG,
    METRICS_PORT,
    TERMINATION_LOG_PATH,
    ExitCode,
    Role,
)
from ..api.finetune import GaudiOptions
from ..catalog.types import AcceleratorSpec, Catalog
from ..plan.types import Plan
from . import accelerator
from .errors import RenderError
from .meta import build_metadata, metrics_annotations, metrics_port_entry
from .names import (
    labels,
    selector_labels,
    train_job_name,
    train_service_account_name,
    train_service_name,
)
from .payload import job_payload_json
from .results import build_reporter_rbac, build_results_config_map, reporter_env
from .storage import ClaimUse, build_claim_volumes, cache_env, cache_volume, is_object_store
from .workload import (
    JobShape,
    build_headless_service,
    build_job,
    container_base,
    env_completion_index,
    env_from,
    env_value,
    is_suspended,
    merge_env,
    pull_secrets,
)

WORKER_CONTAINER = "worker"
WORKER_MODULE = "accelbench.workers.finetune"
PVC_ROOT = "/mnt/pvc"
JAX_COORDINATOR_PORT = 8476
TORCH_MASTER_PORT = 29500


def worker_image(job: FinetuneJob, plan: Plan, accel: AcceleratorSpec) -> str:
    image = job.spec.image or getattr(accel.images, plan.framework, None)
    if not image:
        raise RenderError(f"no {plan.framework} worker image for {accel.name} in the catalog; set spec.image")
    return image


def build_distributed_env(job_name: str, service: str, plan: Plan) -> list[dict[str, Any]]:
    """Rendezvous for the framework: rank 0's stable DNS name is the coordinator."""
    leader = f"{job_name}-0.{service}"
    if plan.framework == "jax":
        env = []
        if plan.multi_host:
            env.append(env_value(ENV_JAX_COORDINATOR, f"{leader}:{JAX_COORDINATOR_PORT}"))
        env.append(env_value(ENV_JAX_PROCESSES, plan.hosts))
        env.append(env_completion_index(ENV_JAX_PROCESS_ID))
        return env
    if plan.framework == "pytorch":
        return [
            env_value(ENV_MASTER_ADDR, leader if plan.multi_host else "127.0.0.1"),
            env_value(ENV_MASTER_PORT, TORCH_MASTER_PORT),
            env_value(ENV_NNODES, plan.hosts),
            env_value(ENV_NPROC_PER_NODE, plan.chips_per_host),
            env_completion_index(ENV_NODE_RANK),
        ]
    raise RenderError(f"framework {plan.framework!r} is neither jax nor pytorch")


def build_execution_env(job: FinetuneJob, plan: Plan, accel: AcceleratorSpec) -> list[dict[str, Any]]:
    """What training.flashAttention and spec.gaudi ask of the runtime: JAX's attention path (the
    fused dot_product_attention, cuDNN on GPU, or XLA's plain one), Gaudi's lazy mode and HPU graphs.
    The PyTorch worker reads flashAttention from the spec itself."""
    env = []
    if plan.framework == "jax":
        fused = "auto" if job.spec.training.flash_attention else "xla"
        env.append(env_value(ENV_JAX_ATTENTION, fused))
    if accel.vendor == accelerator.VENDOR_HABANA:
        gaudi = job.spec.gaudi or GaudiOptions()
        env.append(env_value(ENV_HPU_LAZY_MODE, "1" if gaudi.lazy_mode else "0"))
        env.append(env_value(ENV_HPU_GRAPHS, "1" if gaudi.hpu_graphs else "0"))
    return env


def build_worker_env(job: FinetuneJob, plan: Plan, accel: AcceleratorSpec) -> list[dict[str, Any]]:
    name = job.metadata.name
    env = [
        env_value(ENV_JOB, job_payload_json(job, plan)),
        env_value(ENV_PVC_ROOT, PVC_ROOT),
        *([cache_env()] if uses_object_store(job) else []),
        env_value(ENV_METRICS_PORT, METRICS_PORT),
        env_value(ENV_TERMINATION_LOG, TERMINATION_LOG_PATH),
        *reporter_env(job),
        env_completion_index(ENV_COMPLETION_INDEX),
        *build_distributed_env(train_job_name(name), train_service_name(name), plan),
        *build_execution_env(job, plan, accel),
    ]
    return merge_env(env, job.spec.env)


def input_uris(job: FinetuneJob) -> list[str]:
    model = [job.spec.model.uri] if job.spec.model is not None else []
    uris = [*model, job.spec.dataset.uri]
    if job.spec.pass_at_k is not None:
        uris.append(job.spec.pass_at_k.dataset)
    return uris


def uses_object_store(job: FinetuneJob) -> bool:
    """gs:// or s3:// inputs are copied into, and such outputs staged in, the cache emptyDir."""
    outputs = [job.spec.output.uri] if job.spec.output is not None else []
    return any(is_object_store(uri) for uri in [*input_uris(job), *outputs])


def build_worker_storage(job: FinetuneJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """PVC volumes, and an emptyDir for gs:// inputs and staged outputs (ENV_CACHE_DIR)."""
    uses = [ClaimUse(uri, writable=False) for uri in input_uris(job)]
    if job.spec.output is not None:
        uses.append(ClaimUse(job.spec.output.uri, writable=True))
    volumes, mounts = build_claim_volumes(uses, PVC_ROOT)
    if uses_object_store(job):
        volume, mount = cache_volume()
        volumes.append(volume)
        mounts.append(mount)
    return volumes, mounts


def build_worker_container(job: FinetuneJob, plan: Plan, accel: AcceleratorSpec) -> dict[str, Any]:
    container = container_base(WORKER_CONTAINER, worker_image(job, plan, accel))
    container["command"] = ["python", "-m", WORKER_MODULE]
    container["env"] = build_worker_env(job, plan, accel)
    container.update(env_from(job.spec.env_from))
    container["ports"] = [metrics_port_entry()]
    resources = accelerator.merge_resources(
        accelerator.build_device_resources(plan, accel), job.spec.resources
    )
    if resources:
        container["resources"] = resources
    container["securityContext"] = accelerator.build_container_security(accel)
    return container


def worker_account(job: FinetuneJob) -> str:
    """The user's ServiceAccount (Workload Identity / IRSA for object storage), else the run's own."""
    return job.spec.service_account_name or train_service_account_name(job.metadata.name)


def build_worker_pod_template(job: FinetuneJob, plan: Plan, accel: AcceleratorSpec) -> dict[str, Any]:
    name = job.metadata.name
    container = build_worker_container(job, plan, accel)
    volumes, mounts = build_worker_storage(job)
    volumes = accelerator.mount_volumes(container, accel, volumes, mounts)
    pod: dict[str, Any] = {
        "restartPolicy": "Never",  # retries belong to the Job (and podFailurePolicy needs Never)
        **pull_secrets(job.spec),
        # Its one API call: rank 0 patches the results ConfigMap with its report (render/results.py).
        "serviceAccountName": worker_account(job),
        "securityContext": accelerator.build_pod_security(accel, run_as_non_root=True),
        "containers": [container],
    }
    if plan.multi_host:
        pod["subdomain"] = train_service_name(name)
    accelerator.place_on_accelerator(pod, plan, accel, job.spec.accelerator, job.spec.scheduling)
    if volumes:
        pod["volumes"] = volumes
    # Where rank 0's live metrics are (status.progress; see meta.metrics_annotations).
    labels_ = labels(job, Role.TRAIN, plan.accelerator)
    metadata = {"labels": labels_, "annotations": metrics_annotations()}
    return {"metadata": metadata, "spec": pod}


def build_train_job(job: FinetuneJob, plan: Plan, accel: AcceleratorSpec) -> dict[str, Any]:
    name = job.metadata.name
    # With more than one host, one lost rank takes its peers down with it (their collectives time
    # out), so one real failure costs up to `hosts` pod failures; scaling keeps maxRetries meaning
    # "whole-slice retries".
    shape = JobShape(
        hosts=plan.hosts,
        backoff_limit=job.spec.max_retries * plan.hosts,
        fail_job_exit_codes=[int(ExitCode.INVALID_CONFIG)],
        containers=(WORKER_CONTAINER,),
        suspend=is_suspended(job.spec),
        queue_name=job.spec.queue_name,
    )
    metadata = build_metadata(job, train_job_name(name), labels(job, Role.TRAIN, plan.accelerator))
    return build_job(metadata, shape, job.spec, build_worker_pod_template(job, plan, accel))


def build_train_service(job: FinetuneJob, plan: Plan) -> dict[str, Any]:
    name = job.metadata.name
    metadata = build_metadata(job, train_service_name(name), labels(job, Role.TRAIN, plan.accelerator))
    if plan.framework == "jax":
        port_name, port = "coordinator", JAX_COORDINATOR_PORT
    else:
        port_name, port = "rendezvous", TORCH_MASTER_PORT
    return build_headless_service(metadata, selector_labels(job.kind, name, Role.TRAIN), port_name, port)


def check_plan(job: FinetuneJob, plan: Plan, accel: AcceleratorSpec) -> None:
    if plan.hosts < 1 or plan.chips_per_host < 1:
        raise RenderError(f"plan has {plan.hosts} hosts of {plan.chips_per_host} chips")
    if plan.accelerator != job.spec.accelerator.type.value:
        raise RenderError(f"plan is for {plan.accelerator}, the spec asks for {job.spec.accelerator.type}")
    if accel.resource_name is None and plan.multi_host:
        raise RenderError("multi-host runs need an accelerator; cpu runs on one host")


def render_finetune(job: FinetuneJob, plan: Plan, catalog: Catalog) -> list[dict[str, Any]]:
    """The children of a FinetuneJob in apply order: what the pods refer to (the results ConfigMap,
    rank 0's RBAC, the headless Service of a multi-host run, so the pods' DNS names exist), then
    the Job."""
    accel = catalog.get(plan.accelerator)
    check_plan(job, plan, accel)
    name = job.metadata.name
    train_labels = labels(job, Role.TRAIN, plan.accelerator)
    objects = [
        build_results_config_map(job, train_labels),
        *build_reporter_rbac(job, train_service_account_name(name), worker_account(job), train_labels),
    ]
    if plan.multi_host:
        objects.append(build_train_service(job, plan))
    objects.append(build_train_job(job, plan, accel))
    return objects
