"""InferenceBench -> results ConfigMap + client RBAC + server (Job + Service) + client Job.

Server workload kind: a batch/v1 Indexed Job of one pod, not a Deployment, because
- the server lives exactly as long as one benchmark: its Job always has activeDeadlineSeconds
  (spec.server.deadlineSeconds, 6 h by default), which caps the accelerator bill even if the
  operator is gone, and a crash-looping engine ends in a Failed Job
  with a reason instead of restarting forever on expensive chips;
- Kueue admits batch Jobs natively (same `kueue.x-k8s.io/queue-name` + suspend path as training);
- a multi-host server, when it comes, is the same Indexed Job + headless Service shape as
  training, which a Deployment cannot express (no stable per-host identity or all-or-nothing start).
The Job never completes by itself: the controller deletes `<name>-server` once the client Job has
finished. Multi-host serving is refused for now (vLLM needs a Ray cluster across hosts, TGI is
single-node, JetStream multi-host needs Pathways); the planner should pick single-host shapes.

Model location (see storage.py): pvc://CLAIM/PATH is mounted read-only at /models/CLAIM and the
engine gets /models/CLAIM/PATH. gs:// and s3:// are copied by an init container (FETCH_CONTAINER,
the bench image running workers.storage: the fine-tuning worker's own copy code, verified and
space-checked) into an emptyDir, and every engine gets the local copy's path; a missing, refused or
corrupt object fails the server Job at once (exit INVALID_CONFIG) with its reason. The fetch runs as
the server pod's ServiceAccount (spec.serviceAccountName: Workload Identity, IRSA) with the server's
env. Other values (a path in the image, a Hub id) are passed as-is.

Client: `python -m accelbench.workers.bench` on a CPU node, no accelerator requests or
tolerations. It waits for the server itself (polls ENV_ENDPOINT + ENV_HEALTH_PATH, or
a TCP connect when the path is absent, for up to ENV_READY_TIMEOUT seconds) instead of an
init container, so the wait and its timeout end up in its report as server_startup_seconds.
When the bench is queued in Kueue, the client is created suspended too and rendered unsuspended once
the server Job has been admitted (`server_admitted`, which the controller reads from the live server
Job), so the readiness wait does not run out in the queue.
Client env (names in api.contract): ENV_JOB (as for training, see payload.py), ENV_ENDPOINT,
ENV_HEALTH_PATH, ENV_READY_TIMEOUT, ENV_RESULTS_CONFIGMAP (the ConfigMap it patches with the full
results), ENV_POD_NAMESPACE, ENV_TERMINATION_LOG, ENV_METRICS_PORT. The served model name is
discovered from the endpoint's /v1/models. Exit codes: api.contract.ExitCode.

The client's results write is the one call it makes to the Kubernetes API: its ServiceAccount may
patch only the run's results ConfigMap (render/results.py); the server pod runs without an API token.
"""

from __future__ import annotations

import copy
from typing import Any

from ..api import InferenceBench
from ..api.contract import (
    ENV_ENDPOINT,
    ENV_HEALTH_PATH,
    ENV_JOB,
    ENV_METRICS_PORT,
    ENV_OUTPUT_URI,
    ENV_READY_TIMEOUT,
    ENV_TERMINATION_LOG,
    ENV_TOKENIZER_DIR,
    METRICS_PORT,
    TERMINATION_LOG_PATH,
    ExitCode,
    Role,
)
from ..api.inference import Engine, KvCacheDtype
from ..catalog.types import AcceleratorSpec, Catalog
from ..plan.types import Plan
from . import accelerator
from .errors import RenderError
from .meta import build_metadata, metrics_annotations, metrics_port_entry, namespace_of
from .names import (
    client_job_name,
    client_service_account_name,
    labels,
    selector_labels,
    server_name,
    server_service_name,
)
from .payload import job_payload_json
from .results import build_reporter_rbac, build_results_config_map, reporter_env
from .storage import (
    FETCH_CONTAINER,
    ClaimUse,
    build_claim_volumes,
    cache_volume,
    cached_model_path,
    fetch_command,
    is_local_path,
    is_object_store,
    local_path,
    parse_pvc,
)
from .workload import (
    JobShape,
    build_job,
    container_base,
    env_from,
    env_value,
    is_suspended,
    merge_env,
    pull_secrets,
)

SERVER_CONTAINER = "server"
SERVER_PORT_NAME = "http"  # the engine's port: probes and the Service target it by name
CLIENT_CONTAINER = "client"
CLIENT_MODULE = "accelbench.workers.bench"
MODEL_ROOT = "/models"
ENGINE_HOME = "/home/engine"  # HOME of an engine run as uid 1000 (an emptyDir)
ENGINE_HOME_VOLUME = "engine-home"
HEALTH_PATH = "/health"  # vLLM and TGI both answer 200 here once the model is loaded
EXTERNAL_HEALTH_PATH = "/v1/models"  # any OpenAI-compatible endpoint serves it
STARTUP_PERIOD_SECONDS = 10
# The load generator is asyncio over HTTP: two cores keep client overhead out of the latencies
# up to a few hundred concurrent streams.
# A copy is network- and disk-bound: no CPU request of its own, so the pod's effective request (the
# larger of the init container's and the engine's) stays the engine's; memory for 8 streams' buffers.
FETCH_RESOURCES = {"requests": {"memory": "512Mi"}, "limits": {"memory": "2Gi"}}
CLIENT_RESOURCES = {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
TGI_DEFAULT_PREFILL_TOKENS = 4096
FETCH_ADAPTER_CONTAINER = "fetch-adapter"
# vLLM's LoRAConfig.max_lora_rank accepts only these (vllm/config/lora.py, MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


# ---------------------------------------------------------------- model and engine arguments


def engine_path(uri: str) -> str:
    """Where the engine finds `uri`: a local path for pvc:// and for an object-store copy,
    otherwise the URI as given."""
    ref = parse_pvc(uri)
    if ref is not None:
        return local_path(ref, MODEL_ROOT)
    if is_object_store(uri):
        return cached_model_path(uri)
    return uri


def model_uri(bench: InferenceBench) -> str:
    uri = bench.spec.model.uri
    if uri is None:  # the controller resolves finetuneJob to a uri (controller/served.py) first
        raise RenderError(f"model.finetuneJob {bench.spec.model.finetune_job} is not resolved to a model yet")
    return uri


def model_argument(bench: InferenceBench) -> str:
    """What the engine is told to load."""
    return engine_path(model_uri(bench))


def served_uris(bench: InferenceBench) -> list[tuple[str, str]]:
    """(init container, uri) of what the engine loads: the model, and the LoRA adapter if any."""
    adapter = bench.spec.model.adapter
    return [(FETCH_CONTAINER, model_uri(bench))] + (
        [(FETCH_ADAPTER_CONTAINER, adapter.uri)] if adapter else []
    )


def fetched_uris(bench: InferenceBench) -> list[tuple[str, str]]:
    """The served URIs an init container copies from object storage (none for an external endpoint)."""
    if bench.spec.server.engine == Engine.EXTERNAL:
        return []
    return [(name, uri) for name, uri in served_uris(bench) if is_object_store(uri)]


def build_fetch_container(bench: InferenceBench, image: str, name: str, uri: str) -> dict[str, Any]:
    """An init container copying `uri` into the cache emptyDir with workers.storage, as the pod's
    ServiceAccount (Workload Identity / IRSA) and with the server's env (an endpoint, a secretKeyRef)."""
    container = container_base(name, image)
    container["command"] = fetch_command(uri)
    env = merge_env(merge_env([], bench.spec.env), bench.spec.server.env)
    if env:
        container["env"] = env
    container.update(env_from(bench.spec.env_from))
    container["volumeMounts"] = [cache_volume()[1]]
    container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    container["resources"] = {part: dict(values) for part, values in FETCH_RESOURCES.items()}
    return container


def vllm_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds `rank` (its LoRAConfig takes only these)."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise RenderError(f"LoRA rank {rank} is above the largest vLLM serves ({VLLM_LORA_RANKS[-1]})")


def tensor_parallel(bench: InferenceBench, plan: Plan) -> int:
    # One server process spans every chip the pod gets unless the user says otherwise.
    return bench.spec.server.tensor_parallel or plan.chips


def max_model_length(bench: InferenceBench) -> int:
    """Longest sequence the sweep sends, unless set: a smaller context leaves more room for KV
    cache than the model's full window, and is what the benchmark needs."""
    workload = bench.spec.workload
    return bench.spec.server.max_model_length or max(workload.input_lengths) + workload.output_length


def build_vllm_command(bench: InferenceBench, plan: Plan) -> list[str]:
    server = bench.spec.server
    command = [
        "vllm",
        "serve",
        model_argument(bench),
        "--port",
        str(server.port),
        "--tensor-parallel-size",
        str(tensor_parallel(bench, plan)),
        "--max-model-len",
        str(max_model_length(bench)),
    ]
    # bf16 is what `auto` gives for the bf16 checkpoints benchmarked here; vLLM has no bf16 value.
    if server.kv_cache_dtype == KvCacheDtype.FP8:
        command += ["--kv-cache-dtype", "fp8"]
    if server.quantization:
        command += ["--quantization", server.quantization]
    adapter = bench.spec.model.adapter
    if adapter is not None:
        command += [
            "--enable-lora",
            "--max-lora-rank",
            str(vllm_lora_rank(adapter.rank)),
            "--lora-modules",
            f"{adapter.name}={engine_path(adapter.uri)}",
        ]
    return command + list(server.extra_args)


def build_transformers_command(bench: InferenceBench, accel: AcceleratorSpec) -> list[str]:
    """`transformers serve` loads the model dir itself; the device follows the accelerator."""
    server = bench.spec.server
    device = "cpu" if accel.resource_name is None else "cuda"
    return [
        "transformers",
        "serve",
        model_argument(bench),
        "--host",
        "0.0.0.0",
        "--port",
        str(server.port),
        "--device",
        device,
        *server.extra_args,
    ]


def build_tgi_command(bench: InferenceBench, plan: Plan) -> list[str]:
    server = bench.spec.server
    if server.kv_cache_dtype == KvCacheDtype.FP8:
        raise RenderError("kvCacheDtype fp8 is rendered for vLLM only")
    max_input = max(bench.spec.workload.input_lengths)
    total = max_model_length(bench)
    if total <= max_input:
        raise RenderError(f"maxModelLength {total} leaves no room to generate after {max_input} input tokens")
    shards = tensor_parallel(bench, plan)
    command = [
        "text-generation-launcher",
        "--model-id",
        model_argument(bench),
        "--port",
        str(server.port),
        # --max-input-tokens is the current name of --max-input-length.
        "--max-input-tokens",
        str(max_input),
        "--max-total-tokens",
        str(total),
        # TGI refuses to start when one prompt cannot fit a prefill batch.
        "--max-batch-prefill-tokens",
        str(max(max_input, TGI_DEFAULT_PREFILL_TOKENS)),
    ]
    if shards > 1:
        command += ["--sharded", "true", "--num-shard", str(shards)]
    if server.quantization:
        command += ["--quantize", server.quantization]
    return command + list(server.extra_args)


def build_jetstream_command(bench: InferenceBench, plan: Plan) -> list[str]:
    """JetStream-PyTorch's server, minimal: model and port; everything else via extraArgs."""
    server = bench.spec.server
    command = ["jpt", "serve", f"--model_id={model_argument(bench)}", f"--port={server.port}"]
    return command + list(server.extra_args)


def engine_runs_as_root(bench: InferenceBench, accel: AcceleratorSpec) -> bool:
    return bench.spec.server.run_as_root or accel.vendor == accelerator.VENDOR_HABANA


def engine_home() -> tuple[dict[str, Any], dict[str, Any]]:
    """A writable HOME for an engine run as uid 1000: its images expect to write caches under
    /root (the Hugging Face hub, torch.compile, Triton kernels, vLLM's own)."""
    return {"name": ENGINE_HOME_VOLUME, "emptyDir": {}}, {
        "name": ENGINE_HOME_VOLUME,
        "mountPath": ENGINE_HOME,
    }


def build_engine_env(bench: InferenceBench, plan: Plan, accel: AcceleratorSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    if not engine_runs_as_root(bench, accel):
        env += [env_value("HOME", ENGINE_HOME), env_value("XDG_CACHE_HOME", f"{ENGINE_HOME}/.cache")]
    if bench.spec.server.engine == Engine.TGI and accel.vendor == accelerator.VENDOR_HABANA:
        # Habana's documented settings for TGI: the MPI shared-memory copy path is unsupported in
        # containers, and sharded runs need lazy collectives with HPU graphs.
        env.append(env_value("OMPI_MCA_btl_vader_single_copy_mechanism", "none"))
        if tensor_parallel(bench, plan) > 1:
            env.append(env_value("PT_HPU_ENABLE_LAZY_COLLECTIVES", "true"))
    return merge_env(merge_env(env, bench.spec.env), bench.spec.server.env)


def engine_image(bench: InferenceBench, accel: AcceleratorSpec) -> str:
    engine = bench.spec.server.engine
    image = bench.spec.server.image or getattr(accel.images, engine.value, None)
    if not image:
        raise RenderError(f"no {engine} image for {accel.name} in the catalog; set spec.server.image")
    return image


def build_engine_command(bench: InferenceBench, plan: Plan, accel: AcceleratorSpec) -> list[str]:
    engine = bench.spec.server.engine
    if bench.spec.model.adapter is not None and engine != Engine.VLLM:
        source = bench.spec.model.adapter.uri
        raise RenderError(
            f"engine {engine} does not serve a LoRA adapter ({source}); use engine vllm, or export a "
            "merged model (the FinetuneJob's output.mergeLora: true, its default)"
        )
    if engine == Engine.VLLM:
        return build_vllm_command(bench, plan)
    if engine == Engine.TGI:
        return build_tgi_command(bench, plan)
    if engine == Engine.TRANSFORMERS:
        if accelerator.is_tpu(accel) or accel.vendor == accelerator.VENDOR_HABANA:
            raise RenderError("engine transformers renders for CPU and NVIDIA GPUs only")
        return build_transformers_command(bench, accel)
    if engine == Engine.JETSTREAM:
        if not accelerator.is_tpu(accel):
            raise RenderError("engine jetstream runs on TPU only")
        return build_jetstream_command(bench, plan)
    raise RenderError(f"engine {engine} has no server to render")


def build_probes(bench: InferenceBench) -> dict[str, dict[str, Any]]:
    """startupProbe covers model loading (readinessTimeoutSeconds); readiness gates the Service.

    No liveness probe: restarting an engine mid-sweep would corrupt the measurement; a hung engine
    shows up as client errors and the Job deadline instead.
    """
    server = bench.spec.server
    if server.engine == Engine.JETSTREAM:
        check: dict[str, Any] = {
            "tcpSocket": {"port": SERVER_PORT_NAME}
        }  # JetStream has no HTTP health route
    else:
        check = {"httpGet": {"path": HEALTH_PATH, "port": SERVER_PORT_NAME}}
    startup_failures = max(-(-server.readiness_timeout_seconds // STARTUP_PERIOD_SECONDS), 1)
    # Each probe gets its own copy: no sub-object is shared, so a caller may mutate one safely
    # (and YAML dumps carry no anchors).
    return {
        "startupProbe": {
            **copy.deepcopy(check),
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": startup_failures,
        },
        "readinessProbe": {
            **copy.deepcopy(check),
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
    }


# ---------------------------------------------------------------- server


def build_server_container(bench: InferenceBench, plan: Plan, accel: AcceleratorSpec) -> dict[str, Any]:
    server = bench.spec.server
    command = build_engine_command(bench, plan, accel)  # first: it refuses engine/accelerator mismatches
    container = container_base(SERVER_CONTAINER, engine_image(bench, accel))
    container["command"] = command
    env = build_engine_env(bench, plan, accel)
    if env:
        container["env"] = env
    container.update(env_from(bench.spec.env_from))
    container["ports"] = [{"name": SERVER_PORT_NAME, "containerPort": server.port, "protocol": "TCP"}]
    container.update(build_probes(bench))
    resources = accelerator.merge_resources(accelerator.build_device_resources(plan, accel), server.resources)
    if resources:
        container["resources"] = resources
    container["securityContext"] = accelerator.build_container_security(accel)
    return container


def build_server_pod_template(
    bench: InferenceBench, plan: Plan, accel: AcceleratorSpec, fetch_image: str
) -> dict[str, Any]:
    container = build_server_container(bench, plan, accel)
    claims = [ClaimUse(uri, writable=False) for _, uri in served_uris(bench)]
    volumes, mounts = build_claim_volumes(claims, MODEL_ROOT)
    init = [build_fetch_container(bench, fetch_image, name, uri) for name, uri in fetched_uris(bench)]
    if init:
        volume, mount = cache_volume(read_only=True)
        volumes.append(volume)
        mounts.append(mount)
    as_root = engine_runs_as_root(bench, accel)
    if not as_root:
        volume, mount = engine_home()
        volumes.append(volume)
        mounts.append(mount)
    volumes = accelerator.mount_volumes(container, accel, volumes, mounts)
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        **pull_secrets(bench.spec),
        "automountServiceAccountToken": False,
        **({"serviceAccountName": sa} if (sa := bench.spec.service_account_name) else {}),
        "securityContext": accelerator.build_pod_security(accel, run_as_non_root=not as_root),
        **({"initContainers": init} if init else {}),
        "containers": [container],
    }
    accelerator.place_on_accelerator(pod, plan, accel, bench.spec.accelerator, bench.spec.scheduling)
    if volumes:
        pod["volumes"] = volumes
    return {"metadata": {"labels": labels(bench, Role.SERVER, plan.accelerator)}, "spec": pod}


def build_server_job(
    bench: InferenceBench, plan: Plan, accel: AcceleratorSpec, fetch_image: str
) -> dict[str, Any]:
    name = bench.metadata.name
    shape = JobShape(
        hosts=1,
        backoff_limit=bench.spec.max_retries,
        # Third-party engines have no exit-code contract with us; our fetch container does.
        fail_job_exit_codes=[int(ExitCode.INVALID_CONFIG)],
        containers=tuple(name for name, _ in fetched_uris(bench)),
        suspend=is_suspended(bench.spec),
        queue_name=bench.spec.queue_name,
    )
    server_labels = labels(bench, Role.SERVER, plan.accelerator)
    metadata = build_metadata(bench, server_name(name), server_labels)
    control = bench.spec.model_copy(update={"active_deadline_seconds": server_deadline(bench)})
    return build_job(metadata, shape, control, build_server_pod_template(bench, plan, accel, fetch_image))


def server_deadline(bench: InferenceBench) -> int:
    """The server never ends by itself: its Job always carries a deadline, so chips are never held
    forever by a server whose client (or operator) is gone."""
    own = bench.spec.server.deadline_seconds
    run = bench.spec.active_deadline_seconds
    return own if run is None else min(own, run)


def build_server_service(bench: InferenceBench, plan: Plan) -> dict[str, Any]:
    name = bench.metadata.name
    port = bench.spec.server.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": build_metadata(
            bench, server_service_name(name), labels(bench, Role.SERVER, plan.accelerator)
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(bench.kind, name, Role.SERVER),
            "ports": [
                {"name": SERVER_PORT_NAME, "port": port, "targetPort": SERVER_PORT_NAME, "protocol": "TCP"}
            ],
        },
    }


# ---------------------------------------------------------------- client and its results


def endpoint(bench: InferenceBench) -> str:
    server = bench.spec.server
    if server.engine == Engine.EXTERNAL:
        assert server.endpoint is not None  # the API model guarantees it for external
        return server.endpoint.rstrip("/")
    return f"http://{server_service_name(bench.metadata.name)}.{namespace_of(bench)}.svc:{server.port}"


def client_image(bench: InferenceBench, accel: AcceleratorSpec, catalog: Catalog) -> str:
    image = bench.spec.client_image or accel.images.bench
    if not image and "cpu" in catalog.accelerators:
        image = catalog.get("cpu").images.bench
    if not image:
        raise RenderError("no bench client image in the catalog; set spec.clientImage")
    return image


def health_path(bench: InferenceBench) -> str | None:
    engine = bench.spec.server.engine
    if engine == Engine.EXTERNAL:
        return EXTERNAL_HEALTH_PATH
    if engine == Engine.JETSTREAM:
        return None
    return HEALTH_PATH


def build_client_env(bench: InferenceBench, plan: Plan) -> list[dict[str, Any]]:
    env = [
        env_value(ENV_JOB, job_payload_json(bench, plan)),
        env_value(ENV_ENDPOINT, endpoint(bench)),
    ]
    path = health_path(bench)
    if path is not None:
        env.append(env_value(ENV_HEALTH_PATH, path))
    env += [
        env_value(ENV_READY_TIMEOUT, bench.spec.server.readiness_timeout_seconds),
        *reporter_env(bench),
        env_value(ENV_TERMINATION_LOG, TERMINATION_LOG_PATH),
        env_value(ENV_METRICS_PORT, METRICS_PORT),  # cells done, for status.progress
    ]
    if is_local_path(bench.spec.model.uri):
        # Engines without /tokenize (transformers serve) need the tokenizer for exact input
        # lengths; a plain path is only readable where the client shares the filesystem (the
        # local executor, or a path baked into the client image).
        env.append(env_value(ENV_TOKENIZER_DIR, bench.spec.model.uri))
    if bench.spec.output is not None:
        env.append(env_value(ENV_OUTPUT_URI, bench.spec.output.uri))
    return merge_env(env, bench.spec.env)


def client_suspended(bench: InferenceBench, server_admitted: bool) -> bool:
    """The client waits while the bench is suspended, or while its queued server is not admitted.

    The client carries no queue label (it holds no accelerator quota), so nothing but the operator
    resumes it: its readiness wait must not start while the server sits in Kueue's queue.
    """
    if bench.spec.suspend:
        return True
    return bool(bench.spec.queue_name) and not server_admitted


def build_client_job(
    bench: InferenceBench, plan: Plan, accel: AcceleratorSpec, catalog: Catalog, server_admitted: bool = False
) -> dict[str, Any]:
    name = bench.metadata.name
    container = container_base(CLIENT_CONTAINER, client_image(bench, accel, catalog))
    container["command"] = ["python", "-m", CLIENT_MODULE]
    container["env"] = build_client_env(bench, plan)
    container.update(env_from(bench.spec.env_from))
    container["ports"] = [metrics_port_entry()]
    container["resources"] = {part: dict(values) for part, values in CLIENT_RESOURCES.items()}
    container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    pod = {
        "restartPolicy": "Never",
        **pull_secrets(bench.spec),
        "serviceAccountName": client_account(bench),
        "securityContext": accelerator.non_root_pod_security(),
        # Any Linux node; no tolerations keeps it off tainted accelerator nodes.
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "containers": [container],
    }
    # The user's placement applies here too, so a cluster that confines work to labeled nodes
    # (or the local executor's node) also takes the client.
    accelerator.apply_scheduling(pod, bench.spec.scheduling)
    shape = JobShape(
        hosts=1,
        backoff_limit=bench.spec.max_retries,
        fail_job_exit_codes=[int(ExitCode.INVALID_CONFIG)],
        containers=(CLIENT_CONTAINER,),
        suspend=client_suspended(bench, server_admitted),
        queue_name=None,  # the server carries the queue; the client follows its admission
    )
    pod_labels = labels(bench, Role.CLIENT, plan.accelerator)
    metadata = build_metadata(bench, client_job_name(name), pod_labels)
    template = {"metadata": {"labels": pod_labels, "annotations": metrics_annotations()}, "spec": pod}
    return build_job(metadata, shape, bench.spec, template)


def client_account(bench: InferenceBench) -> str:
    """The load generator's ServiceAccount: the user's (spec.serviceAccountName: the one Workload
    Identity / IRSA maps to the output bucket), else one of its own."""
    return bench.spec.service_account_name or client_service_account_name(bench.metadata.name)


def build_client_rbac(bench: InferenceBench, plan: Plan) -> list[dict[str, Any]]:
    """The client reports into the results ConfigMap (render/results.py) and may write nothing else."""
    name = bench.metadata.name
    meta_labels = labels(bench, Role.CLIENT, plan.accelerator)
    return build_reporter_rbac(bench, client_service_account_name(name), client_account(bench), meta_labels)


def check_plan(bench: InferenceBench, plan: Plan) -> None:
    if bench.spec.server.engine == Engine.EXTERNAL:
        return
    if plan.accelerator != bench.spec.accelerator.type.value:
        raise RenderError(f"plan is for {plan.accelerator}, the spec asks for {bench.spec.accelerator.type}")
    if plan.multi_host:
        raise RenderError(
            f"serving on {plan.hosts} hosts is not supported yet; choose a single-host shape "
            f"(at most {plan.chips_per_host} chips)"
        )


def render_inference(
    bench: InferenceBench, plan: Plan, catalog: Catalog, server_admitted: bool = False
) -> list[dict[str, Any]]:
    """Children in apply order: what the pods refer to (ConfigMap, RBAC, Service) before the pods.

    `server_admitted`: the server Job exists and runs (Kueue cleared its suspend); an external
    endpoint counts as admitted.
    """
    check_plan(bench, plan)
    accel = catalog.get(plan.accelerator)
    results = build_results_config_map(bench, labels(bench, Role.CLIENT, plan.accelerator))
    objects = [results, *build_client_rbac(bench, plan)]
    if bench.spec.server.engine != Engine.EXTERNAL:
        objects.append(build_server_service(bench, plan))
        objects.append(build_server_job(bench, plan, accel, client_image(bench, accel, catalog)))
    admitted = server_admitted or bench.spec.server.engine == Engine.EXTERNAL
    objects.append(build_client_job(bench, plan, accel, catalog, admitted))
    return objects
