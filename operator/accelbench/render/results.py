"""The results ConfigMap every run reports into, and the one permission its reporting pod holds.

Rank 0 of a FinetuneJob and the InferenceBench client write their full WorkerReport (and the bench
its full results) into `<name>-results`. The termination message carries a compact copy; this one
outlives the pods and the Job (it is owned by the resource itself), so the operator still finds the
result when the pods were garbage-collected or the Job deleted before it looked (issue 14).

That write is the only Kubernetes API call a workload pod makes: its ServiceAccount (the user's
spec.serviceAccountName, else one of the run's own) may `patch` that one ConfigMap and nothing else.
Only `patch`: the operator may create a Role only with verbs it holds itself (RBAC's escalation
rule), and it needs no `update` on ConfigMaps anywhere.
"""

from __future__ import annotations

from typing import Any

from ..api import Resource
from ..api.contract import ENV_POD_NAMESPACE, ENV_RESULTS_CONFIGMAP
from .meta import build_metadata, namespace_of
from .names import results_config_map_name
from .workload import env_field, env_value

REPORTER_VERBS = ("patch",)


def build_results_config_map(resource: Resource, labels: dict[str, str]) -> dict[str, Any]:
    """Created empty (no `data`), so a re-apply by the operator never claims or clears the keys
    the reporting pod writes."""
    name = results_config_map_name(resource.metadata.name)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": build_metadata(resource, name, labels)}


def reporter_env(resource: Resource) -> list[dict[str, Any]]:
    """Where the reporting pod writes: the ConfigMap's name and the pod's own namespace."""
    return [
        env_value(ENV_RESULTS_CONFIGMAP, results_config_map_name(resource.metadata.name)),
        env_field(ENV_POD_NAMESPACE, "metadata.namespace"),
    ]


def build_reporter_rbac(
    resource: Resource, role_name: str, account: str, labels: dict[str, str]
) -> list[dict[str, Any]]:
    """The reporting pod's ServiceAccount (only when `account` is the run's own, `role_name`), a Role
    that may patch the results ConfigMap, and the RoleBinding of the two."""
    name = resource.metadata.name

    def metadata() -> dict[str, Any]:
        return build_metadata(resource, role_name, labels)

    own_account = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata()}]
    return [
        *(own_account if account == role_name else []),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(),
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [results_config_map_name(name)],
                    "verbs": list(REPORTER_VERBS),
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace_of(resource)}],
        },
    ]
