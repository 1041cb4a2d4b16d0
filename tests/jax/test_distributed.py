"""Sharded runs agree with a one-device run, step by step (CPU, subprocesses).

- Two JAX processes (one CPU device each) with a local coordinator: each runs the real worker with
  JAX_NUM_PROCESSES=2, so `jax.distributed.initialize` joins them (gloo collectives on CPU) and the
  mesh has data=2. Step 2's loss only agrees with a one-process run if step 1's gradients were
  all-reduced over both halves of the batch.
- One process with four virtual CPU devices and the plan's fsdp=2, tp=2: the sharding rules.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
from jax_helpers import manifest, run

SCRIPT = """
import dataclasses, json, sys
from accelbench.workers.finetune.__main__ import RunOptions, run_job
from accelbench.workers.jobenv import parse_job_payload
spec, env, plan = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
job = parse_job_payload(spec)
job = dataclasses.replace(job, plan=job.plan.model_copy(update=plan))
report, code = run_job(job, RunOptions(serve_metrics=False, log=lambda _: None, env=env))
print("RESULT " + json.dumps({"code": code, "error": str(report.error),
      "loss": report.finetune.loss_history if report.finetune else None}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _result(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, stdout
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_two_processes_agree_with_one(tiny_models: dict[str, Path], chat_dataset: Path) -> None:
    spec = manifest(tiny_models["llama"], chat_dataset, "llama", "jax", method={"type": "full"},
                    training={"maxSteps": 2})  # fmt: skip
    address = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = []
    for pid in range(2):
        dist = {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(pid), "JAX_COORDINATOR_ADDRESS": address}
        cmd = [sys.executable, "-c", SCRIPT, json.dumps(spec), json.dumps(dist), "{}"]
        procs.append(
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        )
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=180)
        results.append(_result(out))
    assert all(r["code"] == 0 for r in results), results
    assert results[0]["loss"] == results[1]["loss"]
    single = run(spec).finetune.loss_history
    np.testing.assert_allclose(results[0]["loss"], single, rtol=1e-5)


def test_fsdp_and_tp_mesh_agrees_with_one_device(tiny_models: dict[str, Path], chat_dataset: Path) -> None:
    spec = manifest(tiny_models["gemma3"], chat_dataset, "gemma3", "jax", method={"type": "full"},
                    training={"maxSteps": 2})  # fmt: skip
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    cmd = [sys.executable, "-c", SCRIPT, json.dumps(spec), "{}", json.dumps({"fsdp": 2, "tp": 2})]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180, check=False)
    result = _result(done.stdout + done.stderr)
    assert result["code"] == 0, result
    np.testing.assert_allclose(result["loss"], run(spec).finetune.loss_history, rtol=1e-5)
