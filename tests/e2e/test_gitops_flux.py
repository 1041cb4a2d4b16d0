"""A BenchCampaign delivered by real Flux (issue 16): source-controller and kustomize-controller,
built from their pinned Go modules (hack/build-servers.sh), sync a Git repository served over
loopback HTTP by `git http-backend` (hack/flux.py) into the local control plane.

What it shows, with `wait: true` and `prune: false` on the Kustomization:
- Flux applies the campaign from Git, and its health check (kstatus, reading the campaign's
  Ready/Reconciling/Stalled conditions and observedGeneration) keeps the Kustomization not Ready
  while cells run; it turns Ready only after the campaign's Ready condition is True;
- a commit adding one matrix value makes only the new cell's run: the runs that finished keep
  their UIDs and start times (never re-run), and the Kustomization waits for the new cell;
- a commit removing the campaign's file leaves the campaign, its runs and its status table.

The file sorts after test_chart_install.py (the operator then runs under the chart's
ServiceAccount, so the RBAC audit in test_rbac_from_audit.py sees these requests too) and passes
alone as well.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import flux
import pytest
import yaml
from e2e_env import ROOT, Env, localcluster, wait_for

from accelbench.workers.testing import make_chat_dataset, make_tiny_model

CAMPAIGN = "flux-campaign"
NS = "default"
FOLDER = "clusters/local"
SOURCE = ("source.toolkit.fluxcd.io", "v1", "gitrepositories")
KUSTOMIZATION = ("kustomize.toolkit.fluxcd.io", "v1", "kustomizations")


@pytest.fixture(scope="module")
def fluxcd(env: Env) -> Iterator[flux.Flux]:
    missing = flux.flux_missing()
    if missing:  # under CI=true a skip fails the run anyway; say what to do
        pytest.fail(f"{', '.join(missing)} missing from {flux.SERVERS}: run `make servers`")
    started = flux.start_flux(
        env.workdir / "flux", env.cluster.kubeconfig, localcluster.bin_dir() / "kubectl"
    )
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("tiny-flux")
    return {
        "model": str(make_tiny_model(base / "model", family="llama")),
        "data": str(make_chat_dataset(base / "chat.jsonl", n=48)),
    }


def campaign(tiny: dict[str, str], ranks: list[int]) -> dict[str, Any]:
    """The CPU demo's fine-tuning half, one cell per LoRA rank, with the tiny model and data."""
    body = yaml.safe_load((ROOT / "examples/campaigns/cpu-demo.yaml").read_text())
    spec = body["spec"]
    del spec["inference"]
    template = spec["finetune"]["template"]
    template["model"]["uri"] = tiny["model"]
    template["dataset"]["uri"] = tiny["data"]
    template["training"].update(seqLength=64, maxSteps=4)
    spec["finetune"]["matrix"]["axes"] = {"method.rank": ranks}
    body["metadata"] = {"name": CAMPAIGN}
    return body


def flux_objects(url: str) -> list[dict[str, Any]]:
    source = {
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "GitRepository",
        "metadata": {"name": "campaigns", "namespace": NS},
        "spec": {"url": url, "interval": "5s", "ref": {"branch": "main"}, "timeout": "30s"},
    }
    kustomization = {
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1",
        "kind": "Kustomization",
        "metadata": {"name": "campaigns", "namespace": NS},
        "spec": {
            "sourceRef": {"kind": "GitRepository", "name": "campaigns"},
            "path": f"./{FOLDER}",
            "interval": "5s",
            "retryInterval": "5s",
            "timeout": "5m",
            "prune": False,
            "wait": True,
            "targetNamespace": NS,
            # kstatus alone calls a campaign with no status yet Current (the operator cannot write
            # status in the create): Ready only once the operator says so for this generation.
            "healthCheckExprs": [
                {
                    "apiVersion": "accelbench.io/v1alpha1",
                    "kind": "BenchCampaign",
                    "current": "status.observedGeneration == metadata.generation && "
                    "status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')",
                    "failed": "status.conditions.exists(c, c.type == 'Stalled' && c.status == 'True')",
                }
            ],
        },
    }
    return [source, kustomization]


def get(env: Env, api: tuple[str, str, str], name: str) -> dict[str, Any]:
    return env.custom.get_namespaced_custom_object(*api[:2], NS, api[2], name)


def condition(obj: dict[str, Any], type_: str = "Ready") -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def runs(env: Env) -> dict[str, dict[str, Any]]:
    listed = env.custom.list_namespaced_custom_object(
        "accelbench.io", "v1alpha1", NS, "finetunejobs", label_selector=f"accelbench.io/campaign={CAMPAIGN}"
    )
    return {item["metadata"]["name"]: item for item in listed["items"]}


def campaign_or_none(env: Env) -> dict[str, Any] | None:
    try:
        return env.get("benchcampaigns", CAMPAIGN)
    except Exception as exc:
        if getattr(exc, "status", None) == 404:
            return None
        raise


def sync_and_watch(env: Env, fluxcd: flux.Flux, sha: str, timeout: float = 420) -> list[tuple[str, str, str]]:
    """Until the Kustomization is Ready at commit `sha`: what was seen on the way, as (campaign
    Ready, Kustomization Ready status, its reason) while the Kustomization worked on `sha`.
    Fails if the Kustomization is Ready at `sha` before the campaign's Ready condition is True."""
    seen: list[tuple[str, str, str]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fluxcd.check_running()
        ks = get(env, KUSTOMIZATION, "campaigns")
        status = ks.get("status") or {}
        ready = condition(ks)
        working_on = status.get("lastAttemptedRevision", "")
        obj = campaign_or_none(env)
        if working_on.endswith(sha):
            seen.append(
                (
                    condition(obj).get("status", "absent") if obj else "absent",
                    ready.get("status", ""),
                    ready.get("reason", ""),
                )
            )
        if status.get("lastAppliedRevision", "").endswith(sha) and ready.get("status") == "True":
            if obj is not None and sha_has_campaign(fluxcd, sha):
                done = condition(obj)
                assert done.get("status") == "True", (
                    f"Kustomization Ready at {sha} ({ready}) while the campaign is not; campaign "
                    f"generation {obj['metadata'].get('generation')}, "
                    f"status: {yaml.safe_dump(obj.get('status'))}"
                )
                # the Kustomization turned Ready no earlier than the campaign did
                assert ready["lastTransitionTime"] >= done["lastTransitionTime"], (ready, done)
            return seen
        time.sleep(0.5)
    raise AssertionError(
        f"Kustomization not Ready at {sha} within {timeout:.0f}s: {yaml.safe_dump(ks.get('status'))}\n"
        f"{fluxcd.logs()}"
    )


def sha_has_campaign(fluxcd: flux.Flux, sha: str) -> bool:
    listed = flux.git(fluxcd.git_server.root / "campaigns", "ls-tree", "-r", "--name-only", sha)
    return f"{FOLDER}/campaign.yaml" in listed.split()


def test_flux_applies_a_campaign_waits_for_it_and_keeps_it_when_pruning_is_off(
    env: Env, fluxcd: flux.Flux, tiny: dict[str, str]
) -> None:
    repo = flux.init_repo(fluxcd.git_server.root / "campaigns")
    folder = repo / FOLDER
    folder.mkdir(parents=True)
    (folder / "campaign.yaml").write_text(yaml.safe_dump(campaign(tiny, [4, 8])))
    marker = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "flux-campaign-notes"}}
    (folder / "notes.yaml").write_text(yaml.safe_dump({**marker, "data": {"why": "a folder Git keeps"}}))
    first = flux.commit_all(repo, "a campaign of two cells")

    for obj in flux_objects(fluxcd.git_server.url("campaigns")):
        env.apply(obj)
    source = wait_for(
        lambda: condition(s := get(env, SOURCE, "campaigns")).get("status") == "True" and s,
        timeout=90,
        what=f"the GitRepository Ready (logs:\n{fluxcd.logs()})",
    )
    assert source["status"]["artifact"]["revision"] == f"main@sha1:{first}"

    # 1. Flux applies the campaign, and is Ready only once the campaign is.
    seen = sync_and_watch(env, fluxcd, first)
    applied = env.get("benchcampaigns", CAMPAIGN)
    assert applied["metadata"]["labels"]["kustomize.toolkit.fluxcd.io/name"] == "campaigns"
    waiting = [s for s in seen if s[0] not in ("True", "absent") and s[1] != "True"]
    assert waiting, f"never saw the Kustomization wait for a running campaign: {seen}"
    assert {reason for _, _, reason in waiting} <= {"Progressing", "ProgressingWithRetry"}, waiting
    assert applied["status"]["phase"] == "Finished", applied["status"]
    assert applied["status"]["totals"]["succeeded"] == 2, applied["status"]["totals"]
    before = {name: (r["metadata"]["uid"], r["status"]["startTime"]) for name, r in runs(env).items()}
    assert len(before) == 2

    # 2. One more matrix value: only the new cell runs; Flux waits for it.
    (folder / "campaign.yaml").write_text(yaml.safe_dump(campaign(tiny, [4, 8, 16])))
    second = flux.commit_all(repo, "one more LoRA rank")
    seen = sync_and_watch(env, fluxcd, second)
    assert [s for s in seen if s[0] != "True" and s[1] != "True"], seen
    after = runs(env)
    assert len(after) == 3, sorted(after)
    assert {n: (r["metadata"]["uid"], r["status"]["startTime"]) for n, r in after.items() if n in before} == (
        before
    )
    finished = env.get("benchcampaigns", CAMPAIGN)
    assert finished["status"]["totals"]["succeeded"] == 3, finished["status"]["totals"]

    # 3. The file leaves Git; with prune off the campaign, its runs and its table stay.
    (folder / "campaign.yaml").unlink()
    third = flux.commit_all(repo, "the campaign's file removed")

    def tracked() -> list[str]:  # inventory ids: <namespace>_<name>_<group>_<kind>
        ks = get(env, KUSTOMIZATION, "campaigns")
        return [e["id"] for e in ks["status"]["inventory"]["entries"] if e["id"].endswith("_BenchCampaign")]

    assert tracked() == [f"{NS}_{CAMPAIGN}_accelbench.io_BenchCampaign"]
    sync_and_watch(env, fluxcd, third)
    assert tracked() == [], "Flux still tracks the campaign whose file left Git"
    time.sleep(6)  # another interval: nothing is deleted later either
    kept = env.get("benchcampaigns", CAMPAIGN)
    assert kept["metadata"]["uid"] == applied["metadata"]["uid"]
    assert kept["status"]["totals"]["succeeded"] == 3 and len(kept["status"]["cells"]) == 3
    assert {n: r["metadata"]["uid"] for n, r in runs(env).items()} == {
        n: r["metadata"]["uid"] for n, r in after.items()
    }
