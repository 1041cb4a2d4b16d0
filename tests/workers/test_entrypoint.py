"""`python -m accelbench.workers.finetune`, `accelbench run -f`, the job/env parsing, exit codes."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accelbench import cli
from accelbench.api import parse_resource, parse_termination_message
from accelbench.catalog import load_catalog
from accelbench.plan import plan_for
from accelbench.render import job_payload_json
from accelbench.workers import InvalidConfigError
from accelbench.workers.jobenv import dist_env, load_job, resolve_uri
from accelbench.workers.report import find_report_line


def _worker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("ACCELBENCH_")}
    full = {**inherited, **env}
    return subprocess.run(
        [sys.executable, "-m", "accelbench.workers.finetune", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_worker_module_runs_a_payload_from_the_env(manifest_for, tmp_path: Path) -> None:
    """The payload exactly as the operator renders it (planner + renderer), parsed by the worker."""
    resource = parse_resource(manifest_for("llama", training={"maxSteps": 2}))
    # A peak the built-in catalog does not have: the worker must take the operator's, not reload it.
    plan = dataclasses.replace(plan_for(resource, load_catalog()), peak_tflops_per_chip=3.5)
    log = tmp_path / "termination-log"
    result = _worker(
        {
            "ACCELBENCH_JOB": job_payload_json(resource, plan),
            "ACCELBENCH_TERMINATION_LOG": str(log),
            "ACCELBENCH_METRICS_PORT": "0",
        }
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = parse_termination_message(log.read_text())
    assert report.ok and report.finetune.steps == 2
    assert report.finetune.peak_tflops_per_chip == 3.5
    full = find_report_line(result.stdout)
    assert full is not None and full.finetune.loss_history == report.finetune.loss_history
    assert "metrics: serving on port" in result.stderr


# What a JAX worker image leaves out (the `jax` extra has no peft, so no torch): a JAX run must not
# need them, or the image would fail at run time, not at build.
TORCH_SIDE = ("torch", "transformers", "peft", "deepspeed", "diffusers", "torchao", "accelerate")


def test_a_jax_run_needs_nothing_from_the_torch_side(manifest_for, tmp_path: Path) -> None:
    """A JAX LoRA run with an export, in a process where importing any torch-side package fails."""
    manifest = manifest_for("llama", training={"maxSteps": 2}, output=str(tmp_path / "out"))
    manifest["spec"]["framework"] = "jax"
    resource = parse_resource(manifest)
    log = tmp_path / "termination-log"
    blocked = "import runpy, sys\n"
    blocked += f"sys.modules.update(dict.fromkeys({TORCH_SIDE!r}))\n"  # None: `import` raises
    blocked += "runpy.run_module('accelbench.workers.finetune', run_name='__main__', alter_sys=True)\n"
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("ACCELBENCH_")}
    result = subprocess.run(
        [sys.executable, "-c", blocked],
        env={
            **inherited,
            "ACCELBENCH_JOB": job_payload_json(resource, plan_for(resource, load_catalog())),
            "ACCELBENCH_TERMINATION_LOG": str(log),
            "ACCELBENCH_METRICS_PORT": "0",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = parse_termination_message(log.read_text())
    assert report.ok and report.finetune.steps == 2, report.error
    assert any((tmp_path / "out").iterdir())


def test_invalid_config_exits_3_with_a_report(manifest_for, tmp_path: Path) -> None:
    manifest = manifest_for("llama")
    manifest["spec"]["dataset"]["uri"] = str(tmp_path / "missing.jsonl")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest))
    log = tmp_path / "termination-log"
    result = _worker({"ACCELBENCH_TERMINATION_LOG": str(log)}, "--job", str(job))
    assert result.returncode == 3, result.stderr[-3000:]
    report = parse_termination_message(log.read_text())
    assert not report.ok and report.error.type == "InvalidConfig" and "missing.jsonl" in report.error.message


def test_unparseable_job_exits_3(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    result = _worker({"ACCELBENCH_JOB": "{not json", "ACCELBENCH_TERMINATION_LOG": str(log)})
    assert result.returncode == 3
    assert parse_termination_message(log.read_text()).error.type == "InvalidConfig"


def test_accelbench_run_on_a_manifest(manifest_for, tmp_path: Path, capsys) -> None:
    manifest = manifest_for("gemma3", training={"maxSteps": 5})
    # A relative dataset path resolves against the manifest's directory.
    dataset = Path(manifest["spec"]["dataset"]["uri"])
    (tmp_path / "data.jsonl").write_bytes(dataset.read_bytes())
    manifest["spec"]["dataset"]["uri"] = "data.jsonl"
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert cli.main(["run", "-f", str(path), "--steps", "2", "--json"]) == 0
    out = capsys.readouterr().out
    assert "accelbench run tiny: ok" in out and "tokens/s" in out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["finetune"]["steps"] == 2


def test_accelbench_run_invalid_manifest_exits_3(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: accelbench.io/v1alpha1\nkind: FinetuneJob\nmetadata: {name: x}\nspec: {}\n")
    assert cli.main(["run", "-f", str(path)]) == 3


def test_dist_env_reads_torchrun_and_jax_variables() -> None:
    torch_env = dist_env(
        "pytorch",
        {
            "RANK": "3",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
            "NNODES": "2",
            "NPROC_PER_NODE": "4",
            "NODE_RANK": "1",
            "MASTER_ADDR": "h0",
        },
    )
    assert (torch_env.rank, torch_env.world_size, torch_env.local_rank, torch_env.nnodes) == (3, 8, 1, 2)
    assert torch_env.master_addr == "h0" and torch_env.distributed and not torch_env.is_main
    jax_env = dist_env(
        "jax",
        {
            "JAX_PROCESS_ID": "1",
            "JAX_NUM_PROCESSES": "2",
            "JAX_COORDINATOR_ADDRESS": "h0:8476",
            "JOB_COMPLETION_INDEX": "1",
        },
    )
    assert (jax_env.rank, jax_env.world_size, jax_env.jax_coordinator) == (1, 2, "h0:8476")
    assert dist_env("pytorch", {}).world_size == 1
    with pytest.raises(InvalidConfigError):
        dist_env("pytorch", {"RANK": "x"})


def test_resolve_uri() -> None:
    env = {"ACCELBENCH_PVC_ROOT": "/mnt/pvc"}
    assert resolve_uri("pvc://models/gemma", env) == Path("/mnt/pvc/models/gemma")
    assert resolve_uri("data.jsonl", env, Path("/m")) == Path("/m/data.jsonl")
    with pytest.raises(InvalidConfigError, match="gs://"):
        resolve_uri("gs://bucket/x", env)


def test_load_job_rejects_other_kinds(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match="no job"):
        load_job(None, {})
    path = tmp_path / "ib.yaml"
    path.write_text("apiVersion: accelbench.io/v1alpha1\nkind: Nope\nmetadata: {name: x}\nspec: {}\n")
    with pytest.raises(InvalidConfigError, match="invalid FinetuneJob"):
        load_job(path)
