"""Spec parts shared by FinetuneJob and InferenceBench."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from .base import ApiModel, cel


class AcceleratorType(StrEnum):
    """Accelerator kinds the catalog knows; each maps to a node pool shape (see catalog/data)."""

    TPU_V5E = "tpu-v5e"
    TPU_V5P = "tpu-v5p"
    TPU_V6E = "tpu-v6e"
    H100 = "h100"
    H100_MEGA = "h100-mega"
    H200 = "h200"
    GAUDI2 = "gaudi2"
    GAUDI3 = "gaudi3"
    CPU = "cpu"


class Capacity(StrEnum):
    ON_DEMAND = "onDemand"
    SPOT = "spot"
    RESERVATION = "reservation"


class ModelFamily(StrEnum):
    GEMMA = "gemma"
    GEMMA2 = "gemma2"
    GEMMA3 = "gemma3"
    GEMMA4 = "gemma4"
    LLAMA = "llama"
    QWEN = "qwen"
    MISTRAL = "mistral"


class ModelSource(ApiModel):
    """Where the model lives and what shape it has (the planner needs the size before any pod runs)."""

    uri: str = Field(
        min_length=1,
        description="Hugging Face-format model directory: pvc://CLAIM/PATH, gs://, s3://, or a local path.",
    )
    family: ModelFamily = Field(description="Architecture family; selects the JAX model and the bridge.")
    size: str | None = Field(
        default=None,
        pattern=r"^([0-9]+(\.[0-9]+)?[mMbB]|tiny)$",
        description="Parameter count such as 31b or 270m (tiny: test shapes); the catalog gives the shape.",
    )
    parameters: int | None = Field(
        default=None, ge=1, description="Exact parameter count; overrides size for memory and FLOPs."
    )


class Accelerator(ApiModel):
    """Which chips and how many. Topology is for TPU slices; count is for GPUs and Gaudi cards."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "!self.type.startsWith('tpu-') || !has(self.count)",
                    "TPU slices are sized by topology, not count",
                ),
                cel(
                    "self.type.startsWith('tpu-') || !has(self.topology)",
                    "topology applies only to TPU types; use count for GPUs and Gaudi",
                ),
                cel(
                    "self.capacity != 'reservation' || has(self.reservationName)",
                    "capacity reservation needs reservationName",
                ),
            ]
        }
    }

    type: AcceleratorType
    topology: str | None = Field(
        default=None, pattern=r"^[0-9]+x[0-9]+(x[0-9]+)?$", description="TPU slice topology, e.g. 2x2x1."
    )
    count: int | None = Field(
        default=None, ge=1, le=4096, description="Chips for GPUs/Gaudi; left out, the planner picks."
    )
    capacity: Capacity = Capacity.ON_DEMAND
    reservation_name: str | None = None

    @model_validator(mode="after")
    def _check_shape(self) -> Accelerator:
        is_tpu = self.type.value.startswith("tpu-")
        if is_tpu and self.count is not None:
            raise ValueError("TPU slices are sized by topology, not count")
        if not is_tpu and self.topology is not None:
            raise ValueError("topology applies only to TPU types; use count for GPUs and Gaudi")
        if self.capacity == Capacity.RESERVATION and not self.reservation_name:
            raise ValueError("capacity reservation needs reservationName")
        return self


class PriceSource(StrEnum):
    CATALOG = "catalog"
    CUSTOM = "custom"


class Pricing(ApiModel):
    """Catalog price for the chosen capacity (on-demand or spot), or a custom $/chip-hour."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "self.source != 'custom' || has(self.dollarsPerChipHour)",
                    "pricing source custom needs dollarsPerChipHour",
                )
            ]
        }
    }

    source: PriceSource = PriceSource.CATALOG
    dollars_per_chip_hour: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _custom_needs_price(self) -> Pricing:
        if self.source == PriceSource.CUSTOM and self.dollars_per_chip_hour is None:
            raise ValueError("pricing source custom needs dollarsPerChipHour")
        return self


class EnvVar(ApiModel):
    name: str = Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str = ""


class Resources(ApiModel):
    """Overrides for the worker container's requests and limits (quantities as strings)."""

    requests: dict[str, str] | None = None
    limits: dict[str, str] | None = None


class Toleration(ApiModel):
    key: str | None = None
    operator: str = Field(default="Equal", pattern="^(Equal|Exists)$")
    value: str | None = None
    effect: str | None = Field(default=None, pattern="^(NoSchedule|PreferNoSchedule|NoExecute)$")
    toleration_seconds: int | None = None


class Scheduling(ApiModel):
    """Extra placement on top of the accelerator's own (for a cluster's custom labels and taints)."""

    node_selector: dict[str, str] = Field(default_factory=dict, description="Merged over the catalog's.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Added to the catalog's.")
    priority_class_name: str | None = None


class RunControl(ApiModel):
    """Batch knobs shared by both kinds; they map onto the child Job."""

    queue_name: str | None = Field(default=None, description="Kueue LocalQueue; the Job starts suspended.")
    suspend: bool = False
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    max_retries: int = Field(default=2, ge=0, le=100, description="Job backoffLimit for real failures.")
    scheduling: Scheduling | None = None
