"""Which chip counts an accelerator can be asked for, and how they land on hosts."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import AcceleratorSpec
from .types import PlanError

MAX_CHIPS = 4096  # the API's upper bound on accelerator.count


@dataclass(frozen=True)
class Placement:
    chips: int
    hosts: int
    chips_per_host: int
    topology: str | None = None

    def describe(self) -> str:
        """'2x2x2 (8 chips)' for a TPU slice, '4' for a GPU count: how a spec asks for it."""
        return f"{self.topology} ({self.chips} chips)" if self.topology else str(self.chips)


def candidate_placements(accel: AcceleratorSpec, single_host: bool = False) -> list[Placement]:
    """Every placement the accelerator allows, fewest chips first.

    TPU: the catalog's slice shapes. GPU/Gaudi/CPU: the single-host counts (1, 2, 4, 8), then whole
    hosts (multiples of max_chips_per_host), because a partial host in a multi-host job would
    leave chips idle that the job still pays for.
    """
    if accel.is_tpu:
        slices = sorted(accel.topologies, key=lambda t: t.chips)
        return [
            Placement(t.chips, t.hosts, t.chips_per_host, t.topology)
            for t in slices
            if not single_host or t.hosts == 1
        ]
    per_host = accel.max_chips_per_host
    placements = [Placement(n, 1, n) for n in sorted(accel.chips_per_host_options)]
    if single_host or accel.resource_name is None:
        return placements
    placements += [
        Placement(n, n // per_host, per_host) for n in range(2 * per_host, MAX_CHIPS + 1, per_host)
    ]
    return placements


def placement_for_count(accel: AcceleratorSpec, count: int) -> Placement:
    """A GPU/Gaudi/CPU count as asked; PlanError names the counts that are allowed."""
    for placement in candidate_placements(accel):
        if placement.chips == count:
            return placement
    options = ", ".join(map(str, sorted(accel.chips_per_host_options)))
    multi = (
        "" if accel.resource_name is None else f", or a multiple of {accel.max_chips_per_host} across hosts"
    )
    raise PlanError(f"{accel.name} runs on {options} chips per host{multi}; spec asks {count}")


def placement_for_topology(accel: AcceleratorSpec, topology: str) -> Placement:
    """A TPU slice shape as asked; PlanError lists the shapes this TPU type has."""
    found = accel.topology(topology)
    if found is None:
        valid = ", ".join(
            f"{t.topology} ({t.chips} chips, {t.hosts} host{'s' if t.hosts > 1 else ''})"
            for t in accel.topologies
        )
        raise PlanError(f"topology {topology} is not valid for {accel.name}; valid topologies: {valid}")
    return Placement(found.chips, found.hosts, found.chips_per_host, found.topology)


def placement_with_chips(accel: AcceleratorSpec, chips: int) -> Placement:
    """The placement with exactly `chips` chips (explicit parallelism fixes the count)."""
    for placement in candidate_placements(accel):
        if placement.chips == chips:
            return placement
    counts = ", ".join(str(p.chips) for p in candidate_placements(accel)[:12])
    raise PlanError(
        f"{accel.name} has no placement with exactly {chips} chips; possible counts start {counts}"
    )


def requested_placement(accel: AcceleratorSpec, count: int | None, topology: str | None) -> Placement | None:
    """What the spec pins, checked against the catalog; None when the planner may choose."""
    if accel.is_tpu:
        if count is not None:
            raise PlanError(f"{accel.name} slices are sized by topology, not count")
        return placement_for_topology(accel, topology) if topology else None
    if topology is not None:
        raise PlanError(f"topology applies only to TPU types; use count for {accel.name}")
    return placement_for_count(accel, count) if count is not None else None
