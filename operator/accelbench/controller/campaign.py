"""One pass over a BenchCampaign: create the runs its budget admits, write its status.

The decisions are campaign/plan.py's (pure); this module does the I/O: a `create` per admitted
cell (never an apply: a run that exists, ours or not, is never changed), one conditional status
write. A run's events wake its campaign (handlers.py), so rows follow their runs within a pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from ..api.campaign import BenchCampaign, CellSummary
from ..api.errors import describe
from ..api.status import ConditionType
from ..campaign.plan import plan_campaign
from .cache import is_controlled_by
from .conditions import conditions_to_wire, make_condition, merge_conditions, now_rfc3339, parse_conditions
from .kube import api_error_message
from .reconciler import Outcome, Snapshot, write_status
from .state import ControllerState
from .status import status_patch

log = logging.getLogger(__name__)

RUNNING_PASS_S = 30.0  # runs' events wake the campaign; this only bounds a missed one
STALLED_PASS_S = 60.0  # budget held: a cell that ends (an event) frees it sooner


def campaign_conditions(
    status: Mapping[str, Any], generation: int | None, now: datetime
) -> list[dict[str, Any]]:
    """kstatus: Ready once every cell ended, Stalled when it cannot go on, Reconciling otherwise."""
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


def _ours(state: ControllerState, manifest: Mapping[str, Any], uid: str | None) -> bool:
    meta = manifest["metadata"]
    try:
        found = state.kube.get(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
    except (ApiException, HTTPError, OSError):
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
        for manifest in planned.create:
            run = f"{manifest['kind']}/{manifest['metadata']['name']}"
            try:
                state.kube.create(manifest)
                log.info("%s/%s: created %s", namespace, name, run)
            except ApiException as exc:
                if exc.status == 409:
                    if _ours(state, manifest, meta.get("uid")):
                        continue  # made by an earlier pass, not in the index yet
                    desired["phase"] = "Stalled"  # never touched: someone else's object
                    desired["message"] = f"NameConflict: {run} exists and is not this campaign's"
                    continue
                log.warning("%s/%s: creating %s failed: %s", namespace, name, run, api_error_message(exc))
                outcome = Outcome("retry", retry=True)
            except (HTTPError, OSError) as exc:
                log.warning("%s/%s: creating %s failed: %s", namespace, name, run, exc)
                outcome = Outcome("retry", retry=True)
        if outcome.label != "retry":
            if desired.get("phase") == "Running":
                outcome = Outcome("campaign", requeue_after=RUNNING_PASS_S)
            elif desired.get("phase") == "Stalled":
                outcome = Outcome("campaign", requeue_after=STALLED_PASS_S)
    desired["conditions"] = campaign_conditions({**stored, **desired}, generation, now)
    patch = status_patch(stored, desired)
    return write_status(state, snap.key, body, patch) or outcome
