"""Parallelism strategies of the PyTorch worker (issue 18): DDP, FSDP2 and DeepSpeed ZeRO-3, each run
by two processes exactly as the rendered pod runs them: `python -m accelbench.workers.finetune` with
the payload in ACCELBENCH_JOB and NNODES × NPROC_PER_NODE = 2, which relaunches itself under torchrun
(gloo on CPU). Each strategy's losses are the one-process run's: the first step's (the same forward
over the same tokens) and the second's, which only agrees if the first step's gradients were reduced
over both ranks' halves of the batch and the sharded optimizer stepped every weight."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from accelbench.api import parse_termination_message
from accelbench.api.contract import (
    ENV_JOB,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_NNODES,
    ENV_NPROC_PER_NODE,
    ENV_TERMINATION_LOG,
    ExitCode,
)
from accelbench.workers.finetune.__main__ import RunOptions, run_job
from accelbench.workers.jobenv import parse_job_payload

QUIET = RunOptions(serve_metrics=False, log=lambda _: None, env={})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_process_plan(strategy: str) -> dict[str, Any]:
    """The plan the operator would write for 2 chips on one host (plan.types.Plan.worker_plan)."""
    return {
        "accelerator": "cpu",
        "framework": "pytorch",
        "chips": 2,
        "hosts": 1,
        "chipsPerHost": 2,
        "fsdp": 1 if strategy == "ddp" else 2,
        "tp": 1,
        "strategy": strategy,
        "peakTflopsPerChip": 1.0,
        "dollarsPerChipHour": 0.0,
        "priceSource": "local machine, not billed",
    }


def run_as_the_pod(manifest: dict[str, Any], plan: dict[str, Any], tmp_path: Path) -> Any:
    log = tmp_path / "termination-log"
    env = {
        **os.environ,
        ENV_JOB: json.dumps({**manifest, "plan": plan}),
        ENV_NNODES: "1",
        ENV_NPROC_PER_NODE: str(plan["chips"]),
        ENV_MASTER_ADDR: "127.0.0.1",
        ENV_MASTER_PORT: str(_free_port()),
        ENV_TERMINATION_LOG: str(log),
    }
    done = subprocess.run(
        [sys.executable, "-m", "accelbench.workers.finetune"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert log.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    report = parse_termination_message(log.read_text())
    assert done.returncode == 0 and report.ok, (report.error, done.stderr[-3000:])
    return report


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero3"])
@pytest.mark.parametrize("method", [{"type": "full"}, {"type": "lora", "rank": 8}], ids=["full", "lora"])
def test_two_processes_under_torchrun_agree_with_one(
    manifest_for, tmp_path: Path, strategy: str, method: dict[str, Any]
) -> None:
    manifest = manifest_for("llama", method=method, training={"maxSteps": 2, "learningRate": 3e-3})
    single, code = run_job(parse_job_payload(manifest), QUIET)
    assert code == 0, single.error
    report = run_as_the_pod(manifest, two_process_plan(strategy), tmp_path)
    ft = report.finetune
    assert report.chips == 2 and report.device.startswith("cpu")
    assert ft.loss_history[0] == pytest.approx(single.finetune.loss_history[0], rel=1e-5)
    assert ft.loss_history[1] == pytest.approx(single.finetune.loss_history[1], rel=1e-4)
    assert ft.loss_history[1] != ft.loss_history[0]  # the step changed the weights


def test_zero3_saves_the_whole_merged_model_from_its_partitions(
    manifest_for, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Under ZeRO-3 no rank holds a whole weight: the save gathers them, and the merged LoRA export
    is a full Hugging Face model with the base's every tensor at its full shape."""
    from safetensors.torch import load_file

    out = tmp_path / "out"
    manifest = manifest_for(
        "llama", method={"type": "lora", "rank": 8}, training={"maxSteps": 1}, output=str(out)
    )
    run_as_the_pod(manifest, two_process_plan("zero3"), tmp_path)
    saved = {k: v.shape for f in out.glob("*.safetensors") for k, v in load_file(f).items()}
    base = {k: v.shape for f in tiny_models["llama"].glob("*.safetensors") for k, v in load_file(f).items()}
    assert saved == base


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_chunked_loss_under_ddp_and_fsdp_agrees_with_one_process(
    manifest_for, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    """ACCELBENCH_LOSS_CHUNK puts the LM head + loss inside the wrapped module (torch_loss): under DDP
    its gradients are still reduced, under FSDP2 the root's head weight is unsharded where the
    chunks use it, and the second step's loss shows both."""
    manifest = manifest_for("llama", method={"type": "full"}, training={"maxSteps": 2, "learningRate": 3e-3})
    single, code = run_job(parse_job_payload(manifest), QUIET)
    assert code == 0, single.error
    monkeypatch.setenv("ACCELBENCH_LOSS_CHUNK", "48")
    report = run_as_the_pod(manifest, two_process_plan(strategy), tmp_path)
    assert "chunks of 48 tokens" in report.versions["loss"], report.versions  # the chunked path ran
    ft = report.finetune
    assert ft.loss_history[0] == pytest.approx(single.finetune.loss_history[0], rel=1e-5)
    assert ft.loss_history[1] == pytest.approx(single.finetune.loss_history[1], rel=1e-4)


def test_blocks_compiled_before_fsdp2_shards_them_train_as_one_eager_process(
    manifest_for, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACCELBENCH_COMPILE=layers under FSDP2 on two processes: each decoder block is compiled in
    place and then sharded (torchtitan's order), and the checkpointed LoRA steps agree with one
    eager process: the compiled blocks gather their shards and reduce their gradients."""
    training = {"maxSteps": 2, "learningRate": 3e-3, "precision": "fp32", "gradientCheckpointing": True}
    manifest = manifest_for("llama", method={"type": "lora", "rank": 8}, training=training)
    single, code = run_job(parse_job_payload(manifest), QUIET)
    assert code == 0, single.error
    monkeypatch.setenv("ACCELBENCH_COMPILE", "layers")
    report = run_as_the_pod(manifest, two_process_plan("fsdp"), tmp_path)
    assert report.versions["compile"].startswith("torch.compile layers"), report.versions
    ft = report.finetune
    assert ft.loss_history[0] == pytest.approx(single.finetune.loss_history[0], rel=1e-5)
    assert ft.loss_history[1] == pytest.approx(single.finetune.loss_history[1], rel=1e-4)
    assert ft.loss_history[1] != ft.loss_history[0]


def test_the_chunked_loss_is_refused_under_zero3_with_the_reason(
    manifest_for, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = manifest_for("llama", method={"type": "full"}, training={"maxSteps": 1})
    monkeypatch.setenv("ACCELBENCH_LOSS_CHUNK", "48")
    log = tmp_path / "termination-log"
    env = {
        **os.environ,
        ENV_JOB: json.dumps({**manifest, "plan": two_process_plan("zero3")}),
        ENV_NNODES: "1",
        ENV_NPROC_PER_NODE: "2",
        ENV_MASTER_ADDR: "127.0.0.1",
        ENV_MASTER_PORT: str(_free_port()),
        ENV_TERMINATION_LOG: str(log),
    }
    done = subprocess.run(
        [sys.executable, "-m", "accelbench.workers.finetune"], env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    report = parse_termination_message(log.read_text())
    assert done.returncode == ExitCode.INVALID_CONFIG and not report.ok, done.stderr[-2000:]
    assert "not supported with the zero3 strategy" in report.error.message
