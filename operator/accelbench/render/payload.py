"""The ACCELBENCH_JOB payload: everything a worker needs, inline in one env var.

Inline rather than a mounted ConfigMap so the local executor (`accelbench run`) can start a worker
with the same contract and no volumes. Shape (compact JSON):

    {"apiVersion": ..., "kind": ..., "metadata": {"name", "namespace", "uid"},
     "spec": <the spec in manifest form>, "plan": <Plan fields, camelCase>}

`{apiVersion, kind, metadata, spec}` parses back with `api.parse_resource`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pydantic.alias_generators import to_camel

from ..api import Resource
from ..plan.types import Plan

JOB_ENV = "ACCELBENCH_JOB"


def plan_to_wire(plan: Plan) -> dict[str, Any]:
    """Plan (a dataclass, nested MemoryEstimate included) with camelCase keys like the API."""
    return _camel_keys(dataclasses.asdict(plan))


def _camel_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {to_camel(k): _camel_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_camel_keys(v) for v in value]
    return value


def build_job_payload(resource: Resource, plan: Plan) -> dict[str, Any]:
    meta = resource.metadata
    metadata = {k: v for k, v in (("name", meta.name), ("namespace", meta.namespace), ("uid", meta.uid)) if v}
    return {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": metadata,
        "spec": resource.spec.to_wire(),
        "plan": plan_to_wire(plan),
    }


def job_payload_json(resource: Resource, plan: Plan) -> str:
    # Compact and NaN-free: it is parsed by json.loads in the worker and must stay byte-stable
    # for golden tests and for server-side apply to see no change on re-render.
    return json.dumps(build_job_payload(resource, plan), separators=(",", ":"), allow_nan=False)
