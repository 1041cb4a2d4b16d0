"""The operator's Kubernetes transport (accelbench.kubeapi) against the real apiserver, with each way a
kubeconfig can log in: inline client certificates, a token file, and an exec credential plugin (the
way GKE, EKS and AKS log in), including a plugin whose first token the apiserver refuses (401), which
must be fetched again once. The apiserver's SelfSubjectReview says who it took each request for."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_env import Env

from accelbench.controller.kube import Kube
from accelbench.kubeapi import ApiError, KubeHTTP, load_connection
from accelbench.kubeapi.config import ExecPlugin

SELF_REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
NAMESPACE = "kubeapi-auth"
ACCOUNT = "prober"


def who_am_i(kubeconfig: Path) -> tuple[str, KubeHTTP]:
    http = KubeHTTP(load_connection(str(kubeconfig)))
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    answer = http.request("POST", SELF_REVIEW, body=review).raise_for_status().json()
    return answer["status"]["userInfo"]["username"], http


def kubeconfig_with(env: Env, path: Path, user: dict[str, Any], *, inline_ca: bool = False) -> Path:
    admin = yaml.safe_load(env.cluster.kubeconfig.read_text())
    cluster = dict(admin["clusters"][0]["cluster"])
    if inline_ca:
        cluster["certificate-authority-data"] = base64.b64encode(
            Path(cluster.pop("certificate-authority")).read_bytes()
        ).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "here", "context": {"cluster": "local", "user": "u"}}],
        "current-context": "here",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def account_token(env: Env) -> str:
    env.kubectl("create", "namespace", NAMESPACE, check=False)
    env.kubectl("create", "serviceaccount", ACCOUNT, "-n", NAMESPACE, check=False)
    return env.kubectl("create", "token", ACCOUNT, "-n", NAMESPACE, "--duration=1h").stdout.strip()


def test_inline_client_certificate_and_ca(env: Env, tmp_path: Path) -> None:
    admin = yaml.safe_load(env.cluster.kubeconfig.read_text())["users"][0]["user"]
    user = {
        "client-certificate-data": base64.b64encode(Path(admin["client-certificate"]).read_bytes()).decode(),
        "client-key-data": base64.b64encode(Path(admin["client-key"]).read_bytes()).decode(),
    }
    name, _ = who_am_i(kubeconfig_with(env, tmp_path / "kc", user, inline_ca=True))
    assert name == who_am_i(env.cluster.kubeconfig)[0]  # the same certificate, from files there
    kube = Kube(load_connection(str(tmp_path / "kc")))
    assert any(ns["metadata"]["name"] == "default" for ns in kube._call("GET", "/api/v1/namespaces")["items"])


def test_token_file(env: Env, tmp_path: Path, account_token: str) -> None:
    (tmp_path / "token").write_text(account_token)
    name, _ = who_am_i(kubeconfig_with(env, tmp_path / "kc", {"tokenFile": "token"}))
    assert name == f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"


PLUGIN = """import json, pathlib, sys
calls = pathlib.Path(sys.argv[1])
n = int(calls.read_text()) + 1 if calls.exists() else 1
calls.write_text(str(n))
token = "not-a-token" if n == 1 and sys.argv[3] == "refused-first" else pathlib.Path(sys.argv[2]).read_text()
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": token, "expirationTimestamp": "2099-01-01T00:00:00Z"}}))
"""


@pytest.mark.parametrize("first", ["accepted", "refused-first"])
def test_exec_plugin(env: Env, tmp_path: Path, account_token: str, first: str) -> None:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    (tmp_path / "token").write_text(account_token)
    calls = tmp_path / "calls"
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(tmp_path / "plugin.py"), str(calls), str(tmp_path / "token"), first],
            "interactiveMode": "Never",
        }
    }
    name, http = who_am_i(kubeconfig_with(env, tmp_path / "kc", user))
    assert name == f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
    assert isinstance(http.conn.auth, ExecPlugin)
    # Refused first: the 401 made the transport ask the plugin again, once; else it ran once.
    assert int(calls.read_text()) == (2 if first == "refused-first" else 1)
    # The token is kept until it expires: a second request does not run the plugin.
    http.request("GET", "/version").raise_for_status()
    assert int(calls.read_text()) == (2 if first == "refused-first" else 1)


def test_a_refused_token_is_an_api_error_with_the_status(env: Env, tmp_path: Path) -> None:
    kube = Kube(load_connection(str(kubeconfig_with(env, tmp_path / "kc", {"token": "wrong"}))))
    with pytest.raises(ApiError) as caught:
        kube.list("v1", "ConfigMap", "default")
    assert caught.value.status == 401
    assert json.loads(caught.value.body)["kind"] == "Status"
