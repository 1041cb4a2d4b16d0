"""The ENV_JOB payload (api/payload.py): the resource's spec and the worker's share of its plan.

Inline in one env var rather than a mounted ConfigMap, so the local executor (`accelbench run`) can
start a worker with the same contract and no volumes.
"""

from __future__ import annotations

from ..api import Resource
from ..api.payload import JobPayload, PayloadMetadata
from ..plan.types import Plan


def build_job_payload(resource: Resource, plan: Plan) -> JobPayload:
    meta = resource.metadata
    return JobPayload(
        kind=resource.kind,
        metadata=PayloadMetadata(name=meta.name, namespace=meta.namespace, uid=meta.uid),
        spec=resource.spec,
        plan=plan.worker_plan(),
    )


def job_payload_json(resource: Resource, plan: Plan) -> str:
    return build_job_payload(resource, plan).to_json()
