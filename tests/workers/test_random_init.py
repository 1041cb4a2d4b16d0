"""Random-init mode (ACCELBENCH_RANDOM_INIT=1, benchmarks only) in both workers, on the CPU.

A directory holding only config.json and the tokenizer files trains with random weights made on the
device when the variable asks for it, says so in its report, and still fails clearly without it.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from accelbench.api.contract import ENV_RANDOM_INIT, ExitCode
from accelbench.workers.finetune.__main__ import RunOptions, run_job
from accelbench.workers.jobenv import parse_job_payload

FRAMEWORKS = ("pytorch", "jax")


@pytest.fixture(scope="module")
def config_only(tiny_gemma3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Gemma 3 dir without its weights: what a benchmark hands the worker."""
    directory = tmp_path_factory.mktemp("config-only")
    for path in tiny_gemma3.iterdir():
        if path.is_file() and ".safetensors" not in path.name:
            shutil.copy(path, directory / path.name)
    assert (directory / "config.json").is_file() and not list(directory.glob("*.safetensors*"))
    return directory


def _run(manifest: dict[str, Any], framework: str, env: dict[str, str]) -> tuple[Any, int]:
    manifest["spec"]["framework"] = framework
    return run_job(parse_job_payload(manifest), RunOptions(serve_metrics=False, log=lambda _: None, env=env))


def _manifest(manifest_for, model_dir: Path, **kwargs: Any) -> dict[str, Any]:
    manifest = manifest_for("gemma3", **kwargs)
    manifest["spec"]["model"]["uri"] = str(model_dir)
    return manifest


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("method", [{"type": "lora", "rank": 4}, {"type": "full"}], ids=["lora", "full"])
def test_random_init_trains_from_a_config_only_dir(
    manifest_for, config_only: Path, framework: str, method: dict[str, Any]
) -> None:
    manifest = _manifest(manifest_for, config_only, method=method, training={"maxSteps": 2})
    report, code = _run(manifest, framework, {ENV_RANDOM_INIT: "1"})
    assert code == ExitCode.OK, report.error
    ft = report.finetune
    assert ft.steps == 2 and all(math.isfinite(x) for x in ft.loss_history)
    assert ft.tokens_per_second > 0 and ft.mfu is not None and ft.mfu > 0
    # Never silent: the report itself says its weights were random.
    assert report.versions["weights"] == f"random ({ENV_RANDOM_INIT}=1)"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_random_init_is_seeded(manifest_for, config_only: Path, framework: str) -> None:
    """Same seed, same weights: the first loss repeats (a benchmark's losses are comparable runs)."""
    losses = []
    for _ in range(2):
        manifest = _manifest(manifest_for, config_only, method={"type": "full"}, training={"maxSteps": 1})
        report, code = _run(manifest, framework, {ENV_RANDOM_INIT: "1"})
        assert code == ExitCode.OK, report.error
        losses.append(report.finetune.loss_history[0])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_config_only_dir_without_the_variable_fails_clearly(
    manifest_for, config_only: Path, framework: str
) -> None:
    report, code = _run(_manifest(manifest_for, config_only, training={"maxSteps": 1}), framework, {})
    assert code == ExitCode.INVALID_CONFIG
    assert report.error is not None and report.error.type == "InvalidConfig"
    assert str(config_only) in report.error.message and ENV_RANDOM_INIT in report.error.message


@pytest.mark.parametrize("value", ["0", "", "true"])
def test_only_the_value_1_turns_it_on(manifest_for, config_only: Path, value: str) -> None:
    report, code = _run(
        _manifest(manifest_for, config_only, training={"maxSteps": 1}), "pytorch", {ENV_RANDOM_INIT: value}
    )
    assert code == ExitCode.INVALID_CONFIG, report


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_random_init_writes_no_output(
    manifest_for, config_only: Path, framework: str, tmp_path: Path
) -> None:
    manifest = _manifest(manifest_for, config_only, training={"maxSteps": 1}, output=str(tmp_path / "out"))
    report, code = _run(manifest, framework, {ENV_RANDOM_INIT: "1"})
    assert code == ExitCode.INVALID_CONFIG
    assert "writes no output" in report.error.message and not (tmp_path / "out").exists()
