"""plan_inference: the fewest chips of one host a serving engine fits on, with its KV cache."""

from __future__ import annotations

from collections.abc import Callable

from ..api.inference import Engine, InferenceBenchSpec, KvCacheDtype
from ..catalog import AcceleratorSpec, Catalog, ModelShape
from .common import accelerator, amount, chip_label, fits, gb, model_shape, usable_bytes
from .memory import BF16, serving_memory
from .placement import Placement, candidate_placements, requested_placement
from .pricing import price_for
from .types import MemoryEstimate, Plan, PlanError

# Bytes per weight for the engine quantization names users write; anything else is taken as bf16.
QUANTIZED_WEIGHT_BYTES = {"fp8": 1.0, "int8": 1.0, "w8a8": 1.0, "awq": 0.5, "gptq": 0.5, "int4": 0.5}
ServingMemoryFn = Callable[..., MemoryEstimate]  # (tp, sequences) -> per-chip memory
KV_BYTES = {KvCacheDtype.FP8: 1.0, KvCacheDtype.BF16: 2.0, KvCacheDtype.AUTO: float(BF16)}


def plan_inference(spec: InferenceBenchSpec, catalog: Catalog) -> Plan:
    """Chips (tensor parallel over one host), memory and price for an InferenceBench.

    Memory per chip = weights / tp + KV cache / min(tp, kv_heads) + runtime overhead. Unasked, the
    planner picks the fewest chips whose cache holds the highest concurrency at the longest request
    (max input + output). The hard floor is one such request: engines queue or preempt what their
    cache cannot hold, which the sweep then shows as TTFT, so a smaller count is allowed with a
    note rather than refused (the public 2 x H100 Gemma 31B setup is such a case). Serving stays on
    one host: multi-host engines need a distributed runtime the operator does not set up. An
    external endpoint schedules nothing (hosts = 0); its chips only price the hardware behind it.
    """
    accel = accelerator(catalog, spec.accelerator.type.value)
    if spec.model.family is None:  # the operator (controller/served.py) or the CLI resolves it first
        raise PlanError(
            f"model.finetuneJob {spec.model.finetune_job}: the model is what that FinetuneJob trains, "
            "known once it succeeded (to plan it here, pass its manifest too: -f train.yaml -f bench.yaml)"
        )
    shape = model_shape(spec.model)
    dollars, source, price_notes = price_for(spec.pricing, spec.accelerator.capacity, accel)
    if spec.server.engine == Engine.EXTERNAL:
        return _external_plan(spec, accel, dollars, source, price_notes)
    context = _context_tokens(spec)
    concurrency, load_notes = _concurrency(spec)
    weight_bytes, quant_notes = _weight_bytes(spec.server.quantization)
    kv_bytes = KV_BYTES[spec.server.kv_cache_dtype]

    def memory_for(tp: int, sequences: int = concurrency) -> MemoryEstimate:
        return serving_memory(
            shape,
            weight_bytes=weight_bytes,
            kv_bytes=kv_bytes,
            context_tokens=context,
            concurrency=sequences,
            tp=tp,
            overhead_gb=accel.runtime_overhead_gb,
        )

    placement = _choose(spec, accel, shape, memory_for)
    held = _sequences_held(memory_for, placement.chips, concurrency, accel)
    cache_notes = (
        []
        if held >= concurrency
        else [
            f"KV cache holds ≈ {held} requests of {context} tokens per replica; levels above that "
            f"queue in the engine and show as TTFT"
        ]
    )
    notes = (
        ([shape.note] if shape.approximate and shape.note else [])
        + load_notes
        + quant_notes
        + cache_notes
        + price_notes
    )
    return Plan(
        accelerator=accel.name,
        framework=accel.default_framework,  # vLLM runs on JAX on TPU and on PyTorch elsewhere
        chips=placement.chips,
        hosts=placement.hosts,
        chips_per_host=placement.chips_per_host,
        topology=placement.topology,
        fsdp=1,
        tp=placement.chips,
        memory=memory_for(placement.chips, max(1, min(held, concurrency))),
        hbm_per_chip_gb=accel.hbm_gb,
        peak_tflops_per_chip=accel.serving_peak_tflops,
        dollars_per_chip_hour=dollars,
        price_source=source,
        notes=notes,
    )


def _context_tokens(spec: InferenceBenchSpec) -> int:
    longest = max(spec.workload.input_lengths) + spec.workload.output_length
    limit = spec.server.max_model_length
    if limit is not None and limit < longest:
        raise PlanError(
            f"the workload sends up to {longest} tokens (input {max(spec.workload.input_lengths)} + output "
            f"{spec.workload.output_length}) but server.maxModelLength is {limit}"
        )
    return longest


def _concurrency(spec: InferenceBenchSpec) -> tuple[int, list[str]]:
    if spec.workload.concurrency:
        return max(spec.workload.concurrency), []
    # Open loop has no concurrency bound to size for: plan for one sequence and let the engine
    # queue what does not fit its cache.
    return 1, ["open-loop workload: KV cache sized for one sequence; the engine queues beyond its cache"]


def _weight_bytes(quantization: str | None) -> tuple[float, list[str]]:
    if quantization is None:
        return float(BF16), []
    name = quantization.lower()
    if name in QUANTIZED_WEIGHT_BYTES:
        return QUANTIZED_WEIGHT_BYTES[name], []
    return float(BF16), [
        f"quantization {quantization!r} is not known to the planner: weights counted as bf16"
    ]


def _choose(
    spec: InferenceBenchSpec, accel: AcceleratorSpec, shape: ModelShape, memory_for: ServingMemoryFn
) -> Placement:
    requested = requested_placement(accel, spec.accelerator.count, spec.accelerator.topology)
    tp = spec.server.tensor_parallel
    if requested is not None and tp is not None and tp != requested.chips:
        raise PlanError(
            f"server.tensorParallel {tp} must equal the chips the accelerator asks for ({requested.chips})"
        )
    single_host = candidate_placements(accel, single_host=True)
    if requested is None and tp is not None:
        requested = next((p for p in single_host if p.chips == tp), None)
        if requested is None:
            counts = ", ".join(str(p.chips) for p in single_host)
            raise PlanError(
                f"server.tensorParallel {tp} is not a single-host chip count of {accel.name} ({counts})"
            )
    if requested is not None:
        return _check_requested(accel, shape, memory_for, requested)
    usable = [p for p in single_host if shape.heads % p.chips == 0]
    for sequences in (None, 1):  # the whole top concurrency first, then the one-request floor
        for placement in usable:
            memory = memory_for(placement.chips) if sequences is None else memory_for(placement.chips, 1)
            if fits(memory, accel):
                return placement
    largest = single_host[-1]
    raise PlanError(
        f"serving {shape.name} does not fit one host of {chip_label(accel)}: "
        f"≈ {gb(memory_for(largest.chips).total)} GB "
        f"per chip on {largest.chips} for one request; shorten the requests or quantize"
    )


def _check_requested(
    accel: AcceleratorSpec, shape: ModelShape, memory_for: ServingMemoryFn, asked: Placement
) -> Placement:
    if asked.hosts > 1:
        raise PlanError(
            f"serving runs on one host; {asked.describe()} spans {asked.hosts} hosts of {accel.name}"
        )
    if shape.heads % asked.chips:
        raise PlanError(
            f"tensor parallel {asked.chips} does not divide the {shape.heads} attention heads of {shape.name}"
        )
    if fits(memory_for(asked.chips, 1), accel):
        return asked
    per_chip = gb(memory_for(asked.chips, 1).total)
    needed = next(
        (
            p
            for p in candidate_placements(accel, single_host=True)
            if shape.heads % p.chips == 0 and fits(memory_for(p.chips, 1), accel)
        ),
        None,
    )
    if needed is None:
        raise PlanError(
            f"serving {shape.name} does not fit one host of {chip_label(accel)} (≈ {per_chip} GB per chip)"
        )
    raise PlanError(
        f"serving {shape.name} needs >= {amount(needed, accel)} (≈ {per_chip} GB per chip on {asked.chips}); "
        f"spec asks {asked.describe()}"
    )


def _sequences_held(memory_for: ServingMemoryFn, tp: int, concurrency: int, accel: AcceleratorSpec) -> int:
    """How many longest requests the cache left after weights holds (capped at the concurrency)."""
    one = memory_for(tp, 1)
    per_request = one.kv_cache
    spare = usable_bytes(accel) - (one.total - per_request)
    if per_request <= 0:
        return concurrency
    return max(0, min(concurrency, int(spare // per_request)))


def _external_plan(
    spec: InferenceBenchSpec, accel: AcceleratorSpec, dollars: float, source: str, notes: list[str]
) -> Plan:
    requested = requested_placement(accel, spec.accelerator.count, spec.accelerator.topology)
    chips = requested.chips if requested else 1
    zero = MemoryEstimate(weights=0.0, gradients=0.0, optimizer=0.0, adapters=0.0, activations=0.0)
    return Plan(
        accelerator=accel.name,
        framework=accel.default_framework,
        chips=chips,
        hosts=0,
        chips_per_host=0,
        topology=requested.topology if requested else None,
        fsdp=1,
        tp=chips,
        memory=zero,
        hbm_per_chip_gb=accel.hbm_gb,
        peak_tflops_per_chip=accel.serving_peak_tflops,
        dollars_per_chip_hour=dollars,
        price_source=source,
        notes=[
            f"external endpoint: nothing is scheduled; cost assumes {chips} {accel.name} chip(s) behind it",
            *notes,
        ],
    )
