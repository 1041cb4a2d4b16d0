"""FinetuneJob tasks superResolution and quantize through the fine-tuning entrypoint on CPU: the
payload the operator renders, the worker process, the report the operator ingests; two torchrun
processes for super-resolution, as a rendered pod with two chips launches them; the planner's UNet
parameter count against diffusers' own."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from accelbench.api import parse_resource, parse_termination_message
from accelbench.api.contract import ENV_MASTER_ADDR, ENV_MASTER_PORT, ENV_NNODES, ENV_NPROC_PER_NODE
from accelbench.catalog import load_catalog
from accelbench.controller.ingest import ingest
from accelbench.plan import PlanError, plan_for
from accelbench.plan.memory import unet_parameters
from accelbench.render import job_payload_json
from accelbench.workers.diffusion.images import make_sr_dataset
from accelbench.workers.diffusion.sr3 import SRSettings, build_unet
from accelbench.workers.testing import make_chat_dataset, make_tiny_model

SR_BLOCK = {
    "imageSize": 16,
    "scale": 2,
    "channels": [16, 32],
    "layersPerBlock": 1,
    "globalBatchSize": 4,
    "steps": 4,
    "warmupSteps": 1,
    "evalImages": 2,
    "sampleSteps": 2,
    "learningRate": 0.002,
    "precision": "fp32",
}


def manifest(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "accelbench.io/v1alpha1",
        "kind": "FinetuneJob",
        "metadata": {"name": "t"},
        "spec": spec,
    }


def run_worker(
    body: dict[str, Any], tmp_path: Path, env: dict[str, str] | None = None, chips: int = 1
) -> tuple[Any, Any]:
    """The worker module on the operator's payload; (process, the ingested report). `chips`: the
    plan of that many chips on one host (the catalog's CPU has one, a GPU host's several)."""
    resource = parse_resource(body)
    plan = dataclasses.replace(plan_for(resource, load_catalog()), chips=chips, chips_per_host=chips)
    log = tmp_path / "termination-log"
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("ACCELBENCH_")}
    result = subprocess.run(
        [sys.executable, "-m", "accelbench.workers.finetune"],
        env={
            **inherited,
            "ACCELBENCH_JOB": job_payload_json(resource, plan),
            "ACCELBENCH_TERMINATION_LOG": str(log),
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result, ingest(log.read_text(), "FinetuneJob")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sr_dataset(tmp_path_factory.mktemp("sr") / "images", n=10, size=16, seed=1)


def test_super_resolution_runs_through_the_finetune_entrypoint(images: Path, tmp_path: Path) -> None:
    body = manifest(
        {
            "task": "superResolution",
            "dataset": {"uri": str(images), "format": "imageFolder"},
            "superResolution": SR_BLOCK,
            "accelerator": {"type": "cpu"},
            "output": {"uri": str(tmp_path / "unet")},
        }
    )
    _, ingested = run_worker(body, tmp_path)
    assert ingested.valid, ingested.condition
    results = ingested.results
    assert results.steps == 4 and results.tokens_per_second is None
    sr = results.super_resolution
    assert sr.images_per_second > 0 and sr.images_per_second_per_chip == sr.images_per_second
    assert sr.eval_images == 2 and sr.psnr is not None and sr.bicubic_psnr is not None
    assert sr.parameters == unet_parameters([16, 32], 1, 1)
    assert (tmp_path / "unet" / "config.json").is_file()  # the trained UNet, diffusers' format


def test_super_resolution_on_two_processes_reports_both_chips(images: Path, tmp_path: Path) -> None:
    """Two chips: the payload says 2 processes, the worker relaunches itself under torchrun (gloo),
    the report counts both, and its losses are the one-process run's (same global batch)."""
    spec = {
        "task": "superResolution",
        "dataset": {"uri": str(images)},
        "superResolution": SR_BLOCK,
        "accelerator": {"type": "cpu"},
    }
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = {
        ENV_NPROC_PER_NODE: "2",
        ENV_NNODES: "1",
        ENV_MASTER_ADDR: "127.0.0.1",
        ENV_MASTER_PORT: str(port),
    }
    _, two = run_worker(manifest(spec), tmp_path, env=launch, chips=2)
    assert two.valid, two.condition
    assert two.report.chips == 2
    one_dir = tmp_path / "one"
    one_dir.mkdir()
    _, one = run_worker(manifest(spec), one_dir)
    assert two.report.finetune.loss_history == pytest.approx(one.report.finetune.loss_history, rel=1e-4)


def test_quantize_runs_through_the_finetune_entrypoint(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "model", "llama", dtype="bfloat16")
    data = make_chat_dataset(tmp_path / "chat.jsonl", n=32)
    out = tmp_path / "quantized"
    body = manifest(
        {
            "task": "quantize",
            "model": {"uri": str(model), "family": "llama", "size": "tiny"},
            "dataset": {"uri": str(data)},
            "quantize": {
                "budgetBits": 6,
                "formats": ["int4-g64", "int8", "bf16"],
                "seqLength": 32,
                "calibrationWindows": 2,
                "heldOutWindows": 2,
                "batchSize": 2,
            },
            "accelerator": {"type": "cpu"},
            "output": {"uri": str(out)},
        }
    )
    _, ingested = run_worker(body, tmp_path)
    assert ingested.valid, ingested.condition
    q = ingested.results.quantization
    assert q.effective_bits <= 6 + 1e-6 and q.budget_bits == 6
    assert q.layers == 16 and sum(q.formats_used.values()) == 16  # 14 projections, embeddings, head
    assert q.weight_bytes_quantized < q.weight_bytes_bf16 and q.compression > 1
    assert q.perplexity_quantized > 1 and q.sensitivity_table == f"{out}/quantization-report.json"
    table = json.loads((out / "quantization-report.json").read_text())["sensitivity"]
    assert len(table) == 16
    assert (out / "config.json").is_file()  # the export transformers (and so vLLM) loads


def test_a_quantize_budget_below_the_floor_fails_before_the_worker_runs() -> None:
    body = manifest(
        {
            "task": "quantize",
            "model": {"uri": "/m", "family": "llama", "size": "tiny"},
            "dataset": {"uri": "/d.jsonl"},
            "quantize": {"budgetBits": 4.4, "formats": ["int4-g64", "int8"]},
            "accelerator": {"type": "cpu"},
            "output": {"uri": "/o"},
        }
    )
    with pytest.raises(PlanError, match=r"budgetBits 4.4 is below 4.500"):
        plan_for(parse_resource(body), load_catalog())


@pytest.mark.parametrize(
    "channels,layers,attention", [((16, 32), 1, 1), ((64, 128, 256, 512), 2, 1), ((32, 64, 64), 2, 2)]
)
def test_the_planners_unet_parameter_count_is_diffusers_own(
    channels: tuple[int, ...], layers: int, attention: int
) -> None:
    settings = SRSettings(
        size=64, scale=2, channels=channels, layers_per_block=layers, attention_levels=attention
    )
    model = build_unet(settings)
    assert unet_parameters(channels, layers, attention) == sum(p.numel() for p in model.parameters())


def test_a_report_without_any_task_figures_is_refused() -> None:
    text = json.dumps({"schemaVersion": 1, "kind": "finetune", "ok": True, "finetune": {"steps": 3}})
    refused = ingest(text, "FinetuneJob")
    assert not refused.valid and "no throughput" in refused.condition.message
    assert parse_termination_message(text).finetune.tokens_per_second is None
