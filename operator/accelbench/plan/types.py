"""What the planner decides; the renderer and the controller read it, and pods get its
`worker_plan()` in their payload."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..api.payload import WorkerPlan


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per chip, broken down so a user sees why a spec does or does not fit."""

    weights: float
    gradients: float
    optimizer: float
    adapters: float
    activations: float
    kv_cache: float = 0.0
    overhead: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.adapters
            + self.activations
            + self.kv_cache
            + self.overhead
        )


@dataclass(frozen=True)
class Plan:
    accelerator: str  # catalog name
    framework: str  # jax | pytorch
    chips: int
    hosts: int
    chips_per_host: int
    topology: str | None  # TPU only
    fsdp: int
    tp: int
    memory: MemoryEstimate  # per chip
    hbm_per_chip_gb: float
    peak_tflops_per_chip: float  # dense bf16, from the catalog: what MFU divides by
    dollars_per_chip_hour: float | None  # None: no price known (plan.pricing.is_unpriced)
    price_source: str
    notes: list[str] = field(default_factory=list)
    # Sequences per chip per forward pass that the memory estimate assumed (fine-tuning only); the
    # worker should use the same, making up the global batch with gradient accumulation.
    micro_batch_size: int | None = None
    # Fine-tuning: how the chips share the work, resolved (ddp, fsdp, zero3 or explicit); "" for serving.
    strategy: str = ""

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def dollars_per_hour(self) -> float | None:
        return self.chips * self.dollars_per_chip_hour if self.dollars_per_chip_hour is not None else None

    def worker_plan(self) -> WorkerPlan:
        """What a pod needs of the plan (the memory breakdown and notes stay with the operator)."""
        return WorkerPlan(
            accelerator=self.accelerator,
            framework=self.framework,
            chips=self.chips,
            hosts=self.hosts,
            chips_per_host=self.chips_per_host,
            topology=self.topology,
            fsdp=self.fsdp,
            tp=self.tp,
            strategy=self.strategy or None,
            micro_batch_size=self.micro_batch_size,
            peak_tflops_per_chip=self.peak_tflops_per_chip,
            dollars_per_chip_hour=self.dollars_per_chip_hour,
            price_source=self.price_source,
        )


class PlanError(ValueError):
    """The spec cannot run as asked; the message says what would (e.g. needs >= 4 x H100 80 GB)."""
