"""The two custom resources as whole objects (apiVersion, kind, metadata, spec, status)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from .base import API_VERSION, ApiModel
from .finetune import FinetuneJobSpec
from .inference import InferenceBenchSpec
from .status import FinetuneJobStatus, InferenceBenchStatus

# A run's children are named <name>-train, <name>-results, ...; an Indexed Job's pods get the
# hostname <name>-train-<index>, capped at 63 with indexes up to 4 digits; Services need DNS-1035
# labels. A name that cannot make its children is refused (the CRD's rule says so at admission).
MAX_NAME_LENGTH = 52
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class ObjectMeta(ApiModel):
    """Only what the project reads; the rest of metadata is kept as given."""

    model_config = ApiModel.model_config | {"extra": "allow"}

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class FinetuneJob(ApiModel):
    KIND: ClassVar[str] = "FinetuneJob"
    PLURAL: ClassVar[str] = "finetunejobs"
    SHORT_NAMES: ClassVar[list[str]] = ["ftj", "ft"]

    api_version: Literal["accelbench.io/v1alpha1"] = API_VERSION
    kind: Literal["FinetuneJob"] = "FinetuneJob"
    metadata: ObjectMeta
    spec: FinetuneJobSpec
    status: FinetuneJobStatus | None = None


class InferenceBench(ApiModel):
    KIND: ClassVar[str] = "InferenceBench"
    PLURAL: ClassVar[str] = "inferencebenches"
    SHORT_NAMES: ClassVar[list[str]] = ["ib", "ibench"]

    api_version: Literal["accelbench.io/v1alpha1"] = API_VERSION
    kind: Literal["InferenceBench"] = "InferenceBench"
    metadata: ObjectMeta
    spec: InferenceBenchSpec
    status: InferenceBenchStatus | None = None


Resource = FinetuneJob | InferenceBench
KINDS: dict[str, type[FinetuneJob] | type[InferenceBench]] = {
    FinetuneJob.KIND: FinetuneJob,
    InferenceBench.KIND: InferenceBench,
}


def parse_resource(obj: dict[str, Any]) -> Resource:
    """A manifest dict -> its typed resource. Raises ValueError with a readable message."""
    if not isinstance(obj, dict):
        raise ValueError("a manifest must be a mapping with apiVersion, kind, metadata and spec")
    kind = obj.get("kind")
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {sorted(KINDS)}")
    if obj.get("apiVersion") != API_VERSION:
        raise ValueError(f"apiVersion must be {API_VERSION}, got {obj.get('apiVersion')!r}")
    return KINDS[kind].model_validate(obj)
