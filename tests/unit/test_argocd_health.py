"""Argo CD's health checks for accelbench's kinds (docs/argocd/*.lua), run by a real Lua 5.1
interpreter (Argo CD runs gopher-lua, a Lua 5.1) against objects recorded from the e2e suite's
cluster in each phase (tests/unit/recorded/argocd)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ARGOCD = ROOT / "docs" / "argocd"
RECORDED = Path(__file__).parent / "recorded" / "argocd"
LUA = shutil.which("lua5.1") or shutil.which("lua")


def lua_literal(value: Any) -> str:
    """A JSON value as a Lua table constructor (what Argo CD hands the script as `obj`)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid Lua string for these characters
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    items = (f"[{json.dumps(k)}] = {lua_literal(v)}" for k, v in value.items() if v is not None)
    return "{" + ", ".join(items) + "}"


def health(script: Path, obj: dict[str, Any]) -> tuple[str, str]:
    if LUA is None:
        pytest.skip("no Lua interpreter (make tools installs lua5.1)")
    program = (
        f"obj = {lua_literal(obj)}\n"
        f"local hs = (function()\n{script.read_text()}\nend)()\n"
        'io.write(hs.status, "\\t", hs.message or "")\n'
    )
    done = subprocess.run([LUA, "-"], input=program, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    status, _, message = done.stdout.partition("\t")
    return status, message


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text())


RUN_CASES = {
    # recorded object -> the health Argo CD should show
    "finetunejob-quota-exceeded": "Progressing",  # retried every 30 s: it waits, it is not stuck
    "finetunejob-scheduling": "Progressing",
    "finetunejob-running": "Progressing",
    "finetunejob-succeeded": "Healthy",
    "finetunejob-failed": "Degraded",
    "finetunejob-suspended": "Suspended",
    "finetunejob-name-conflict": "Degraded",
    "inferencebench-running": "Progressing",
    "inferencebench-succeeded": "Healthy",
    "inferencebench-failed": "Degraded",
}


@pytest.mark.parametrize(("name", "expected"), sorted(RUN_CASES.items()))
def test_a_run_is_healthy_only_once_it_succeeded(name: str, expected: str) -> None:
    status, message = health(ARGOCD / "health-run.lua", recorded(name))
    assert status == expected, (name, status, message)
    assert message  # Argo CD shows it: always say something


def test_a_generation_the_operator_has_not_seen_is_progressing() -> None:
    obj = recorded("finetunejob-succeeded")
    obj["metadata"]["generation"] = obj["status"]["observedGeneration"] + 1
    assert health(ARGOCD / "health-run.lua", obj)[0] == "Progressing"
    assert health(ARGOCD / "health-run.lua", {"metadata": {"name": "new"}})[0] == "Progressing"


CAMPAIGN_CASES = {  # recorded by tests/e2e/test_gitops_campaign.py with ACCELBENCH_RECORD_ARGOCD set
    "benchcampaign-running": "Progressing",
    "benchcampaign-finished": "Healthy",
    "benchcampaign-budget-reached": "Degraded",  # Stalled: it cannot go on without a larger budget
}


@pytest.mark.parametrize(("name", "expected"), sorted(CAMPAIGN_CASES.items()))
def test_a_recorded_campaign_is_healthy_only_once_every_cell_ended(name: str, expected: str) -> None:
    status, message = health(ARGOCD / "health-campaign.lua", recorded(name))
    assert status == expected, (name, status, message)
    assert message


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        (
            [{"type": "Reconciling", "status": "True", "reason": "CellsRunning", "message": "3 of 12 done"}],
            "Progressing",
        ),
        ([{"type": "Ready", "status": "True", "reason": "Finished", "message": "12 cells"}], "Healthy"),
        ([{"type": "Stalled", "status": "True", "reason": "BudgetReached", "message": "$500"}], "Degraded"),
        ([], "Progressing"),
    ],
)
def test_a_campaign_follows_its_kstatus_conditions(conditions: list[dict[str, str]], expected: str) -> None:
    obj = {
        "metadata": {"name": "study", "generation": 2},
        "status": {"observedGeneration": 2, "conditions": conditions},
    }
    assert health(ARGOCD / "health-campaign.lua", obj)[0] == expected


def test_the_argocd_cm_snippet_carries_the_scripts_as_they_are() -> None:
    data = yaml.safe_load((ARGOCD / "argocd-cm.yaml").read_text())["data"]
    prefix = "resource.customizations.health.accelbench.io_"
    assert (
        data[prefix + "FinetuneJob"]
        == data[prefix + "InferenceBench"]
        == (ARGOCD / "health-run.lua").read_text()
    )
    assert data[prefix + "BenchCampaign"] == (ARGOCD / "health-campaign.lua").read_text()
