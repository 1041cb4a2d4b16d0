"""`accelbench report` for a campaign (views/campaign_page.py) and `accelbench compare --artifact`.

The document is built as the operator builds it: the committed Gemma 4 31B study planned by
campaign/plan.py, its runs finished with the study's figures (training $56.11 on TPU v5p and $119.23
on 2xH100, serving at $21.52/h on v6e-8 and $22.12/h on 2xH100), then campaign/artifact.py."""

from __future__ import annotations

import html
import json
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from campaign_fixtures import by_accelerator, run_of

from accelbench.api.campaign import BenchCampaign
from accelbench.campaign.artifact import artifact_document
from accelbench.campaign.plan import plan_campaign
from accelbench.catalog import load_catalog
from accelbench.cli import main
from accelbench.views.campaign_page import (
    capacity_by_input_length,
    render_campaign_report,
    tco_crossings,
    tco_lines,
)
from accelbench.views.compare import compare

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
CATALOG = load_catalog()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
LEVELS = (1, 2, 4, 8, 16, 32, 64)
# The largest concurrency meeting the SLO per input length, as the synthetic sweeps are made.
CAPACITY = {
    "tpu-v6e": {512: 64, 1024: 32, 2048: 32, 4096: 16, 8192: 8, 16384: 4},
    "h100": {512: 32, 1024: 16, 2048: 16, 4096: 8, 8192: 4, 16384: 2},
}


def study(**spec: Any) -> BenchCampaign:
    body = yaml.safe_load((ROOT / "examples" / "campaigns" / "gemma4-31b-study.yaml").read_text())
    body["metadata"] |= {"namespace": "team-a", "uid": "c-1", "generation": 1}
    body["spec"] |= {"repeats": 1, "budget": {}, "maxConcurrentPerAccelerator": None} | spec
    return BenchCampaign.model_validate(body)


def sweep(accelerator: str) -> list[dict[str, Any]]:
    """status.results.cells of a serving run: attainment 0.97 up to the capacity, 0.6 past it."""
    cells = []
    for length in LENGTHS:
        for level in LEVELS:
            ok = level <= CAPACITY[accelerator][length]
            cells.append(
                {
                    "inputLength": length,
                    "concurrency": level,
                    "ttftP50Ms": 100.0 * level,
                    "ttftP99Ms": 150.0 * level,
                    "tpotP99Ms": 20.0 + level,
                    "outputTokensPerSecond": 40.0 * level * (1 if ok else 0.8),
                    "attainment": 0.97 if ok else 0.6,
                    "errors": 0,
                }
            )
    return cells


def finished_study(cluster: str | None = "gke") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the BenchCampaignResults document, its runs): the study with Gaudi 3's training failed."""
    campaign = study()
    train = by_accelerator(plan_campaign(campaign, [], CATALOG, NOW).create, "FinetuneJob")
    runs = [
        run_of(train["tpu-v5p"], dollars=56.11, chips=4, price=4.2, tokensPerSecond=764.0, mfu=0.41),
        run_of(train["h100"], dollars=119.23, chips=2, price=11.06, tokensPerSecond=486.0, mfu=0.38),
        run_of(train["gaudi3"], phase="Failed", dollars=3.0, chips=1, price=1.0),
    ]
    serve = by_accelerator(plan_campaign(campaign, runs, CATALOG, NOW).create, "InferenceBench")
    for accelerator, chips, price, peak, per_million in (
        ("tpu-v6e", 8, 2.69, 5000.0, 1.87),
        ("h100", 2, 11.06, 3000.0, 3.41),
    ):
        runs.append(
            run_of(
                serve[accelerator],
                dollars=2.0,
                chips=chips,
                price=price,
                cells=sweep(accelerator),
                capacityConcurrency=CAPACITY[accelerator][16384],
                capacityInputLength=16384,
                peakOutputTokensPerSecond=peak,
                dollarsPerMillionTokensAtCapacity=per_million,
            )
        )
    status = plan_campaign(campaign, runs, CATALOG, NOW).status
    assert status["phase"] == "Finished"
    body = campaign.model_dump(by_alias=True, exclude_none=True, mode="json")
    return artifact_document({**body, "status": status}, runs, "2026-12-03T12:00:00Z", cluster), runs


def is_png(path: Path) -> bool:
    data = path.read_bytes()
    if not data.startswith(PNG_MAGIC) or len(data) < 33 or data[12:16] != b"IHDR":
        return False
    width, height = struct.unpack(">II", data[16:24])
    return width > 0 and height > 0


def test_the_page_holds_every_row_the_tco_figures_and_four_real_pngs(tmp_path: Path) -> None:
    document, _ = finished_study()
    paths = render_campaign_report(document, tmp_path / "page")
    assert set(paths) == {"html", "speed", "cost", "tco", "capacity"}
    for key in ("speed", "cost", "tco", "capacity"):
        assert paths[key].stat().st_size > 0 and is_png(paths[key]), key
        assert f"src='{paths[key].name}'" in paths["html"].read_text()
    page = paths["html"].read_text()
    status = document["status"]
    assert "gemma4-31b-study" in page and "<b>cluster</b>: gke" in page and "Finished" in page
    for row in status["cells"]:  # every run, the failed Gaudi 3 one with its phase too
        assert f"<td>{row['name']}</td>" in page
    assert "<td>Failed</td>" in page
    for row in status["summary"]:
        assert f"<td>{row['cell']}</td>" in page
    # Total cost of ownership at 1 h: the study's $77.63 (v5p + v6e-8) and $141.35 (2xH100 + 2xH100),
    # from $56.11 / $119.23 of training and $21.52/h / $22.12/h of serving.
    for figure in ("77.63", "141.35", "56.11", "119.23", "21.52", "22.12", "1.82"):
        assert f"<td>{figure}</td>" in page, figure
    assert status["winners"] and all(cell in page for cell in status["winners"].values())
    assert all(name in page for name in status["paretoFront"])
    # The lines never cross in 0–720 h: v5p + v6e-8 is cheaper throughout, and the page says so.
    assert "do not cross within 0–720 h" in page
    assert "No capacity plot" not in page and "no TCO plot" not in page


def test_tco_lines_are_the_ownership_rows_and_a_crossing_is_found() -> None:
    document, _ = finished_study()
    lines = {line.label: line for line in tco_lines(document["status"]["ownership"])}
    assert len(lines) == 2
    tpu = next(line for label, line in lines.items() if "tpu-v5p" in label)
    assert tpu.training_dollars == 56.11 and round(tpu.serving_dollars_per_hour, 2) == 21.52
    assert {round(d, 2) for h, d in tpu.points if h == 1} == {77.63}
    assert round(tpu.at(720), 2) == round(56.11 + 21.52 * 720, 2)
    assert tco_crossings(list(lines.values()), 720) == []  # cheaper to train and to serve
    # A line cheaper to train but dearer to serve crosses: at (119.23 - 56.11) / (22.12 - 21.0) h.
    row = document["status"]["ownership"][0]
    cheap = {**row, "training": "x", "serving": "y", "trainingDollars": 119.23, "servingDollarsPerHour": 21.0}
    dear = {**cheap, "training": "a", "serving": "b", "trainingDollars": 56.11}
    dear["servingDollarsPerHour"] = 22.12
    (crossing,) = tco_crossings(tco_lines([cheap, dear]), 720)
    assert crossing.hours == pytest.approx((119.23 - 56.11) / (22.12 - 21.0))


def test_capacity_per_input_length_follows_the_runs_slo() -> None:
    slo = {"ttftMs": 2000, "tpotMs": 100, "attainment": 0.9}
    found = capacity_by_input_length(sweep("h100"), slo)
    assert {lc.input_length: lc.capacity for lc in found} == CAPACITY["h100"]
    assert all(lc.levels == LEVELS for lc in found)
    widest = next(lc for lc in capacity_by_input_length(sweep("tpu-v6e"), slo) if lc.input_length == 512)
    assert widest.capacity == 64 and widest.first_failing is None  # every level measured met it
    # A stricter attainment than any level reached: none meets it, nothing is made up.
    strict = capacity_by_input_length(sweep("h100"), {**slo, "attainment": 0.99})
    assert strict and all(lc.capacity is None for lc in strict)
    assert capacity_by_input_length([{"inputLength": 512, "concurrency": 1}], slo) == []  # no attainment


def test_rows_that_never_ran_are_listed_with_their_reason_and_missing_plots_are_explained(
    tmp_path: Path,
) -> None:
    campaign = study()
    first = plan_campaign(campaign, [], CATALOG, NOW)
    train = by_accelerator(first.create, "FinetuneJob")
    runs = [run_of(m, phase="Failed", dollars=3.0) for m in train.values()]  # every training failed
    status = plan_campaign(campaign, runs, CATALOG, NOW).status
    body = campaign.model_dump(by_alias=True, exclude_none=True, mode="json")
    document = artifact_document({**body, "status": status}, runs, "2026-12-03T12:00:00Z", None)
    paths = render_campaign_report(document, tmp_path)
    page = paths["html"].read_text()
    skipped = [r for r in status["cells"] if r["phase"] == "Skipped"]
    assert len(skipped) == 2
    for row in status["cells"]:
        assert f"<td>{row['name']}</td>" in page
    assert "<td>Skipped</td>" in page and "<td>ModelNotTrained</td>" in page
    assert all(html.escape(status["waiting"][r["name"]]) in page for r in skipped)
    # Nothing succeeded: no speed, cost, TCO or capacity figure, and no empty PNG either.
    assert set(paths) == {"html"} and list(tmp_path.glob("*.png")) == []
    assert "no TCO plot" in page and "No capacity plot" in page and "no training tokens/s plot" in page

    # A campaign still waiting on its models: its serving rows say why.
    waiting = artifact_document({**body, "status": first.status}, [], "2026-12-03T12:00:00Z", None)
    page = render_campaign_report(waiting, tmp_path / "waiting")["html"].read_text()
    serving = [r for r in first.status["cells"] if r["kind"] == "InferenceBench"]
    assert serving and all(r["phase"] == "Waiting" for r in serving)
    assert all(f"<td>{r['name']}</td>" in page for r in serving) and "waiting for its model" in page


def test_text_from_the_document_is_escaped(tmp_path: Path) -> None:
    document, _ = finished_study(cluster="<script>alert(1)</script>")
    document["status"]["message"] = "a & b <i>"
    page = render_campaign_report(document, tmp_path)["html"].read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "a &amp; b &lt;i&gt;" in page


def test_the_cli_reports_an_artifact_file_and_refuses_what_is_neither(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document, _ = finished_study()
    artifact = tmp_path / "gemma4-31b-study.json"
    artifact.write_text(json.dumps(document))
    out = tmp_path / "report"
    assert main(["report", str(artifact), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"report: {out / 'index.html'}" in printed
    assert "141.35" in (out / "index.html").read_text() and is_png(out / "tco.png")
    # file:// too, and the default directory is named for the campaign.
    assert main(["report", f"file://{artifact}", "--out", str(tmp_path / "again")]) == 0
    capsys.readouterr()

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"kind": "Something", "items": []}))
    assert main(["report", str(other), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "neither a BenchCampaignResults document" in err
    assert main(["report", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["report", str(artifact), "--campaign", "x"]) == 2
    assert "one of FILE" in capsys.readouterr().err


def test_the_cli_reports_a_campaign_read_from_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import accelbench.cli as cli

    document, runs = finished_study()
    body = {
        "apiVersion": "accelbench.io/v1alpha1",
        "kind": "BenchCampaign",
        "metadata": {k: document["metadata"][k] for k in ("name", "namespace", "uid", "generation")},
        "spec": document["spec"],
        "status": document["status"],
    }
    asked: list[tuple[str, ...]] = []

    class FakeKube:
        def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
            asked.append(("get", kind, namespace, name))
            return body if (namespace, name) == ("team-a", "gemma4-31b-study") else None

        def list(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
            asked.append(("list", kind, namespace, selector))
            # A list's items carry no kind: the CLI adds it.
            return [{k: v for k, v in r.items() if k != "kind"} for r in runs if r["kind"] == kind]

    monkeypatch.setattr(cli, "_kube_for", lambda args: FakeKube())
    monkeypatch.setattr(cli, "_context_name", lambda args: "gke-prod")
    out = tmp_path / "page"
    assert main(["report", "--campaign", "gemma4-31b-study", "-n", "team-a", "--out", str(out)]) == 0
    assert ("list", "InferenceBench", "team-a", "accelbench.io/campaign=gemma4-31b-study") in asked
    page = (out / "index.html").read_text()
    assert "<b>cluster</b>: gke-prod" in page and "77.63" in page and is_png(out / "capacity.png")
    capsys.readouterr()
    assert main(["report", "--campaign", "nope", "-n", "team-a"]) == 2
    assert "no BenchCampaign nope in namespace team-a" in capsys.readouterr().err


def test_compare_merges_two_clusters_artifacts_into_one_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gke, _ = finished_study(cluster="gke")
    other, _ = finished_study(cluster=None)  # no cluster recorded: the file's name stands for it
    for run in other["runs"]:  # the other cloud's runs were slower, with the same names
        results = run["status"].get("results") or {}
        if "tokensPerSecond" in results:
            results["tokensPerSecond"] /= 2
    (tmp_path / "gke.json").write_text(json.dumps(gke))
    (tmp_path / "other.json").write_text(json.dumps(other))

    rows = compare([], [], [("gke", gke), ("other", other)])
    ft = rows["FinetuneJob"]
    assert len(ft) == 6 and len({(r.cluster, r.name) for r in ft}) == 6 and len({r.name for r in ft}) == 3
    assert (ft[0].cluster, ft[0].accelerator, ft[0].figures["speedRatio"]) == ("gke", "tpu-v5p", 1.0)
    slow = next(r for r in ft if r.cluster == "other" and r.accelerator == "tpu-v5p")
    assert slow.figures["speedRatio"] == pytest.approx(0.5)  # ratios across both clusters

    argv = ["compare", "--kubeconfig", str(tmp_path / "no-kubeconfig"), "-o", "json"]
    argv += ["--artifact", str(tmp_path / "gke.json"), "--artifact", f"file://{tmp_path / 'other.json'}"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    records = json.loads(captured.out)
    assert {r["cluster"] for r in records} == {"gke", "other"} and len(records) == 10
    assert "only the artifacts' runs" in captured.err  # no cluster to read here: said, not fatal
    assert main([*argv[:5], "--artifact", str(tmp_path / "missing.json")]) == 2
    assert "artifact" in capsys.readouterr().err
    # The table, one per kind, with a cluster column.
    assert main([a for a in argv if a not in ("-o", "json")]) == 0
    table = capsys.readouterr().out
    assert "cluster" in table and "other" in table and "gke" in table


def test_repeats_give_the_speed_bar_an_error_of_cv_times_the_median() -> None:
    from accelbench.views.campaign_page import spread_bars

    repeated = {"median": 500.0, "cv": 0.1, "n": 3}
    summary = [
        {"kind": "FinetuneJob", "name": "a", "accelerator": "h100", "tokensPerSecond": repeated},
        {
            "kind": "FinetuneJob",
            "name": "b",
            "accelerator": "h200",
            "tokensPerSecond": {"median": 700.0, "n": 1},
        },
        {"kind": "FinetuneJob", "name": "c", "accelerator": "gaudi3"},  # no figure: no bar
        {"kind": "InferenceBench", "name": "d", "peakOutputTokensPerSecond": {"median": 9.0, "n": 1}},
    ]
    bars = spread_bars(summary, "FinetuneJob", "tokensPerSecond")
    assert [(b.value, b.error) for b in bars] == [(500.0, pytest.approx(50.0)), (700.0, None)]
    assert bars[0].label == "h100\na"
