"""One pass over a BenchCampaign: create the runs its budget admits, write its status.

The decisions are campaign/plan.py's (pure); this module does the I/O: a `create` per admitted
cell (never an apply: a run that exists, ours or not, is never changed), one conditional status
write. A run's events wake its campaign (handlers.py), so rows follow their runs within a pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from ..api.campaign import BenchCampaign, CellSummary
from ..api.errors import describe
from ..api.status import ConditionType, Reason
from ..campaign.artifact import ArtifactError, artifact_document, artifact_uri, write_artifact
from ..campaign.plan import plan_campaign, with_rejected
from ..kubeapi import ApiError
from .cache import is_controlled_by
from .conditions import conditions_to_wire, make_condition, merge_conditions, now_rfc3339, parse_conditions
from .kube import api_error_message
from .reconciler import Outcome, Snapshot, write_status
from .state import ControllerState
from .status import status_patch

log = logging.getLogger(__name__)

RUNNING_PASS_S = 30.0  # runs' events wake the campaign; this only bounds a missed one
STALLED_PASS_S = 60.0  # budget held: a cell that ends (an event) frees it sooner
ARTIFACT_RETRY_S = 60.0  # a store that refused or failed: tried again, the campaign stays Finished
# The apiserver refused the manifest itself (a CRD rule, a schema): the same spec is refused again,
# so the cell is shown Invalid with the apiserver's message instead of retried ever after.
REFUSED_MANIFEST = (400, 422)


def campaign_conditions(
    status: Mapping[str, Any],
    generation: int | None,
    now: datetime,
    artifact: ArtifactWrite | None = None,
) -> list[dict[str, Any]]:
    """kstatus: Ready once every cell ended, Stalled when it cannot go on, Reconciling otherwise;
    Regressed with a baseline; ArtifactWritten once a results artifact was tried."""
    phase, message = status.get("phase"), str(status.get("message") or "")
    reason = {"Finished": "CellsFinished", "Stalled": "CannotProceed", "Running": "CellsRunning"}.get(
        str(phase), "Pending"
    )
    desired = [
        make_condition(ConditionType.READY.value, phase == "Finished", reason, message, generation),
        make_condition(ConditionType.RECONCILING.value, phase == "Running", reason, message, generation),
        make_condition(ConditionType.STALLED.value, phase == "Stalled", reason, message, generation),
    ]
    regressions = status.get("regressions") or []
    if status.get("baseline"):
        desired.append(
            make_condition(
                ConditionType.REGRESSED.value,
                bool(regressions),
                "BeyondThreshold" if regressions else "WithinThreshold",
                "; ".join(regressions)[:1024] or f"no cell worse than its baseline ({status['baseline']})",
                generation,
            )
        )
    if artifact is not None:
        desired.append(
            make_condition(
                ConditionType.ARTIFACT_WRITTEN.value,
                artifact.error is None,
                (Reason.ARTIFACT_STORED if artifact.error is None else Reason.ARTIFACT_WRITE_FAILED).value,
                artifact.error or str(status.get("artifact") or ""),
                generation,
            )
        )
    merged = merge_conditions(parse_conditions(status.get("conditions")), desired, now=now_rfc3339(now))
    return conditions_to_wire(merged)


def baseline_summary(body: Mapping[str, Any] | None) -> list[CellSummary] | None:
    """The per-cell summary an earlier campaign's status holds; entries that do not parse are left out
    (a hand-edited or older status must not stop this campaign)."""
    if body is None:
        return None
    out = []
    for entry in (body.get("status") or {}).get("summary") or []:
        try:
            out.append(CellSummary.model_validate(entry))
        except ValidationError:
            continue
    return out


@dataclass(frozen=True)
class ArtifactWrite:
    uri: str
    error: str | None = None  # why the store refused or failed; tried again later


def write_campaign_artifact(
    campaign: BenchCampaign,
    body: Mapping[str, Any],
    status: Mapping[str, Any],
    runs: Sequence[Mapping[str, Any]],
    state: ControllerState,
    now: datetime,
) -> ArtifactWrite | None:
    """Once the campaign has settled (every cell ended, or the budget stopped it with nothing
    running), its results document goes to spec.artifactUri; again when it settles again after a
    Git edit or a larger budget ran more cells. None when there is nothing to do."""
    base, phase = campaign.spec.artifact_uri, status.get("phase")
    totals = status.get("totals") or {}
    creating = any(row.get("phase") == "Creating" for row in status.get("cells") or [])
    settled = phase == "Finished" or (phase == "Stalled" and not totals.get("running") and not creating)
    if base is None or not settled:
        return None
    target = artifact_uri(base, campaign.metadata.name)
    stored = body.get("status") or {}
    if stored.get("artifact") == target and stored.get("phase") == phase and stored.get("totals") == totals:
        return None  # written when it settled; nothing has run since
    document = artifact_document({**body, "status": dict(status)}, runs, now_rfc3339(now), state.cluster)
    try:
        write_artifact(target, document)
    except ArtifactError as exc:
        log.warning(
            "%s/%s: results not written: %s", campaign.metadata.namespace, campaign.metadata.name, exc
        )
        return ArtifactWrite(target, str(exc)[:1024])
    log.info("%s/%s: results written to %s", campaign.metadata.namespace, campaign.metadata.name, target)
    return ArtifactWrite(target)


def _ours(state: ControllerState, manifest: Mapping[str, Any], uid: str | None) -> bool:
    meta = manifest["metadata"]
    try:
        found = state.kube.get(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
    except (ApiError, HTTPError, OSError):
        return True  # cannot tell now: the next pass looks again, nothing was changed
    return found is not None and is_controlled_by(found, uid)


def reconcile_campaign(snap: Snapshot, state: ControllerState, now: datetime) -> Outcome:
    _, namespace, name = snap.key
    body = snap.body
    if body is None:
        return Outcome("gone")
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return Outcome("deleting")  # its runs go with it (ownerReferences)
    stored: dict[str, Any] = dict(body.get("status") or {})
    generation = meta.get("generation")
    outcome = Outcome("campaign")
    artifact: ArtifactWrite | None = None
    try:
        campaign = BenchCampaign.model_validate(body)
    except ValidationError as exc:
        desired: dict[str, Any] = {
            "phase": "Stalled",
            "message": describe(exc)[:1024],
            "observedGeneration": generation,
        }
    else:
        planned = plan_campaign(campaign, snap.runs, state.catalog(), now, baseline_summary(snap.baseline))
        desired = planned.status
        rejected: dict[str, str] = {}
        for manifest in planned.create:
            run = f"{manifest['kind']}/{manifest['metadata']['name']}"
            try:
                state.kube.create(manifest)
                log.info("%s/%s: created %s", namespace, name, run)
            except ApiError as exc:
                if exc.status == 409:
                    if _ours(state, manifest, meta.get("uid")):
                        continue  # made by an earlier pass, not in the index yet
                    desired["phase"] = "Stalled"  # never touched: someone else's object
                    desired["message"] = f"NameConflict: {run} exists and is not this campaign's"
                    continue
                log.warning("%s/%s: creating %s failed: %s", namespace, name, run, api_error_message(exc))
                if exc.status in REFUSED_MANIFEST:
                    rejected[manifest["metadata"]["name"]] = api_error_message(exc)
                    continue
                outcome = Outcome("retry", retry=True)
            except (HTTPError, OSError) as exc:
                log.warning("%s/%s: creating %s failed: %s", namespace, name, run, exc)
                outcome = Outcome("retry", retry=True)
        desired = with_rejected(desired, rejected)
        artifact = write_campaign_artifact(campaign, body, {**stored, **desired}, snap.runs, state, now)
        if artifact is not None and artifact.error is None:
            desired["artifact"] = artifact.uri
        elif artifact is not None and outcome.label != "retry":
            outcome = Outcome("campaign", requeue_after=ARTIFACT_RETRY_S)
        if outcome.label != "retry" and outcome.requeue_after is None:
            if desired.get("phase") == "Running":
                outcome = Outcome("campaign", requeue_after=RUNNING_PASS_S)
            elif desired.get("phase") == "Stalled":
                outcome = Outcome("campaign", requeue_after=STALLED_PASS_S)
    desired["conditions"] = campaign_conditions({**stored, **desired}, generation, now, artifact)
    patch = status_patch(stored, desired, whole_maps=True)  # waiting, winners: cells come and go
    return write_status(state, snap.key, body, patch, outcome)[0]
