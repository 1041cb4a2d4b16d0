"""The `accelbench` CLI on the shipped examples and on bad input."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from accelbench.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))
KUBERNETES_VERSION = "1.35"


def files_for(example: Path) -> list[str]:
    """The example, after the example that defines the FinetuneJob it serves from, if it names one."""
    names = {
        doc["metadata"]["name"]: path
        for path in EXAMPLES
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "FinetuneJob"
    }
    model = ((yaml.safe_load(example.read_text()) or {}).get("spec") or {}).get("model") or {}
    source = names.get(model.get("finetuneJob", "")) if isinstance(model, dict) else None
    args = ["-f", str(source)] if source else []
    return [*args, "-f", str(example)]


def test_crds_writes_every_kind(tmp_path: Path) -> None:
    assert main(["crds", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "accelbench.io_benchcampaigns.yaml",
        "accelbench.io_finetunejobs.yaml",
        "accelbench.io_inferencebenches.yaml",
    ]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_plan_every_example(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *files_for(example)]) == 0
    out = capsys.readouterr().out
    assert "chips" in out and "$/hour" in out


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_every_example_is_valid_kubernetes(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", *files_for(example)]) == 0
    objects = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    assert any(o["kind"] == "Job" for o in objects)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_a_bench_serving_a_finetune_job_needs_that_manifest_to_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = ROOT / "examples/inference/gemma4-31b-vllm-h100x2.yaml"
    assert main(["plan", "-f", str(bench)]) == 2
    err = capsys.readouterr().err
    assert "serves what FinetuneJob gemma4-31b-lora-h100x2 trains: pass that FinetuneJob's manifest" in err


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return str(path)


VALID_HEAD = """apiVersion: accelbench.io/v1alpha1
kind: FinetuneJob
metadata: {name: x}
spec:
  model: {uri: /m, family: llama, size: 8b}
  dataset: {uri: /d.jsonl}
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "no such file"),
        ("a: [1, 2", "not valid YAML"),
        ("- 1\n- 2\n", "document 1 is a list, not a mapping"),
        ("", "no documents"),
        (VALID_HEAD + "  accelerator: {type: h100, count: 3}\n", "spec asks 3"),
        (VALID_HEAD + "  accelerator: {type: tpu-v5p, topology: 3x3x3}\n", "3x3x3"),
        (VALID_HEAD + "  accelerator: {type: h100}\n  method: {type: lora}\n", "method lora needs a rank"),
        (
            VALID_HEAD.replace("8b", "70b")
            + "  accelerator: {type: h100, count: 1}\n  method: {type: full}\n",
            "needs >= ",
        ),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "kind 'Pod' is not one of"),
    ],
)
def test_bad_input_gets_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, message: str
) -> None:
    path = str(tmp_path / "missing.yaml") if text is None else _write(tmp_path, text)
    assert main(["plan", "-f", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert message in err
    assert "Traceback" not in err
