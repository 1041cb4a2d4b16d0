"""Hand-built catalog entries, plans and resources for the renderer tests.

Built here rather than loaded from catalog/data so the renderer's tests do not move when prices
or images in the data files change. Figures are realistic (public spec sheets, list prices read
2025) but only their shape matters to the renderer.
"""

from __future__ import annotations

from typing import Any

from accelbench.api import FinetuneJob, InferenceBench
from accelbench.catalog.types import AcceleratorSpec, Catalog, Price, Toleration, TpuTopology, WorkerImages
from accelbench.plan.types import MemoryEstimate, Plan

NAMESPACE = "ml-bench"
UID = "2f6c1f7e-9a43-4c1e-8d0b-5d3c7c1e0a11"
GB = 1e9

WORKER_REGISTRY = "ghcr.io/accelbench"


def _price(on_demand: float, spot: float | None, page: str) -> Price:
    return Price(on_demand=on_demand, spot=spot, source=page, date="2025-06-01")


TPU_V5P = AcceleratorSpec(
    name="tpu-v5p",
    vendor="google",
    display_name="TPU v5p",
    resource_name="google.com/tpu",
    node_labels={"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice"},
    tolerations=[Toleration(key="google.com/tpu")],
    chips_per_host_options=[4],
    max_chips_per_host=4,
    topologies=[
        TpuTopology(topology="2x2x1", chips=4, hosts=1, chips_per_host=4),
        TpuTopology(topology="2x2x2", chips=8, hosts=2, chips_per_host=4),
        TpuTopology(topology="2x2x4", chips=16, hosts=4, chips_per_host=4),
    ],
    hbm_gb=95,
    hbm_tb_per_s=2.765,
    peak_tflops={"bf16": 459},
    host_cpu=208,
    host_memory_gb=448,
    default_framework="jax",
    images=WorkerImages(
        jax=f"{WORKER_REGISTRY}/worker-jax-tpu:0.1.0",
        bench=f"{WORKER_REGISTRY}/bench:0.1.0",
        vllm="vllm/vllm-tpu:v0.10.1",
    ),
    price=_price(4.20, 2.10, "cloud.google.com/tpu/pricing us-east5"),
)

TPU_V6E = AcceleratorSpec(
    name="tpu-v6e",
    vendor="google",
    display_name="TPU v6e (Trillium)",
    resource_name="google.com/tpu",
    node_labels={"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"},
    tolerations=[Toleration(key="google.com/tpu")],
    chips_per_host_options=[1, 4, 8],
    max_chips_per_host=8,
    topologies=[
        TpuTopology(topology="1x1", chips=1, hosts=1, chips_per_host=1),
        TpuTopology(topology="2x2", chips=4, hosts=1, chips_per_host=4),
        TpuTopology(topology="2x4", chips=8, hosts=1, chips_per_host=8),
        TpuTopology(topology="4x4", chips=16, hosts=4, chips_per_host=4),
    ],
    hbm_gb=32,
    hbm_tb_per_s=1.64,
    peak_tflops={"bf16": 918},
    host_cpu=180,
    host_memory_gb=720,
    default_framework="jax",
    images=WorkerImages(
        jax=f"{WORKER_REGISTRY}/worker-jax-tpu:0.1.0",
        bench=f"{WORKER_REGISTRY}/bench:0.1.0",
        vllm="vllm/vllm-tpu:v0.10.1",
        jetstream="us-docker.pkg.dev/cloud-tpu-images/inference/jetstream-pytorch-server:v0.2.4",
    ),
    price=_price(2.70, 1.35, "cloud.google.com/tpu/pricing us-east5"),
)


def _nvidia(name: str, display: str, label: str, hbm: float, tbps: float, price: float) -> AcceleratorSpec:
    return AcceleratorSpec(
        name=name,
        vendor="nvidia",
        display_name=display,
        resource_name="nvidia.com/gpu",
        node_labels={"cloud.google.com/gke-accelerator": label},
        tolerations=[Toleration(key="nvidia.com/gpu")],
        chips_per_host_options=[1, 2, 4, 8],
        max_chips_per_host=8,
        hbm_gb=hbm,
        hbm_tb_per_s=tbps,
        peak_tflops={"bf16": 989},
        host_cpu=208,
        host_memory_gb=1872,
        default_framework="pytorch",
        images=WorkerImages(
            jax=f"{WORKER_REGISTRY}/worker-jax-cuda:0.1.0",
            pytorch=f"{WORKER_REGISTRY}/worker-torch-cuda:0.1.0",
            bench=f"{WORKER_REGISTRY}/bench:0.1.0",
            vllm="vllm/vllm-openai:v0.10.1",
            tgi="ghcr.io/huggingface/text-generation-inference:3.3.5",
        ),
        price=_price(price, price * 0.3, "cloud.google.com/compute/gpus-pricing us-central1"),
    )


H100 = _nvidia("h100", "NVIDIA H100 80GB", "nvidia-h100-80gb", 80, 3.35, 11.06)
H200 = _nvidia("h200", "NVIDIA H200 141GB", "nvidia-h200-141gb", 141, 4.8, 13.20)

GAUDI3 = AcceleratorSpec(
    name="gaudi3",
    vendor="habana",
    display_name="Intel Gaudi 3",
    resource_name="habana.ai/gaudi",
    node_labels={"habana.ai/device.name": "gaudi3"},
    tolerations=[Toleration(key="habana.ai/gaudi")],
    chips_per_host_options=[1, 2, 4, 8],
    max_chips_per_host=8,
    hbm_gb=128,
    hbm_tb_per_s=3.7,
    peak_tflops={"bf16": 1835},
    host_cpu=160,
    host_memory_gb=1024,
    default_framework="pytorch",
    images=WorkerImages(
        pytorch=f"{WORKER_REGISTRY}/worker-torch-gaudi:0.1.0",
        bench=f"{WORKER_REGISTRY}/bench:0.1.0",
        tgi="ghcr.io/huggingface/text-generation-inference:3.3.5-gaudi",
        vllm="vault.habana.ai/gaudi-docker/1.21.0/ubuntu22.04/habanalabs/vllm-installer:latest",
    ),
    price=_price(6.25, None, "intel tiber ai cloud price list"),
)

CPU = AcceleratorSpec(
    name="cpu",
    vendor="cpu",
    display_name="CPU (local)",
    resource_name=None,
    node_labels={},
    chips_per_host_options=[1],
    max_chips_per_host=1,
    hbm_gb=16,
    hbm_tb_per_s=0.1,
    peak_tflops={"bf16": 1.0},
    host_cpu=8,
    host_memory_gb=32,
    default_framework="pytorch",
    images=WorkerImages(
        pytorch=f"{WORKER_REGISTRY}/worker-torch-cpu:0.1.0", bench=f"{WORKER_REGISTRY}/bench:0.1.0"
    ),
    price=_price(0.0, None, "local"),
)

CATALOG = Catalog(accelerators={a.name: a for a in (TPU_V5P, TPU_V6E, H100, H200, GAUDI3, CPU)})


def make_plan(
    accelerator: AcceleratorSpec,
    *,
    chips: int,
    hosts: int = 1,
    topology: str | None = None,
    framework: str | None = None,
    fsdp: int | None = None,
    tp: int = 1,
    spot: bool = False,
    parameters: float = 27e9,
) -> Plan:
    memory = MemoryEstimate(
        weights=parameters * 2 / chips,  # bf16 weights sharded over the chips
        gradients=0.0,
        optimizer=0.5 * GB,
        adapters=0.3 * GB,
        activations=6 * GB,
        overhead=2 * GB,
    )
    price = (
        accelerator.price.spot if spot and accelerator.price.spot is not None else accelerator.price.on_demand
    )
    return Plan(
        accelerator=accelerator.name,
        framework=framework or accelerator.default_framework,
        chips=chips,
        hosts=hosts,
        chips_per_host=chips // hosts,
        topology=topology,
        fsdp=fsdp if fsdp is not None else chips // tp,
        tp=tp,
        memory=memory,
        hbm_per_chip_gb=accelerator.hbm_gb,
        peak_tflops_per_chip=accelerator.peak_for("bf16"),
        dollars_per_chip_hour=price,
        price_source=f"{accelerator.price.source} ({accelerator.price.date})",
    )


def _metadata(name: str, *, uid: str | None = UID, namespace: str | None = NAMESPACE) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if uid:
        meta["uid"] = uid
    return meta


def finetune(
    name: str,
    accelerator: dict[str, Any],
    *,
    uid: str | None = UID,
    namespace: str | None = NAMESPACE,
    **spec: Any,
) -> FinetuneJob:
    """A Gemma-style LoRA run like the study's (r=64 on every projection, seq 3072)."""
    body: dict[str, Any] = {
        "model": {"uri": "pvc://models/gemma-3-27b-it", "family": "gemma3", "size": "27b"},
        "dataset": {"uri": "pvc://datasets/chat/train.jsonl", "format": "chat"},
        "method": {"type": "lora", "rank": 64},
        "training": {"seqLength": 3072, "globalBatchSize": 16, "maxSteps": 200},
        "accelerator": accelerator,
        **spec,
    }
    return FinetuneJob.model_validate(
        {
            "apiVersion": "accelbench.io/v1alpha1",
            "kind": "FinetuneJob",
            "metadata": _metadata(name, uid=uid, namespace=namespace),
            "spec": body,
        }
    )


def inference(name: str, accelerator: dict[str, Any], server: dict[str, Any], **spec: Any) -> InferenceBench:
    body: dict[str, Any] = {
        "model": {"uri": "pvc://models/gemma-3-27b-it", "family": "gemma3", "size": "27b"},
        "server": server,
        "accelerator": accelerator,
        "workload": {"inputLengths": [512, 4096, 16384], "outputLength": 256, "concurrency": [1, 8, 32]},
        "slo": {"ttftMs": 2000, "tpotMs": 50},
        **spec,
    }
    return InferenceBench.model_validate(
        {
            "apiVersion": "accelbench.io/v1alpha1",
            "kind": "InferenceBench",
            "metadata": _metadata(name),
            "spec": body,
        }
    )


# ---------------------------------------------------------------- the golden cases


def ft_tpu_v5p_multihost() -> tuple[FinetuneJob, Plan]:
    job = finetune(
        "gemma-v5p16",
        {"type": "tpu-v5p", "topology": "2x2x2", "capacity": "spot"},
        framework="jax",
        activeDeadlineSeconds=21600,
        ttlSecondsAfterFinished=86400,
        output={"uri": "gs://acme-checkpoints/gemma-v5p16", "format": "orbax"},
    )
    return job, make_plan(TPU_V5P, chips=8, hosts=2, topology="2x2x2", spot=True)


def ft_tpu_v5p_single() -> tuple[FinetuneJob, Plan]:
    job = finetune(
        "gemma-v5p8",
        {"type": "tpu-v5p", "topology": "2x2x1", "capacity": "reservation", "reservationName": "v5p-res-a"},
        output={"uri": "pvc://checkpoints/gemma-v5p8"},
    )
    return job, make_plan(TPU_V5P, chips=4, topology="2x2x1")


def ft_h100_x2() -> tuple[FinetuneJob, Plan]:
    job = finetune(
        "gemma-h100x2",
        {"type": "h100", "count": 2},
        framework="pytorch",
        env=[{"name": "NCCL_DEBUG", "value": "WARN"}],
        resources={"requests": {"cpu": "48", "memory": "400Gi"}, "limits": {"memory": "600Gi"}},
    )
    return job, make_plan(H100, chips=2)


def ft_h200_x1() -> tuple[FinetuneJob, Plan]:
    job = finetune("gemma-h200", {"type": "h200", "count": 1}, queueName="a3-ultra", maxRetries=1)
    return job, make_plan(H200, chips=1)


def ft_gaudi3_x8() -> tuple[FinetuneJob, Plan]:
    job = finetune(
        "llama-gaudi3",
        {"type": "gaudi3", "count": 8},
        model={"uri": "pvc://models/llama-3.1-8b", "family": "llama", "size": "8b"},
        training={"seqLength": 2048, "globalBatchSize": 64, "epochs": 1, "flashAttention": True},
    )
    return job, make_plan(GAUDI3, chips=8, parameters=8e9)


def ft_cpu_local() -> tuple[FinetuneJob, Plan]:
    job = finetune(
        "tiny-cpu",
        {"type": "cpu"},
        model={"uri": "/opt/models/gemma-3-270m", "family": "gemma3", "size": "270m"},
        dataset={"uri": "/opt/data/tiny.jsonl", "maxSamples": 64},
        training={"seqLength": 256, "globalBatchSize": 2, "maxSteps": 5, "flashAttention": False},
        suspend=True,
    )
    return job, make_plan(CPU, chips=1, parameters=270e6)


def ib_vllm_tpu_v6e() -> tuple[InferenceBench, Plan]:
    bench = inference(
        "gemma-serve-v6e",
        {"type": "tpu-v6e", "topology": "2x4"},
        {"engine": "vllm", "maxModelLength": 20480, "readinessTimeoutSeconds": 2400},
    )
    return bench, make_plan(TPU_V6E, chips=8, topology="2x4", framework="jax", tp=8)


def ib_vllm_h100_x2() -> tuple[InferenceBench, Plan]:
    bench = inference(
        "gemma-serve-h100",
        {"type": "h100", "count": 2},
        {"engine": "vllm", "kvCacheDtype": "fp8", "extraArgs": ["--enable-chunked-prefill"]},
        queueName="a3-serving",
    )
    return bench, make_plan(H100, chips=2, tp=2)


def ib_tgi_gaudi3() -> tuple[InferenceBench, Plan]:
    bench = inference(
        "llama-serve-gaudi3",
        {"type": "gaudi3", "count": 8},
        {"engine": "tgi", "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}]},
        model={"uri": "pvc://models/llama-3.1-70b", "family": "llama", "size": "70b"},
    )
    return bench, make_plan(GAUDI3, chips=8, tp=8, parameters=70e9)


def ib_external() -> tuple[InferenceBench, Plan]:
    bench = inference(
        "external-endpoint",
        {"type": "h100", "count": 8},
        {"engine": "external", "endpoint": "https://llm.internal.example.com/"},
        clientImage=f"{WORKER_REGISTRY}/bench:0.2.0",
    )
    return bench, make_plan(H100, chips=8, tp=8)


GOLDEN_CASES = {
    "finetune-tpu-v5p-2x2x2-multihost": ft_tpu_v5p_multihost,
    "finetune-tpu-v5p-2x2x1": ft_tpu_v5p_single,
    "finetune-h100-x2-torch": ft_h100_x2,
    "finetune-h200-x1-kueue": ft_h200_x1,
    "finetune-gaudi3-x8": ft_gaudi3_x8,
    "finetune-cpu-local": ft_cpu_local,
    "inference-vllm-tpu-v6e-2x4": ib_vllm_tpu_v6e,
    "inference-vllm-h100-x2": ib_vllm_h100_x2,
    "inference-tgi-gaudi3-x8": ib_tgi_gaudi3,
    "inference-external": ib_external,
}
