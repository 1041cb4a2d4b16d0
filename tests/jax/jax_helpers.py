"""Helpers shared by the JAX tests (a uniquely named module: tests/ has no packages)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

FAMILIES = ("llama", "gemma3", "gemma4")

# The tiny_config shape of the single-model tests (2 layers, GQA 4:2), fp32.
TINY_SHAPE = {
    "vocab_size": 64,
    "layers": 2,
    "hidden": 32,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 8,
    "intermediate": 64,
    "dtype": "float32",
}


def packed_inputs(seed: int = 0, vocab: int = 512) -> dict[str, np.ndarray]:
    """Two rows of length 24: row 0 packs segments of 10 and 14 tokens, row 1 is 20 tokens + padding.

    The second segment is longer than the tiny Gemma's 16-token window, so local layers are tested.
    """
    rng = np.random.default_rng(seed)
    ids = rng.integers(6, vocab, size=(2, 24)).astype(np.int32)
    seg = np.array([[1] * 10 + [2] * 14, [1] * 20 + [0] * 4], dtype=np.int32)
    pos = np.array([list(range(10)) + list(range(14)), list(range(20)) + [0] * 4], dtype=np.int32)
    return {"input_ids": ids, "segment_ids": seg, "positions": pos}


def hf_logits(model_dir: Path, ids: np.ndarray) -> np.ndarray:
    """transformers' logits for one unpacked sequence [1, T] (eager attention, float32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(ids.astype(np.int64))).logits.float().numpy()


def manifest(
    model_dir: Path,
    dataset: Path,
    family: str,
    framework: str,
    *,
    method: dict[str, Any],
    training: dict[str, Any] | None = None,
    output: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A FinetuneJob manifest for a tiny CPU run in float32."""
    spec: dict[str, Any] = {
        "model": {"uri": str(model_dir), "family": family, "size": "tiny"},
        "dataset": {"uri": str(dataset), "heldOutFraction": 0.1},
        "method": method,
        "framework": framework,
        "training": {
            "seqLength": 128,
            "globalBatchSize": 4,
            "microBatchSize": 2,
            "maxSteps": 4,
            "learningRate": 3e-3,
            "precision": "fp32",
            **(training or {}),
        },
        "accelerator": {"type": "cpu"},
    }
    if output:
        spec["output"] = output
    return {
        "apiVersion": "accelbench.io/v1alpha1",
        "kind": "FinetuneJob",
        "metadata": {"name": "t"},
        "spec": spec,
    }


def run(manifest: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    """Run the worker in this process; returns the WorkerReport (asserting it succeeded)."""
    from accelbench.workers.finetune.__main__ import RunOptions, run_job
    from accelbench.workers.jobenv import parse_job_payload

    report, code = run_job(
        parse_job_payload(manifest), RunOptions(serve_metrics=False, log=lambda _: None, env=env or {})
    )
    assert code == 0, report.error
    return report
