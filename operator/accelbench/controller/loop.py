"""The event-driven loop: watch events wake resources; workers run one pass per woken resource.

kopf does the watching and keeps the indexes (slim copies, cache.py); its event handlers only call
`wake`. This loop owns everything else:

- a WorkQueue of resource keys, drained by `workers` tasks; each takes a Snapshot from the indexes
  on the event-loop thread (where kopf mutates them, so no lock is needed) and runs the pass on a
  thread pool (the Kubernetes client blocks);
- progress reads of running ranks 0, as asyncio tasks: a slow or hostile /metrics endpoint delays
  only its own resource's progress, never a pass;
- a resync that wakes every known resource every RESYNC_S, the safety net for a missed event.

No per-resource timer or daemon exists, so kopf puts no finalizer on any resource: deleting one, or
its namespace, never waits for the operator.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..api import FinetuneJob, InferenceBench
from ..api.campaign import BenchCampaign
from ..api.status import Phase
from .cache import ResourceKey
from .campaign import reconcile_campaign
from .progress import PROGRESS_ROLE, metrics_url, read_progress
from .reconciler import RUNNING_PASS_S, Outcome, Snapshot, reconcile
from .served import source_name
from .state import ControllerState
from .workqueue import WorkQueue

log = logging.getLogger(__name__)

RESYNC_S = 300.0
STALE_RECHECK_S = 1.0  # a pass skipped for a lagging index is retried by then at the latest
MAX_SCRAPES = 64  # progress reads in flight at once
# Periodic passes (progress, the billing minute) of a large fleet are spread to at most this many a
# second, and never further apart than PERIODIC_MAX_S: 25 running runs keep the 5 s pass, 100 are
# passed every 20 s, 1,000 every 200 s (a running cost then lags by up to that; the final one is
# exact). Measured (benchmarks/scale, 100 Running on 2 vCPU): 20 passes/s held the idle operator at
# 5.7 % of a core.
PERIODIC_PASSES_PER_S = 5.0
PERIODIC_MAX_S = 300.0
# A running cost moves by a minute at a time, and by more for a large fleet, so that the billing
# writes of all Running runs together stay near this many a second (1,000 runs: every 10 minutes).
# Budgets never wait on it: a campaign counts an unfinished run at its whole allowance.
BILLING_WRITES_PER_S = 2.0


def spread(requeue_after: float, scheduled: int) -> float:
    """The delay of a periodic wake-up with `scheduled` resources already waiting on one. Short
    requeues (retries, the first look after an apply) are never stretched."""
    if requeue_after < RUNNING_PASS_S:
        return requeue_after
    return max(requeue_after, min(scheduled / PERIODIC_PASSES_PER_S, PERIODIC_MAX_S))


def billing_step(scheduled: int) -> float:
    """Seconds a running cost's clock moves at a time with `scheduled` resources on a timer: whole
    minutes, at least one."""
    minutes = math.ceil(scheduled / BILLING_WRITES_PER_S / 60.0)
    return 60.0 * max(1, minutes)


@dataclass
class Indexes:
    """kopf's indexes, by reference: resources by kind (key (namespace, name)), Jobs by their
    controller's UID, Pods by their Job's UID."""

    resources: Mapping[str, Any]  # kind -> kopf.Index
    jobs: Any
    pods: Any
    runs: Sequence[Any] = ()  # per run kind: its resources by their BenchCampaign's UID
    sources: Any = None  # InferenceBench keys by the (namespace, FinetuneJob) they serve from


def _first(store: Any) -> Any:
    return next(iter(store), None) if store is not None else None


class Controller:
    def __init__(self, state: ControllerState, workers: int) -> None:
        self.state = state
        self.workers = workers
        self.queue: WorkQueue[ResourceKey] = WorkQueue()
        self.indexes: Indexes | None = None
        self.ready = asyncio.Event()  # set by the first watch event: kopf's indexes are complete by then
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")
        self._progress: dict[ResourceKey, dict[str, Any]] = {}
        self._scraping: dict[ResourceKey, float] = {}  # key -> when its last read started (monotonic)
        self._scrape_slots = asyncio.Semaphore(MAX_SCRAPES)
        self._wrote_over: dict[ResourceKey, str] = {}  # see _stale
        self._wrote: dict[ResourceKey, str] = {}  # see resource_changed
        self._deferred: set[ResourceKey] = set()  # passes skipped by _stale, owed on the next event
        self._tasks: list[asyncio.Task[None]] = []
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)

    # --- inputs ---------------------------------------------------------------------------------

    def wake(self, key: ResourceKey) -> None:
        self.ready.set()
        self.queue.add(key, first=self._unapplied(key))

    def _unapplied(self, key: ResourceKey) -> bool:
        """A run whose spec generation is not applied yet: its pass goes ahead of the others."""
        if self.indexes is None or key[0] == BenchCampaign.KIND:
            return False
        body = _first(self.indexes.resources[key[0]].get(key[1:]))
        if body is None:
            return False
        observed = (body.get("status") or {}).get("observedGeneration")
        return observed != (body.get("metadata") or {}).get("generation")

    def wake_servers_of(self, namespace: str, finetune_job: str) -> None:
        """The InferenceBenches serving what this FinetuneJob trains: its phase may start them."""
        if self.indexes is None or self.indexes.sources is None:
            return
        for key in list(self.indexes.sources.get((namespace, finetune_job), ())):
            self.wake(key)

    def resource_changed(self, key: ResourceKey, resource_version: str | None) -> None:
        """A watch event of one of our resources. The echo of our own status write (the version
        that write made) wakes nothing: the pass that wrote it was computed from the version before,
        plus only what it wrote, so a pass over the echo would find nothing to do, yet it would be
        half the passes of a fleet whose billing clocks tick. A pass skipped as stale is owed then."""
        if resource_version is not None and self._wrote.get(key) == resource_version:
            self.ready.set()
            if key not in self._deferred:
                return
        self.wake(key)

    def snapshot(self, key: ResourceKey) -> Snapshot:
        assert self.indexes is not None, "indexes attached at startup"
        kind, namespace, name = key
        body = _first(self.indexes.resources[kind].get((namespace, name)))
        if body is None:
            return Snapshot(key, None)
        uid = (body.get("metadata") or {}).get("uid")
        if kind == BenchCampaign.KIND:
            runs = [run for index in self.indexes.runs for run in index.get(uid, ())]
            earlier = ((body.get("spec") or {}).get("baseline") or {}).get("campaign")
            baseline = _first(self.indexes.resources[kind].get((namespace, earlier))) if earlier else None
            return Snapshot(key, body, runs=runs, baseline=baseline)
        source = None
        if kind == InferenceBench.KIND and (name_of_source := source_name(body)) is not None:
            source = _first(self.indexes.resources[FinetuneJob.KIND].get((namespace, name_of_source)))
        jobs = list(self.indexes.jobs.get(uid, ()))
        pods = [
            pod for job in jobs for pod in self.indexes.pods.get((job.get("metadata") or {}).get("uid"), ())
        ]
        step = billing_step(self.queue.scheduled)
        return Snapshot(key, body, jobs, pods, self._progress.get(key), billing_step_s=step, source=source)

    async def _pass(self, key: ResourceKey, snap: Snapshot) -> Outcome:
        self._maybe_scrape(snap)
        step = reconcile_campaign if key[0] == BenchCampaign.KIND else reconcile
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(self._executor, step, snap, self.state, self.clock())
        if outcome.wrote_over is not None:
            self._wrote_over[key] = outcome.wrote_over
        if outcome.wrote is not None:
            self._wrote[key] = outcome.wrote
        return outcome

    def _stale(self, key: ResourceKey, snap: Snapshot) -> bool:
        """The snapshot is the body our last status write replaced (the index lags our own write);
        a pass from it would redo what that write recorded (a new run's children: a 409 per child)."""
        written = self._wrote_over.get(key)
        if written is None or snap.body is None:
            return False
        if (snap.body.get("metadata") or {}).get("resourceVersion") == written:
            return True
        del self._wrote_over[key]  # the index has moved past it
        return False

    # --- progress -------------------------------------------------------------------------------

    def _maybe_scrape(self, snap: Snapshot) -> None:
        body = snap.body or {}
        kind = snap.key[0]
        if kind not in PROGRESS_ROLE or (body.get("status") or {}).get("phase") != Phase.RUNNING.value:
            self._progress.pop(snap.key, None)
            return
        started = self._scraping.get(snap.key)
        if started is not None and time.monotonic() - started < RUNNING_PASS_S:
            return  # one in flight, or one read recently
        url = metrics_url(snap.pods, PROGRESS_ROLE[kind])
        if url is None:
            return
        self._scraping[snap.key] = time.monotonic()
        self._tasks.append(asyncio.create_task(self._scrape(snap.key, url)))

    async def _scrape(self, key: ResourceKey, url: str) -> None:
        async with self._scrape_slots:
            progress = await read_progress(url, self.clock())
        if progress is not None:
            self._progress[key] = progress
            self.queue.add(key)

    # --- the loop -------------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            started, kind = time.monotonic(), key[0]
            outcome = Outcome("error", retry=True)
            try:
                snap = self.snapshot(key)
                if self._stale(key, snap):
                    # Woken (a child's event) before our own last status write reached the index:
                    # that write's event wakes it again; the timer is only a safety net.
                    self._deferred.add(key)
                    outcome = Outcome("stale-index", requeue_after=STALE_RECHECK_S)
                else:
                    self._deferred.discard(key)
                    outcome = await self._pass(key, snap)
                if snap.body is None:
                    self.queue.drop(key)
                    self._progress.pop(key, None)
                    self._scraping.pop(key, None)
                    self._wrote_over.pop(key, None)
                    self._wrote.pop(key, None)
                    self._deferred.discard(key)
            except Exception:  # never let one resource stop a worker
                log.exception("pass over %s failed", key)
            finally:
                self.queue.done(key)
                self.state.metrics.observe_reconcile(kind, outcome.label, time.monotonic() - started)
            if outcome.retry:
                self.queue.add_after(key, self.queue.backoff(key))
            else:
                self.queue.forget(key)
                if outcome.requeue_after is not None:
                    self.queue.add_after(key, spread(outcome.requeue_after, self.queue.scheduled))
            self._tasks = [t for t in self._tasks if not t.done()]

    def known(self) -> list[ResourceKey]:
        assert self.indexes is not None
        return [
            (kind, namespace, name)
            for kind, index in self.indexes.resources.items()
            for (namespace, name) in list(index.keys())
        ]

    async def _resync(self) -> None:
        await self.ready.wait()
        while True:
            for key in self.resync_keys():
                self.queue.add(key)
            await asyncio.sleep(RESYNC_S)

    def resync_keys(self) -> list[ResourceKey]:
        """Every known resource but those with a timed pass due before the next resync: that pass
        is their safety net already. 1,000 Running runs otherwise got a second pass each every
        RESYNC_S, as many passes as their own periodic ones."""
        return [key for key in self.known() if not self.queue.waiting(key, RESYNC_S)]

    def start(self, indexes: Indexes) -> None:
        self.indexes = indexes
        self._tasks.extend(asyncio.create_task(self._work()) for _ in range(self.workers))
        self._tasks.append(asyncio.create_task(self._resync()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)
