"""Active/standby replicas through a coordination.k8s.io Lease, the way Kubernetes' own controllers do it.

A replica starts the operator only once it holds the Lease; the others wait. The holder renews it
every RENEW_S; a standby takes over when it has seen the same record unrenewed for the lease's
duration, measured on its own clock (never by comparing two machines' clocks). A holder that cannot
renew within its own duration stops at once (it exits; the Deployment restarts it as a standby), so
two replicas never write at the same time. A holder that stops cleanly gives the Lease up, so the
standby takes over within one retry instead of one duration.

Failover takes at most DURATION_S + RETRY_S after the active replica dies (17 s with the defaults).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from urllib3.exceptions import HTTPError

from ..kubeapi import ApiError

log = logging.getLogger(__name__)

DURATION_S = 15
RENEW_S = 5.0
RETRY_S = 2.0
LEASE_API = "coordination.k8s.io/v1"


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    duration_s: int
    renew_time: str
    transitions: int
    acquire_time: str
    resource_version: str | None


def parse_lease(obj: Mapping[str, Any] | None) -> LeaseRecord | None:
    if obj is None:
        return None
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_s=int(spec.get("leaseDurationSeconds") or DURATION_S),
        renew_time=str(spec.get("renewTime") or ""),
        transitions=int(spec.get("leaseTransitions") or 0),
        acquire_time=str(spec.get("acquireTime") or ""),
        resource_version=(obj.get("metadata") or {}).get("resourceVersion"),
    )


def may_take(record: LeaseRecord | None, me: str, unchanged_for_s: float) -> bool:
    """Free, ours, or not renewed for its whole duration as this replica has watched it."""
    return record is None or not record.holder or record.holder == me or unchanged_for_s >= record.duration_s


def micro_time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_object(
    name: str, namespace: str, me: str, record: LeaseRecord | None, now: datetime, holder: str | None = None
) -> dict[str, Any]:
    """The Lease this replica writes: renewed when it already held it, else taken over."""
    holder = me if holder is None else holder
    renewing = record is not None and record.holder == me and holder == me
    stamp = micro_time(now)
    transitions = 0 if record is None else record.transitions + (0 if renewing or not holder else 1)
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if record is not None and record.resource_version:
        meta["resourceVersion"] = record.resource_version  # a write from an older read is refused
    return {
        "apiVersion": LEASE_API,
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": DURATION_S,
            "acquireTime": record.acquire_time if renewing and record is not None else stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions,
        },
    }


class LeaderElector:
    def __init__(self, kube: Any, namespace: str, name: str, identity: str) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self._seen: tuple[str, str] | None = None  # (holder, renewTime) last read
        self._seen_at = time.monotonic()
        self._renewed_at = float("-inf")
        self._stop = threading.Event()

    def _read(self) -> LeaseRecord | None:
        record = parse_lease(self.kube.get(LEASE_API, "Lease", self.namespace, self.name))
        key = (record.holder, record.renew_time) if record else None
        if key != self._seen:
            self._seen, self._seen_at = key, time.monotonic()
        return record

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        try:
            record = self._read()
            if not may_take(record, self.identity, time.monotonic() - self._seen_at):
                return False
            body = lease_object(self.name, self.namespace, self.identity, record, datetime.now(UTC))
            if record is None:
                self.kube.create(body)
            else:
                self.kube.replace(body)
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("lease %s/%s: %s %s", self.namespace, self.name, exc.status, exc.reason)
            return False  # another replica wrote first: read again next time
        except (HTTPError, OSError) as exc:
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        self._renewed_at = time.monotonic()
        return True

    def acquire(self) -> None:
        """Block until this replica is the leader."""
        log.info("waiting to lead through Lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not self.try_acquire_or_renew():
            time.sleep(RETRY_S)
        log.info("leading through Lease %s/%s as %s", self.namespace, self.name, self.identity)

    def keep(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in the background; call `on_lost` once the Lease could not be renewed for its duration."""

        def renew() -> None:
            while not self._stop.wait(RENEW_S):
                if self.try_acquire_or_renew():
                    continue
                taken = self._seen is not None and self._seen[0] not in ("", self.identity)
                if taken or time.monotonic() - self._renewed_at >= DURATION_S - RETRY_S:
                    log.error(
                        "lost Lease %s/%s: stopping so two replicas never act", self.namespace, self.name
                    )
                    on_lost()
                    return

        thread = threading.Thread(target=renew, name="lease-renew", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Give the Lease up on a clean stop, so a standby takes over at its next retry."""
        self._stop.set()
        try:
            record = self._read()
            if record is not None and record.holder == self.identity:
                body = lease_object(self.name, self.namespace, self.identity, record, datetime.now(UTC), "")
                self.kube.replace(body)
        except (ApiError, HTTPError, OSError) as exc:
            log.warning("releasing Lease %s/%s failed: %s", self.namespace, self.name, exc)
