"""A campaign pass (campaign/plan.py) on the committed example campaigns: which runs it makes, in
what order, under which caps, and the status it writes. Pure: the runs are dicts as the index has."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from campaign_fixtures import by_accelerator, run_of

from accelbench.api import parse_resource
from accelbench.api.campaign import BenchCampaign
from accelbench.campaign.plan import measured_runs, plan_campaign
from accelbench.campaign.projection import Projection, project
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


def finished(
    manifest: dict[str, Any], phase: str = "Succeeded", dollars: float | None = 1.0
) -> dict[str, Any]:
    """The run as the index holds it once it ended (its status as the operator wrote it); dollars
    None: an unpriced run (its cost has hours, no dollars)."""
    run = copy.deepcopy(manifest)
    cost: dict[str, Any] = {"chips": 1, "hours": 0.01}
    if dollars is not None:
        cost |= {"dollars": dollars, "dollarsPerChipHour": 0.0}
    run["status"] = {
        "phase": phase,
        "accelerator": "cpu",
        "cost": cost,
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
    # Two more training cells wait for a slot; the two serving cells for the model they serve.
    waiting = sorted(status["waiting"].values())
    assert len(waiting) == 4 and all("maxConcurrent 2" in why for why in waiting[:2])
    assert all(why.startswith("waiting for its model: training run cpu-demo-t") for why in waiting[2:])
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
    trained = plan_campaign(demo, [], CATALOG, NOW).create  # the serving cells wait for their model
    assert {m["kind"] for m in trained} == {"FinetuneJob"} and len(trained) == 4
    runs = [finished(m, dollars=0.1 * i) for i, m in enumerate(trained, 1)]
    served = plan_campaign(demo, runs, CATALOG, NOW).create
    assert {m["kind"] for m in served} == {"InferenceBench"} and len(served) == 2
    runs += [finished(m, dollars=0.1 * i) for i, m in enumerate(served, 5)]
    last = plan_campaign(demo, runs, CATALOG, NOW)
    assert last.create == [] and last.status["phase"] == "Finished"
    assert last.status["totals"] == {
        "cells": 6,
        "succeeded": 6,
        "failed": 0,
        "skipped": 0,
        "running": 0,
        "waiting": 0,
        "dollars": 2.1,
        "chipHours": 0.06,
        "unpricedCells": 0,
    }
    # An unpriced run counts its chip-hours and is named in the totals, never added as $0.
    runs[0] = finished(trained[0], dollars=None)
    totals = plan_campaign(demo, runs, CATALOG, NOW).status["totals"]
    assert (totals["dollars"], totals["chipHours"], totals["unpricedCells"]) == (2.0, 0.06, 1)
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
    # The serving cells named the dropped training cell: they say so and the campaign is Stalled.
    assert len(out.invalid) == 2 and all("selects no training cell" in why for why in out.invalid.values())
    assert out.status["phase"] == "Stalled"
    dropped = [r for r in out.status["cells"] if not r.get("inMatrix", True)]
    assert len(dropped) == 2 and all(r["phase"] == "Succeeded" for r in dropped)
    edited.spec.finetune.matrix.axes["method.rank"] = [4, 8, 16]  # one value added: only its cells run
    out = plan_campaign(edited, runs, CATALOG, NOW)
    trains = [m for m in out.create if m["kind"] == "FinetuneJob"]
    assert len(trains) == 2 and all(m["spec"]["method"]["rank"] == 16 for m in trains)
    # The serving cells start now that the model they serve (rank 8, still kept) has finished.
    serves = [m for m in out.create if m["kind"] == "InferenceBench"]
    assert len(serves) == 2 and all(m["spec"]["model"]["uri"].startswith(".demo/out") for m in serves)


def test_the_budget_holds_what_it_cannot_pay_for_and_the_campaign_says_it_is_stalled() -> None:
    study = campaign("gemma4-31b-study", budget={"maxUSD": 100})
    out = plan_campaign(study, [], CATALOG, NOW)
    # Every priced training cell reserves its 12 h deadline, far past $100; Gaudi 3 has no price in
    # the catalog, so a dollar budget cannot bound it: it waits and says why, never runs as "$0".
    assert out.create == [] and out.status["phase"] == "Stalled"
    waiting = out.status["waiting"]
    gaudi = {n for n, why in waiting.items() if "no price for gaudi3" in why}
    assert len(gaudi) == 3 and all(
        "past maxUSD 100" in why for n, why in waiting.items() if "-t" in n and n not in gaudi
    )
    roomy = plan_campaign(campaign("gemma4-31b-study"), [], CATALOG, NOW)
    # maxConcurrent 4, one per accelerator: v5p and H100 training; serving waits for its model.
    assert sorted(m["spec"]["accelerator"]["type"] for m in roomy.create) == ["h100", "tpu-v5p"]
    worst = 0.0
    for run in roomy.create:
        # Trained by epochs: no projection but the run's own 12 h deadline, reserved whole and kept.
        deadline = run["spec"]["activeDeadlineSeconds"]
        assert deadline <= 43200, run["metadata"]["name"]
        worst += plan_for(parse_resource(run), CATALOG).dollars_per_hour * deadline / 3600
    assert worst <= 3000
    # With a price for Gaudi 3 (custom pricing in the template), its cells are admitted like any.
    priced = campaign("gemma4-31b-study")
    assert priced.spec.finetune is not None
    priced.spec.finetune.matrix.include = [
        {
            "accelerator": {"type": "gaudi3", "count": 1},
            "pricing": {"source": "custom", "dollarsPerChipHour": 5.0},
        }
    ]
    priced.spec.finetune.matrix.axes["accelerator"] = priced.spec.finetune.matrix.axes["accelerator"][:2]
    kinds = sorted(m["spec"]["accelerator"]["type"] for m in plan_campaign(priced, [], CATALOG, NOW).create)
    assert kinds == ["gaudi3", "h100", "tpu-v5p"]


def test_a_serving_cell_serves_what_its_training_cell_wrote_and_tco_reproduces_the_study() -> None:
    """Fine-tune on TPU v5p and 2xH100, serve the outputs on v6e-8 and 2xH100: the serving cells wait
    for their training run, then serve its output; the TCO rows are the study's ($77.63 vs
    $141.35 with one hour of serving: 1.82x)."""
    study = campaign("gemma4-31b-study", repeats=1, budget={}, maxConcurrentPerAccelerator=None)
    first = plan_campaign(study, [], CATALOG, NOW)
    train = by_accelerator(first.create, "FinetuneJob")
    assert set(train) == {"tpu-v5p", "h100", "gaudi3"} and not by_accelerator(first.create, "InferenceBench")
    serving_rows = [r for r in first.status["cells"] if r["kind"] == "InferenceBench"]
    assert all(r["phase"] == "Waiting" and r["modelFrom"] for r in serving_rows)
    assert all("waiting for its model" in first.status["waiting"][r["name"]] for r in serving_rows)

    runs = [
        run_of(train["tpu-v5p"], dollars=56.11, chips=4, price=4.2, tokensPerSecond=764.0),
        run_of(train["h100"], dollars=119.23, chips=2, price=11.06, tokensPerSecond=486.0),
        run_of(train["gaudi3"], phase="Failed", dollars=3.0, chips=1, price=1.0),
    ]
    second = plan_campaign(study, runs, CATALOG, NOW)
    serve = by_accelerator(second.create, "InferenceBench")
    assert set(serve) == {"tpu-v6e", "h100"}
    assert serve["tpu-v6e"]["spec"]["model"]["uri"] == train["tpu-v5p"]["spec"]["output"]["uri"]
    assert serve["h100"]["spec"]["model"]["uri"] == train["h100"]["spec"]["output"]["uri"]
    assert train["h100"]["spec"]["output"]["uri"].endswith("/" + train["h100"]["metadata"]["name"])

    runs += [
        run_of(serve["tpu-v6e"], dollars=2.0, chips=8, price=2.69, peakOutputTokensPerSecond=5000.0),
        run_of(serve["h100"], dollars=2.0, chips=2, price=11.06, peakOutputTokensPerSecond=3000.0),
    ]
    done = plan_campaign(study, runs, CATALOG, NOW).status
    assert done["phase"] == "Finished"
    one_hour = {r["servingAccelerator"]: r for r in done["ownership"] if r["servingHours"] == 1}
    assert (
        round(one_hour["tpu-v6e"]["dollars"], 2) == 77.63 and round(one_hour["h100"]["dollars"], 2) == 141.35
    )
    assert round(one_hour["h100"]["ratio"], 2) == 1.82 and one_hour["tpu-v6e"]["ratio"] == 1.0
    assert {r["servingHours"] for r in done["ownership"]} == {1, 24, 720}
    assert done["winners"]["totalCostOfOwnership"].startswith(train["tpu-v5p"]["metadata"]["name"])


def test_a_serving_cell_whose_model_failed_to_train_is_skipped_and_a_bad_selection_is_invalid() -> None:
    study = campaign("gemma4-31b-study", repeats=1, budget={}, maxConcurrentPerAccelerator=None)
    train = by_accelerator(plan_campaign(study, [], CATALOG, NOW).create, "FinetuneJob")
    runs = [run_of(m, phase="Failed") for m in train.values()]
    out = plan_campaign(study, runs, CATALOG, NOW)
    skipped = [r for r in out.status["cells"] if r["phase"] == "Skipped"]
    assert len(skipped) == 2 and all(r["reason"] == "ModelNotTrained" for r in skipped)
    assert out.status["phase"] == "Finished" and out.status["totals"]["skipped"] == 2
    assert "failed" in out.status["waiting"][skipped[0]["name"]]
    assert study.spec.inference is not None
    study.spec.inference.matrix.include[0]["fromFinetune"] = {"accelerator": {"type": "h200", "count": 1}}
    bad = plan_campaign(study, [], CATALOG, NOW)
    assert bad.status["phase"] == "Stalled" and "selects no training cell" in bad.status["message"]


def test_repeats_are_summarized_as_median_and_spread_and_a_baseline_sets_ratios_and_regressions() -> None:
    demo = campaign(
        "cpu-demo",
        repeats=3,
        maxConcurrent=None,
        inference=None,
        baseline={"cell": {"method.rank": 4, "training.seqLength": 64}},
    )
    made = plan_campaign(demo, [], CATALOG, NOW).create
    assert len(made) == 12
    speeds = {}
    runs = []
    for m in made:
        values = yaml.safe_load(m["metadata"]["annotations"]["accelbench.io/cell-values"])
        slow = values["method.rank"] == 8 and values["training.seqLength"] == 128
        base = 50.0 if slow else 100.0
        speed = (
            base + int(m["metadata"]["name"].rsplit("-", 1)[-1]) if m["metadata"]["name"][-2] == "-" else base
        )
        speeds.setdefault(m["metadata"]["labels"]["accelbench.io/cell"], []).append(speed)
        runs.append(run_of(m, dollars=0.01, tokensPerSecond=speed))
    status = plan_campaign(demo, runs, CATALOG, NOW).status
    assert status["phase"] == "Finished" and len(status["summary"]) == 4
    for s in status["summary"]:
        assert s["succeeded"] == 3 and s["runs"] == 3
        values = sorted(speeds[s["cell"]])
        assert s["tokensPerSecond"]["median"] == values[1] and s["tokensPerSecond"]["n"] == 3
        assert s["tokensPerSecond"]["cv"] > 0
    slow = next(s for s in status["summary"] if '"method.rank": 8, "training.seqLength": 128' in s["values"])
    assert slow["regressed"] == ["tokens_per_second"] and slow["speedRatio"] < 0.6
    assert len(status["regressions"]) == 1 and slow["name"] in status["regressions"][0]
    assert status["baseline"].startswith("cell cpu-demo-t")

    # The controller turns that into the Regressed condition beside kstatus's three.
    from accelbench.controller.campaign import campaign_conditions

    conditions = {c["type"]: c for c in campaign_conditions(status, 1, NOW)}
    assert (
        conditions["Regressed"]["status"] == "True" and conditions["Regressed"]["reason"] == "BeyondThreshold"
    )
    assert conditions["Ready"]["status"] == "True"


def test_an_earlier_campaign_is_a_baseline_cell_by_cell() -> None:
    from accelbench.api.campaign import CellSummary
    from accelbench.controller.campaign import baseline_summary

    demo = campaign("cpu-demo", maxConcurrent=None, inference=None)
    made = plan_campaign(demo, [], CATALOG, NOW).create
    earlier_status = plan_campaign(
        demo, [run_of(m, tokensPerSecond=100.0) for m in made], CATALOG, NOW
    ).status
    earlier = baseline_summary({"status": earlier_status})
    assert earlier is not None and all(isinstance(s, CellSummary) for s in earlier)
    assert baseline_summary({"status": {"summary": [{"cell": "broken"}]}}) == []  # never stops the pass

    now = campaign(
        "cpu-demo", maxConcurrent=None, inference=None, baseline={"campaign": "last-week", "threshold": 0.2}
    )
    runs = [run_of(m, tokensPerSecond=90.0 if i else 70.0) for i, m in enumerate(made)]
    status = plan_campaign(now, runs, CATALOG, NOW, earlier).status
    ratios = sorted(s["speedRatio"] for s in status["summary"])
    assert ratios == [0.7, 0.9, 0.9, 0.9] and len(status["regressions"]) == 1
    missing = plan_campaign(now, runs, CATALOG, NOW, None).status
    assert "not found" in missing["baseline"] and missing["regressions"] == []


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
    def __init__(self, taken: dict[str, dict[str, Any]] | None = None, invalid: str | None = None) -> None:
        self.created: list[dict[str, Any]] = []
        self.status_writes: list[dict[str, Any]] = []
        self.taken = taken or {}  # name -> the object already there
        self.invalid = invalid  # every create refused with 422 and this message

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        from accelbench.kubeapi import ApiError

        if obj["metadata"]["name"] in self.taken:
            raise ApiError(status=409, reason="AlreadyExists")
        if self.invalid is not None:
            body = json.dumps({"kind": "Status", "reason": "Invalid", "message": self.invalid, "code": 422})
            raise ApiError(status=422, reason="Unprocessable Entity", body=body)
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
        "set training.maxSteps or activeDeadlineSeconds" in why or "no price for gaudi3" in why
        for why in out.status["waiting"].values()
    )
    study.spec.budget.max_usd = None
    assert len(plan_campaign(study, [], CATALOG, NOW).create) == 3


def test_the_campaign_label_reaches_every_child_and_pod_template_of_its_runs() -> None:
    from accelbench.render import render

    for manifest in plan_campaign(campaign("cpu-demo", maxConcurrent=None), [], CATALOG, NOW).create:
        resource = parse_resource(manifest)
        objects = render(resource, plan_for(resource, CATALOG), CATALOG).objects
        for obj in objects:
            labels = obj["metadata"]["labels"]
            assert labels["accelbench.io/campaign"] == "cpu-demo", obj["kind"]
            assert labels["accelbench.io/cell"] == manifest["metadata"]["labels"]["accelbench.io/cell"]
            template = (obj.get("spec") or {}).get("template")
            if obj["kind"] == "Job":
                assert template["metadata"]["labels"]["accelbench.io/campaign"] == "cpu-demo"


def test_a_settled_campaign_writes_its_results_artifact_once_and_says_so(tmp_path: Path) -> None:
    from accelbench.campaign.artifact import read_artifact

    demo = campaign("cpu-demo", maxConcurrent=None, artifactUri=str(tmp_path / "results"))
    body = demo.model_dump(by_alias=True, exclude_none=True, mode="json")
    made = plan_campaign(demo, [], CATALOG, NOW).create
    train = [m for m in made if m["kind"] == "FinetuneJob"]
    runs = [run_of(m, tokensPerSecond=100.0) for m in train]
    serving = plan_campaign(demo, runs, CATALOG, NOW).create
    runs += [run_of(m, peakOutputTokensPerSecond=50.0) for m in serving]
    kube = CampaignKube()
    _pass(kube, body, runs)
    (status,) = kube.status_writes
    assert status["phase"] == "Finished" and status["artifact"] == str(tmp_path / "results" / "cpu-demo.json")
    written = {c["type"]: c for c in status["conditions"]}["ArtifactWritten"]
    assert written["status"] == "True" and written["reason"] == "Written"
    document = read_artifact(status["artifact"])
    assert document["kind"] == "BenchCampaignResults" and len(document["runs"]) == len(runs)
    assert document["status"]["summary"] and document["metadata"]["name"] == "cpu-demo"
    # Written once: the next pass over the same settled campaign leaves it alone.
    settled = {**body, "status": status}
    (tmp_path / "results" / "cpu-demo.json").unlink()
    _pass(CampaignKube(), settled, runs)
    assert not (tmp_path / "results" / "cpu-demo.json").exists()
    # A store that cannot be written: the campaign stays Finished, says why, and tries again later.
    (tmp_path / "blocked").write_text("a file where a directory should be")
    bad = {**body, "spec": {**body["spec"], "artifactUri": str(tmp_path / "blocked" / "results")}}
    failing = CampaignKube()
    outcome = _pass(failing, bad, runs)
    (status,) = failing.status_writes
    written = {c["type"]: c for c in status["conditions"]}["ArtifactWritten"]
    assert status["phase"] == "Finished" and "artifact" not in status
    assert (
        written["status"] == "False"
        and written["reason"] == "WriteFailed"
        and "blocked" in written["message"]
    )
    assert outcome.requeue_after == 60.0


def test_a_measured_cell_projects_its_siblings_scaled_up_by_their_work_never_down() -> None:
    """What a finished cell took is the projection for its siblings on the same accelerator: a cell
    with twice the tokens projects twice the time, one with half keeps the measured time (a small
    run's time is mostly start-up), and the budget's deadline leaves at least a minute of slack."""
    demo = campaign("cpu-demo", maxConcurrent=None)
    cells = {
        m["spec"]["training"]["seqLength"] * 100 + m["spec"]["method"]["rank"]: m
        for m in plan_campaign(demo, [], CATALOG, NOW).create
    }
    short, long = cells[64 * 100 + 8], cells[128 * 100 + 8]
    ran = finished(short)  # 0.01 h: 36 s
    measured = measured_runs([ran], CATALOG)
    assert list(measured) == [("FinetuneJob", "cpu")]

    def projection(manifest: dict[str, Any]) -> Projection:
        resource = parse_resource(manifest)
        out = project(resource, plan_for(resource, CATALOG), measured)
        assert out is not None and out.basis.startswith("measured: 1 finished FinetuneJob(s) on cpu")
        return out

    assert projection(long).hours == pytest.approx(0.02)  # twice the tokens
    assert projection(short).hours == pytest.approx(0.01)
    smaller = copy.deepcopy(short)
    smaller["spec"]["training"]["maxSteps"] //= 2
    slow = projection(smaller)
    assert slow.hours == pytest.approx(0.01)  # half the work: not less than measured
    assert slow.hours * slow.headroom == pytest.approx(60 / 3600)  # a minute past 36 s, not 18 s
    # A failed run measures nothing: the prior (or the deadline) stays.
    assert measured_runs([finished(short, phase="Failed")], CATALOG) == {}


def test_a_run_is_made_of_what_the_template_says_so_a_task_refusing_causal_lm_fields_is_admitted() -> None:
    """Defaults are not written into a cell's run: the apiserver counts a written default as set,
    and refuses spec.training, spec.method and spec.parallelism on task superResolution."""
    from accelbench.api.finetune import CAUSAL_LM_ONLY

    sr3 = campaign("sr3-scaling", maxConcurrent=8)
    out = plan_campaign(sr3, [], CATALOG, NOW)
    assert len(out.create) == 4, out.status["message"]  # the H100 cells; Gaudi 3 has no price for maxUSD
    assert all("no price for gaudi3" in why for why in out.status["waiting"].values())
    written = yaml.safe_load((ROOT / "examples/campaigns/sr3-scaling.yaml").read_text())
    for run in out.create:
        assert set(run["spec"]) == set(written["spec"]["finetune"]["template"]), run["spec"]
        assert not set(CAUSAL_LM_ONLY) & set(run["spec"])
        assert run["spec"]["superResolution"] == written["spec"]["finetune"]["template"]["superResolution"]


def test_a_run_the_apiserver_refuses_shows_its_cell_invalid_and_stalls_the_campaign_with_why() -> None:
    body = campaign("cpu-demo").model_dump(by_alias=True, exclude_none=True, mode="json")
    refused = CampaignKube(invalid="spec: Invalid value: spec.training applies only to task causalLM")
    outcome = _pass(refused, body)
    assert refused.created == [] and not outcome.retry and outcome.requeue_after == 60.0
    (status,) = refused.status_writes
    assert status["phase"] == "Stalled" and "rejected by the apiserver" in status["message"]
    assert "spec.training applies only to task causalLM" in status["message"]
    rejected = [c for c in status["cells"] if c.get("reason") == "RejectedByApiserver"]
    assert len(rejected) == 2 and all(
        c["phase"] == "Invalid" and c["name"] in status["message"] for c in rejected
    )
    waiting = sum(c["phase"] == "Waiting" for c in status["cells"])
    assert status["totals"]["waiting"] == waiting
    assert {c["type"]: c["status"] for c in status["conditions"]}["Stalled"] == "True"
