"""Base model for every API object: camelCase on the wire, unknown fields refused."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

GROUP = "accelbench.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


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
    )

    def to_wire(self) -> dict[str, Any]:
        """The manifest form: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def cel(rule: str, message: str) -> dict[str, str]:
    """One CEL rule for `x-kubernetes-validations`, checked by the apiserver itself."""
    return {"rule": rule, "message": message}
