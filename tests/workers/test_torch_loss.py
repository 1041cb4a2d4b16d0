"""The chunked LM head + cross-entropy of the PyTorch worker (ACCELBENCH_LOSS_CHUNK): the same sums
and gradients as the whole-logits path, the Gemma soft cap included, through the worker as a user
sets it, and refused where it cannot work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from accelbench.api.contract import ExitCode
from accelbench.workers import InvalidConfigError
from accelbench.workers.finetune import loss_chunk_tokens
from accelbench.workers.finetune.__main__ import RunOptions, run_job
from accelbench.workers.finetune.torch_loss import chunked_ce_sum
from accelbench.workers.jobenv import parse_job_payload
from accelbench.workers.testing import make_tiny_model


def _whole(hidden, weight, targets, mask, softcap):
    logits = F.linear(hidden, weight).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return (ce * mask.reshape(-1)).sum()


@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("chunk", [7, 64, 1000])  # uneven last chunk, even, larger than the batch
def test_chunks_give_the_whole_loss_and_its_gradients(chunk: int, softcap: float | None) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 32, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (2, 32), generator=gen)
    mask = (torch.rand(2, 32, generator=gen) > 0.3).double()
    whole = _whole(hidden, weight, targets, mask, softcap)
    grads = torch.autograd.grad(whole, (hidden, weight))
    total, count = chunked_ce_sum(hidden, weight, targets, mask, chunk, softcap)
    assert count.item() == mask.sum().item()
    assert total.item() == pytest.approx(whole.item(), rel=1e-12)
    for got, want in zip(torch.autograd.grad(total, (hidden, weight)), grads, strict=True):
        torch.testing.assert_close(got, want)


def test_the_variable_takes_whole_numbers_only() -> None:
    assert [loss_chunk_tokens(v) for v in (None, "", "0", " 512 ")] == [0, 0, 0, 512]
    for bad in ("-1", "half", "1.5"):
        with pytest.raises(InvalidConfigError, match="ACCELBENCH_LOSS_CHUNK"):
            loss_chunk_tokens(bad)


def _run(manifest: dict[str, Any], env: dict[str, str]):
    return run_job(parse_job_payload(manifest), RunOptions(serve_metrics=False, log=lambda _: None, env=env))


@pytest.mark.parametrize(
    ("family", "method"),
    [("llama", {"type": "lora", "rank": 8}), ("gemma4", {"type": "full"})],  # gemma4: the soft cap
)
def test_the_worker_trains_and_evaluates_the_same_with_the_loss_in_chunks(
    manifest_for, tmp_path: Path, family: str, method: dict[str, Any]
) -> None:
    training = {"maxSteps": 3, "learningRate": 3e-3, "precision": "fp32"}
    manifest = manifest_for("llama", method=method, training=training)
    if family != "llama":
        manifest["spec"]["model"]["uri"] = str(make_tiny_model(tmp_path / family, family))
        manifest["spec"]["model"]["family"] = family
    whole, code = _run(manifest, {})
    chunked, chunked_code = _run(manifest, {"ACCELBENCH_LOSS_CHUNK": "48"})  # 2 × 128 tokens: 6 chunks
    assert code == 0 and chunked_code == 0, (whole.error, chunked.error)
    assert chunked.finetune.loss_history == pytest.approx(whole.finetune.loss_history, rel=1e-5)
    assert chunked.finetune.eval_loss == pytest.approx(whole.finetune.eval_loss, rel=1e-5)
    assert chunked.finetune.loss_history[-1] != chunked.finetune.loss_history[0]
    assert "chunks of 48 tokens" in chunked.versions["loss"] and "loss" not in whole.versions  # says what ran


def test_a_bad_chunk_size_is_a_config_error_before_any_work(manifest_for) -> None:
    report, code = _run(manifest_for("llama", training={"maxSteps": 1}), {"ACCELBENCH_LOSS_CHUNK": "lots"})
    assert code == ExitCode.INVALID_CONFIG and "ACCELBENCH_LOSS_CHUNK='lots'" in report.error.message
