"""A BenchCampaign on the local control plane (issue 16), run by the chart-installed operator (the
file sorts after test_chart_install.py, so the RBAC audit sees its requests): the CPU demo
campaign's six cells (four fine-tunes, two benches) run with tiny real workers under maxConcurrent
2, through two operator kills, to one table in status; no finished cell ever runs twice, and the
kstatus conditions say when it is done."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_env import Env, wait_for

from accelbench.workers.testing import make_chat_dataset, make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
PLURAL = "benchcampaigns"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("tiny-campaign")
    return {
        "model": str(make_tiny_model(base / "model", family="llama")),
        "data": str(make_chat_dataset(base / "chat.jsonl", n=48)),
    }


def demo(tiny: dict[str, str]) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples/campaigns/cpu-demo.yaml").read_text())
    spec = body["spec"]
    spec["finetune"]["template"]["model"]["uri"] = tiny["model"]
    spec["finetune"]["template"]["dataset"]["uri"] = tiny["data"]
    spec["inference"]["template"]["model"]["uri"] = tiny["model"]
    return body


def runs(env: Env) -> dict[str, tuple[str, str | None]]:
    """name -> (uid, phase) of every run the campaign made."""
    found = {}
    for plural in ("finetunejobs", "inferencebenches"):
        listed = env.custom.list_namespaced_custom_object(
            "accelbench.io", "v1alpha1", "default", plural, label_selector="accelbench.io/campaign=cpu-demo"
        )
        for item in listed["items"]:
            found[item["metadata"]["name"]] = (
                item["metadata"]["uid"],
                (item.get("status") or {}).get("phase"),
            )
    return found


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def test_the_cpu_campaign_runs_every_cell_once_through_operator_kills(env: Env, tiny: dict[str, str]) -> None:
    env.apply(demo(tiny))
    seen: dict[str, str] = {}  # run name -> the one UID it ever had
    finished_before_kill: set[str] = set()

    def watch() -> None:
        for name, (uid, phase) in runs(env).items():
            assert seen.setdefault(name, uid) == uid, f"{name} was made twice"
            if phase in ("Succeeded", "Failed"):
                finished_before_kill.add(name)

    for _ in range(2):  # kill the operator once a cell has finished, twice
        target = len(finished_before_kill) + 1
        wait_for(
            lambda t=target: (watch(), len(finished_before_kill) >= t)[1], timeout=300, what="a cell done"
        )
        env.operator.process.kill()  # type: ignore[union-attr]
        env.operator.process.wait()  # type: ignore[union-attr]
        time.sleep(2)
        env.operator.start()

    obj = wait_for(
        lambda: (
            watch(),
            (o := env.get(PLURAL, "cpu-demo")).get("status", {}).get("phase") == "Finished" and o,
        )[1],
        timeout=600,
        what="the campaign finished",
    )
    status = obj["status"]
    assert status["totals"]["cells"] == 6 and status["totals"]["succeeded"] == 6, status["totals"]
    assert len(seen) == 6  # one run per cell, never a second
    rows = {r["name"]: r for r in status["cells"]}
    assert set(rows) == set(seen)
    for row in rows.values():
        assert row["phase"] == "Succeeded", row
        measured = (
            row.get("tokensPerSecond")
            if row["kind"] == "FinetuneJob"
            else row.get("peakOutputTokensPerSecond")
        )
        assert measured and measured > 0, row
    assert status["winners"]["tokensPerSecondPerChip"] in rows
    assert (condition(obj, "Ready")["status"], condition(obj, "Stalled")["status"]) == ("True", "False")
    table = env.kubectl("get", PLURAL, "cpu-demo").stdout
    assert "Finished" in table.splitlines()[1]
    # A Git edit that adds a value runs only the new cells; the finished ones stay as they are.
    body = demo(tiny)
    body["spec"]["inference"]["matrix"]["axes"]["workload.outputLength"] = [8, 16, 4]
    env.apply(body)
    wait_for(lambda: len(runs(env)) == 7, timeout=60, what="the one new cell's run")
    assert {n: u for n, (u, _) in runs(env).items() if n in seen} == seen
