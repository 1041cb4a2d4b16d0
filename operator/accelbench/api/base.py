"""Base model for every API object: camelCase on the wire, unknown fields refused."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

GROUP = "accelbench.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
INT64_MAX = 2**63 - 1  # the apiserver stores integers as int64: a larger one fails the status write


def _in_int64(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ValueError(f"{value} does not fit a 64-bit integer")
    if isinstance(value, list | tuple):
        for item in value:
            _in_int64(item)
    elif isinstance(value, dict):
        for item in value.values():
            _in_int64(item)
    return value


def to_camel(name: str) -> str:
    """snake_case -> camelCase by word: `e2e_ms` -> `e2eMs` (pydantic's would give `e2EMs`)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class ApiModel(BaseModel):
    """Fields are snake_case in Python and camelCase in manifests, like every Kubernetes API."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        # NaN and infinities have no JSON form the apiserver accepts; they are refused where they
        # enter (a spec, a worker report, a scraped page), never met in a status write.
        allow_inf_nan=False,
    )

    @field_validator("*", mode="after")
    @classmethod
    def _int64(cls, value: Any) -> Any:
        return _in_int64(value)

    def to_wire(self) -> dict[str, Any]:
        """The manifest form: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def cel(rule: str, message: str) -> dict[str, str]:
    """One CEL rule for `x-kubernetes-validations`, checked by the apiserver itself."""
    return {"rule": rule, "message": message}
