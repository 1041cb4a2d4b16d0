"""NetworkPolicies of one run: its pods accept only the traffic the run itself needs.

- training pods: anything from the same run's training pods (the JAX coordinator, torch's rendezvous
  and the collectives, whose ports NCCL picks at run time), and their metrics port from the
  operator's namespace (status.progress) and the namespaces Prometheus runs in;
- the serving engine: its port from the same run's load generator only (the bench is what reads it);
- the load generator: only its metrics port, the same way (it serves nothing else).

Only ingress is restricted: egress goes to places a policy cannot name well (object stores, the
API server, an external endpoint). Opt-out with the chart's `networkPolicy.enabled: false`. The
local control plane has no network plugin, so these objects are validated there, not enforced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api import FinetuneJob, InferenceBench, Resource
from ..api.contract import METRICS_PORT, Role
from ..api.inference import Engine
from .meta import build_metadata
from .names import labels, selector_labels

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace


@dataclass(frozen=True)
class NetworkPolicies:
    """What the operator was told at start (the chart's networkPolicy values)."""

    operator_namespace: str
    metrics_namespaces: tuple[str, ...] = ()

    @property
    def scrapers(self) -> list[dict[str, Any]]:
        """Peers allowed to read a pod's metrics port: the operator's and Prometheus' namespaces."""
        names = sorted({self.operator_namespace, *self.metrics_namespaces})
        return [
            {
                "namespaceSelector": {
                    "matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": names}]
                }
            }
        ]


def _policy(
    resource: Resource, role: Role, accelerator: str, ingress: list[dict[str, Any]]
) -> dict[str, Any]:
    name, kind = resource.metadata.name, resource.kind
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": build_metadata(resource, f"{name}-{role.value}", labels(resource, role, accelerator)),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(kind, name, role)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _metrics_rule(policies: NetworkPolicies) -> dict[str, Any]:
    return {"from": policies.scrapers, "ports": [{"protocol": "TCP", "port": METRICS_PORT}]}


def _peers(resource: Resource, role: Role) -> list[dict[str, Any]]:
    """Pods of this run in `role` (same namespace: a podSelector alone never crosses namespaces)."""
    return [{"podSelector": {"matchLabels": selector_labels(resource.kind, resource.metadata.name, role)}}]


def build_network_policies(
    resource: Resource, accelerator: str, policies: NetworkPolicies | None
) -> list[dict[str, Any]]:
    """The run's NetworkPolicies, none when the operator runs without them."""
    if policies is None:
        return []
    metrics = _metrics_rule(policies)
    if isinstance(resource, FinetuneJob):
        among_ranks = {"from": _peers(resource, Role.TRAIN)}  # every port: collectives pick theirs
        return [_policy(resource, Role.TRAIN, accelerator, [among_ranks, metrics])]
    if isinstance(resource, InferenceBench):
        built = []
        if resource.spec.server.engine != Engine.EXTERNAL:
            port = resource.spec.server.port
            serve = {"from": _peers(resource, Role.CLIENT), "ports": [{"protocol": "TCP", "port": port}]}
            built.append(_policy(resource, Role.SERVER, accelerator, [serve]))
        built.append(_policy(resource, Role.CLIENT, accelerator, [metrics]))
        return built
    raise TypeError(f"no network policies for {type(resource).__name__}")
