"""Plans for the FinetuneJob tasks other than causalLM: superResolution (DDP over the fewest chips
whose share of the batch fits) and quantize (one chip, the budget checked against the cheapest
assignment the formats allow for the model's layers)."""

from __future__ import annotations

from ..api.finetune import FORMATS, FinetuneJobSpec, budget_floor
from ..catalog import AcceleratorSpec, Catalog, ModelShape, projection_dims
from .common import accelerator, chip_label, fits, framework_for, gb, model_shape, usable_bytes
from .memory import quantize_memory, super_resolution_memory
from .placement import Placement, candidate_placements, requested_placement
from .pricing import price_for
from .types import MemoryEstimate, Plan, PlanError

DDP = "ddp"  # a whole replica per chip: the only strategy these tasks run


def _pytorch_only(spec: FinetuneJobSpec, accel: AcceleratorSpec) -> None:
    if framework_for(spec.framework, accel) != "pytorch":
        raise PlanError(
            f"task {spec.task.value} runs on the PyTorch worker, and {accel.display_name} pools run JAX: "
            "choose a GPU or Gaudi accelerator"
        )


def _check_precision(precision: str, accel: AcceleratorSpec, field: str) -> None:
    if not accel.supports(precision):
        raise PlanError(f"{accel.display_name} has no {precision} matrix units: set {field} to fp32")


def _plan(
    spec: FinetuneJobSpec,
    accel: AcceleratorSpec,
    placement: Placement,
    memory: MemoryEstimate,
    precision: str,
    micro_batch: int,
    notes: list[str],
) -> Plan:
    dollars, source, price_notes = price_for(spec.pricing, spec.accelerator.capacity, accel)
    return Plan(
        accelerator=accel.name,
        framework="pytorch",
        chips=placement.chips,
        hosts=placement.hosts,
        chips_per_host=placement.chips_per_host,
        topology=placement.topology,
        fsdp=1,
        tp=1,
        memory=memory,
        hbm_per_chip_gb=accel.hbm_gb,
        peak_tflops_per_chip=accel.peak_for(precision),
        dollars_per_chip_hour=dollars,
        price_source=source,
        notes=notes + price_notes,
        micro_batch_size=micro_batch,
        strategy=DDP,
    )


def plan_super_resolution(spec: FinetuneJobSpec, catalog: Catalog) -> Plan:
    """The fewest chips (or those asked for) that split the global batch evenly and hold a replica
    with their share of the images; PlanError naming the gigabytes otherwise."""
    accel = accelerator(catalog, spec.accelerator.type.value)
    _pytorch_only(spec, accel)
    sr = spec.sr
    precision = sr.precision.value
    _check_precision(precision, accel, "superResolution.precision")

    def memory(chips: int) -> MemoryEstimate:
        return super_resolution_memory(
            size=sr.image_size,
            channels=sr.channels,
            layers_per_block=sr.layers_per_block,
            attention_levels=sr.attention_levels,
            images_per_chip=sr.global_batch_size // chips,
            precision=precision,
            overhead_gb=accel.runtime_overhead_gb,
        )

    batch = sr.global_batch_size
    requested = requested_placement(accel, spec.accelerator.count, spec.accelerator.topology)
    if requested is not None:
        if batch % requested.chips:
            raise PlanError(
                f"superResolution.globalBatchSize {batch} does not split evenly over {requested.chips} chips"
            )
        estimate = memory(requested.chips)
        if not fits(estimate, accel):
            raise PlanError(
                f"SR3 training needs ≈ {gb(estimate.total)} GB per chip with "
                f"{batch // requested.chips} images each on {requested.chips} {chip_label(accel)} "
                f"({gb(usable_bytes(accel))} GB usable): "
                "add chips or lower superResolution.globalBatchSize"
            )
        return _plan(spec, accel, requested, estimate, precision, batch // requested.chips, [])
    for placement in candidate_placements(accel):
        if batch % placement.chips == 0 and fits(memory(placement.chips), accel):
            chips = placement.chips
            return _plan(spec, accel, placement, memory(chips), precision, batch // chips, [])
    one = memory(1)
    raise PlanError(
        f"SR3 training of {batch} images per step does not fit any {chip_label(accel)} placement that "
        f"splits the batch evenly (≈ {gb(one.total)} GB on one chip, {gb(usable_bytes(accel))} GB usable): "
        "lower superResolution.globalBatchSize or imageSize"
    )


def quantized_matrices(shape: ModelShape) -> list[tuple[int, int]]:
    """(parameters, in_features) of every weight matrix a quantize budget covers, as the worker
    finds them (workers.quantize.run.quantizable_layers): each decoder linear layer, then the input
    embeddings and the output head unless they are one tied matrix (grouped along the hidden size)."""
    layers = []
    for index in range(shape.layers):
        for in_features, out_features in projection_dims(shape, shape.is_global_layer(index)).values():
            layers.append((in_features * out_features, in_features))
    if not shape.tied_embeddings:
        layers += [(shape.vocab * shape.hidden, shape.hidden)] * 2
    return layers


def plan_quantize(spec: FinetuneJobSpec, catalog: Catalog) -> Plan:
    """One chip (layers are measured one at a time; more would sit idle); the budget must reach the
    formats' cheapest assignment over the model's layers, and the bf16 model must fit."""
    accel = accelerator(catalog, spec.accelerator.type.value)
    _pytorch_only(spec, accel)
    if not accel.supports("bf16"):
        raise PlanError(
            f"task quantize measures the model in bf16, and {accel.display_name} has no bf16 matrix "
            "units: choose another accelerator"
        )
    q = spec.quantization
    count = spec.accelerator.count
    if count is not None and count > 1:
        raise PlanError(
            f"task quantize runs on one chip (each layer's sensitivity is measured in turn): "
            f"accelerator.count {count} would pay for {count - 1} idle chips; set it to 1 or leave it out"
        )
    shape = model_shape(spec.base_model)
    formats = [f.value for f in q.formats]
    floor = budget_floor(formats, quantized_matrices(shape))
    if floor is None:
        raise PlanError(
            f"quantize.formats {formats} leave some layer of {shape.name} without an applicable format "
            "(grouped formats need whole groups along the input dimension): add int8 or bf16"
        )
    if q.budget_bits + 1e-9 < floor:
        cheapest = min(FORMATS[f].bits for f in formats)
        raise PlanError(
            f"quantize.budgetBits {q.budget_bits:g} is below {floor:.3f}, the fewest effective bits "
            f"{formats} reach on {shape.name} (every layer at {cheapest} bits, scales and zero-points "
            "counted): raise the budget or add a cheaper format"
        )
    estimate = quantize_memory(
        shape, seq=q.seq_length, batch=q.batch_size, overhead_gb=accel.runtime_overhead_gb
    )
    if not fits(estimate, accel):
        raise PlanError(
            f"quantizing {shape.name} holds its bf16 weights and a batch of {q.batch_size} × {q.seq_length} "
            f"tokens' logits: ≈ {gb(estimate.total)} GB, over one {chip_label(accel)} "
            f"({gb(usable_bytes(accel))} GB usable); lower quantize.batchSize or seqLength"
        )
    one = candidate_placements(accel)[0]
    notes = [shape.note] if shape.approximate and shape.note else []
    return _plan(spec, accel, one, estimate, "bf16", q.batch_size, notes)
