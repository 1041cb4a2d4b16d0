"""kubeapi.config: kubeconfig and ServiceAccount parsing, token files, exec credential plugins (a real
script run as the plugin). Requests against a real apiserver are in tests/e2e/test_kubeapi_auth.py."""

from __future__ import annotations

import base64
import json
import stat
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelbench.kubeapi import ApiError, ConfigError, Response
from accelbench.kubeapi.config import (
    Auth,
    BasicAuth,
    ExecPlugin,
    TokenFile,
    connection_from_kubeconfig,
    current_context,
    in_cluster,
    kubeconfig_paths,
    load_connection,
    parse_exec_credential,
    read_kubeconfigs,
)


def kubeconfig(
    path: Path, user: dict[str, Any], *, cluster: dict[str, Any] | None = None, **extra: Any
) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443/"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "team"}}],
        "current-context": "ctx",
        **extra,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def connection(path: Path, context: str | None = None):
    return connection_from_kubeconfig(read_kubeconfigs([path]), context)


def test_token_user_and_the_context_namespace(tmp_path: Path) -> None:
    conn = connection(kubeconfig(tmp_path / "kc", {"token": "abc"}))
    assert conn.server == "https://10.0.0.1:6443"  # the trailing slash would double every path's
    assert conn.auth.headers() == {"Authorization": "Bearer abc"}
    assert (conn.namespace, conn.context) == ("team", "ctx")


def test_relative_files_are_read_beside_their_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "token").write_text("from-file\n")
    user = {"client-certificate": "pki/u.crt", "client-key": "pki/u.key", "tokenFile": "pki/token"}
    cluster = {"server": "https://h:1", "certificate-authority": "pki/ca.crt", "tls-server-name": "kube"}
    conn = connection(kubeconfig(tmp_path / "kc", user, cluster=cluster))
    assert conn.ca_file == str(tmp_path / "pki" / "ca.crt")
    assert (conn.client_cert_file, conn.client_key_file) == (
        str(tmp_path / "pki/u.crt"),
        str(tmp_path / "pki/u.key"),
    )
    assert conn.tls_server_name == "kube"
    assert isinstance(conn.auth, TokenFile) and conn.auth.headers() == {"Authorization": "Bearer from-file"}


def test_inline_certificates_become_private_files(tmp_path: Path) -> None:
    b64 = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    user = {"client-certificate-data": b64("CERT"), "client-key-data": b64("KEY")}
    cluster = {"server": "https://h:1", "certificate-authority-data": b64("CA PEM")}
    conn = connection(kubeconfig(tmp_path / "kc", user, cluster=cluster))
    assert conn.ca_data == "CA PEM"
    assert Path(conn.client_cert_file or "").read_text() == "CERT"
    key = Path(conn.client_key_file or "")
    assert key.read_text() == "KEY" and stat.S_IMODE(key.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("user", "cluster", "says"),
    [
        ({"client-certificate": "a.crt"}, None, "both the certificate and its key"),
        ({"client-key-data": "not base64!"}, None, "client-key-data is not base64"),
        ({"auth-provider": {"name": "gcp"}}, None, "gke-gcloud-auth-plugin"),
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}}, None, "v1alpha1"),
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1"}}, None, "exec has no command"),
        ({"token": "t"}, {"certificate-authority": "ca"}, "has no server"),
    ],
)
def test_bad_kubeconfigs_are_refused_with_the_field(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None, says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        connection(kubeconfig(tmp_path / "kc", user, cluster=cluster))


def test_unknown_context_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"context 'prod' is not in the kubeconfig \(contexts: ctx\)"):
        connection(kubeconfig(tmp_path / "kc", {"token": "t"}), "prod")


def test_no_kubeconfig_anywhere_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no kubeconfig found"):
        read_kubeconfigs([tmp_path / "missing"])
    assert current_context(str(tmp_path / "missing")) is None


def test_kubeconfig_list_merges_first_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = kubeconfig(tmp_path / "a", {"token": "first"})
    second = tmp_path / "b"
    doc = yaml.safe_load(first.read_text())
    doc["users"][0]["user"] = {"token": "second"}
    doc["contexts"].append({"name": "other", "context": {"cluster": "c", "user": "u"}})
    doc["current-context"] = "other"
    second.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KUBECONFIG", f"{first}:{tmp_path / 'absent'}:{second}")
    paths = kubeconfig_paths()
    assert paths == [first, tmp_path / "absent", second]
    merged = read_kubeconfigs(paths)
    assert merged["current-context"] == "ctx"  # the first file's
    assert connection_from_kubeconfig(merged, "other").auth.headers() == {"Authorization": "Bearer first"}
    assert kubeconfig_paths("/x/kc") == [Path("/x/kc")]


def test_basic_and_anonymous_users(tmp_path: Path) -> None:
    basic = connection(kubeconfig(tmp_path / "kc", {"username": "ann", "password": "pw"})).auth
    assert isinstance(basic, BasicAuth)
    assert basic.headers() == {"Authorization": "Basic " + base64.b64encode(b"ann:pw").decode()}
    assert type(connection(kubeconfig(tmp_path / "kc2", {})).auth) is Auth


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    assert in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, sa) is None  # no token: not a pod
    (sa / "token").write_text("pod-token")
    (sa / "ca.crt").write_text("PEM")
    (sa / "namespace").write_text("ops\n")
    conn = in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}, sa)
    assert conn is not None
    assert conn.server == "https://[fd00::1]:6443"
    assert (conn.ca_file, conn.namespace, conn.context) == (str(sa / "ca.crt"), "ops", None)
    assert conn.auth.headers() == {"Authorization": "Bearer pod-token"}
    assert in_cluster({}, sa) is None


def test_explicit_kubeconfig_wins_over_the_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    conn = load_connection(str(kubeconfig(tmp_path / "kc", {"token": "laptop"})))
    assert conn.auth.headers() == {"Authorization": "Bearer laptop"}


def test_token_file_is_read_again_when_rotated(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one")
    now = [0.0]
    auth = TokenFile(path, max_age=60, clock=lambda: now[0])
    assert auth.token() == "one"
    path.write_text("two")  # the kubelet rotated it
    now[0] = 59.0
    assert auth.token() == "one"  # not read on every request
    now[0] = 60.0
    assert auth.token() == "two"
    path.write_text("three")
    auth.invalidate()  # after a 401
    assert auth.token() == "three"
    path.unlink()
    auth.invalidate()
    with pytest.raises(ConfigError, match="cannot read the token file"):
        auth.token()


PLUGIN = """#!{python}
import json, os, pathlib, sys
calls = pathlib.Path(sys.argv[1])
n = int(calls.read_text()) + 1 if calls.exists() else 1
calls.write_text(str(n))
request = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
pathlib.Path(sys.argv[1] + ".request").write_text(json.dumps(request))
status = {{"token": f"{{os.environ['PREFIX']}}-{{n}}"}}
if sys.argv[2] != "none":
    status["expirationTimestamp"] = sys.argv[2]
print(json.dumps({{"apiVersion": request["apiVersion"], "kind": "ExecCredential", "status": status}}))
"""


def exec_user(tmp_path: Path, expiry: str, **extra: Any) -> dict[str, Any]:
    script = tmp_path / "plugin.py"
    script.write_text(PLUGIN.format(python=sys.executable))
    script.chmod(0o755)
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "./plugin.py",  # relative to the kubeconfig, as kubectl resolves it
            "args": [str(tmp_path / "calls"), expiry],
            "env": [{"name": "PREFIX", "value": "tok"}],
            **extra,
        }
    }


def test_exec_plugin_token_is_kept_until_it_expires(tmp_path: Path) -> None:
    expiry = datetime(2030, 1, 1, tzinfo=UTC)
    path = kubeconfig(tmp_path / "kc", exec_user(tmp_path, "2030-01-01T00:00:00Z", provideClusterInfo=True))
    auth = connection(path).auth
    assert isinstance(auth, ExecPlugin)
    now = [expiry - timedelta(hours=1)]
    auth.clock = lambda: now[0]
    assert auth.headers() == {"Authorization": "Bearer tok-1"}
    assert auth.headers() == {"Authorization": "Bearer tok-1"}  # cached: the plugin ran once
    assert auth.runs == 1 and auth.expires == expiry
    request = json.loads((tmp_path / "calls.request").read_text())
    assert request["spec"]["cluster"]["server"] == "https://10.0.0.1:6443/"
    assert request["spec"]["interactive"] is False
    now[0] = expiry - timedelta(seconds=10)  # inside the margin: ask again before it lapses
    assert auth.headers() == {"Authorization": "Bearer tok-2"}
    auth.invalidate()  # a 401
    assert auth.headers() == {"Authorization": "Bearer tok-3"} and auth.runs == 3


def test_exec_plugin_without_expiry_runs_once_until_a_401(tmp_path: Path) -> None:
    auth = connection(kubeconfig(tmp_path / "kc", exec_user(tmp_path, "none"))).auth
    assert [auth.headers()["Authorization"] for _ in range(3)] == ["Bearer tok-1"] * 3
    assert auth.expires is None


def test_exec_plugin_failures_say_what_the_plugin_said(tmp_path: Path) -> None:
    failing = ExecPlugin(
        command=sys.executable, args=["-c", "import sys; sys.exit('no login: run gcloud auth')"]
    )
    with pytest.raises(ConfigError, match="exited 1: no login: run gcloud auth"):
        failing.token()
    with pytest.raises(ConfigError, match="did not run"):
        ExecPlugin(command=str(tmp_path / "absent")).token()
    with pytest.raises(ConfigError, match="printed no ExecCredential"):
        parse_exec_credential("not json", "p")
    with pytest.raises(ConfigError, match="client certificate"):
        parse_exec_credential('{"status": {"clientCertificateData": "x"}}', "p")
    assert parse_exec_credential('{"status": {"token": "t"}}', "p") == ("t", None)


def test_api_error_reads_the_status_message() -> None:
    body = json.dumps(
        {"kind": "Status", "message": 'jobs.batch "x" already exists', "reason": "AlreadyExists"}
    )
    with pytest.raises(ApiError) as caught:
        Response(409, body.encode(), {}, "Conflict").raise_for_status()
    assert caught.value.status == 409
    assert caught.value.message == 'jobs.batch "x" already exists'
    assert str(caught.value) == '(409) Conflict: jobs.batch "x" already exists'
    assert ApiError(503, "Service Unavailable").message == "Service Unavailable"
    assert Response(200, b"", {}).raise_for_status().json() == {}


def test_a_bad_expiry_is_refused_without_echoing_the_token() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_exec_credential('{"status": {"token": "secret", "expirationTimestamp": "soon"}}', "p")
    assert "secret" not in str(caught.value)  # a credential never goes into a message or a log
    assert "'soon'" in str(caught.value)


def test_kopf_logs_in_with_the_same_connection(tmp_path: Path) -> None:
    from accelbench.controller.handlers import connection_info

    user = {"client-certificate": "u.crt", "client-key": "u.key", "token": "abc"}
    info = connection_info(connection(kubeconfig(tmp_path / "kc", user)))
    assert (info.server, info.scheme, info.token, info.default_namespace) == (
        "https://10.0.0.1:6443",
        "Bearer",
        "abc",
        "team",
    )
    assert info.certificate_path == str(tmp_path / "u.crt") and info.username is None
    basic = connection_info(connection(kubeconfig(tmp_path / "kc2", {"username": "ann", "password": "pw"})))
    assert (basic.username, basic.password, basic.token) == ("ann", "pw", None)
    anonymous = connection_info(connection(kubeconfig(tmp_path / "kc3", {})))
    assert (anonymous.scheme, anonymous.token, anonymous.expiration) == (None, None, None)
