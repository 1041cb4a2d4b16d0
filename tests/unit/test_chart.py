"""The Helm chart: lint, render, validate offline with kubeconform, and least-privilege RBAC.

kubeconform downloads its schemas by default; these tests point it at local ones instead:
- Kubernetes kinds: the JSON schemas shipped by the `kubernetes_validate` package, made standalone
  (its files `$ref` a shared `_definitions.json` by URL; the definitions a kind needs are inlined);
- our CRDs: converted from their openAPIV3Schema.
ServiceMonitor/PodMonitor have no local schema and are skipped by kind.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "accelbench"
BIN = ROOT / ".bin"
HELM = BIN / "helm"
KUBECONFORM = BIN / "kubeconform"
K8S_SCHEMA_VERSION = "v1.35.0-local-strict"
MONITORING_KINDS = "ServiceMonitor,PodMonitor"
RELEASE_NAMESPACE = "accelbench-system"

pytestmark = pytest.mark.skipif(
    not HELM.exists(), reason=f"{HELM.relative_to(ROOT)} is absent: run hack/build-binaries.sh to build it"
)

# Value sets rendered and validated; each is a list of extra `helm template` arguments.
VALUE_SETS: dict[str, list[str]] = {
    "defaults": [],
    "namespaces": ["--set", "scope=namespaces", "--set", "namespaces={team-a,team-b}"],
    "standby": ["--set", "replicas=2"],
    "namespaces-standby": [
        "--set",
        "scope=namespaces",
        "--set",
        "namespaces={team-a,accelbench-system}",
        "--set",
        "replicas=2",
    ],
    "no-election": ["--set", "leaderElection.enabled=false"],
    "dashboard-prices": [
        "--set",
        "dashboard.enabled=true",
        "--set-json",
        'prices={"h100": {"onDemand": 9.8, "spot": null, "source": "contract", "date": "2026-01-15"}}',
    ],
}
# `helm lint` has no --api-versions, so the Prometheus Operator objects are only templated.
MONITORS = [
    "--api-versions",
    "monitoring.coreos.com/v1",
    "--set",
    "serviceMonitor.enabled=true",
    "--set",
    "podMonitor.enabled=true",
]
RENDERED_SETS = {
    **VALUE_SETS,
    "monitors": MONITORS,
    "namespaces-monitors": VALUE_SETS["namespaces"] + MONITORS,
}

# ---------------------------------------------------------------- what the operator touches
# Mirrors controller/kube.py (server-side apply of what render/ emits, price ConfigMap read),
# controller/handlers.py (kopf watches and indexes), controller/reconciler.py (status, events, the
# ownership read before an apply) and kopf's own needs. Kept explicit on
# purpose: a change to the operator's API use must show up here and in templates/rbac.yaml together.

# Kind -> (API group, resource) for every kind the renderer may emit.
CHILD_RESOURCES: dict[str, tuple[str, str]] = {
    "Job": ("batch", "jobs"),
    "Service": ("", "services"),
    "ConfigMap": ("", "configmaps"),
    "ServiceAccount": ("", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
    "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
}
# Server-side apply is a PATCH, also authorized as `create` when the object is new; `get` is the
# read that refuses to touch an object of the same name this resource does not control.
APPLY_VERBS = {"get", "create", "patch"}
OPERATOR_RULES: dict[tuple[str, str], set[str]] = {
    # kopf watches the resources; the operator writes only their status subresource.
    # ... and create a campaign's runs (get: whose is a name that is taken).
    ("accelbench.io", "finetunejobs"): {"list", "watch", "create", "get"},
    ("accelbench.io", "inferencebenches"): {"list", "watch", "create", "get"},
    ("accelbench.io", "benchcampaigns"): {"list", "watch"},
    ("accelbench.io", "benchcampaigns/status"): {"patch"},
    ("accelbench.io", "benchcampaigns/finalizers"): {"update"},
    ("accelbench.io", "finetunejobs/status"): {"patch"},
    ("accelbench.io", "inferencebenches/status"): {"patch"},
    # children carry blockOwnerDeletion: OwnerReferencesPermissionEnforcement asks for this.
    ("accelbench.io", "finetunejobs/finalizers"): {"update"},
    ("accelbench.io", "inferencebenches/finalizers"): {"update"},
    # kopf indexes of the children (jobs are also applied, below).
    ("", "pods"): {"list", "watch"},
    # the operator's transition events; list: a stuck Job's FailedCreate Events.
    ("", "events"): {"create", "list"},
}
# jobs: delete = the InferenceBench server Job, stopped once the client finished.
INDEXED = {("batch", "jobs"): {"list", "watch", "delete"}}
# configmaps: get = the price book and, when a termination message is gone, a run's results ConfigMap.
EXTRA = {("", "configmaps"): {"get"}}


@functools.cache
def rendered_children() -> list[dict[str, Any]]:
    """Every object the operator would create for the repository's examples."""
    from accelbench.catalog import load_catalog
    from accelbench.cli.manifests import load_all
    from accelbench.plan import plan_for
    from accelbench.render import NetworkPolicies, render

    catalog = load_catalog()
    objects: list[dict[str, Any]] = []
    # every example at once: a bench serving a FinetuneJob's output is resolved against it
    for item in load_all([str(p) for p in sorted((ROOT / "examples").rglob("*.yaml"))]):
        # as the chart runs it: networkPolicy.enabled by default
        network = NetworkPolicies(operator_namespace="accelbench-system", metrics_namespaces=("monitoring",))
        objects += render(item.resource, plan_for(item.resource, catalog), catalog, network=network).objects
    return objects


def expected_rules() -> dict[tuple[str, str], set[str]]:
    rules = {key: set(verbs) for key, verbs in OPERATOR_RULES.items()}
    from accelbench.controller.kube import resource_path

    for obj in rendered_children():
        kind = obj["kind"]
        assert kind in CHILD_RESOURCES, f"the renderer emits {kind}: add it to CHILD_RESOURCES and the chart"
        resource_path(obj["apiVersion"], kind, "ns", "name")  # the operator's client knows its path
        rules.setdefault(CHILD_RESOURCES[kind], set()).update(APPLY_VERBS)
    for table in (INDEXED, EXTRA):
        for key, verbs in table.items():
            rules.setdefault(key, set()).update(verbs)
    return rules


# ---------------------------------------------------------------- helm and kubeconform


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120, check=False)


def template(*args: str, crds: bool = False) -> str:
    extra = ["--include-crds"] if crds else []
    done = helm("template", "accelbench", str(CHART), "--namespace", RELEASE_NAMESPACE, *extra, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _local_refs(node: Any) -> Any:
    """`/api/_definitions.json#/$defs/X` (resolved against a kubernetes.io $id) -> `#/$defs/X`."""
    if isinstance(node, dict):
        return {
            key: "#" + value.split("#", 1)[1]
            if key == "$ref" and isinstance(value, str)
            else _local_refs(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_local_refs(value) for value in node]
    return node


def standalone_k8s_schema(source: Path, definitions: dict[str, Any]) -> dict[str, Any]:
    """One kind's schema with the definitions it reaches inlined, so nothing is fetched."""
    schema = json.loads(source.read_text())
    schema.pop("$id", None)
    needed: dict[str, Any] = {}
    pending = list(_refs(schema))
    while pending:
        name = pending.pop().rsplit("/", 1)[-1]
        if name not in needed:
            needed[name] = definitions[name]
            pending += list(_refs(definitions[name]))
    schema["$defs"] = needed
    return _local_refs(schema)


def crd_to_json_schema(node: Any) -> Any:
    """A CRD's openAPIV3Schema as plain JSON schema, strict where Kubernetes is (no unknown fields
    unless x-kubernetes-preserve-unknown-fields), which is what kubeconform -strict then checks."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {name: crd_to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = crd_to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [crd_to_json_schema(sub) for sub in value]
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    closed = "properties" in out and "additionalProperties" not in out
    if closed and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def crd_object_schema(version_schema: dict[str, Any]) -> dict[str, Any]:
    schema = crd_to_json_schema(version_schema)
    schema.setdefault("properties", {})
    schema["properties"].setdefault("apiVersion", {"type": "string"})
    schema["properties"].setdefault("kind", {"type": "string"})
    schema["properties"].setdefault("metadata", {"type": "object"})
    return schema


@pytest.fixture(scope="module")
def schema_locations(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """kubeconform -schema-location templates for local Kubernetes and CRD schemas."""
    import kubernetes_validate

    source = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / K8S_SCHEMA_VERSION
    assert source.is_dir(), f"kubernetes_validate has no {K8S_SCHEMA_VERSION} schemas"
    definitions = json.loads((source / "_definitions.json").read_text())["$defs"]
    out = tmp_path_factory.mktemp("schemas")
    k8s, crds = out / "k8s", out / "crds"
    k8s.mkdir()
    # File names follow kubeconform's {{ .ResourceKind }}{{ .KindSuffix }}: kind-group-version.
    for path in source.glob("*.json"):
        if path.name.startswith("_") or not json.loads(path.read_text()).get(
            "x-kubernetes-group-version-kind"
        ):
            continue
        if path.stem.split("-")[0] in {
            "deployment",
            "serviceaccount",
            "service",
            "configmap",
            "clusterrole",
            "clusterrolebinding",
            "role",
            "rolebinding",
            "customresourcedefinition",
            "networkpolicy",
        }:
            (k8s / path.name).write_text(json.dumps(standalone_k8s_schema(path, definitions)))
    for crd_file in sorted((CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(crd_file.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"].lower()
        (crds / group).mkdir(parents=True, exist_ok=True)
        for version in crd["spec"]["versions"]:
            schema = crd_object_schema(version["schema"]["openAPIV3Schema"])
            (crds / group / f"{kind}_{version['name']}.json").write_text(json.dumps(schema))
    return [
        f"{k8s}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
        f"{crds}/{{{{ .Group }}}}/{{{{ .ResourceKind }}}}_{{{{ .ResourceAPIVersion }}}}.json",
    ]


def kubeconform(locations: list[str], manifests: str, *files: str) -> subprocess.CompletedProcess[str]:
    if not KUBECONFORM.exists():
        pytest.skip(f"{KUBECONFORM.relative_to(ROOT)} is absent: run hack/build-binaries.sh to build it")
    args = [str(KUBECONFORM), "-strict", "-summary", "-skip", MONITORING_KINDS]
    for location in locations:
        args += ["-schema-location", location]
    args += list(files) or ["-"]
    return subprocess.run(args, input=manifests, capture_output=True, text=True, timeout=120, check=False)


# ---------------------------------------------------------------- lint and render


@pytest.mark.parametrize("strict", [False, True], ids=["lint", "lint-strict"])
def test_helm_lint(strict: bool) -> None:
    done = helm("lint", str(CHART), *(["--strict"] if strict else []))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_value_sets(name: str) -> None:
    done = helm("lint", "--strict", str(CHART), *VALUE_SETS[name])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", sorted(RENDERED_SETS))
def test_rendered_manifests_validate(name: str, schema_locations: list[str]) -> None:
    manifests = template(*RENDERED_SETS[name], crds=True)
    done = kubeconform(schema_locations, manifests)
    assert done.returncode == 0, done.stdout + done.stderr
    match = re.search(r"Invalid: (\d+), Errors: (\d+), Skipped: (\d+)", done.stdout)
    assert match and match.groups()[:2] == ("0", "0"), done.stdout
    skipped = {doc["kind"] for doc in documents(manifests)} & set(MONITORING_KINDS.split(","))
    assert int(match.group(3)) == len([d for d in documents(manifests) if d["kind"] in skipped])


def test_crd_schemas_accept_the_examples(schema_locations: list[str]) -> None:
    """The converted CRD schemas are real: the repository's examples pass them, a typo does not."""
    examples = sorted(str(p) for p in (ROOT / "examples").rglob("*.yaml"))
    done = kubeconform(schema_locations, "", *examples)
    assert done.returncode == 0, done.stdout + done.stderr
    typo = (ROOT / "examples" / "quickstart" / "finetune-tiny-cpu.yaml").read_text()
    done = kubeconform(schema_locations, typo.replace("maxRetries:", "maxRetrys:"))
    assert done.returncode != 0 and "maxRetrys" in done.stdout, done.stdout


def test_kubernetes_schemas_are_strict(schema_locations: list[str]) -> None:
    """The local Kubernetes schemas do reject mistakes (so a pass above means something)."""
    field = "readOnlyRootFilesystem: true"
    bad = template().replace(field, f"{field}\n            readonlyRootFilesystem: true")
    done = kubeconform(schema_locations, bad)
    assert done.returncode != 0
    assert "additional properties 'readonlyRootFilesystem' not allowed" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "replicaz=2"], "additional properties 'replicaz' not allowed"),
        (["--set", "scope=namespace"], "value must be one of 'cluster', 'namespaces'"),
        (["--set", "metrics.prot=9000"], "additional properties 'prot' not allowed"),
        (["--set", "prices.h1000.onDemand=3"], "additional properties 'h1000' not allowed"),
        (["--set", "prices.h100.onDemand=-1"], "minimum"),
        (["--set", "scope=namespaces"], 'scope is "namespaces" but namespaces is empty'),
        (["--set", "namespaces={a}"], 'namespaces is set but scope is "cluster"'),
        (
            ["--set", "replicas=2", "--set", "leaderElection.enabled=false"],
            "replicas > 1 needs leaderElection",
        ),
        (["--set", "replicas=9"], "maximum"),
        (["--set", "workerImages.h100.pytorchh=x"], "additional properties 'pytorchh' not allowed"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_values_are_refused_clearly(args: list[str], message: str) -> None:
    done = helm("template", "accelbench", str(CHART), *args)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_monitors_need_the_prometheus_operator(kind: str) -> None:
    key = kind[0].lower() + kind[1:]
    done = helm("template", "accelbench", str(CHART), "--set", f"{key}.enabled=true")
    assert done.returncode != 0
    assert f"{key}.enabled is true but the cluster does not serve monitoring.coreos.com/v1" in done.stderr
    docs = documents(template("--set", f"{key}.enabled=true", "--api-versions", "monitoring.coreos.com/v1"))
    assert len(by_kind(docs, kind)) == 1


# ---------------------------------------------------------------- CRDs


def test_chart_crds_are_the_generated_ones() -> None:
    repo = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert repo, "crds/ is empty"
    for name, content in repo.items():
        assert chart.get(name) == content, f"charts/accelbench/crds/{name} differs from crds/{name}: copy it"
    assert set(chart) == set(repo), set(chart) ^ set(repo)


# ---------------------------------------------------------------- the Deployment


def test_deployment_runs_locked_down() -> None:
    docs = documents(template())
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert "--liveness=http://0.0.0.0:8081/healthz" in container["args"]
    assert "--metrics-port=8080" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["ACCELBENCH_PRICES_CONFIGMAP"]["value"] == "accelbench-prices"
    assert (env["ACCELBENCH_API_QPS"]["value"], env["ACCELBENCH_API_BURST"]["value"]) == ("300", "300")
    assert env["ACCELBENCH_WORKERS"]["value"] == "64"
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # Lease identity
    assert "--leader-election=accelbench" in container["args"]  # on by default: a second operator waits
    assert "strategy" not in deployment["spec"]  # rolling: the new pod waits for the old one's Lease
    assert not any(a.startswith("--namespace") for a in container["args"])


def test_deployment_args_follow_scope_and_leader_election() -> None:
    from accelbench.controller.__main__ import parse_args

    docs = documents(template(*VALUE_SETS["namespaces-standby"]))
    (deployment,) = by_kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = parse_args(container["args"])  # the operator's own parser accepts them
    assert args.namespace == ["team-a", "accelbench-system"]
    assert args.leader_election == "accelbench"
    assert args.liveness == "http://0.0.0.0:8081/healthz"
    (lease_role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "accelbench-lease"]
    assert lease_role["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert {(tuple(r["verbs"]), tuple(r.get("resourceNames", ()))) for r in lease_role["rules"]} == {
        (("create",), ()),
        (("get", "update"), ("accelbench",)),
    }

    docs = documents(template(*VALUE_SETS["no-election"]))
    (deployment,) = by_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert parse_args(container["args"]).leader_election is None
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # never two operators at once
    assert not [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-lease")]


# ---------------------------------------------------------------- RBAC


def rules_of(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    flat: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                flat.setdefault((group, resource), set()).update(rule["verbs"])
    return flat


def test_cluster_rbac_is_exactly_what_the_operator_uses() -> None:
    docs = documents(template())
    (role,) = by_kind(docs, "ClusterRole")
    assert rules_of(role) == expected_rules()
    assert [r["metadata"]["name"] for r in by_kind(docs, "Role")] == ["accelbench-lease"]  # its Lease only
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    (account,) = by_kind(docs, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": RELEASE_NAMESPACE}
    ]


def test_namespaced_rbac_is_exactly_what_the_operator_uses() -> None:
    docs = documents(template(*VALUE_SETS["namespaces"]))
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind(docs, "Role")}
    bindings = {(b["metadata"]["namespace"], b["metadata"]["name"]): b for b in by_kind(docs, "RoleBinding")}
    assert set(roles) == set(bindings)
    for namespace in ("team-a", "team-b"):
        assert rules_of(roles[(namespace, "accelbench")]) == expected_rules()
        subject = bindings[(namespace, "accelbench")]["subjects"][0]
        assert subject["namespace"] == RELEASE_NAMESPACE
    # The price book beside the operator (outside the served namespaces): read that one object only.
    (prices_rule,) = roles[(RELEASE_NAMESPACE, "accelbench-prices")]["rules"]
    assert prices_rule == {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": ["accelbench-prices"],
        "verbs": ["get"],
    }
    docs = documents(template(*VALUE_SETS["namespaces-standby"]))
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind(docs, "Role")}
    assert set(roles) == {
        ("team-a", "accelbench"),
        (RELEASE_NAMESPACE, "accelbench"),
        (RELEASE_NAMESPACE, "accelbench-lease"),
    }
    for key in (("team-a", "accelbench"), (RELEASE_NAMESPACE, "accelbench")):
        assert rules_of(roles[key]) == expected_rules()


def test_operator_may_grant_what_the_client_role_grants() -> None:
    """RBAC's escalation rule: the operator can create the client's Role only if it holds every
    permission that Role grants (it has no `escalate` or `bind` verb)."""
    (role,) = by_kind(documents(template()), "ClusterRole")
    held = rules_of(role)
    client_roles = [obj for obj in rendered_children() if obj["kind"] == "Role"]
    assert client_roles, "no example renders a client Role"
    for client_role in client_roles:
        for rule in client_role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    missing = set(rule["verbs"]) - held.get((group, resource), set())
                    assert not missing, f"operator lacks {sorted(missing)} on {resource}"


# ---------------------------------------------------------------- prices and dashboard


def test_prices_configmap_is_what_the_operator_reads(tmp_path: Path) -> None:
    from accelbench.catalog import (
        IMAGES_KEY,
        PRICES_KEY,
        load_catalog,
        parse_image_overrides,
        parse_price_overrides,
    )

    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "prices": {
                    "h100": {"onDemand": 9.8, "spot": 3.1, "source": "contract", "date": "2026-01-15"},
                    "tpu-v5p": {"onDemand": 3.5},
                }
            }
        )
    )
    (configmap,) = [
        d
        for d in by_kind(documents(template("-f", str(values))), "ConfigMap")
        if "prices" in d["metadata"]["name"]
    ]
    overrides = parse_price_overrides(configmap["data"])
    assert overrides == {
        "h100": {"on_demand": 9.8, "spot": 3.1, "source": "contract", "date": "2026-01-15"},
        "tpu-v5p": {"on_demand": 3.5},
    }
    assert load_catalog(price_overrides=overrides).get("h100").price.on_demand == 9.8
    (empty,) = [d for d in by_kind(documents(template()), "ConfigMap") if "prices" in d["metadata"]["name"]]
    assert parse_price_overrides(empty["data"]) == {}
    assert set(empty["data"]) == {PRICES_KEY, IMAGES_KEY}
    assert parse_image_overrides(empty["data"]) == {}


def test_worker_images_reach_the_catalog_the_operator_renders_with(tmp_path: Path) -> None:
    from accelbench.catalog import load_catalog, parse_image_overrides

    mirror = "registry.example.com/accelbench/worker-torch-cuda:0.1.0"
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"workerImages": {"h100": {"pytorch": mirror}}}))
    (configmap,) = [
        d
        for d in by_kind(documents(template("-f", str(values))), "ConfigMap")
        if "prices" in d["metadata"]["name"]
    ]
    images = parse_image_overrides(configmap["data"])
    catalog = load_catalog(image_overrides=images)
    assert catalog.get("h100").images.pytorch == mirror
    assert catalog.get("h100").images.bench == load_catalog().get("h100").images.bench  # others kept


def test_schema_lists_the_catalog_accelerators() -> None:
    from accelbench.catalog import load_catalog

    schema = json.loads((CHART / "values.schema.json").read_text())
    names = set(load_catalog().accelerators)
    assert set(schema["properties"]["prices"]["properties"]) == names
    assert set(schema["properties"]["workerImages"]["properties"]) == names


def test_dashboard_uses_only_metrics_the_operator_exports() -> None:
    from prometheus_client import CollectorRegistry

    from accelbench.controller.metrics import Metrics

    exported: set[str] = set()
    for family in Metrics(CollectorRegistry()).registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        exported |= {family.name + suffix for suffix in suffixes}
    dashboard = json.loads((CHART / "dashboards" / "accelbench.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {name for expr in exprs for name in re.findall(r"\baccelbench_[a-z0-9_]+", expr)}
    assert used and used <= exported, used - exported
    for name in exported - {
        "accelbench_reconcile_duration_seconds_sum",
        "accelbench_reconcile_duration_seconds_count",
    }:
        assert name in used, f"{name} is exported but not on the dashboard"

    docs = documents(template("--set", "dashboard.enabled=true"))
    (configmap,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["accelbench.json"]) == dashboard
