"""The MFU convention end to end, as the report gives it: the LoRA adapters' own FLOPs are counted
(4N + 6·N_lora + attention), and tokens are trained tokens only, never padding.

test_flops.py checks the formula on hand-made shapes; this checks that a real worker run reports
exactly that formula on the tokens it trained, so the MFU of a LoRA run compares with published marks
that count the same way (benchmarks/finetune/README.md, "LoRA FLOPs convention").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelbench.workers.data import data_config_from_spec, prepare_data
from accelbench.workers.finetune.__main__ import RunOptions, run_job
from accelbench.workers.flops import flops_per_token, shape_from_hf_config
from accelbench.workers.jobenv import parse_job_payload

ALL_PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_lora_report_counts_adapter_flops_and_no_padding(manifest_for, tiny_llama: Path) -> None:
    manifest = manifest_for(
        "llama",
        method={"type": "lora", "rank": 8, "targetModules": ALL_PROJ},
        training={"maxSteps": 2, "packing": False},  # one example per row: every row ends in padding
    )
    manifest["spec"]["dataset"]["heldOutFraction"] = 0
    job_input = parse_job_payload(manifest)
    report, code = run_job(job_input, RunOptions(serve_metrics=False, log=lambda _: None, env={}))
    assert code == 0, report.error
    ft = report.finetune

    spec = job_input.job.spec
    data = prepare_data(
        tiny_llama, Path(spec.dataset.uri), data_config_from_spec(spec, job_input.plan, None), "llama"
    )
    rows = [data.step_rows(s) for s in range(1, data.total_steps + 1)]
    trained = sum(int(data.train.loss_mask[r].sum()) for r in rows)
    slots = sum(len(r) for r in rows) * spec.training.seq_length
    padding = sum(int((data.train.segment_ids[r] == 0).sum()) for r in rows)
    assert padding > 0 and trained <= slots - padding  # rows end in padding, which carries no loss
    assert ft.trained_tokens == trained  # sum of loss_mask: padding (and the unscored) never counted

    shape = shape_from_hf_config(json.loads((tiny_llama / "config.json").read_text()), "llama")
    expected = flops_per_token(shape, spec.training.seq_length, 8, ALL_PROJ)
    assert expected.lora_parameters > 0
    assert ft.flops_per_token == pytest.approx(
        4 * expected.base_parameters + 6 * expected.lora_parameters + expected.attention
    )
    assert "6·N_lora" in ft.mfu_formula
    peak = ft.peak_tflops_per_chip * 1e12
    assert ft.mfu == pytest.approx(ft.tokens_per_second * ft.flops_per_token / peak)
