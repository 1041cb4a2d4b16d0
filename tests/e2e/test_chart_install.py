"""`helm install` into the real control plane, then the operator runs under the chart's
ServiceAccount for the rest of the session: every later test proves the chart's RBAC suffices."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from e2e_env import ROOT, Env, localcluster, wait_for

from accelbench.api.contract import ENV_OPERATOR_METRICS_NAMESPACES, ENV_OPERATOR_NETWORK_POLICIES

RELEASE, NAMESPACE = "accelbench", "accelbench-system"


def helm(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(localcluster.bin_dir() / "helm"), f"--kubeconfig={env.cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def service_account_kubeconfig(env: Env, token: str, path: Path) -> Path:
    admin = yaml.safe_load(env.cluster.kubeconfig.read_text())
    cluster = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "operator-sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "operator-sa"}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_helm_install_and_the_operator_runs_under_the_charts_service_account(env: Env) -> None:
    done = helm(
        env, "install", RELEASE, str(ROOT / "charts/accelbench"), "-n", NAMESPACE, "--create-namespace"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kubectl get finetunejobs" in done.stdout  # NOTES.txt
    deployment = env.kubectl("get", "deployment", RELEASE, "-n", NAMESPACE, "-o", "yaml").stdout
    pod_spec = yaml.safe_load(deployment)["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == RELEASE
    assert pod_spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True

    # No kubelet runs the chart's pod here, so run the operator process with that pod's identity:
    # a token of the chart's ServiceAccount, nothing more.
    token = env.kubectl("create", "token", RELEASE, "-n", NAMESPACE, "--duration=3h").stdout.strip()
    kubeconfig = service_account_kubeconfig(env, token, env.workdir / "operator-sa.kubeconfig")
    denied = env.kubectl(f"--kubeconfig={kubeconfig}", "get", "secrets", "-A", check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr  # least privilege, not admin
    env.operator.kubeconfig = kubeconfig
    env.operator.namespace = NAMESPACE
    # ... and with the chart's settings for what it renders (its NetworkPolicies).
    container_env = {e["name"]: e.get("value") for e in pod_spec["containers"][0]["env"]}
    env.operator.extra_env = {
        k: container_env[k] for k in (ENV_OPERATOR_NETWORK_POLICIES, ENV_OPERATOR_METRICS_NAMESPACES)
    }
    assert env.operator.extra_env[ENV_OPERATOR_NETWORK_POLICIES] == "true"  # on unless turned off
    env.operator.restart()
    wait_for(lambda: "accelbench controller configured" in env.operator.log(), what="operator start-up")
    assert env.operator.process is not None and env.operator.process.poll() is None
