"""The cheap part of benchmarks/faults/run.py in `make test`: real tiny runs while the operator is
SIGKILLed every few seconds and the apiserver is frozen once. Every run ends Succeeded with exactly
what its worker reported, one Job UID per child, no phase moving backwards (issue 14)."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_env import Env
from kubernetes import client

ROOT = Path(__file__).resolve().parents[2]


def _faults() -> Any:
    spec = importlib.util.spec_from_file_location("faults_run", ROOT / "benchmarks/faults/run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from accelbench.workers.testing import make_chat_dataset, make_tiny_model

    base = tmp_path_factory.mktemp("tiny-kill-loop")
    return {
        "model": make_tiny_model(base / "model", family="llama"),
        "data": make_chat_dataset(base / "chat.jsonl", n=48),
    }


def test_runs_survive_operator_kills_and_an_apiserver_freeze(env: Env, tiny: dict[str, Path]) -> None:
    faults = _faults()
    rng = random.Random(7)
    bodies = [faults.finetune(f"kl-ft-{i}", tiny["model"], tiny["data"], 10) for i in range(3)]
    bodies.append(faults.bench("kl-ib-0", tiny["model"], faults.localcluster.free_port()))
    names = {
        b["metadata"]["name"]: ("finetunejobs" if b["kind"] == "FinetuneJob" else "inferencebenches")
        for b in bodies
    }
    watcher, poller = faults.Watcher(env.api), faults.Poller(env.api, names)
    watcher.start()
    custom = client.CustomObjectsApi(env.api)
    for body in bodies:
        custom.create_namespaced_custom_object(
            "accelbench.io", "v1alpha1", "default", names[body["metadata"]["name"]], body
        )
    poller.start()
    kills, froze, started = 0, False, time.monotonic()
    try:
        while not poller.done() and time.monotonic() - started < 420:
            time.sleep(rng.uniform(2, 5))
            if not froze and time.monotonic() - started > 15:
                os.kill(env.cluster.pids["kube-apiserver"], signal.SIGSTOP)
                time.sleep(8)
                os.kill(env.cluster.pids["kube-apiserver"], signal.SIGCONT)
                froze = True
                continue
            assert env.operator.process is not None
            env.operator.process.send_signal(signal.SIGKILL)
            env.operator.process.wait()
            env.operator.process = None
            env.operator.start()
            kills += 1
        time.sleep(3)
    finally:
        watcher.stop.set()
        poller.stop.set()
        if env.operator.process is None:
            env.operator.start()
    execdir = env.workdir / "localexec"
    result = faults.verify(
        type("Args", (), {"finetunejobs": 3, "benches": 1})(),
        poller,
        watcher,
        env.api,
        execdir,
        kills,
        [8.0],
        8.0,
        time.monotonic() - started,
    )
    print(f"kill loop: {kills} SIGKILLs, one 8 s apiserver freeze, {result['elapsed_s']} s")
    assert kills >= 5 and froze
    assert result["details"] == {"lost": [], "duplicates": {}, "regressions": {}, "mismatched": []}
    assert result["runs_whose_progress_moved_while_running"] >= 1
    for name, plural in names.items():
        env.kubectl("delete", plural, name, "--wait=false")
