"""Tiny random-weight models and datasets, made once per test session (no model hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from accelbench.workers.testing import make_chat_dataset, make_tiny_model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="session")
def tiny_gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("gemma3"), "gemma3")


@pytest.fixture(scope="session")
def tiny_models(tiny_llama: Path, tiny_gemma3: Path) -> dict[str, Path]:
    return {"llama": tiny_llama, "gemma3": tiny_gemma3}


@pytest.fixture(scope="session")
def chat_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_chat_dataset(tmp_path_factory.mktemp("data") / "chat.jsonl", n=64, seed=0)


def finetune_manifest(
    model_dir: Path,
    dataset: Path,
    family: str = "llama",
    *,
    method: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
    output: str | None = None,
) -> dict[str, Any]:
    """A FinetuneJob manifest (dict) for a tiny CPU run."""
    spec: dict[str, Any] = {
        "model": {"uri": str(model_dir), "family": family, "size": "tiny"},
        "dataset": {"uri": str(dataset), "heldOutFraction": 0.1},
        "method": method or {"type": "lora", "rank": 8},
        "training": {
            "seqLength": 128,
            "globalBatchSize": 4,
            "microBatchSize": 2,
            "maxSteps": 4,
            "learningRate": 1e-2,
            "precision": "fp32",
            **(training or {}),
        },
        "accelerator": {"type": "cpu"},
    }
    if output:
        spec["output"] = {"uri": output}
    return {
        "apiVersion": "accelbench.io/v1alpha1",
        "kind": "FinetuneJob",
        "metadata": {"name": "tiny"},
        "spec": spec,
    }


@pytest.fixture
def manifest_for(chat_dataset: Path, tiny_models: dict[str, Path]):
    """manifest_for(family="llama", **kwargs) -> a FinetuneJob manifest dict for a tiny model."""

    def build(family: str = "llama", **kwargs: Any) -> dict[str, Any]:
        return finetune_manifest(tiny_models[family], chat_dataset, family, **kwargs)

    return build
