"""ACCELBENCH_REMAT=dots in the PyTorch worker: selective activation checkpointing keeps the
projections' outputs, so the backward pass runs fewer matmul FLOPs than full recomputation, for the
same gradients; and the worker takes the policy from its run options and says so in its report."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM

from accelbench.workers.finetune.__main__ import RunOptions, run_job
from accelbench.workers.finetune.torch_worker import checkpointing_kwargs
from accelbench.workers.jobenv import parse_job_payload


def test_dots_keeps_the_projections_and_the_gradients_stay_the_same(tiny_llama: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32, attn_implementation="sdpa")
    ids = torch.randint(0, base.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))

    def step(policy: str) -> tuple[float, list[torch.Tensor], int]:
        model = copy.deepcopy(base).train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing_kwargs(policy))
        with FlopCounterMode(display=False) as counter:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
        return loss.item(), [p.grad for p in model.parameters()], counter.get_total_flops()

    full_loss, full_grads, full_flops = step("full")
    dots_loss, dots_grads, dots_flops = step("dots")
    assert dots_loss == pytest.approx(full_loss, rel=1e-6)
    for got, want in zip(dots_grads, full_grads, strict=True):
        torch.testing.assert_close(got, want)
    # Full recomputation runs every block's projections twice forward; "dots" runs them once.
    assert dots_flops < full_flops, (dots_flops, full_flops)


def test_the_worker_takes_the_policy_from_its_run_options(manifest_for) -> None:
    training = {"maxSteps": 3, "learningRate": 1e-2, "precision": "fp32", "gradientCheckpointing": True}
    manifest = manifest_for("llama", method={"type": "lora", "rank": 8}, training=training)

    def run(env: dict[str, str]):
        report, code = run_job(
            parse_job_payload(manifest), RunOptions(serve_metrics=False, log=lambda _: None, env=env)
        )
        assert code == 0, report.error
        return report

    full, dots = run({}), run({"ACCELBENCH_REMAT": "dots"})
    assert dots.finetune.loss_history == pytest.approx(full.finetune.loss_history, rel=1e-5)
    assert (
        dots.versions["remat"].startswith("selective checkpointing saves dots")
        and "remat" not in full.versions
    )
