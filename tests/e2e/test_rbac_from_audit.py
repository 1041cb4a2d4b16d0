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
from e2e_env import ROOT, Env, localcluster

RELEASE, NAMESPACE = "accelbench", "accelbench-system"
OPERATOR = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
DECISION = "authorization.k8s.io/decision"  # the authorizer's verdict, in every audit event

# Granted but not seen as a request verb in the audit log, and why the grant is still needed.
GRANTED_WITHOUT_A_REQUEST: dict[tuple[str, str, str], str] = {
    # Server-side apply is a PATCH; for an object that does not exist yet the API server also
    # authorizes it as `create` (the audit log records the request verb, patch).
    **{
        (group, resource, "create"): "server-side apply of a new child is authorized as create"
        for group, resource in (
            ("batch", "jobs"),
            ("", "services"),
            ("", "serviceaccounts"),
            ("", "configmaps"),
            ("rbac.authorization.k8s.io", "roles"),
            ("rbac.authorization.k8s.io", "rolebindings"),
        )
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


def chart_grants() -> set[tuple[str, str, str]]:
    helm = localcluster.bin_dir() / "helm"
    rendered = subprocess.run(
        [str(helm), "template", RELEASE, str(ROOT / "charts/accelbench"), "-n", NAMESPACE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    grants: set[tuple[str, str, str]] = set()
    for doc in yaml.safe_load_all(rendered):
        if doc and doc["kind"] in ("ClusterRole", "Role"):  # the Role: its leader-election Lease
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        grants.update((group, resource, verb) for verb in rule["verbs"])
    return grants


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
    unexplained = sorted(grants - used - set(GRANTED_WITHOUT_A_REQUEST))
    assert not unexplained, f"grants no request used and no reason given for: {unexplained}"
    # The list above stays true: an entry the suite now exercises is no longer an exception.
    exercised = sorted(set(GRANTED_WITHOUT_A_REQUEST) & used)
    assert not exercised, f"listed as unused but used: {exercised}"
