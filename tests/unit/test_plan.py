"""Planner: memory by hand, fewest chips that fit, topologies, meshes, prices and error messages.

Numbers in comments are worked by hand from catalog/data/models.yaml and the formulas in
plan/memory.py; GB is 1e9 bytes, and a chip may be planned to 90 % of its HBM.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from accelbench.api import FinetuneJobSpec, InferenceBenchSpec
from accelbench.catalog import load_catalog, model_shape
from accelbench.plan import (
    PlanError,
    activation_bytes,
    finetune_memory,
    kv_cache_bytes,
    lora_adapter_parameters,
    plan_finetune,
    plan_inference,
)

GB = 1e9
CATALOG = load_catalog()
GEMMA4_31B = {"uri": "pvc://models/gemma-4-31b", "family": "gemma4", "size": "31b"}
GEMMA3_1B = {"uri": "pvc://models/gemma-3-1b", "family": "gemma3", "size": "1b"}
LORA_64 = {"type": "lora", "rank": 64}
STUDY_TRAINING = {"seqLength": 3072, "gradientCheckpointing": True}


def finetune(**spec: Any) -> FinetuneJobSpec:
    base: dict[str, Any] = {
        "model": GEMMA4_31B,
        "dataset": {"uri": "pvc://data/train.jsonl"},
        "accelerator": {"type": "h200"},
    }
    return FinetuneJobSpec.model_validate(base | spec)


def bench(**spec: Any) -> InferenceBenchSpec:
    base: dict[str, Any] = {
        "model": {"uri": "pvc://models/llama", "family": "llama", "size": "8b"},
        "accelerator": {"type": "h100"},
        "workload": {"inputLengths": [512, 4096], "outputLength": 512, "concurrency": [1, 4, 16]},
    }
    return InferenceBenchSpec.model_validate(base | spec)


# ---------------------------------------------------------------- the 31B study case


def test_lora_adapters_of_gemma4_31b() -> None:
    # r x (in + out) per projection. Sliding layer (hidden 5376, q 32x256 = 8192, kv 16x256 = 4096,
    # MLP 21504): q 64x13568 + k 64x9472 + v 64x9472 + o 64x13568 + 3 x 64x26880 = 8,110,080.
    # Global layer (q 32x512 = 16384, k 4x512 = 2048, no v_proj since K = V):
    # 64x21760 + 64x7424 + 64x21760 + 3 x 64x26880 = 8,421,376.
    # 50 sliding + 10 global layers: 405,504,000 + 84,213,760 = 489,717,760.
    count, unmatched = lora_adapter_parameters(
        model_shape("gemma4", "31b"),
        64,
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    assert count == 489_717_760
    assert unmatched == []


def test_31b_lora_r64_seq3072_checkpointed_fits_one_h200() -> None:
    # weights     31e9 x 2 B (bf16)                                  = 62.00 GB
    # adapters    489.7M x 4 B (fp32), grads x 4 B, AdamW x 8 B      =  7.84 GB
    # activations layer inputs 60 x 5376 x 2 B x 3072                =  1.98 GB
    #             one global layer recomputed: (6x5376 + 3x16384 + 3x2048 + 4x21504) x 2 B x 3072
    #             = 173,568 x 6144                                   =  1.07 GB
    #             logits 12 B x 3072 x 262,144                       =  9.66 GB
    # overhead    H200 runtime                                       =  3.00 GB
    # total ≈ 85.5 GB <= 0.9 x 141 = 126.9 GB: one chip.
    plan = plan_finetune(finetune(method=LORA_64, training=STUDY_TRAINING), CATALOG)
    assert (plan.chips, plan.hosts, plan.fsdp, plan.tp) == (1, 1, 1, 1)
    assert plan.memory.weights == pytest.approx(62.0 * GB)
    assert plan.memory.adapters + plan.memory.gradients + plan.memory.optimizer == pytest.approx(
        489_717_760 * 16
    )
    assert plan.memory.activations == pytest.approx(12.71 * GB, rel=1e-3)
    assert plan.memory.total == pytest.approx(85.5 * GB, rel=1e-3)
    assert plan.framework == "pytorch"
    assert plan.micro_batch_size == 1


def test_31b_lora_on_h100_needs_two_as_in_the_study() -> None:
    # One H100: the same 85.5 GB > 72 GB. Two with FSDP: 31 + 3.92 + 12.71 + 3 = 50.6 GB.
    plan = plan_finetune(
        finetune(accelerator={"type": "h100"}, method=LORA_64, training=STUDY_TRAINING), CATALOG
    )
    assert (plan.chips, plan.fsdp) == (2, 2)
    assert plan.memory.total == pytest.approx(50.6 * GB, rel=1e-3)


def test_31b_full_finetune_shards_over_several_h200() -> None:
    # 16 B/param x 31e9 = 496 GB sharded, plus 12.71 + 3 GB per chip that do not shard.
    # 4 chips: 124 + 15.7 = 139.7 GB > 126.9. 8 chips: 62 + 15.7 = 77.7 GB: 8 x H200 on one host.
    plan = plan_finetune(finetune(method={"type": "full"}, training=STUDY_TRAINING), CATALOG)
    assert (plan.chips, plan.hosts, plan.chips_per_host, plan.fsdp) == (8, 1, 8, 8)
    assert plan.memory.optimizer == pytest.approx(31e9 * 12 / 8)


def test_count_too_small_says_what_would_fit() -> None:
    spec = finetune(
        accelerator={"type": "h200", "count": 4}, method={"type": "full"}, training=STUDY_TRAINING
    )
    with pytest.raises(PlanError) as err:
        plan_finetune(spec, CATALOG)
    assert str(err.value) == (
        "full fine-tuning of gemma4-31b needs >= 8 x H200 141 GB (≈ 140 GB per chip on 4); spec asks 4"
    )


def test_calibration_against_measured_gemma3_27b_lora() -> None:
    # docs/anchors.md, one H200: Gemma-3-27B text shape (27.0B), LoRA r64 all projections, grad. ckpt.,
    # seq 3072: 73.1 GB peak at batch 1, 113.2 GB at batch 4 (torch peak, without the CUDA context).
    shape = model_shape("gemma3", "27b").model_copy(update={"parameters": 27_007_991_808})
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for batch, measured in ((1, 73.1), (4, 113.2)):
        memory = finetune_memory(
            shape,
            lora_rank=64,
            target_modules=targets,
            precision="bf16",
            seq=3072,
            micro_batch=batch,
            checkpointing=True,
            flash_attention=True,
            fsdp=1,
            tp=1,
            overhead_gb=0.0,
        )
        assert memory.total / GB == pytest.approx(measured, rel=0.03)


# ---------------------------------------------------------------- 1B full fine-tune everywhere


@pytest.mark.parametrize(
    "accelerator", ["h100", "h100-mega", "h200", "gaudi2", "gaudi3", "tpu-v5p", "tpu-v6e"]
)
def test_1b_full_finetune_fits_one_card(accelerator: str) -> None:
    # Gemma-3-1B (999,885,952 params), full, bf16, seq 1024, micro-batch 1, no checkpointing:
    # weights + grads + AdamW + master = 16 B x 1.0e9                    = 16.00 GB
    # activations: every layer keeps (6x1152 + 3x1024 + 3x256 + 4x6912) = 38,400 values x 2 B
    #              x 26 layers x 1024 tokens                           =  2.04 GB
    #              logits 12 B x 1024 x 262,144                          =  3.22 GB
    # overhead 3 GB on GPU/Gaudi, 1 GB on TPU -> 24.3 or 22.3 GB. The smallest usable HBM here is
    # v6e's 0.9 x 32 = 28.8 GB, so every one of these runs it on one chip.
    spec = finetune(
        model=GEMMA3_1B,
        accelerator={"type": accelerator},
        method={"type": "full"},
        training={"seqLength": 1024},
    )
    plan = plan_finetune(spec, CATALOG)
    overhead = 1.0 if accelerator.startswith("tpu") else 3.0
    if accelerator == "tpu-v5p":
        # v5p's smallest slice is 2x2x1: 4 chips is its "one card"; the planner shards over them.
        assert (plan.chips, plan.topology) == (4, "2x2x1")
    else:
        assert plan.chips == 1
        assert plan.memory.total == pytest.approx((16.0 + 5.26 + overhead) * GB, rel=2e-3)


def test_1b_full_finetune_does_not_fit_one_v5e() -> None:
    # 16 GB HBM -> 14.4 GB usable, and 16 B/param alone is 16.0 GB: not realistic on one v5e.
    # 2 chips is not a v5e slice, so the planner takes 2x2: 16/4 + 5.26 + 1 = 10.3 GB per chip.
    spec = finetune(
        model=GEMMA3_1B,
        accelerator={"type": "tpu-v5e"},
        method={"type": "full"},
        training={"seqLength": 1024},
    )
    plan = plan_finetune(spec, CATALOG)
    assert (plan.chips, plan.hosts, plan.topology) == (4, 1, "2x2")
    assert plan.framework == "jax"


def test_tiny_model_fits_the_nominal_cpu() -> None:
    spec = finetune(
        model={"uri": "/tmp/tiny", "family": "gemma3", "size": "1b", "parameters": 16_846_848},
        accelerator={"type": "cpu"},
        method={"type": "full"},
        training={"seqLength": 128},
    )
    plan = plan_finetune(spec, CATALOG)
    assert (plan.chips, plan.hosts) == (1, 1)
    assert plan.dollars_per_chip_hour == 0.0


# ---------------------------------------------------------------- TPU topologies and meshes


def test_tpu_v5p_eight_chips_is_2x2x2_on_two_hosts() -> None:
    # Gemma-3-27B full, seq 2048, checkpointed: 16 x 27.43e9 = 438.9 GB shards; 8.4 GB activations
    # (1.37 inputs + 0.56 one layer + 6.44 logits) + 1 GB do not.
    # 4 chips: 109.7 + 9.4 = 119 GB > 85.5 usable; 8 chips: 54.9 + 9.4 = 64.2 GB: 2x2x2.
    spec = finetune(
        model={"uri": "pvc://m", "family": "gemma3", "size": "27b"},
        accelerator={"type": "tpu-v5p"},
        method={"type": "full"},
        training={"seqLength": 2048, "gradientCheckpointing": True},
    )
    plan = plan_finetune(spec, CATALOG)
    assert (plan.chips, plan.hosts, plan.chips_per_host, plan.topology) == (8, 2, 4, "2x2x2")
    assert plan.multi_host


def test_explicit_mesh_picks_the_slice_with_that_many_chips() -> None:
    spec = finetune(
        model=GEMMA3_1B,
        accelerator={"type": "tpu-v5p"},
        parallelism={"strategy": "explicit", "fsdp": 4, "tp": 2},
    )
    plan = plan_finetune(spec, CATALOG)
    assert (plan.topology, plan.hosts, plan.fsdp, plan.tp) == ("2x2x2", 2, 4, 2)


def test_invalid_topology_lists_the_valid_ones() -> None:
    spec = finetune(accelerator={"type": "tpu-v5p", "topology": "2x2"}, method=LORA_64)
    with pytest.raises(PlanError) as err:
        plan_finetune(spec, CATALOG)
    message = str(err.value)
    assert message.startswith("topology 2x2 is not valid for tpu-v5p; valid topologies: ")
    assert "2x2x1 (4 chips, 1 host)" in message
    assert "2x2x2 (8 chips, 2 hosts)" in message


def test_asked_topology_too_small() -> None:
    # The study's v5p-8 (2x2x1, 4 chips) runs the LoRA case sharded: 15.5 + 1.96 + 12.71 + 1 = 31.2 GB
    # per chip. auto keeps a whole replica per chip instead, as one v5p holds it:
    # 62.0 + 7.8 + 12.71 + 1 = 83.5 GB of 85.5 usable, and data parallelism needs no weight gathers.
    asked = {"type": "tpu-v5p", "topology": "2x2x1"}
    auto = plan_finetune(finetune(accelerator=asked, method=LORA_64, training=STUDY_TRAINING), CATALOG)
    assert (auto.chips, auto.fsdp, auto.strategy, auto.framework) == (4, 1, "ddp", "jax")
    ok = plan_finetune(
        finetune(
            accelerator=asked, method=LORA_64, training=STUDY_TRAINING, parallelism={"strategy": "fsdp"}
        ),
        CATALOG,
    )
    assert (ok.chips, ok.fsdp, ok.strategy, ok.framework) == (4, 4, "fsdp", "jax")
    assert ok.memory.total == pytest.approx(31.2 * GB, rel=0.01)
    # Full fine-tuning does not: 496/4 + 12.71 + 1 = 137.7 GB on 4 chips; 496/8 + 13.71 = 75.7 GB on 8.
    spec = finetune(
        accelerator={"type": "tpu-v5p", "topology": "2x2x1"}, method={"type": "full"}, training=STUDY_TRAINING
    )
    with pytest.raises(PlanError) as err:
        plan_finetune(spec, CATALOG)
    assert str(err.value).endswith(
        "needs >= a TPU v5p 95 GB slice 2x2x2 (8 chips) (≈ 138 GB per chip on 4); spec asks 2x2x1 (4 chips)"
    )


def test_explicit_parallelism_must_use_every_chip() -> None:
    spec = finetune(
        model=GEMMA3_1B,
        accelerator={"type": "h100", "count": 8},
        parallelism={"strategy": "explicit", "fsdp": 2, "tp": 2},
    )
    with pytest.raises(PlanError, match=r"fsdp=2 x tp=2 must use all 8 chips"):
        plan_finetune(spec, CATALOG)


def test_explicit_tp_fills_fsdp_from_the_count() -> None:
    spec = finetune(
        model=GEMMA3_1B,
        accelerator={"type": "h100", "count": 8},
        parallelism={"strategy": "explicit", "tp": 2},
    )
    plan = plan_finetune(spec, CATALOG)
    assert (plan.fsdp, plan.tp) == (4, 2)


@pytest.mark.parametrize("count", [3, 12])
def test_gpu_count_must_be_allowed(count: int) -> None:
    with pytest.raises(PlanError, match=r"h100 runs on 1, 2, 4, 8 chips per host, or a multiple of 8"):
        plan_finetune(finetune(model=GEMMA3_1B, accelerator={"type": "h100", "count": count}), CATALOG)


def test_multi_host_gpu_counts() -> None:
    # Llama-3.1-70B full, seq 1024, checkpointed: 16 x 70.55e9 = 1129 GB shards. Activations
    # 80 x 8192 x 2 x 1024 = 1.34 GB inputs + 0.33 GB one layer + 12 x 1024 x 128256 = 1.58 GB
    # logits = 3.25 GB, +3 GB. On 16 H100: 70.6 + 6.3 = 76.8 GB > 72; on 24: 47.0 + 6.3 = 53.3 GB.
    spec = finetune(
        model={"uri": "pvc://m", "family": "llama", "size": "70b"},
        accelerator={"type": "h100"},
        method={"type": "full"},
        training={"seqLength": 1024, "gradientCheckpointing": True},
    )
    plan = plan_finetune(spec, CATALOG)
    assert (plan.chips, plan.hosts, plan.chips_per_host) == (24, 3, 8)


def test_activation_formula_without_flash_attention_adds_scores() -> None:
    shape = model_shape("llama", "1b")
    # Without flash attention every kept layer also stores a x seq^2 scores and probabilities in
    # bf16: 16 layers x 2 x 2 B x 32 heads x 1024^2 = 2.15 GB more.
    extra = activation_bytes(shape, 1024, 1, False, False) - activation_bytes(shape, 1024, 1, False, True)
    assert extra == 16 * 2 * 2 * 32 * 1024 * 1024


def test_unknown_lora_target_is_refused_by_the_api() -> None:
    with pytest.raises(ValidationError, match="all-linear"):
        finetune(model=GEMMA3_1B, method={"type": "lora", "rank": 8, "targetModules": ["q_proj", "qkv"]})


def test_lora_target_no_layer_has_is_reported() -> None:
    # Every layer global with shared k/v: no v_proj anywhere for an adapter to go on.
    shape = model_shape("gemma4", "31b").model_copy(update={"sliding_window": None})
    _, unmatched = lora_adapter_parameters(shape, 8, ["q_proj", "v_proj"])
    assert unmatched == ["v_proj"]


# ---------------------------------------------------------------- prices


def test_catalog_on_demand_price() -> None:
    plan = plan_finetune(
        finetune(accelerator={"type": "h100"}, method=LORA_64, training=STUDY_TRAINING), CATALOG
    )
    assert plan.dollars_per_chip_hour == 11.06
    assert plan.price_source.startswith("catalog h100 on-demand, ")
    assert plan.price_source.endswith(", 2026-12-02")
    assert plan.dollars_per_hour == pytest.approx(22.12)  # the study's 2 x H100 rate


def test_price_override_reaches_the_plan() -> None:
    overrides = {"h100": {"on_demand": 9.5, "source": "negotiated rate", "date": "2026-11-30"}}
    plan = plan_finetune(
        finetune(accelerator={"type": "h100"}, method=LORA_64, training=STUDY_TRAINING),
        load_catalog(overrides),
    )
    assert plan.dollars_per_chip_hour == 9.5
    assert plan.price_source == "catalog h100 on-demand, negotiated rate, 2026-11-30"


def test_spot_pricing_uses_the_spot_figure() -> None:
    catalog = load_catalog({"h100": {"spot": 3.5, "source": "spot page", "date": "2026-12-01"}})
    spec = finetune(accelerator={"type": "h100", "capacity": "spot"}, method=LORA_64, training=STUDY_TRAINING)
    plan = plan_finetune(spec, catalog)
    assert plan.dollars_per_chip_hour == 3.5
    assert plan.price_source == "catalog h100 spot, spot page, 2026-12-01"


def test_spot_without_a_catalog_spot_price_falls_back_with_a_note() -> None:
    spec = finetune(accelerator={"type": "h100", "capacity": "spot"}, method=LORA_64, training=STUDY_TRAINING)
    plan = plan_finetune(spec, CATALOG)
    assert plan.dollars_per_chip_hour == 11.06
    assert any("no spot price for h100" in note for note in plan.notes)


def test_custom_pricing() -> None:
    spec = finetune(
        accelerator={"type": "tpu-v5p", "topology": "2x2x1"},
        method=LORA_64,
        training=STUDY_TRAINING,
        pricing={"source": "custom", "dollarsPerChipHour": 2.1},
    )
    plan = plan_finetune(spec, CATALOG)
    assert (plan.dollars_per_chip_hour, plan.price_source) == (2.1, "custom")
    assert plan.dollars_per_hour == pytest.approx(8.4)


def test_an_unpriced_accelerator_plans_with_no_price_and_says_so() -> None:
    """Gaudi 3 has no citable public price: the plan carries None (cost unavailable), never $0, and a
    custom price makes it priced."""
    spec = finetune(accelerator={"type": "gaudi3"}, method=LORA_64, training=STUDY_TRAINING)
    plan = plan_finetune(spec, CATALOG)
    assert plan.dollars_per_chip_hour is None and plan.dollars_per_hour is None
    assert any("cost shows as unavailable" in note for note in plan.notes)
    assert "dollarsPerChipHour" not in plan.worker_plan().to_wire()
    priced = finetune(
        accelerator={"type": "gaudi3"},
        method=LORA_64,
        training=STUDY_TRAINING,
        pricing={"source": "custom", "dollarsPerChipHour": 4.0},
    )
    assert plan_finetune(priced, CATALOG).dollars_per_chip_hour == 4.0


def test_v100_refuses_bf16_with_the_precisions_it_has_and_plans_fp16_against_its_fp16_peak() -> None:
    llama_8b = {"uri": "pvc://models/llama-3.1-8b", "family": "llama", "size": "8b"}
    spec = finetune(model=llama_8b, accelerator={"type": "v100"}, method=LORA_64)
    refused = r"no bf16 matrix units: set training\.precision to one of fp16, fp32"
    with pytest.raises(PlanError, match=refused):
        plan_finetune(spec, CATALOG)
    spec = finetune(
        model=llama_8b,
        accelerator={"type": "v100"},
        method=LORA_64,
        training={"precision": "fp16", "seqLength": 1024, "gradientCheckpointing": True},
    )
    plan = plan_finetune(spec, CATALOG)
    # 8.03e9 x 2 B frozen fp16 base = 16.1 GB alone passes one V100's 14.4 usable GB: sharded.
    assert (plan.chips, plan.fsdp, plan.peak_tflops_per_chip) == (2, 2, 125)
    assert plan.dollars_per_chip_hour is None  # unpriced in the catalog: cost unavailable, not $0


def test_fp16_full_finetune_keeps_fp32_weights_and_jax_refuses_fp16() -> None:
    # Mixed precision: fp32 weights and gradients (4 + 4 B) and AdamW's moments (8 B): 16 B/param.
    spec = finetune(
        model=GEMMA3_1B,
        accelerator={"type": "a100-80gb"},
        method={"type": "full"},
        training={"precision": "fp16"},
    )
    plan = plan_finetune(spec, CATALOG)
    n = 999_885_952
    assert plan.memory.weights == 4 * n and plan.memory.gradients == 4 * n and plan.memory.optimizer == 8 * n
    assert plan.peak_tflops_per_chip == 312
    jax = finetune(
        model=GEMMA3_1B, accelerator={"type": "a100"}, framework="jax", training={"precision": "fp16"}
    )
    with pytest.raises(PlanError, match="fp16 needs loss scaling"):
        plan_finetune(jax, CATALOG)
    with pytest.raises(PlanError, match=r"spec\.gaudi applies to Gaudi accelerators"):
        plan_finetune(finetune(accelerator={"type": "h100"}, gaudi={"hpuGraphs": True}), CATALOG)
    with pytest.raises(PlanError, match="Gaudi 3 has no fp16"):
        plan_finetune(finetune(accelerator={"type": "gaudi3"}, training={"precision": "fp16"}), CATALOG)


def test_strategies_choose_the_mesh_and_the_memory_follows() -> None:
    """auto: no sharding when a replica fits one chip; ddp refuses what one chip cannot hold; fsdp
    and zero3 shard over every chip; zero3 is PyTorch's only."""
    one_b = {"model": GEMMA3_1B, "method": {"type": "full"}, "training": {"seqLength": 1024}}
    two_h100 = {"type": "h100", "count": 2}
    auto = plan_finetune(finetune(accelerator=two_h100, **one_b), CATALOG)
    assert (auto.chips, auto.fsdp, auto.strategy) == (2, 1, "ddp")  # 24.3 GB fits one 80 GB card
    fsdp = plan_finetune(finetune(accelerator=two_h100, parallelism={"strategy": "fsdp"}, **one_b), CATALOG)
    zero3 = plan_finetune(finetune(accelerator=two_h100, parallelism={"strategy": "zero3"}, **one_b), CATALOG)
    assert (fsdp.fsdp, fsdp.strategy, zero3.fsdp, zero3.strategy) == (2, "fsdp", 2, "zero3")
    # 16 B/param of state halves over 2 shards; activations do not shard.
    assert fsdp.memory.total == pytest.approx(auto.memory.total - 8 * 999_885_952, rel=1e-6)
    assert zero3.memory == fsdp.memory and zero3.worker_plan().strategy == "zero3"
    # Full fine-tuning of Gemma 4 31B needs ~510 GB: no chip holds a replica.
    with pytest.raises(PlanError, match=r"ddp keeps a whole replica on every chip.*use fsdp or zero3"):
        plan_finetune(
            finetune(
                accelerator={"type": "h200", "count": 8},
                method={"type": "full"},
                parallelism={"strategy": "ddp"},
            ),
            CATALOG,
        )
    # auto without a count: the fewest chips, one here.
    assert plan_finetune(finetune(accelerator={"type": "h100"}, **one_b), CATALOG).chips == 1
    with pytest.raises(PlanError, match="zero3 is DeepSpeed's"):
        plan_finetune(
            finetune(accelerator={"type": "tpu-v5p"}, parallelism={"strategy": "zero3"}, **one_b), CATALOG
        )


# ---------------------------------------------------------------- serving


def test_kv_cache_by_hand() -> None:
    # Llama-3.1-8B: 2 (K, V) x 32 layers x 8 heads x 128 x 2 B = 131,072 B per token.
    assert kv_cache_bytes(model_shape("llama", "8b"), 2, 4608, 16) == 131_072 * 4608 * 16


def test_kv_cache_caps_sliding_layers_at_the_window() -> None:
    # Gemma-3-1B: 1 KV head x 256 x 2 x 2 B = 1024 B per token per layer. At 8192 tokens the 22
    # sliding layers hold 512 tokens, the 4 global layers all 8192.
    assert kv_cache_bytes(model_shape("gemma3", "1b"), 2, 8192, 1) == 1024 * (22 * 512 + 4 * 8192)


def test_serving_fits_one_h100() -> None:
    # weights 8.03e9 x 2 = 16.06 GB; KV 131,072 x (4096 + 512) x 16 = 9.66 GB; +3 GB = 28.7 GB.
    plan = plan_inference(bench(), CATALOG)
    assert (plan.chips, plan.tp, plan.fsdp) == (1, 1, 1)
    assert plan.memory.total == pytest.approx(28.7 * GB, rel=2e-3)


def test_serving_honours_tensor_parallel() -> None:
    plan = plan_inference(bench(server={"tensorParallel": 2}), CATALOG)
    assert (plan.chips, plan.tp) == (2, 2)
    assert plan.memory.weights == pytest.approx(8_030_261_248)


def test_serving_tensor_parallel_must_match_the_count() -> None:
    with pytest.raises(PlanError, match="tensorParallel 2 must equal the chips"):
        plan_inference(bench(server={"tensorParallel": 2}, accelerator={"type": "h100", "count": 4}), CATALOG)


def test_serving_on_tpu_picks_a_single_host_slice() -> None:
    # Gemma-4-31B on v6e, input up to 16k + 512 out, concurrency 16: 62 GB of weights alone need
    # at least 4 chips of 28.8 usable GB; 4 chips give 15.5 + 8.9 (KV) + 1 = 25.4 GB.
    spec = bench(
        model=GEMMA4_31B,
        accelerator={"type": "tpu-v6e"},
        workload={"inputLengths": [512, 4096, 16384], "outputLength": 512, "concurrency": [1, 4, 16]},
    )
    plan = plan_inference(spec, CATALOG)
    assert (plan.chips, plan.hosts, plan.topology, plan.tp) == (4, 1, "2x2", 4)


def test_serving_too_small_count() -> None:
    spec = bench(
        model={"uri": "pvc://m", "family": "llama", "size": "70b"}, accelerator={"type": "h100", "count": 1}
    )
    with pytest.raises(PlanError, match=r"serving llama-70b needs >= 4 x H100 80 GB .*spec asks 1"):
        plan_inference(spec, CATALOG)


def test_serving_max_model_length_below_the_workload() -> None:
    with pytest.raises(PlanError, match="maxModelLength is 2048"):
        plan_inference(bench(server={"maxModelLength": 2048}), CATALOG)


def test_external_endpoint_schedules_nothing() -> None:
    plan = plan_inference(
        bench(
            server={"engine": "external", "endpoint": "http://svc:8000"},
            accelerator={"type": "h100", "count": 2},
        ),
        CATALOG,
    )
    assert (plan.hosts, plan.chips) == (0, 2)
    assert plan.memory.total == 0


def test_serving_count_that_holds_one_request_is_allowed_with_a_note() -> None:
    # Gemma 4 31B on 2 x H100 (the public study's GPU setup): weights ≈ 31 GB per chip, so a
    # 16k-token request fits, but 64 of them at once do not; the engine queues the rest.
    spec = bench(
        model={"uri": "/m", "family": "gemma4", "size": "31b"},
        accelerator={"type": "h100", "count": 2},
        workload={"inputLengths": [512, 16384], "outputLength": 512, "concurrency": [1, 64]},
    )
    plan = plan_inference(spec, CATALOG)
    assert plan.chips == 2
    assert any("KV cache holds" in note for note in plan.notes)
    assert plan.memory.total <= 80e9 * 0.9


def test_cpu_chips_are_processes_for_pytorch_and_jax_stays_on_one() -> None:
    """Two CPU chips are two torchrun processes (the strategies run locally); JAX sees one device."""
    two = {"type": "cpu", "count": 2}
    plan = plan_finetune(
        finetune(model=GEMMA3_1B, accelerator=two, parallelism={"strategy": "zero3"}), CATALOG
    )
    assert (plan.chips, plan.chips_per_host, plan.strategy, plan.framework) == (2, 2, "zero3", "pytorch")
    with pytest.raises(PlanError, match="JAX on CPU drives one device per process"):
        plan_finetune(finetune(model=GEMMA3_1B, accelerator=two, framework="jax"), CATALOG)
