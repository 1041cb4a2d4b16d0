"""Runs as the operator's status leaves them, for the campaign planner's and report's tests."""

from __future__ import annotations

import copy
from typing import Any


def run_of(
    manifest: dict[str, Any],
    phase: str = "Succeeded",
    dollars: float = 1.0,
    chips: int = 1,
    price: float = 1.0,
    **results: Any,
) -> dict[str, Any]:
    """`manifest` (a run a campaign pass made) once it ended: cost and results in its status."""
    run = copy.deepcopy(manifest)
    run["status"] = {
        "phase": phase,
        "accelerator": manifest["spec"]["accelerator"]["type"],
        "cost": {
            "dollars": dollars,
            "chips": chips,
            "hours": dollars / (chips * price),
            "dollarsPerChipHour": price,
        },
        "results": results,
    }
    return run


def by_accelerator(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {m["spec"]["accelerator"]["type"]: m for m in manifests if m["kind"] == kind}
