"""$ per chip-hour for a plan, and a price_source string that says where it came from."""

from __future__ import annotations

from ..api.common import Capacity, PriceSource, Pricing
from ..catalog import AcceleratorSpec


def price_for(
    pricing: Pricing, capacity: Capacity, accel: AcceleratorSpec
) -> tuple[float | None, str, list[str]]:
    """(dollars per chip-hour, price source, notes) for the spec's pricing and capacity; None
    dollars when the catalog has no price for the accelerator (cost unavailable, never $0).

    custom: the spec's figure. catalog: the spot price for spot capacity when the catalog has one,
    otherwise on-demand; a reservation is priced at on-demand because its discount is contractual
    and not in any public price book. The notes say when such a substitution happened.
    """
    if pricing.source == PriceSource.CUSTOM:
        # The API refuses custom pricing without a figure, so it is set here.
        return float(pricing.dollars_per_chip_hour or 0.0), "custom", []
    price = accel.price
    notes: list[str] = []
    if capacity == Capacity.SPOT and price.spot is not None:
        return price.spot, f"catalog {accel.name} spot, {price.source}, {price.date}", notes
    if capacity == Capacity.SPOT:
        notes.append(
            f"the catalog has no spot price for {accel.name}: cost uses on-demand; "
            "set one in the prices ConfigMap"
        )
    elif capacity == Capacity.RESERVATION:
        notes.append(
            "reservation capacity is priced at the on-demand list price; use custom pricing for your rate"
        )
    if is_unpriced(price.on_demand):
        notes.append(
            f"the catalog has no price for {accel.name}: cost shows as unavailable until the prices "
            "ConfigMap sets one"
        )
    return price.on_demand, f"catalog {accel.name} on-demand, {price.source}, {price.date}", notes


def is_unpriced(dollars_per_chip_hour: float | None) -> bool:
    """No price known: the run's cost is unavailable (not $0), so a dollar budget cannot bound it.
    A local CPU is free ($0 from its catalog entry), which is a price."""
    return dollars_per_chip_hour is None
