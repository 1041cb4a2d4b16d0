"""FinetuneJob tasks superResolution and quantize (pure): the spec's rules, the planner's refusals and
memory, the report's ingestion, the metrics, `accelbench compare` and campaign summaries."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from accelbench.api.campaign import CellRow
from accelbench.api.finetune import FORMATS, FinetuneJobSpec, budget_floor
from accelbench.campaign.results import conclude
from accelbench.catalog import load_catalog, model_shape
from accelbench.cli.crdgen import generate_crds
from accelbench.controller.ingest import ingest
from accelbench.controller.metrics import result_values
from accelbench.plan import PlanError
from accelbench.plan.finetune import plan_finetune
from accelbench.plan.memory import super_resolution_memory
from accelbench.plan.tasks import quantized_matrices
from accelbench.views.compare import QUANTIZE, SUPER_RESOLUTION, compare, format_value

SR = {"task": "superResolution", "dataset": {"uri": "gs://bucket/images"}, "accelerator": {"type": "h100"}}
QUANT = {
    "task": "quantize",
    "model": {"uri": "gs://bucket/tinyllama", "family": "llama", "size": "1b"},
    "dataset": {"uri": "gs://bucket/chat.jsonl"},
    "accelerator": {"type": "h200"},
    "output": {"uri": "gs://bucket/out"},
}


DROP = object()  # a change that removes the field


def spec(base: dict[str, Any], **changes: Any) -> FinetuneJobSpec:
    merged = {**base, **changes}
    return FinetuneJobSpec.model_validate({k: v for k, v in merged.items() if v is not DROP})


def refusal(base: dict[str, Any], **changes: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        spec(base, **changes)
    return str(caught.value)


@pytest.mark.parametrize(
    "base,changes,message",
    [
        (SR, {"model": {"uri": "/m", "family": "llama"}}, "leave spec.model out"),
        (SR, {"method": {"type": "full"}}, "spec.method applies only to task causalLM"),
        (SR, {"training": {"seqLength": 64}}, "spec.training applies only to task causalLM"),
        (SR, {"framework": "jax"}, "run on the PyTorch worker only"),
        (SR, {"quantize": {}}, "spec.quantize applies only to task quantize"),
        (SR, {"dataset": {"uri": "/d", "format": "chat"}}, "dataset.format imageFolder is for task"),
        (SR, {"superResolution": {"imageSize": 60, "channels": [8, 16, 32]}}, "imageSize must be divisible"),
        (SR, {"superResolution": {"attentionLevels": 5}}, "attentionLevels exceeds the levels"),
        (SR, {"superResolution": {"steps": 2, "warmupSteps": 2}}, "steps must exceed warmupSteps"),
        (QUANT, {"output": DROP}, "task quantize needs spec.output"),
        (QUANT, {"superResolution": {}}, "applies only to task superResolution"),
        (QUANT, {"passAtK": {"dataset": "/p", "checker": {"command": ["true"]}}}, "spec.passAtK applies"),
        ({**QUANT, "task": "causalLM"}, {"dataset": {"uri": "/d", "format": "imageFolder"}}, "imageFolder"),
        (QUANT, {"model": DROP}, "spec.model is required"),
    ],
)
def test_a_spec_that_mixes_tasks_is_refused_naming_the_field(
    base: dict[str, Any], changes: dict[str, Any], message: str
) -> None:
    assert message in refusal(base, **changes)


def test_every_spec_rule_is_also_a_cel_rule_the_apiserver_checks() -> None:
    crd = generate_crds(load_catalog())["accelbench.io_finetunejobs.yaml"]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    messages = {rule["message"] for rule in schema["x-kubernetes-validations"]}
    for expected in (
        "spec.method applies only to task causalLM",
        "spec.superResolution applies only to task superResolution",
        "task superResolution trains its UNet from scratch: leave spec.model out",
        "task quantize needs spec.output for the export",
    ):
        assert expected in messages
    block = schema["properties"]["superResolution"]["x-kubernetes-validations"]
    assert any("[1, 2, 4, 8, 16, 32]" in rule["rule"] for rule in block)


def test_defaults_written_out_by_a_payload_read_back_as_the_same_spec() -> None:
    parsed = spec(SR)
    again = FinetuneJobSpec.model_validate(parsed.model_dump(by_alias=True))
    assert again == parsed and again.sr.image_size == 64 and again.super_resolution is None


def test_the_budget_floor_counts_scales_and_zero_points() -> None:
    layers = [(4096 * 1024, 4096), (64 * 64, 64)]  # the second has no whole group of 128
    floor = budget_floor(["int4-g128", "int8"], layers)
    int8_small = FORMATS["int8"].effective_bits(64)
    assert floor == pytest.approx((4.25 * 4096 * 1024 + int8_small * 4096) / (4096 * 1024 + 4096))
    assert budget_floor(["int4-g128"], layers) is None


def test_a_quantize_budget_covers_the_embeddings_and_head_unless_they_are_tied() -> None:
    untied = model_shape("llama", "8b")  # Llama 3.1 8B: its own output head
    tied = model_shape("llama", "1b")  # Llama 3.2 1B: the head is the embedding table
    assert not untied.tied_embeddings and tied.tied_embeddings
    decoder = quantized_matrices(untied.model_copy(update={"tied_embeddings": True}))
    both = quantized_matrices(untied)
    assert both[: len(decoder)] == decoder
    assert both[len(decoder) :] == [(untied.vocab * untied.hidden, untied.hidden)] * 2
    assert len(quantized_matrices(tied)) == 7 * tied.layers


def test_super_resolution_plans_the_fewest_chips_that_split_the_batch_and_fit() -> None:
    catalog = load_catalog()
    block = {"imageSize": 128, "channels": [64, 128, 256, 512], "precision": "bf16"}
    one = plan_finetune(spec(SR, superResolution={**block, "globalBatchSize": 64}), catalog)
    assert (one.chips, one.strategy, one.micro_batch_size) == (1, "ddp", 64)
    # Measured on one H100 (benchmarks/diffusion_sr/results/h100): 23.86 GB peak at batch 64.
    assert one.memory.total - one.memory.overhead == pytest.approx(23.86e9 - 0.75e9, rel=0.05)
    big = plan_finetune(spec(SR, superResolution={**block, "globalBatchSize": 512}), catalog)
    assert big.chips > 1 and 512 % big.chips == 0 and big.micro_batch_size == 512 // big.chips
    with pytest.raises(PlanError, match="does not split evenly over 4 chips"):
        plan_finetune(
            spec(
                SR, superResolution={**block, "globalBatchSize": 6}, accelerator={"type": "h100", "count": 4}
            ),
            catalog,
        )
    with pytest.raises(PlanError, match=r"GB per chip with 4096 images each on 1"):
        plan_finetune(
            spec(
                SR,
                superResolution={**block, "globalBatchSize": 4096},
                accelerator={"type": "h100", "count": 1},
            ),
            catalog,
        )
    with pytest.raises(PlanError, match="pools run JAX"):
        plan_finetune(spec(SR, accelerator={"type": "tpu-v5p"}), catalog)


def test_fp32_super_resolution_needs_more_memory_than_bf16() -> None:
    shape = {"size": 128, "channels": [64, 128, 256, 512], "layers_per_block": 2, "attention_levels": 1}
    bf16 = super_resolution_memory(**shape, images_per_chip=64, precision="bf16", overhead_gb=0)
    fp32 = super_resolution_memory(**shape, images_per_chip=64, precision="fp32", overhead_gb=0)
    assert bf16.total < fp32.total
    assert fp32.total == pytest.approx(27.24e9, rel=0.05)  # measured on one H100


def test_quantize_plans_one_chip_and_refuses_more_or_a_budget_below_the_floor() -> None:
    catalog = load_catalog()
    plan = plan_finetune(spec(QUANT), catalog)
    assert plan.chips == 1 and plan.memory.total < 141e9
    with pytest.raises(PlanError, match="runs on one chip"):
        plan_finetune(spec(QUANT, accelerator={"type": "h200", "count": 2}), catalog)
    with pytest.raises(PlanError, match=r"budgetBits 4\.2 is below 4\.250"):
        plan_finetune(spec(QUANT, quantize={"budgetBits": 4.2}), catalog)
    with pytest.raises(PlanError, match=r"measures the model in bf16, and .* has no bf16 matrix units"):
        plan_finetune(spec(QUANT, accelerator={"type": "v100"}), catalog)
    with pytest.raises(PlanError, match="holds its bf16 weights"):
        plan_finetune(spec(QUANT, model={"uri": "/m", "family": "llama", "size": "405b"}), catalog)


def _report(**sections: Any) -> str:
    return json.dumps({"schemaVersion": 1, "kind": "finetune", "ok": True, "chips": 2, **sections})


SR_SECTION = {
    "imagesPerSecond": 830.123456,
    "imagesPerSecondPerChip": 415.0617,
    "parameters": 61834563,
    "evalImages": 16,
    "psnr": 27.5,
    "ssim": 0.91,
    "bicubicPsnr": 28.43,
    "bicubicSsim": 0.906,
}
Q_SECTION = {
    "budgetBits": 4.5,
    "effectiveBits": 4.49987,
    "modelEffectiveBits": 5.8712,
    "compression": 2.725,
    "layers": 154,
    "formatsUsed": {"int4-g128": 150, "int8": 4},
    "perplexityBf16": 2.023,
    "perplexityQuantized": 2.023,
    "perplexityIncrease": 0.0,
    "weightBytesBf16": 2200000000,
    "weightBytesQuantized": 819000000,
}


def test_task_sections_reach_the_status_rounded_but_bits_kept_exact() -> None:
    done = ingest(
        _report(finetune={"steps": 40, "firstLoss": 1.0, "finalLoss": 0.1}, superResolution=SR_SECTION),
        "FinetuneJob",
    )
    assert done.valid
    assert done.results.super_resolution.images_per_second == 830.1
    assert done.results.super_resolution.parameters == 61834563 and done.results.tokens_per_second is None
    quantized = ingest(_report(finetune={"steps": 0}, quantization=Q_SECTION), "FinetuneJob")
    assert quantized.valid and quantized.results.quantization.effective_bits == 4.49987
    bad = ingest(_report(finetune={"steps": 1}, superResolution={**SR_SECTION, "ssim": 3.0}), "FinetuneJob")
    assert not bad.valid and "ssim" in bad.condition.message


def test_task_figures_become_metrics() -> None:
    status = {"results": {"superResolution": SR_SECTION, "quantization": Q_SECTION}}
    values = result_values("FinetuneJob", status)
    assert values["images_per_second"] == pytest.approx(830.123456) and values["psnr_db"] == 27.5
    assert values["effective_bits"] == pytest.approx(4.49987) and values["perplexity_increase"] == 0.0
    assert "tokens_per_second" not in values


def _run(name: str, task: str | None, results: dict[str, Any], chips: int = 1) -> dict[str, Any]:
    spec_part = {"task": task} if task else {}
    status = {"phase": "Succeeded", "accelerator": "h100", "results": results}
    status["cost"] = {"chips": chips, "dollarsPerChipHour": 3.0}
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec_part, "status": status}


def test_compare_puts_each_task_in_its_own_table_with_its_own_ratios() -> None:
    llm = _run("llm", None, {"tokensPerSecond": 1000.0})
    sr1 = _run("sr1", "superResolution", {"superResolution": {"imagesPerSecond": 400.0, "psnr": 27.0}})
    sr2 = _run("sr2", "superResolution", {"superResolution": {"imagesPerSecond": 760.0}}, chips=2)
    q = _run("q", None, {"quantization": Q_SECTION})  # an artifact's run: its results say the task
    rows = compare([llm, sr1, sr2, q], [])
    assert [r.name for r in rows["FinetuneJob"]] == ["llm"]
    assert [r.name for r in rows[SUPER_RESOLUTION]] == ["sr2", "sr1"]
    sr2_row, sr1_row = rows[SUPER_RESOLUTION]
    assert sr1_row.figures["speedRatio"] == pytest.approx(400 / 760)
    # $3/h at 400 images/s: 3 / (400 × 3600) × 1e6 dollars per million images
    assert sr1_row.figures["dollarsPerMillionImages"] == pytest.approx(3 / (400 * 3600) * 1e6)
    assert sr2_row.figures["costRatio"] == pytest.approx((6 / 760) / (3 / 400))
    (quant,) = rows[QUANTIZE]
    assert quant.figures["compression"] == 2.725 and format_value("perplexityIncrease", 0.0123) == "+1.23 %"


def _cell(name: str, values: dict[str, Any], images: float) -> CellRow:
    return CellRow(
        name=name,
        kind="FinetuneJob",
        cell=name,
        values=json.dumps(values, sort_keys=True),
        repeat=0,
        phase="Succeeded",
        images_per_second=images,
    )


def test_campaign_scaling_efficiency_over_accelerator_count() -> None:
    rows = [
        _cell("one", {"accelerator": {"type": "h100", "count": 1}}, 400.0),
        _cell("two", {"accelerator": {"type": "h100", "count": 2}}, 760.0),
        _cell("four", {"accelerator": {"type": "h100", "count": 4}}, 1400.0),
        _cell("gaudi", {"accelerator": {"type": "gaudi3", "count": 2}}, 700.0),  # no one-chip peer
        _cell("axis", {"accelerator.count": 2, "x": 1}, 300.0),
        _cell("axis1", {"accelerator.count": 1, "x": 1}, 200.0),
    ]
    summaries = {s.name: s for s in conclude(rows, [1.0]).summary}
    assert summaries["one"].scaling_efficiency == 1.0
    assert summaries["two"].scaling_efficiency == pytest.approx(760 / (2 * 400), abs=1e-4)
    assert summaries["four"].scaling_efficiency == pytest.approx(1400 / (4 * 400), abs=1e-4)
    assert summaries["gaudi"].scaling_efficiency is None
    assert summaries["axis"].scaling_efficiency == pytest.approx(0.75)
    assert summaries["two"].images_per_second.median == 760.0
