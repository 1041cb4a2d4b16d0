"""`accelbench compare`: rows, $ per 1M tokens and ratios from statuses (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from accelbench.views.compare import as_records, compare, format_value


def _ft(name: str, tps: float | None, chips: int = 4, rate: float = 4.2, phase: str = "Succeeded") -> dict:
    status: dict[str, Any] = {"phase": phase, "accelerator": f"acc-{name}"}
    status["cost"] = {"chips": chips, "dollarsPerChipHour": rate, "dollars": 1.0, "hours": 1.0}
    if tps is not None:
        status["results"] = {"tokensPerSecond": tps, "tokensPerSecondPerChip": tps / chips, "mfu": 0.4}
    return {"metadata": {"name": name, "namespace": "ns"}, "status": status}


def test_finetune_cost_per_million_tokens_and_ratios() -> None:
    rows = compare([_ft("tpu", 763.0, 4, 4.2), _ft("gpu", 486.0, 2, 11.06), _ft("queued", None)], [])
    ft = rows["FinetuneJob"]
    assert [r.name for r in ft] == ["tpu", "gpu", "queued"]  # fastest first, no results last
    tpu, gpu, queued = ft
    # $16.80/h / (763 tok/s × 3600) × 1e6 = $6.116 per 1M tokens; $22.12/h at 486 tok/s = $12.64
    assert tpu.figures["dollarsPerMillionTokens"] == pytest.approx(16.8 / (763 * 3600) * 1e6)
    assert gpu.figures["dollarsPerMillionTokens"] == pytest.approx(22.12 / (486 * 3600) * 1e6)
    assert tpu.figures["speedRatio"] == 1.0 and tpu.figures["costRatio"] == 1.0
    assert gpu.figures["speedRatio"] == pytest.approx(486 / 763)
    assert gpu.figures["costRatio"] == pytest.approx((22.12 / 486) / (16.8 / 763))
    assert queued.figures["dollarsPerMillionTokens"] is None and queued.figures["speedRatio"] is None


def test_a_finetune_row_says_how_the_work_ran_and_an_unpriced_run_has_no_dollars() -> None:
    """Same chips, different work: the strategy over several chips and the precision are shown; a
    run with no known price gets no $/1M tokens and no cost ratio (never a $0 winner)."""
    zero3 = _ft("zero3", 400.0, 2)
    zero3["status"]["plan"] = {"chips": 2, "strategy": "zero3"}
    zero3["spec"] = {"training": {"precision": "fp16"}}
    one_chip = _ft("one", 300.0, 1)
    one_chip["status"]["plan"] = {"chips": 1, "strategy": "ddp"}
    unpriced = _ft("gaudi3", 500.0, 8)
    del unpriced["status"]["cost"]["dollarsPerChipHour"], unpriced["status"]["cost"]["dollars"]
    rows = {r.name: r for r in compare([zero3, one_chip, unpriced], [])["FinetuneJob"]}
    assert (rows["zero3"].setup, rows["one"].setup) == ("zero3 fp16", "bf16")
    assert rows["gaudi3"].figures["dollarsPerMillionTokens"] is None
    assert rows["gaudi3"].figures["costRatio"] is None and rows["gaudi3"].figures["speedRatio"] == 1.0
    assert as_records({"FinetuneJob": [rows["zero3"]]})[0]["setup"] == "zero3 fp16"


def test_bench_rows_take_the_status_figures_and_garbage_is_no_number() -> None:
    good = {
        "metadata": {"name": "v6e"},
        "status": {"phase": "Succeeded", "results": {"capacityConcurrency": 16,
                   "peakOutputTokensPerSecond": 1206.0, "dollarsPerMillionTokensAtCapacity": 2.5}},
    }  # fmt: skip
    odd = {"metadata": {"name": "odd"}, "status": {"results": {"peakOutputTokensPerSecond": "fast"}}}
    rows = compare([], [odd, good])["InferenceBench"]
    assert [r.name for r in rows] == ["v6e", "odd"]
    assert rows[0].figures["costRatio"] == 1.0 and rows[1].figures["peakOutputTokensPerSecond"] is None
    assert rows[1].phase == "Pending"
    records = as_records({"InferenceBench": rows})
    assert records[0]["kind"] == "InferenceBench" and records[0]["capacityConcurrency"] == 16


def test_format_value() -> None:
    assert format_value("mfu", 0.449) == "44.9 %"
    assert format_value("tokensPerSecond", 70127.4) == "70,127"
    assert format_value("dollarsPerMillionTokens", 6.1162) == "6.116"
    assert format_value("speedRatio", 0.637) == "0.64"
    assert format_value("finalLoss", None) == "–"
