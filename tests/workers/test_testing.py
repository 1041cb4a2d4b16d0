"""The tiny-model factory is deterministic and writes what transformers and the data path read."""

from __future__ import annotations

import json
from pathlib import Path

from accelbench.workers.testing import main, make_chat_dataset, make_tiny_model


def test_tiny_model_is_deterministic(tmp_path: Path, tiny_gemma3: Path) -> None:
    again = make_tiny_model(tmp_path / "g", "gemma3")
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_gemma3 / name).read_bytes(), name
    config = json.loads((again / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["layer_types"] == [
        "sliding_attention",
        "full_attention",
    ]
    assert "chat_template" in json.loads((again / "tokenizer_config.json").read_text())


def test_dataset_and_command_line(tmp_path: Path) -> None:
    a = make_chat_dataset(tmp_path / "a.jsonl", n=5, seed=1).read_text()
    assert main(["--dataset", str(tmp_path / "b.jsonl"), "--rows", "5", "--seed", "1"]) == 0
    assert (tmp_path / "b.jsonl").read_text() == a and len(a.splitlines()) == 5
