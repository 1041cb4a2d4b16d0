"""Spec parts shared by FinetuneJob and InferenceBench."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, Field, model_validator

from .base import ApiModel, cel

# Where a model, dataset or output lives: pvc://CLAIM[/PATH] (a DNS-1123 claim name),
# gs://BUCKET[/PATH] or s3://BUCKET[/PATH] (3-223 characters of bucket name), file:///PATH, or a
# path without a scheme (in the image, or a Hub id for a serving engine). Anything else (http://,
# a typo like gcs://, pvc:/x) is refused at admission by the same rule the API server checks.
# Sanity bounds where a typo would otherwise reach the planner or the cost: the dearest chip-hour on
# any price list today is tens of dollars; the largest models have trillions of parameters.
MAX_DOLLARS_PER_CHIP_HOUR = 1000.0
MAX_PARAMETERS = 10**15

STORAGE_URI_PATTERN = (
    r"^(pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/.*)?"
    r"|(gs|s3)://[a-z0-9][-a-z0-9_.]{1,221}[a-z0-9](/.*)?"
    r"|file:///.*"
    r"|[^:]+)$"
)
STORAGE_URI_MESSAGE = "must be pvc://CLAIM/PATH, gs://BUCKET/PATH, s3://BUCKET/PATH, file:///PATH or a path"


def check_storage_uri(value: str) -> str:
    if not re.fullmatch(STORAGE_URI_PATTERN, value):
        raise ValueError(f"{value!r} {STORAGE_URI_MESSAGE}")
    return value


StorageUri = Annotated[str, AfterValidator(check_storage_uri)]


def storage_uri_field(description: str, **extra: Any) -> Any:
    """A StorageUri field: the same rule in pydantic and, as CEL, in the CRD."""
    rule = cel(f"self.matches('{STORAGE_URI_PATTERN}')", f"uri {STORAGE_URI_MESSAGE}")
    return Field(
        min_length=1,
        max_length=2048,
        description=description,
        json_schema_extra={"x-kubernetes-validations": [rule]},
        **extra,
    )


class AcceleratorType(StrEnum):
    """Accelerator kinds the catalog knows; each maps to a node pool shape (see catalog/data)."""

    TPU_V5E = "tpu-v5e"
    TPU_V5P = "tpu-v5p"
    TPU_V6E = "tpu-v6e"
    H100 = "h100"
    H100_MEGA = "h100-mega"
    H200 = "h200"
    A100 = "a100"
    A100_80GB = "a100-80gb"
    V100 = "v100"
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

    uri: StorageUri = storage_uri_field(
        "Hugging Face-format model directory: pvc://CLAIM/PATH, gs://, s3://, or a local path."
    )
    family: ModelFamily = Field(description="Architecture family; selects the JAX model and the bridge.")
    size: str | None = Field(
        default=None,
        pattern=r"^([0-9]+(\.[0-9]+)?[mMbB]|tiny)$",
        max_length=12,  # 400 digits once overflowed the planner; no model has more than 999999b
        description="Parameter count such as 31b or 270m (tiny: test shapes); the catalog gives the shape.",
    )
    parameters: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PARAMETERS,
        description="Exact parameter count; overrides size for memory and FLOPs.",
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
    dollars_per_chip_hour: float | None = Field(default=None, ge=0, le=MAX_DOLLARS_PER_CHIP_HOUR)

    @model_validator(mode="after")
    def _custom_needs_price(self) -> Pricing:
        if self.source == PriceSource.CUSTOM and self.dollars_per_chip_hour is None:
            raise ValueError("pricing source custom needs dollarsPerChipHour")
        return self


DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"  # the names of Secrets, ConfigMaps, ServiceAccounts


class KeyRef(ApiModel):
    """One key of a Secret or ConfigMap in the resource's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    optional: bool | None = None


class EnvVarSource(ApiModel):
    """Where a variable's value comes from, so a secret (e.g. a Hugging Face token) is never written
    in the spec, the payload, the status or the operator's annotations: only its name is."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "has(self.secretKeyRef) != has(self.configMapKeyRef)",
                    "valueFrom takes exactly one of secretKeyRef, configMapKeyRef",
                )
            ]
        }
    }

    secret_key_ref: KeyRef | None = None
    config_map_key_ref: KeyRef | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise ValueError("valueFrom takes exactly one of secretKeyRef, configMapKeyRef")
        return self


class EnvVar(ApiModel):
    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both")
            ]
        }
    }

    name: str = Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    value_from: EnvVarSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError("set value or valueFrom, not both")
        return self

    def to_container_env(self) -> dict[str, Any]:
        """The Kubernetes EnvVar: the value, or the reference the kubelet resolves in the pod."""
        if self.value_from is not None:
            return {"name": self.name, "valueFrom": self.value_from.to_wire()}
        return {"name": self.name, "value": self.value or ""}


class ObjectRef(ApiModel):
    """A Secret or ConfigMap in the resource's namespace, by name."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    optional: bool | None = None


class EnvFromSource(ApiModel):
    """Every key of a Secret or ConfigMap as a variable, resolved by the kubelet in the pod: the
    values never pass through the spec, the payload, the status or the operator."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "has(self.secretRef) != has(self.configMapRef)",
                    "envFrom takes exactly one of secretRef, configMapRef",
                )
            ]
        }
    }

    prefix: str | None = Field(default=None, max_length=64, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    secret_ref: ObjectRef | None = None
    config_map_ref: ObjectRef | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvFromSource:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError("envFrom takes exactly one of secretRef, configMapRef")
        return self


class PullSecret(ApiModel):
    """A docker-registry Secret in the resource's namespace, for a private worker or engine image."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)


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

    # Fields only the Job itself reads; the worker never does. The payload a pod gets carries their
    # defaults, so editing one (suspend a running run) changes the Job, not its immutable template.
    JOB_ONLY_FIELDS: ClassVar[tuple[str, ...]] = (
        "queue_name",
        "suspend",
        "active_deadline_seconds",
        "ttl_seconds_after_finished",
        "max_retries",
    )

    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="ServiceAccount of the worker (and server) pods: the identity GKE Workload Identity or "
        "IRSA maps to cloud credentials, e.g. for gs:// models, data and outputs. No keys in the spec.",
    )

    image_pull_secrets: list[PullSecret] = Field(
        default_factory=list, max_length=16, description="For every pod of the run (private images)."
    )
    queue_name: str | None = Field(default=None, description="Kueue LocalQueue; the Job starts suspended.")
    suspend: bool = False
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the run's Jobs (and their pods) this long after it ended. The operator does "
        "it once the result is stored in status; the resource and its status stay.",
    )
    max_retries: int = Field(default=2, ge=0, le=100, description="Job backoffLimit for real failures.")
    scheduling: Scheduling | None = None
