"""The ENV_JOB payload (api/payload.py): the resource's spec and the worker's share of its plan.

Inline in one env var rather than a mounted ConfigMap, so the local executor (`accelbench run`) can
start a worker with the same contract and no volumes.
"""

from __future__ import annotations

from ..api import Resource
from ..api.common import RunControl
from ..api.payload import JobPayload, PayloadMetadata
from ..plan.types import Plan


def build_job_payload(resource: Resource, plan: Plan) -> JobPayload:
    meta = resource.metadata
    spec = resource.spec
    # The Job-only knobs at their defaults: an edit of one (spec.suspend) must not change the pod
    # template, which a Job does not let change.
    defaults = {name: type(spec).model_fields[name].default for name in RunControl.JOB_ONLY_FIELDS}
    return JobPayload(
        kind=resource.kind,
        metadata=PayloadMetadata(name=meta.name, namespace=meta.namespace, uid=meta.uid),
        spec=spec.model_copy(update=defaults),
        plan=plan.worker_plan(),
    )


def job_payload_json(resource: Resource, plan: Plan) -> str:
    return build_job_payload(resource, plan).to_json()
