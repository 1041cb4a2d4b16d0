"""Active/standby through a Lease: one holder at a time, takeover only after a full unrenewed duration
measured on the standby's own clock, a clean stop hands over at once, a stale write is refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from accelbench.controller import leader
from accelbench.controller.leader import DURATION_S, LeaderElector
from accelbench.kubeapi import ApiError


class LeaseStore:
    """The apiserver's part: create refuses an existing name, replace refuses an old resourceVersion."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.version = 0

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.obj)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self.obj is not None:
            raise ApiError(status=409, reason="AlreadyExists")
        return self._store(obj)

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        if (
            self.obj is None
            or obj["metadata"].get("resourceVersion") != self.obj["metadata"]["resourceVersion"]
        ):
            raise ApiError(status=409, reason="Conflict")
        return self._store(obj)

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.obj = copy.deepcopy(obj)
        self.obj["metadata"]["resourceVersion"] = str(self.version)
        return self.obj

    @property
    def holder(self) -> str:
        return (self.obj or {}).get("spec", {}).get("holderIdentity", "")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(leader.time, "monotonic", lambda: now[0])
    return now


def test_one_holder_and_takeover_only_after_a_full_duration(clock: list[float]) -> None:
    store = LeaseStore()
    a = LeaderElector(store, "ops", "accelbench", "a")
    b = LeaderElector(store, "ops", "accelbench", "b")
    assert a.try_acquire_or_renew() and store.holder == "a"
    assert not b.try_acquire_or_renew()  # held and fresh
    clock[0] += DURATION_S - 1
    assert not b.try_acquire_or_renew()  # b has watched it unrenewed for less than its duration
    assert a.try_acquire_or_renew()  # a renews: the record changes ...
    assert not b.try_acquire_or_renew()  # ... and b's next poll sees it: its watch starts over
    clock[0] += DURATION_S - 1
    assert not b.try_acquire_or_renew()
    clock[0] += 2  # a died: nothing renewed for a whole duration since b last saw a change
    assert b.try_acquire_or_renew() and store.holder == "b"
    assert store.obj is not None and store.obj["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew()  # the old holder is out (it would exit)


def test_a_clean_stop_hands_over_at_the_next_retry(clock: list[float]) -> None:
    store = LeaseStore()
    a = LeaderElector(store, "ops", "accelbench", "a")
    b = LeaderElector(store, "ops", "accelbench", "b")
    assert a.try_acquire_or_renew()
    a.release()
    assert store.holder == ""
    assert b.try_acquire_or_renew() and store.holder == "b"


def test_a_write_from_an_older_read_is_refused(clock: list[float]) -> None:
    store = LeaseStore()
    a = LeaderElector(store, "ops", "accelbench", "a")
    assert a.try_acquire_or_renew()
    record = leader.parse_lease(store.obj)
    assert a.try_acquire_or_renew()  # moves the resourceVersion on
    stale = leader.lease_object("accelbench", "ops", "b", record, leader.datetime.now(leader.UTC))
    with pytest.raises(ApiError):
        store.replace(stale)
