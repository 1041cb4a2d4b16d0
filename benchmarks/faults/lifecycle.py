#!/usr/bin/env python3
"""Lifecycle fuzz (issue 14): what users and clusters do to runs, in a seeded random order, on a real
control plane, with the operator installed by the real chart and running under its ServiceAccount.

Runs live on kwok pools whose pods stay Running (the scale benchmark's "hold" profile), so a run
ends only by what the fuzz does to it. Operations, picked at random every 0.5-2 s for --duration s:
create; delete; delete and at once re-create under the same name; suspend or resume; an edit of a
locked field (spec.training.maxSteps, refused by admission once the run has started); an
activeDeadlineSeconds of 1 (the run ends DeadlineExceeded); `kubectl delete job` under a run; the
operator SIGKILLed and restarted; `helm uninstall` with operations while it is gone, then
`helm install` again; a namespace deleted and re-created. The operator is cluster-wide for the first
half and watches only the fuzzed namespaces (--namespace, repeated) for the second, so a namespace
is deleted under each scope.

Checks, after a settle with the operator up:
- nothing orphaned: every object labelled accelbench.io/name has a live controller (GC waited for);
- nothing hangs: every deleted run and namespace is gone within 2 minutes;
- cost never decreases for a run (per UID, every status seen by a watch);
- at most one Job UID per run and Job name; phases never move backwards;
- an accepted edit of a locked field never hit a run whose status already had startTime;
- every live run caught up (status.observedGeneration == metadata.generation), none stuck;
- the operator never exited by itself.

    .venv/bin/python benchmarks/faults/lifecycle.py --duration 300 --out benchmarks/faults/lifecycle.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import localcluster  # noqa: E402

from accelbench.api.contract import LABEL_NAME  # noqa: E402

GROUP, VERSION, FT = "accelbench.io", "v1alpha1", "finetunejobs"
RELEASE, SYSTEM = "accelbench", "accelbench-system"
NAMESPACES = ("fuzz-a", "fuzz-b")
HANG_LIMIT_S = 120.0  # issue 14: nothing hangs more than 2 minutes
CHILD_KINDS = (  # (path, kind) of every child kind the operator makes
    ("/apis/batch/v1/jobs", "Job"),
    ("/api/v1/services", "Service"),
    ("/api/v1/configmaps", "ConfigMap"),
    ("/api/v1/serviceaccounts", "ServiceAccount"),
    ("/apis/rbac.authorization.k8s.io/v1/roles", "Role"),
    ("/apis/rbac.authorization.k8s.io/v1/rolebindings", "RoleBinding"),
)


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


scale = _load("scale_run", ROOT / "benchmarks/scale/run.py")
faults = _load("faults_run", ROOT / "benchmarks/faults/run.py")


# --------------------------------------------------------------------------- what the watches saw


class Record:
    """Per run UID: name, phase history, cost history, when it was deleted and when it was gone.
    Per Job: the UIDs seen under each (run UID, Job name). Namespaces: deleted and gone times."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.name: dict[str, tuple[str, str]] = {}
        self.phases: dict[str, list[str]] = defaultdict(list)
        self.costs: dict[str, list[float]] = defaultdict(list)
        self.deleted_at: dict[str, float] = {}
        self.gone_at: dict[str, float] = {}
        self.jobs: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.ns_deleted_at: dict[str, list[float]] = defaultdict(list)
        self.ns_gone_at: dict[str, list[float]] = defaultdict(list)
        self.stop = threading.Event()

    def on_run(self, type_: str, obj: dict[str, Any]) -> None:
        meta, status = obj["metadata"], obj.get("status") or {}
        uid = meta["uid"]
        with self.lock:
            self.name[uid] = (meta["namespace"], meta["name"])
            if type_ == "DELETED":
                self.gone_at.setdefault(uid, time.monotonic())
                return
            phase = status.get("phase")
            if phase and (not self.phases[uid] or self.phases[uid][-1] != phase):
                self.phases[uid].append(phase)
            dollars = (status.get("cost") or {}).get("dollars")
            if dollars is not None:
                self.costs[uid].append(float(dollars))

    def on_job(self, _type: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller"):
                with self.lock:
                    self.jobs[(ref["uid"], meta["name"])].add(meta["uid"])

    def on_namespace(self, type_: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name in NAMESPACES and type_ == "DELETED":
            with self.lock:
                if len(self.ns_gone_at[name]) < len(self.ns_deleted_at[name]):  # one per deletion
                    self.ns_gone_at[name].append(time.monotonic())

    def start(self, api: Any) -> None:
        feeds = (
            (f"/apis/{GROUP}/{VERSION}/{FT}", "", self.on_run),
            ("/apis/batch/v1/jobs", LABEL_NAME, self.on_job),
            ("/api/v1/namespaces", "", self.on_namespace),
        )
        for path, selector, handler in feeds:

            def loop(path: str = path, selector: str = selector, handler: Any = handler) -> None:
                for event_type, obj in api.watch(path, selector, self.stop):
                    handler(event_type, obj)

            threading.Thread(target=loop, daemon=True, name=f"watch {path}").start()


# --------------------------------------------------------------------------- the operator, via the chart


class Installed:
    """The chart installed with helm, and the operator process under its ServiceAccount's token
    (no kubelet runs the chart's pod here)."""

    def __init__(self, cluster: Any, tmp: Path) -> None:
        self.cluster, self.tmp = cluster, tmp
        self.helm = [str(localcluster.bin_dir() / "helm"), f"--kubeconfig={cluster.kubeconfig}"]
        self.kubectl = [str(localcluster.bin_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        self.process: subprocess.Popen[bytes] | None = None
        self.scope: tuple[str, ...] = ()
        self.starts = 0
        self.own_exits: list[int] = []  # exits we did not cause
        self.installed = False

    def install(self) -> None:
        chart = str(ROOT / "charts/accelbench")
        subprocess.run(
            [*self.helm, "install", RELEASE, chart, "-n", SYSTEM, "--create-namespace"],
            check=True,
            capture_output=True,
        )
        self.installed = True

    def uninstall(self) -> None:
        subprocess.run([*self.helm, "uninstall", RELEASE, "-n", SYSTEM], check=True, capture_output=True)
        self.installed = False

    def kubeconfig(self) -> Path:
        token = subprocess.run(
            [*self.kubectl, "create", "token", RELEASE, "-n", SYSTEM, "--duration=3h"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        admin = yaml.safe_load(self.cluster.kubeconfig.read_text())
        cluster = admin["clusters"][0]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": "operator", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "operator"}}],
            "current-context": "sa",
        }
        path = self.tmp / "operator-sa.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    def start(self) -> None:
        self.check_alive()
        self.starts += 1
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig()), "POD_NAMESPACE": SYSTEM}
        args = [arg for ns in self.scope for arg in ("--namespace", ns)]
        with (self.tmp / f"operator-{self.starts}.log").open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "accelbench.controller", "--metrics-port", "0", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
            )

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            self.own_exits.append(self.process.returncode)
            self.process = None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.check_alive()
        if self.process is not None:
            self.process.send_signal(sig)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


# --------------------------------------------------------------------------- the fuzz


class Fuzz:
    def __init__(self, args: argparse.Namespace, api: Any, raw: Any, op: Installed, record: Record) -> None:
        self.args, self.rng = args, random.Random(args.seed)
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.raw, self.op, self.record = raw, op, record
        self.counts: dict[str, int] = defaultdict(int)
        self.locked_edits = {"refused": 0, "accepted_before_start": 0, "accepted_after_start": 0}
        self.refusal_messages: set[str] = set()
        self.t0 = time.monotonic()

    def log(self, what: str) -> None:
        self.counts[what] += 1
        print(f"[{time.monotonic() - self.t0:6.0f} s] {what}", flush=True)

    def names(self) -> list[str]:
        return [f"run-{i}" for i in range(self.args.runs_per_namespace)]

    def live(self) -> list[dict[str, Any]]:
        out = []
        for ns in NAMESPACES:
            with contextlib.suppress(client.ApiException):  # a namespace being deleted or re-created
                out += self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, FT)["items"]
        return [o for o in out if not o["metadata"].get("deletionTimestamp")]

    def create(self, ns: str, name: str) -> None:
        accelerator = self.rng.choice(({"type": "h100", "count": 1}, {"type": "h200", "count": 1}))
        body = scale.finetune_body(name, accelerator)
        body["metadata"]["namespace"] = ns
        body["spec"]["suspend"] = self.rng.random() < 0.25
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, FT, body)
            self.log("create")
        except client.ApiException as exc:
            if exc.status not in (404, 409, 403):  # a namespace going away; the name still taken
                raise

    def delete(self, obj: dict[str, Any], recreate: bool) -> None:
        meta = obj["metadata"]
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, meta["namespace"], FT, meta["name"])
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        with self.record.lock:
            self.record.deleted_at.setdefault(meta["uid"], time.monotonic())
        self.log("delete and re-create" if recreate else "delete")
        if recreate:
            self.create(meta["namespace"], meta["name"])

    def patch(self, obj: dict[str, Any], spec: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        try:
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, meta["namespace"], FT, meta["name"], {"spec": spec}
            )
            return True
        except client.ApiException as exc:
            if exc.status == 422 or exc.status == 400:
                self.refusal_messages.add(json.loads(exc.body or "{}").get("message", "")[:200])
                return False
            if exc.status == 404:
                return False
            raise

    def locked_edit(self, obj: dict[str, Any]) -> None:
        started = bool((obj.get("status") or {}).get("startTime"))
        steps = self.rng.randint(11, 999)
        if self.patch(obj, {"training": {"maxSteps": steps}}):
            self.locked_edits["accepted_after_start" if started else "accepted_before_start"] += 1
        else:
            self.locked_edits["refused"] += 1
        self.log("edit a locked field")

    def delete_job(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        for job in self.batch.list_namespaced_job(
            meta["namespace"], label_selector=f"{LABEL_NAME}={meta['name']}"
        ).items:
            try:
                self.batch.delete_namespaced_job(
                    job.metadata.name, meta["namespace"], propagation_policy="Background"
                )
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
        self.log("kubectl delete job")

    def delete_namespace(self, ns: str) -> None:
        try:
            self.core.delete_namespace(ns)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            return
        with self.record.lock:
            self.record.ns_deleted_at[ns].append(time.monotonic())
        self.log(f"delete namespace ({'namespace-scoped' if self.op.scope else 'cluster-wide'} operator)")
        print(f"    namespace {ns}", flush=True)

    def ensure_namespaces(self) -> None:
        for ns in NAMESPACES:
            try:
                self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            except client.ApiException as exc:
                if exc.status != 409:  # exists (or still terminating: created on a later tick)
                    raise
                continue
            with self.record.lock:  # it was gone: a bound on when, should the watch have missed it
                if len(self.record.ns_gone_at[ns]) < len(self.record.ns_deleted_at[ns]):
                    self.record.ns_gone_at[ns].append(time.monotonic())

    def helm_cycle(self) -> None:
        self.op.stop()
        self.op.uninstall()
        self.log("helm uninstall")
        for _ in range(3):  # users go on while the operator is gone: nothing may wait for it
            self.step(operator_ops=False)
            time.sleep(self.rng.uniform(0.5, 2))
        self.op.install()
        self.op.start()
        self.log("helm install")

    def step(self, operator_ops: bool = True) -> None:
        self.ensure_namespaces()
        live = self.live()
        by_key = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in live}
        free = [(ns, n) for ns in NAMESPACES for n in self.names() if (ns, n) not in by_key]
        choices = ["create"] * 4 + ["delete", "recreate", "suspend", "suspend", "locked", "deadline", "job"]
        if operator_ops:
            choices += ["kill", "kill"]
        pick = self.rng.choice(choices)
        if pick == "create" or not live:
            if free:
                self.create(*self.rng.choice(free))
            return
        obj = self.rng.choice(live)
        if pick == "delete":
            self.delete(obj, recreate=False)
        elif pick == "recreate":
            self.delete(obj, recreate=True)
        elif pick == "suspend":
            held = bool(obj["spec"].get("suspend"))
            if self.patch(obj, {"suspend": not held}):
                self.log("resume" if held else "suspend")
        elif pick == "locked":
            self.locked_edit(obj)
        elif pick == "deadline":
            if self.patch(obj, {"activeDeadlineSeconds": 1}):
                self.log("activeDeadlineSeconds 1")
        elif pick == "job":
            self.delete_job(obj)
        elif pick == "kill":
            self.op.stop(signal.SIGKILL)
            self.op.start()
            self.log("operator SIGKILLed and restarted")

    def run(self) -> None:
        half = self.t0 + self.args.duration / 2
        end = self.t0 + self.args.duration
        helm_at = sorted(self.rng.uniform(self.t0 + 20, end - 20) for _ in range(self.args.helm_cycles))
        ns_at = [self.rng.uniform(self.t0 + 20, half - 10), self.rng.uniform(half + 10, end - 20)]
        while time.monotonic() < end:
            now = time.monotonic()
            if not self.op.scope and now >= half:
                self.op.stop()
                self.op.scope = NAMESPACES
                self.op.start()
                self.log("operator restarted namespace-scoped")
            if helm_at and now >= helm_at[0]:
                helm_at.pop(0)
                self.helm_cycle()
            elif ns_at and now >= ns_at[0]:
                ns_at.pop(0)
                self.delete_namespace(self.rng.choice(NAMESPACES))
            else:
                self.step()
            self.op.check_alive()
            time.sleep(self.rng.uniform(0.5, 2.0))


# --------------------------------------------------------------------------- checks


def orphans(raw: Any, live_uids: set[str]) -> list[str]:
    """Children whose controller is no longer a live run (or who have none)."""
    left = []
    for path, kind in CHILD_KINDS:
        for item in raw.json("GET", path, query=[("labelSelector", LABEL_NAME)]).get("items") or []:
            meta = item["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            owners = [r["uid"] for r in meta.get("ownerReferences") or [] if r.get("controller")]
            if not owners or owners[0] not in live_uids:
                left.append(f"{kind} {meta['namespace']}/{meta['name']}")
    return left


def see_namespaces_go(fuzz: Fuzz, record: Record) -> None:
    """A namespace's DELETED event is lost when its watch breaks and lists again (a list shows no
    deletions): read each deleted namespace not yet seen gone, until it is gone or the hang limit
    after its deletion passes. Its gone time is when it was read gone (an upper bound), so a
    namespace that really hangs still counts."""
    while True:
        with record.lock:
            pending = {
                ns: deleted[-1]
                for ns, deleted in record.ns_deleted_at.items()
                if len(record.ns_gone_at[ns]) < len(deleted)
            }
        if not pending or all(time.monotonic() > at + HANG_LIMIT_S for at in pending.values()):
            return
        for ns in pending:
            try:
                fuzz.core.read_namespace(ns)
            except client.ApiException as exc:
                if exc.status == 404:
                    with record.lock:
                        if len(record.ns_gone_at[ns]) < len(record.ns_deleted_at[ns]):
                            record.ns_gone_at[ns].append(time.monotonic())
        time.sleep(2)


def verify(fuzz: Fuzz, raw: Any, record: Record, settle_s: float) -> dict[str, Any]:
    see_namespaces_go(fuzz, record)
    deadline = time.monotonic() + settle_s
    stuck: list[str] = []
    while time.monotonic() < deadline:
        live = fuzz.live()
        stuck = [
            f"{o['metadata']['namespace']}/{o['metadata']['name']}"
            for o in live
            if (o.get("status") or {}).get("observedGeneration") != o["metadata"]["generation"]
            or not (o.get("status") or {}).get("phase")
        ]
        if not stuck:
            break
        time.sleep(2)
    live_uids = {o["metadata"]["uid"] for o in fuzz.live()}
    left: list[str] = []
    gc_deadline = time.monotonic() + HANG_LIMIT_S
    while time.monotonic() < gc_deadline:
        left = orphans(raw, live_uids)
        if not left:
            break
        time.sleep(2)
    with record.lock:
        waits = {uid: (record.gone_at.get(uid, float("inf")) - at) for uid, at in record.deleted_at.items()}
        ns_waits = [
            gone - deleted
            for ns, deleted_times in record.ns_deleted_at.items()
            for deleted, gone in zip(
                deleted_times, record.ns_gone_at.get(ns, []) + [float("inf")] * 9, strict=False
            )
        ]
        decreasing = {
            "/".join(record.name[uid]): costs
            for uid, costs in record.costs.items()
            if any(b < a - 1e-9 for a, b in itertools.pairwise(costs))
        }
        duplicates = {
            f"{uid}/{job}": sorted(uids) for (uid, job), uids in record.jobs.items() if len(uids) > 1
        }
        regressions = {
            "/".join(record.name[uid]): found
            for uid, h in record.phases.items()
            if (found := faults.regressions(h))
        }
    fuzz.op.check_alive()
    namespaces = {}  # what a namespace that did not go is waiting for (its conditions say)
    for ns in NAMESPACES:
        try:
            obj = fuzz.core.read_namespace(ns)
            namespaces[ns] = {
                "phase": obj.status.phase,
                "conditions": [f"{c.type}={c.status}: {c.message}" for c in obj.status.conditions or []],
            }
        except client.ApiException as exc:
            namespaces[ns] = {"phase": f"absent ({exc.status})"}
    hung = {
        "/".join(record.name.get(uid, ("?", uid))): round(w, 1)
        for uid, w in waits.items()
        if w > HANG_LIMIT_S
    }
    checks = {
        "orphans": left,
        "runs_that_waited_over_2_min_to_go": hung,
        "namespaces_that_waited_over_2_min_to_go": [round(w, 1) for w in ns_waits if w > HANG_LIMIT_S],
        "cost_decreased": decreasing,
        "duplicate_jobs": duplicates,
        "phase_regressions": regressions,
        "locked_edits_accepted_after_start": fuzz.locked_edits["accepted_after_start"],
        "runs_not_caught_up": stuck,
        "operator_exits_not_caused_by_the_fuzz": fuzz.op.own_exits,
    }
    finite = [w for w in waits.values() if w != float("inf")]
    return {
        "checks": checks,
        "ok": not any(checks.values()),
        "operations": dict(fuzz.counts),
        "locked_edits": fuzz.locked_edits,
        "refusal_messages": sorted(fuzz.refusal_messages)[:5],
        "runs_seen": len(record.name),
        "namespaces_at_the_end": namespaces,
        "runs_not_caught_up_detail": {
            f"{o['metadata']['namespace']}/{o['metadata']['name']}": {
                "generation": o["metadata"]["generation"],
                "status": {k: v for k, v in (o.get("status") or {}).items() if k != "plan"},
            }
            for o in fuzz.live()
            if f"{o['metadata']['namespace']}/{o['metadata']['name']}" in stuck
        },
        "run_delete_to_gone_s": scale.percentiles(finite),
        "namespace_delete_to_gone_s": scale.percentiles([w for w in ns_waits if w != float("inf")]),
        "final_phases": {
            phase: sum(1 for o in fuzz.live() if (o.get("status") or {}).get("phase") == phase)
            for phase in ("Pending", "Scheduling", "Suspended", "Running", "Succeeded", "Failed")
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="accelbench-lifecycle-"))
    os.environ["ACCELBENCH_BIN_DIR"] = str(scale.hold_bin_dir(tmp))
    cluster = localcluster.start_cluster(tmp / "cp", kwok_pod_stages="fast", timeout=180)
    op = Installed(cluster, tmp)
    record = Record()
    try:
        api = cluster.api_client()
        raw = scale.Api(cluster.kubeconfig, 16)
        nodes = localcluster.create_node_pools(api)
        localcluster.wait_nodes_ready(api, nodes)
        op.install()
        op.start()
        record.start(raw)
        fuzz = Fuzz(args, api, raw, op, record)
        fuzz.run()
        if not op.installed:
            op.install()
        op.check_alive()
        if op.process is None:
            op.start()
        result = verify(fuzz, raw, record, args.settle)
        result.update(
            {
                "benchmark": "lifecycle fuzz (issue 14)",
                "command": "python "
                + " ".join([str(Path(sys.argv[0]).resolve().relative_to(ROOT)), *sys.argv[1:]]),
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": scale.machine(),
                "config": {k: v for k, v in vars(args).items() if k != "out"},
                "operator_starts": op.starts,
            }
        )
        return result
    finally:
        record.stop.set()
        op.stop()
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of fuzzing")
    parser.add_argument("--runs-per-namespace", type=int, default=6)
    parser.add_argument("--helm-cycles", type=int, default=2)
    parser.add_argument("--settle", type=float, default=120.0, help="seconds for every run to catch up")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
