"""JobPayload: what a pod is told, in the ENV_JOB variable (api/contract.py). Render writes it, the
fine-tuning worker and the bench client parse it.

It carries the resource's spec and the plan the operator resolved for it (framework, chips, mesh,
micro-batch, the chips' peak FLOP/s and the price), so a pod never re-derives what the operator
decided: it does not reload the catalog (which would miss the cluster's price overrides) and does
not re-apply defaults of its own.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, model_validator

from .base import API_VERSION, ApiModel
from .finetune import FinetuneJobSpec, Framework
from .inference import InferenceBenchSpec
from .resources import FinetuneJob, InferenceBench, Resource


class WorkerPlan(ApiModel):
    """The planner's decisions a pod needs (plan.types.Plan.worker_plan() writes it)."""

    accelerator: str = Field(description="Catalog name, e.g. h200, tpu-v5p, cpu.")
    framework: Framework = Field(description="Resolved: the spec's, else the accelerator's default.")
    chips: int = Field(ge=1, description="Chips of the whole run (for an external endpoint: priced).")
    hosts: int = Field(ge=0, description="Pods of the Indexed Job; 0 for an external endpoint.")
    chips_per_host: int = Field(ge=0)
    topology: str | None = None
    fsdp: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1)
    strategy: str | None = Field(
        default=None,
        description="ddp, fsdp, zero3 or explicit, as the planner resolved it; None (an older payload): "
        "fsdp when fsdp > 1, else ddp.",
    )
    micro_batch_size: int | None = Field(default=None, ge=1, description="Sequences per chip per pass.")
    peak_tflops_per_chip: float = Field(gt=0, description="Dense bf16 peak of one chip (MFU divides by it).")
    dollars_per_chip_hour: float | None = Field(default=None, ge=0, description="None: no price known.")
    price_source: str


class PayloadMetadata(ApiModel):
    name: str
    namespace: str | None = None
    uid: str | None = None


class JobPayload(ApiModel):
    """{apiVersion, kind, metadata, spec} parse back as the resource; `plan` is the operator's."""

    api_version: Literal["accelbench.io/v1alpha1"] = API_VERSION
    kind: Literal["FinetuneJob", "InferenceBench"]
    metadata: PayloadMetadata
    spec: FinetuneJobSpec | InferenceBenchSpec
    plan: WorkerPlan

    @model_validator(mode="before")
    @classmethod
    def _spec_of_kind(cls, data: Any) -> Any:
        """Validate the spec as the kind's spec (a union would try both and report both failures)."""
        if isinstance(data, dict) and isinstance(data.get("spec"), dict):
            spec_type = FinetuneJobSpec if data.get("kind") == FinetuneJob.KIND else InferenceBenchSpec
            data = {**data, "spec": spec_type.model_validate(data["spec"])}
        return data

    def resource(self) -> Resource:
        """The resource the payload was rendered from (status left out)."""
        meta = self.metadata.model_dump(exclude_none=True)
        if isinstance(self.spec, FinetuneJobSpec):
            return FinetuneJob(metadata=meta, spec=self.spec)
        return InferenceBench(metadata=meta, spec=self.spec)

    def to_json(self) -> str:
        # Compact and NaN-free: byte-stable, so server-side apply sees no change on a re-render.
        return json.dumps(self.to_wire(), separators=(",", ":"), allow_nan=False)
