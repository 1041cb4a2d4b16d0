"""Conditions as the Kubernetes API conventions define them, merged without churning timestamps.

lastTransitionTime moves only when a condition's status flips, so `kubectl describe` tells a user how
long something has been true, and an unchanged observation never rewrites the status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from accelbench.api.status import Condition


def now_rfc3339(at: datetime | None = None) -> str:
    """Second precision with a Z, the form the apiserver writes for metav1.Time."""
    moment = (at or datetime.now(UTC)).astimezone(UTC)
    return moment.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_condition(
    type_: str, status: bool | str, reason: str, message: str = "", generation: int | None = None
) -> Condition:
    """A condition without a transition time; merging stamps it."""
    if isinstance(status, bool):
        status = "True" if status else "False"
    return Condition(
        type=type_, status=status, reason=reason, message=message, observed_generation=generation
    )


def parse_conditions(raw: Iterable[Mapping[str, Any]] | None) -> list[Condition]:
    """Conditions from a status dict; entries that do not validate are dropped rather than crashing."""
    parsed: list[Condition] = []
    for item in raw or ():
        try:
            parsed.append(Condition.model_validate(dict(item)))
        except (ValueError, TypeError):
            continue  # a hand-edited status must not wedge reconciliation
    return parsed


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(conditions: Sequence[Condition], new: Condition, *, now: str) -> list[Condition]:
    """Put `new` in place of the condition of its type (or append it), keeping the list order.

    The transition time is carried over when the status did not change; reason, message and
    observedGeneration always take the new values.
    """
    old = find_condition(conditions, new.type)
    keep_time = old is not None and old.status == new.status and old.last_transition_time
    stamped = new.model_copy(update={"last_transition_time": old.last_transition_time if keep_time else now})
    if old is None:
        return [*conditions, stamped]
    return [stamped if c.type == new.type else c for c in conditions]


def merge_conditions(
    conditions: Sequence[Condition], desired: Iterable[Condition], *, now: str
) -> list[Condition]:
    """Apply every desired condition in turn; types not mentioned are left as they are."""
    merged = list(conditions)
    for condition in desired:
        merged = set_condition(merged, condition, now=now)
    return merged


def remove_condition(conditions: Sequence[Condition], type_: str) -> list[Condition]:
    return [c for c in conditions if c.type != type_]


def conditions_to_wire(conditions: Iterable[Condition]) -> list[dict[str, Any]]:
    return [c.to_wire() for c in conditions]
