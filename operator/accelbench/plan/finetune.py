"""plan_finetune: the fewest chips a fine-tuning spec fits on, its mesh, price and memory."""

from __future__ import annotations

from collections.abc import Callable

from ..api.finetune import FinetuneJobSpec, MethodType, Parallelism, ParallelismStrategy, Task
from ..catalog import AcceleratorSpec, Catalog, ModelShape
from .common import accelerator, amount, chip_label, fits, framework_for, gb, model_shape, usable_bytes
from .memory import finetune_memory, lora_adapter_parameters
from .placement import Placement, candidate_placements, placement_with_chips, requested_placement
from .pricing import price_for
from .tasks import plan_quantize, plan_super_resolution
from .types import MemoryEstimate, Plan, PlanError

MemoryFn = Callable[[int, int], MemoryEstimate]  # (fsdp, tp) -> per-chip memory


def plan_finetune(spec: FinetuneJobSpec, catalog: Catalog) -> Plan:
    """Chips, hosts, mesh, memory and price for a FinetuneJob, or PlanError saying what would fit.

    One chip first; shard (FSDP over every chip, unless parallelism is explicit) only when the
    model does not fit, in the counts the accelerator allows. A count or topology in the spec is
    checked, never changed. Tasks superResolution and quantize are planned by plan/tasks.py.
    """
    if spec.task == Task.SUPER_RESOLUTION:
        return plan_super_resolution(spec, catalog)
    if spec.task == Task.QUANTIZE:
        return plan_quantize(spec, catalog)
    accel = accelerator(catalog, spec.accelerator.type.value)
    precision = spec.training.precision.value
    _check_precision(precision, accel, framework_for(spec.framework, accel))
    if spec.gaudi is not None and accel.vendor != "habana":
        raise PlanError(f"spec.gaudi applies to Gaudi accelerators (gaudi2, gaudi3), not {accel.name}")
    shape = model_shape(spec.base_model)
    memory_for = _memory_function(spec, shape, accel)
    requested = requested_placement(accel, spec.accelerator.count, spec.accelerator.topology)
    framework = framework_for(spec.framework, accel)
    if spec.parallelism.strategy == ParallelismStrategy.ZERO3 and framework == "jax":
        raise PlanError("parallelism zero3 is DeepSpeed's (PyTorch): with JAX use fsdp, the same sharding")
    placement, fsdp, tp = _choose(spec, accel, shape, memory_for, requested)
    if framework == "jax" and accel.vendor == "cpu" and placement.chips > 1:
        raise PlanError(
            f"JAX on CPU drives one device per process, so {placement.chips} CPU chips cannot run it: "
            "set accelerator.count 1, or framework pytorch (one process per chip)"
        )
    memory = memory_for(fsdp, tp)
    dollars, source, price_notes = price_for(spec.pricing, spec.accelerator.capacity, accel)
    return Plan(
        accelerator=accel.name,
        framework=framework_for(spec.framework, accel),
        chips=placement.chips,
        hosts=placement.hosts,
        chips_per_host=placement.chips_per_host,
        topology=placement.topology,
        fsdp=fsdp,
        tp=tp,
        memory=memory,
        hbm_per_chip_gb=accel.hbm_gb,
        peak_tflops_per_chip=accel.peak_for(precision),
        dollars_per_chip_hour=dollars,
        price_source=source,
        notes=_shape_notes(spec, shape) + price_notes,
        micro_batch_size=_micro_batch(spec),
        strategy=resolved_strategy(spec.parallelism, fsdp, tp),
    )


def _micro_batch(spec: FinetuneJobSpec) -> int:
    # Left out, one sequence per chip per pass: the least memory, with the global batch made up by
    # gradient accumulation. A larger micro-batch is the user's call, and is checked like any other.
    return spec.training.micro_batch_size or 1


def _memory_function(spec: FinetuneJobSpec, shape: ModelShape, accel: AcceleratorSpec) -> MemoryFn:
    training = spec.training
    lora_rank = spec.method.rank if spec.method.type == MethodType.LORA else None

    def memory(fsdp: int, tp: int) -> MemoryEstimate:
        return finetune_memory(
            shape,
            lora_rank=lora_rank,
            target_modules=spec.method.target_modules,
            precision=training.precision.value,
            seq=training.seq_length,
            micro_batch=_micro_batch(spec),
            checkpointing=training.gradient_checkpointing,
            flash_attention=training.flash_attention,
            fsdp=fsdp,
            tp=tp,
            overhead_gb=accel.runtime_overhead_gb,
        )

    return memory


def _choose(
    spec: FinetuneJobSpec,
    accel: AcceleratorSpec,
    shape: ModelShape,
    memory_for: MemoryFn,
    requested: Placement | None,
) -> tuple[Placement, int, int]:
    parallelism = spec.parallelism
    explicit = parallelism.strategy == ParallelismStrategy.EXPLICIT
    replica_fits = fits(memory_for(1, 1), accel)
    if parallelism.strategy == ParallelismStrategy.DDP and not replica_fits:
        raise PlanError(_replica_too_large(spec, accel, shape, memory_for))
    if requested is None and explicit and parallelism.fsdp and parallelism.tp:
        requested = placement_with_chips(accel, parallelism.fsdp * parallelism.tp)
    if requested is not None:
        fsdp, tp = mesh(requested.chips, parallelism, replica_fits)
        if not fits(memory_for(fsdp, tp), accel):
            raise PlanError(_too_small(spec, accel, shape, memory_for, requested, fsdp, tp))
        return requested, fsdp, tp
    for placement in candidate_placements(accel):
        try:
            fsdp, tp = mesh(placement.chips, parallelism, replica_fits)
        except PlanError:
            continue  # e.g. tp=4 given explicitly cannot run on 1 or 2 chips
        if fits(memory_for(fsdp, tp), accel):
            return placement, fsdp, tp
    raise PlanError(_never_fits(spec, accel, shape, memory_for))


def mesh(chips: int, parallelism: Parallelism, replica_fits: bool = False) -> tuple[int, int]:
    """(fsdp, tp) for `chips`; the chips fsdp × tp leave over hold data-parallel replicas.

    auto: a replica per chip when one chip holds the model (no sharding traffic), else everything
    sharded; ddp: replicas; fsdp and zero3: everything sharded; explicit: the axes given, which must
    multiply to the chip count."""
    strategy = parallelism.strategy
    if strategy == ParallelismStrategy.DDP or (strategy == ParallelismStrategy.AUTO and replica_fits):
        return 1, 1
    if strategy != ParallelismStrategy.EXPLICIT:
        return chips, 1
    fsdp, tp = parallelism.fsdp, parallelism.tp
    if fsdp is None and tp is not None:
        fsdp = chips // tp
    if tp is None and fsdp is not None:
        tp = chips // fsdp
    fsdp, tp = fsdp or 1, tp or 1
    if fsdp * tp != chips:
        raise PlanError(
            f"explicit parallelism fsdp={parallelism.fsdp} x tp={parallelism.tp} must use all {chips} chips "
            f"(fsdp x tp = {fsdp * tp})"
        )
    return fsdp, tp


def resolved_strategy(parallelism: Parallelism, fsdp: int, tp: int) -> str:
    """What the worker runs: zero3 and explicit as asked; otherwise ddp for whole replicas, fsdp when
    sharded."""
    if parallelism.strategy in (ParallelismStrategy.ZERO3, ParallelismStrategy.EXPLICIT):
        return parallelism.strategy.value
    return ParallelismStrategy.FSDP.value if fsdp * tp > 1 else ParallelismStrategy.DDP.value


def _replica_too_large(
    spec: FinetuneJobSpec, accel: AcceleratorSpec, shape: ModelShape, memory_for: MemoryFn
) -> str:
    return (
        f"parallelism ddp keeps a whole replica on every chip, and {_method_label(spec, shape)} needs "
        f"≈ {gb(memory_for(1, 1).total)} GB of one {chip_label(accel)} "
        f"({gb(usable_bytes(accel))} GB usable): use fsdp or zero3 to shard it"
    )


def _method_label(spec: FinetuneJobSpec, shape: ModelShape) -> str:
    if spec.method.type == MethodType.LORA:
        return f"LoRA r={spec.method.rank} fine-tuning of {shape.name}"
    return f"full fine-tuning of {shape.name}"


def _needed(spec: FinetuneJobSpec, accel: AcceleratorSpec, memory_for: MemoryFn) -> Placement | None:
    """The fewest chips that would fit with automatic (all-FSDP) sharding."""
    for placement in candidate_placements(accel):
        if fits(memory_for(placement.chips, 1), accel):
            return placement
    return None


def _too_small(
    spec: FinetuneJobSpec,
    accel: AcceleratorSpec,
    shape: ModelShape,
    memory_for: MemoryFn,
    asked: Placement,
    fsdp: int,
    tp: int,
) -> str:
    per_chip = gb(memory_for(fsdp, tp).total)
    needed = _needed(spec, accel, memory_for)
    what = _method_label(spec, shape)
    if needed is None:
        return (
            f"{what} does not fit any {chip_label(accel)} placement "
            f"(≈ {per_chip} GB per chip on {asked.chips})"
        )
    return (
        f"{what} needs >= {amount(needed, accel)} (≈ {per_chip} GB per chip on {asked.chips}); "
        f"spec asks {asked.describe()}"
    )


def _never_fits(
    spec: FinetuneJobSpec, accel: AcceleratorSpec, shape: ModelShape, memory_for: MemoryFn
) -> str:
    largest = candidate_placements(accel)[-1]
    fsdp, tp = largest.chips, 1
    return (
        f"{_method_label(spec, shape)} does not fit any {chip_label(accel)} placement: ≈ "
        f"{gb(memory_for(fsdp, tp).total)} GB per chip even on {largest.chips} (activations do not shard "
        f"with FSDP; lower seqLength or microBatchSize, or enable gradientCheckpointing)"
    )


def _check_precision(precision: str, accel: AcceleratorSpec, framework: str) -> None:
    if not accel.supports(precision):
        usable = ", ".join([*accel.peak_tflops, "fp32"])
        raise PlanError(
            f"{accel.display_name} has no {precision} matrix units: set training.precision to one of {usable}"
        )
    if precision == "fp16" and framework == "jax":
        raise PlanError(
            "training.precision fp16 needs loss scaling, which the JAX worker does not do: use bf16 or "
            "fp32 with JAX, or framework pytorch (fp16 with a gradient scaler)"
        )


def _shape_notes(spec: FinetuneJobSpec, shape: ModelShape) -> list[str]:
    notes = []
    if shape.approximate and shape.note:
        notes.append(shape.note)
    if spec.method.type == MethodType.LORA and spec.method.rank:
        _, unmatched = lora_adapter_parameters(shape, spec.method.rank, spec.method.target_modules)
        if unmatched:
            notes.append(f"LoRA target modules {unmatched} match no projection of {shape.name}; not counted")
    return notes
