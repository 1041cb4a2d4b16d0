"""A campaign pass (campaign/plan.py) on the committed example campaigns: which runs it makes, in
what order, under which caps, and the status it writes. Pure: the runs are dicts as the index has."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from accelbench.api import parse_resource
from accelbench.api.campaign import BenchCampaign
from accelbench.campaign.plan import plan_campaign
from accelbench.catalog import load_catalog
from accelbench.plan import plan_for

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
CATALOG = load_catalog()


def campaign(example: str, **spec: Any) -> BenchCampaign:
    body = yaml.safe_load((ROOT / "examples" / "campaigns" / f"{example}.yaml").read_text())
    body["metadata"] |= {"namespace": "team-a", "uid": "c-1", "generation": 1}
    body["spec"] |= spec
    return BenchCampaign.model_validate(body)


def finished(manifest: dict[str, Any], phase: str = "Succeeded", dollars: float = 1.0) -> dict[str, Any]:
    """The run as the index holds it once it ended (its status as the operator wrote it)."""
    run = copy.deepcopy(manifest)
    run["status"] = {
        "phase": phase,
        "accelerator": "cpu",
        "cost": {"dollars": dollars, "chips": 1, "hours": 0.01, "dollarsPerChipHour": 0.0},
        "results": {
            "tokensPerSecond": 100.0 + len(manifest["metadata"]["name"]),
            "tokensPerSecondPerChip": 100.0,
        },
        "conditions": [
            {"type": "Ready", "status": "True" if phase == "Succeeded" else "False", "reason": phase}
        ],
    }
    return run


def test_a_campaign_makes_its_cells_runs_up_to_max_concurrent_and_says_why_the_rest_wait() -> None:
    demo = campaign("cpu-demo")
    first = plan_campaign(demo, [], CATALOG, NOW)
    assert len(first.create) == 2 and not first.invalid
    status = first.status
    assert status["totals"]["cells"] == 6 and status["phase"] == "Running"
    assert len(status["waiting"]) == 4 and all("maxConcurrent 2" in why for why in status["waiting"].values())
    run = first.create[0]
    assert run["metadata"]["labels"]["accelbench.io/campaign"] == "cpu-demo"
    assert run["metadata"]["ownerReferences"][0] | {} == {
        "apiVersion": "accelbench.io/v1alpha1",
        "kind": "BenchCampaign",
        "name": "cpu-demo",
        "uid": "c-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    values = yaml.safe_load(run["metadata"]["annotations"]["accelbench.io/cell-values"])
    assert run["spec"]["training"]["seqLength"] == values["training.seqLength"]
    assert run["spec"]["method"]["rank"] == values["method.rank"]

    # The same pass again, the two runs not in the index yet: nothing new is made past the cap.
    running = [{**copy.deepcopy(m), "status": {"phase": "Running"}} for m in first.create]
    again = plan_campaign(demo, running, CATALOG, NOW)
    assert again.create == [] and again.status["totals"]["running"] == 2
    # Both ended: the next two start; the finished ones' rows carry their results.
    done = [finished(m) for m in first.create]
    later = plan_campaign(demo, done, CATALOG, NOW)
    assert len(later.create) == 2 and {m["metadata"]["name"] for m in later.create}.isdisjoint(
        {m["metadata"]["name"] for m in first.create}
    )
    rows = {r["name"]: r for r in later.status["cells"]}
    assert all(rows[m["metadata"]["name"]]["tokensPerSecond"] > 100 for m in first.create)
    assert later.status["totals"]["succeeded"] == 2


def test_every_cell_done_is_finished_with_the_front_and_the_winners() -> None:
    demo = campaign("cpu-demo", maxConcurrent=None)
    runs = [
        finished(m, dollars=0.1 * i) for i, m in enumerate(plan_campaign(demo, [], CATALOG, NOW).create, 1)
    ]
    last = plan_campaign(demo, runs, CATALOG, NOW)
    assert last.create == [] and last.status["phase"] == "Finished"
    assert last.status["totals"] == {
        "cells": 6,
        "succeeded": 6,
        "failed": 0,
        "running": 0,
        "waiting": 0,
        "dollars": 2.1,
        "chipHours": 0.06,
    }
    assert last.status["paretoFront"] and set(last.status["winners"]) >= {
        "tokensPerSecondPerChip",
        "trainingCost",
    }


def test_a_git_edit_that_drops_a_value_keeps_the_finished_runs_and_never_makes_them_again() -> None:
    demo = campaign("cpu-demo", maxConcurrent=None)
    runs = [finished(m) for m in plan_campaign(demo, [], CATALOG, NOW).create]
    edited = copy.deepcopy(demo)
    assert edited.spec.finetune is not None
    edited.spec.finetune.matrix.axes["method.rank"] = [4]  # rank 8 dropped
    out = plan_campaign(edited, runs, CATALOG, NOW)
    assert out.create == []
    dropped = [r for r in out.status["cells"] if not r.get("inMatrix", True)]
    assert len(dropped) == 2 and all(r["phase"] == "Succeeded" for r in dropped)
    edited.spec.finetune.matrix.axes["method.rank"] = [4, 8, 16]  # one value added: only its cells run
    out = plan_campaign(edited, runs, CATALOG, NOW)
    assert len(out.create) == 2 and all(m["spec"]["method"]["rank"] == 16 for m in out.create)


def test_the_budget_holds_what_it_cannot_pay_for_and_the_campaign_says_it_is_stalled() -> None:
    study = campaign("gemma4-31b-study", budget={"maxUSD": 100})
    out = plan_campaign(study, [], CATALOG, NOW)
    # Gaudi 3 has no public price in the catalog ($0 until the prices ConfigMap sets one): only it
    # fits; every priced cell reserves its 12 h deadline, far past $100.
    assert [m["spec"]["accelerator"]["type"] for m in out.create] == ["gaudi3"]
    assert all("past maxUSD 100" in why for n, why in out.status["waiting"].items() if "-ta" not in n)
    stalled = plan_campaign(study, [finished(out.create[0], phase="Running")], CATALOG, NOW)
    assert stalled.status["phase"] == "Running"  # the Gaudi run goes on
    done = plan_campaign(study, [finished(out.create[0])], CATALOG, NOW)
    assert [m["metadata"]["name"] for m in done.create] == [out.create[0]["metadata"]["name"] + "-2"]
    roomy = plan_campaign(campaign("gemma4-31b-study"), [], CATALOG, NOW)
    assert len(roomy.create) == 4  # maxConcurrent 4, one per accelerator
    worst = 0.0
    for run in roomy.create:
        # Trained by epochs: no projection but the run's own 12 h deadline, reserved whole and kept;
        # a bench: its prior plus headroom. Together, run to their deadlines, within the budget.
        deadline = run["spec"]["activeDeadlineSeconds"]
        assert deadline <= 43200 or run["kind"] == "InferenceBench", run["metadata"]["name"]
        worst += plan_for(parse_resource(run), CATALOG).dollars_per_hour * deadline / 3600
    assert worst <= 3000


def test_a_cell_that_cannot_be_made_stalls_the_campaign_naming_it() -> None:
    demo = campaign("cpu-demo")
    assert demo.spec.finetune is not None
    demo.spec.finetune.matrix.axes["training.seqLength"] = [64, 4]  # below the minimum of 8
    out = plan_campaign(demo, [], CATALOG, NOW)
    assert out.status["phase"] == "Stalled" and "seqLength" in out.status["message"]
    assert any(r["phase"] == "Invalid" and r["reason"] == "InvalidCell" for r in out.status["cells"])
    assert len(out.create) == 2  # the valid cells still run


# --- the controller's pass (controller/campaign.py) against a recording fake client ---------------


class CampaignKube:
    def __init__(self, taken: dict[str, dict[str, Any]] | None = None) -> None:
        self.created: list[dict[str, Any]] = []
        self.status_writes: list[dict[str, Any]] = []
        self.taken = taken or {}  # name -> the object already there

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        if obj["metadata"]["name"] in self.taken:
            raise ApiException(status=409, reason="AlreadyExists")
        self.created.append(obj)
        return obj

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.taken.get(name)

    def patch_status(self, obj: Any, status: dict[str, Any], resource_version: str | None) -> dict[str, Any]:
        self.status_writes.append(copy.deepcopy(status))
        return {}


def _pass(kube: CampaignKube, body: dict[str, Any], runs: list[dict[str, Any]] = ()) -> Any:  # type: ignore[assignment]
    from accelbench.controller.campaign import reconcile_campaign
    from accelbench.controller.metrics import Metrics
    from accelbench.controller.reconciler import Snapshot
    from accelbench.controller.state import ControllerState

    state = ControllerState(kube=kube, metrics=Metrics(), price_namespace="x", price_config_map="y")  # type: ignore[arg-type]
    state._catalog, state._loaded_at = CATALOG, float("inf")
    return reconcile_campaign(
        Snapshot(("BenchCampaign", "team-a", "cpu-demo"), body, runs=list(runs)), state, NOW
    )


def test_the_operators_client_knows_every_kind_it_writes() -> None:
    from accelbench.api import KINDS
    from accelbench.controller.kube import resource_path

    for kind in [*KINDS, "BenchCampaign"]:  # status writes, and a campaign's runs
        assert resource_path("accelbench.io/v1alpha1", kind, "ns", "n").startswith("/apis/accelbench.io/")


def test_the_controller_creates_the_admitted_runs_and_writes_kstatus() -> None:
    body = campaign("cpu-demo").model_dump(by_alias=True, exclude_none=True, mode="json")
    kube = CampaignKube()
    outcome = _pass(kube, body)
    assert len(kube.created) == 2 and outcome.requeue_after == 30.0
    (status,) = kube.status_writes
    kstatus = {c["type"]: c["status"] for c in status["conditions"]}
    assert kstatus == {"Ready": "False", "Reconciling": "True", "Stalled": "False"}
    # A run made by an earlier pass, not in the index yet: its name is taken by the campaign itself.
    own = {**kube.created[0], "metadata": {**kube.created[0]["metadata"]}}
    again = CampaignKube(taken={own["metadata"]["name"]: own})
    _pass(again, body)
    assert again.status_writes[0]["phase"] == "Running"
    # Someone else's object under a run's name: never touched, the campaign says so.
    foreign = {"metadata": {"name": own["metadata"]["name"], "ownerReferences": []}}
    blocked = CampaignKube(taken={own["metadata"]["name"]: foreign})
    _pass(blocked, body)
    assert (
        blocked.status_writes[0]["phase"] == "Stalled"
        and "NameConflict" in blocked.status_writes[0]["message"]
    )
    # A spec the models refuse: Stalled with the reason, nothing made.
    bad = copy.deepcopy(body)
    bad["spec"]["repeats"] = 0
    refused = CampaignKube()
    _pass(refused, bad)
    assert refused.created == [] and refused.status_writes[0]["phase"] == "Stalled"
    assert "repeats" in refused.status_writes[0]["message"]


def test_a_budgeted_cell_without_any_projection_waits_and_says_what_to_set() -> None:
    """Trained by epochs with no deadline: no cost can be projected, so a budget cannot admit it;
    without a budget it runs."""
    study = campaign("gemma4-31b-study", inference=None, repeats=1)
    assert study.spec.finetune is not None
    study.spec.finetune.template.active_deadline_seconds = None
    out = plan_campaign(study, [], CATALOG, NOW)
    assert out.create == [] and out.status["phase"] == "Stalled"
    assert all(
        "set training.maxSteps or activeDeadlineSeconds" in why for why in out.status["waiting"].values()
    )
    study.spec.budget.max_usd = None
    assert len(plan_campaign(study, [], CATALOG, NOW).create) == 3
