"""The resource as a user wrote it, and a refusal of it as a sentence a user can act on. Pure."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from ..api import GROUP
from ..api.errors import describe

# Annotations kopf itself writes with our prefix; they are bookkeeping, not part of the manifest.
KOPF_ANNOTATIONS = (
    f"{GROUP}/last-handled-configuration",
    f"{GROUP}/kopf-managed",
    f"{GROUP}/ensure_children",
)
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"


def manifest_of(body: Mapping[str, Any]) -> dict[str, Any]:
    """Spec and identity, without status, kubectl's and kopf's bookkeeping."""
    meta = body.get("metadata") or {}
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not k.startswith(KOPF_ANNOTATIONS) and k != LAST_APPLIED_ANNOTATION
    }
    plain_meta = {
        k: copy.deepcopy(meta[k]) for k in ("name", "namespace", "uid", "generation", "labels") if k in meta
    }
    plain_meta["annotations"] = annotations
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": plain_meta,
        "spec": copy.deepcopy(dict(body.get("spec") or {})),
    }


def spec_error_message(exc: BaseException) -> str:
    """What is wrong with the spec, as text for status.message and the event.

    Pydantic errors read field by field in manifest (camelCase) paths:
    `metadata.name: String should have at most 52 characters`; an unknown accelerator reads as
    the catalog's message (a KeyError carries it as its argument).
    """
    if isinstance(exc, ValidationError):
        return describe(exc)
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc)
