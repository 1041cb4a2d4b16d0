"""The chart's RBAC against what the operator did, read from the API server's audit log.

Runs after the other e2e files (pytest takes them in name order): by then the operator has run
the whole suite under the chart's ServiceAccount (test_chart_install.py). Every request it made is
in the audit log (hack/localcluster.py AUDIT_POLICY) with its verb, resource and response code, so:
- nothing it tried was forbidden (the grants suffice);
- each grant was used by some request, or is listed below with the reason no request shows it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import yaml
from e2e_env import ROOT, Env, localcluster, wait_for

RELEASE, NAMESPACE = "accelbench", "accelbench-system"
OPERATOR = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
DECISION = "authorization.k8s.io/decision"  # the authorizer's verdict, in every audit event

# Granted but not seen as a request verb in the audit log, and why the grant is still needed.
# Grants whose request depends on a race the suite does not control: used in some runs, not others.
GRANTED_FOR_A_RACE: dict[tuple[str, str, str], str] = {
    ("accelbench.io", plural, "get"): "a campaign reads a run only when its create finds the name taken "
    "(the run exists but its event has not reached the index yet, e.g. right after an operator restart), "
    "to tell its own from someone else's (unit-tested in test_campaign_plan.py; the 12-cell e2e's kills "
    "make it happen in some runs)"
    for plural in ("finetunejobs", "inferencebenches")
} | {
    (group, resource, "get"): "a run's first apply creates its children (POST) and reads one only when "
    "the create finds the name taken (a pass whose status write was lost, or a foreign object); a "
    "later apply (an edit before the start, a deleted child made again) reads before it applies"
    for group, resource in (
        ("batch", "jobs"),
        ("", "services"),
        ("", "serviceaccounts"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("networking.k8s.io", "networkpolicies"),
    )
}
GRANTED_FOR_A_RACE |= {
    (group, resource, "patch"): "a new run's children are created (POST); a child is applied (PATCH) "
    "only when a create finds it already there or a later apply makes it again (it was deleted), "
    "which the suite does for some kinds only"
    for group, resource in (
        ("", "services"),
        ("", "serviceaccounts"),
        ("", "configmaps"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("networking.k8s.io", "networkpolicies"),
    )
}
GRANTED_WITHOUT_A_REQUEST: dict[tuple[str, str, str], str] = {
    **{
        ("accelbench.io", f"{plural}/finalizers", "update"): "OwnerReferencesPermissionEnforcement asks "
        "it of whoever sets blockOwnerDeletion on an owner reference (an authorization check, not a request)"
        for plural in ("finetunejobs", "inferencebenches", "benchcampaigns")
    },
}


def audit_events(env: Env) -> Iterator[dict[str, Any]]:
    """The operator process's requests (not kubectl's: test_chart_install uses the same token once
    to show that reading secrets is refused)."""
    for line in env.cluster.audit_log.read_text().splitlines():
        event = json.loads(line)
        if (
            event.get("stage") == "ResponseComplete"
            and event["user"]["username"] == OPERATOR
            and not event.get("userAgent", "").startswith("kubectl")
        ):
            yield event


def chart_rules() -> list[dict[str, Any]]:
    """The rules of the chart's ClusterRole and its leader-election Role, as `helm template` renders."""
    helm = localcluster.bin_dir() / "helm"
    rendered = subprocess.run(
        [str(helm), "template", RELEASE, str(ROOT / "charts/accelbench"), "-n", NAMESPACE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [
        rule
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] in ("ClusterRole", "Role")
        for rule in doc["rules"]
    ]


def chart_grants() -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in chart_rules()
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def request_key(event: dict[str, Any]) -> tuple[str, str, str]:
    ref = event.get("objectRef") or {}
    resource = ref.get("resource", "")
    if ref.get("subresource"):
        resource = f"{resource}/{ref['subresource']}"
    return ref.get("apiGroup", ""), resource, event["verb"]


def test_the_operator_used_its_grants_and_nothing_else(env: Env) -> None:
    events = list(audit_events(env))
    assert len(events) > 50, "too few requests: did the operator run under the chart's account?"
    # Refused by RBAC, that is; a ResourceQuota or a terminating namespace also answers 403, and the
    # suite makes both happen (test_neighbours.py) with grants that are enough.
    refused = {request_key(e) for e in events if (e.get("annotations") or {}).get(DECISION) == "forbid"}
    forbidden = sorted(refused)
    assert not forbidden, f"forbidden requests: {forbidden}"
    # Non-resource requests (/version, discovery) have no objectRef: every authenticated user may
    # make them (the system:discovery ClusterRole), so they are not the chart's to grant.
    used = {request_key(e) for e in events if e.get("objectRef")}
    grants = chart_grants()
    # Watches and lists are one verb each in RBAC and in the log ("watch" / "list").
    assert used <= grants, f"requests no grant covers: {sorted(used - grants)}"
    unexplained = sorted(grants - used - set(GRANTED_WITHOUT_A_REQUEST) - set(GRANTED_FOR_A_RACE))
    assert not unexplained, f"grants no request used and no reason given for: {unexplained}"
    # The list above stays true: an entry the suite now exercises is no longer an exception.
    exercised = sorted(set(GRANTED_WITHOUT_A_REQUEST) & used)
    assert not exercised, f"listed as unused but used: {exercised}"


def test_the_finalizers_grant_is_what_owner_reference_enforcement_asks_for(env: Env) -> None:
    """The local control plane runs OwnerReferencesPermissionEnforcement (as OpenShift does): a child
    naming its FinetuneJob as owner with blockOwnerDeletion is refused to an account holding every
    grant of the chart but `finetunejobs/finalizers` update, and allowed with it."""
    ns, account = "default", "owner-ref-probe"
    owner = env.apply(
        {
            "apiVersion": "accelbench.io/v1alpha1",
            "kind": "FinetuneJob",
            "metadata": {"name": "owner-ref-probe", "namespace": ns},
            "spec": yaml.safe_load((ROOT / "examples/quickstart/finetune-tiny-cpu.yaml").read_text())["spec"]
            | {"suspend": True},
        }
    )
    assert owner.returncode == 0, owner.stderr
    uid = env.get("finetunejobs", "owner-ref-probe")["metadata"]["uid"]
    operator_rules = [r for r in chart_rules() if "leases" not in r["resources"]]
    rules = [r for r in operator_rules if "finetunejobs/finalizers" not in r["resources"]]
    env.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": ns}})
    for name, role_rules in (("without-finalizers", rules), ("chart", operator_rules)):
        env.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": f"{account}-{name}", "namespace": ns},
                "rules": role_rules,
            }
        )
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": account, "namespace": ns},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": f"{account}-without-finalizers",
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }
    env.apply(binding)
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "owner-ref-probe-child",
            "namespace": ns,
            "ownerReferences": [
                {
                    "apiVersion": "accelbench.io/v1alpha1",
                    "kind": "FinetuneJob",
                    "name": "owner-ref-probe",
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
    }
    as_probe = ("--as", f"system:serviceaccount:{ns}:{account}")

    def refusal() -> str | None:  # once the binding is in effect, only the finalizers rule is missing
        done = env.kubectl(
            "apply", "--server-side", "-f", "-", *as_probe, stdin=json.dumps(child), check=False
        )
        assert done.returncode != 0, "applied without finalizers update"
        return done.stderr if "blockOwnerDeletion" in done.stderr else None

    assert "cannot set blockOwnerDeletion" in wait_for(refusal, timeout=30, what="the refusal")
    env.kubectl("delete", "rolebinding", account)
    binding["roleRef"]["name"] = f"{account}-chart"
    env.apply(binding)

    def apply_as_probe() -> bool:  # RBAC caches a moment after the new binding
        done = env.kubectl(
            "apply", "--server-side", "-f", "-", *as_probe, stdin=json.dumps(child), check=False
        )
        return done.returncode == 0

    wait_for(apply_as_probe, timeout=30, what="the apply allowed with the chart's grants")
    env.kubectl("delete", "finetunejob", "owner-ref-probe")
