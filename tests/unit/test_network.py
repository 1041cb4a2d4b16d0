"""The run's NetworkPolicies, read the way a network plugin reads them: which pod may reach which
port of which other pod. (The local control plane has no network plugin; these tests are where the
policies' meaning is checked, the e2e suite checks that the API server accepts them.)"""

from __future__ import annotations

from typing import Any

import render_fixtures as fx

from accelbench.api.contract import LABEL_INSTANCE, METRICS_PORT
from accelbench.render import render
from accelbench.render.network import NAMESPACE_NAME_LABEL, NetworkPolicies

POLICIES = NetworkPolicies(operator_namespace="accelbench-system", metrics_namespaces=("monitoring",))


def _labels_match(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        assert expr["operator"] == "In", expr
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def allowed(
    policies: list[dict[str, Any]], source: tuple[str, dict[str, str]], target: Any, port: int
) -> bool:
    """Ingress from `source` (namespace, pod labels) to `target` (namespace, pod labels) on `port`."""
    src_ns, src_labels = source
    dst_ns, dst_labels = target
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == dst_ns and _labels_match(p["spec"]["podSelector"], dst_labels)
    ]
    if not selecting:
        return True  # no policy selects the pod: open, as Kubernetes says
    for policy in selecting:
        for rule in policy["spec"]["ingress"]:
            ports = [p["port"] for p in rule.get("ports") or []]
            if ports and port not in ports:
                continue
            for peer in rule.get("from") or []:
                ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
                if ns_sel is None and src_ns != policy["metadata"]["namespace"]:
                    continue
                if ns_sel is not None and not _labels_match(ns_sel, {NAMESPACE_NAME_LABEL: src_ns}):
                    continue
                if pod_sel is not None and not _labels_match(pod_sel, src_labels):
                    continue
                return True
    return False


def pods(objects: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, str]]]:
    """Role -> (namespace, pod labels) of each Job's pods."""
    return {
        o["metadata"]["labels"]["accelbench.io/role"]: (
            o["metadata"]["namespace"],
            o["spec"]["template"]["metadata"]["labels"],
        )
        for o in objects
        if o["kind"] == "Job"
    }


def test_training_ranks_reach_each_other_on_any_port_and_nobody_else_does() -> None:
    job, plan = fx.ft_tpu_v5p_multihost()
    objects = render(job, plan, fx.CATALOG, network=POLICIES).objects
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert objects.index(policies[0]) < next(i for i, o in enumerate(objects) if o["kind"] == "Job")
    train = pods(objects)["train"]
    neighbour = (train[0], {**train[1], LABEL_INSTANCE: "someone-else"})
    for port in (8476, 29500, 41234):  # coordinator, rendezvous, a port NCCL picked
        assert allowed(policies, train, train, port)
        assert not allowed(policies, neighbour, train, port)
        assert not allowed(policies, ("monitoring", {}), train, port)
    for scraper in ("accelbench-system", "monitoring"):
        assert allowed(policies, (scraper, {"app": "prometheus"}), train, METRICS_PORT)
    assert not allowed(policies, ("team-b", {}), train, METRICS_PORT)
    same_labels_elsewhere = ("team-b", train[1])  # a podSelector never crosses namespaces
    assert not allowed(policies, same_labels_elsewhere, train, 8476)


def test_a_bench_server_is_reached_only_by_its_own_client() -> None:
    bench, plan = fx.ib_vllm_h100_x2()
    objects = render(bench, plan, fx.CATALOG, network=POLICIES).objects
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    roles = pods(objects)
    server, client = roles["server"], roles["client"]
    port = bench.spec.server.port
    assert allowed(policies, client, server, port)
    assert not allowed(policies, client, server, port + 1)
    other_client = (client[0], {**client[1], LABEL_INSTANCE: "other-bench"})
    assert not allowed(policies, other_client, server, port)
    assert not allowed(policies, ("monitoring", {}), server, port)
    assert allowed(policies, ("monitoring", {}), client, METRICS_PORT)
    assert not allowed(policies, server, client, 8080)


def test_no_policies_unless_the_operator_runs_with_them_and_none_for_an_external_engine() -> None:
    job, plan = fx.ft_h100_x2()
    assert not [o for o in render(job, plan, fx.CATALOG).objects if o["kind"] == "NetworkPolicy"]
    bench, plan = fx.ib_external()
    kinds = [
        o["metadata"]["name"]
        for o in render(bench, plan, fx.CATALOG, network=POLICIES).objects
        if o["kind"] == "NetworkPolicy"
    ]
    assert kinds == [f"{bench.metadata.name}-client"]
