"""Tiny random-weight Hugging Face models shared by the JAX tests (made once per session)."""

from __future__ import annotations

from pathlib import Path

# Plain imports: a broken JAX or torch install must fail these tests, not skip them (`make test`
# installs both through the `all` extra).
import flax  # noqa: F401
import pytest
import torch
from jax_helpers import FAMILIES

import jax  # noqa: F401
from accelbench.workers.testing import make_tiny_model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("tiny-models")
    return {family: make_tiny_model(root / family, family) for family in FAMILIES}


@pytest.fixture(scope="session")
def chat_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from accelbench.workers.testing import make_chat_dataset

    return make_chat_dataset(tmp_path_factory.mktemp("data") / "chat.jsonl", n=64, seed=0)
