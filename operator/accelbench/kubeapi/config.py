"""Where the apiserver is and how this process proves who it is.

Two sources, as kubectl reads them:
- in a pod, its ServiceAccount: KUBERNETES_SERVICE_HOST/PORT, the mounted CA and token. The token
  is a projected one that the kubelet rotates, so it is read again once it is a minute old;
- a kubeconfig: $KUBECONFIG (several files merged, the first to name a cluster, user or context
  wins) or ~/.kube/config, one context (the current one unless named). Clusters give server, CA
  (file or data), insecure-skip-tls-verify, tls-server-name and proxy-url; users a token or
  tokenFile, a client certificate and key (file or data), a username and password, or an exec
  credential plugin (client.authentication.k8s.io, the way GKE, EKS and AKS log in) whose token is
  kept until its expirationTimestamp and asked for again after a 401.

The legacy `auth-provider` plugins (gcp, azure, oidc) were removed from kubectl in 1.26; a
kubeconfig still naming one is refused with the exec plugin that replaced it. Parsing is pure
(`connection_from_kubeconfig`); reading files and running the plugin happen in the Auth objects.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
ENV_SERVICE_HOST = "KUBERNETES_SERVICE_HOST"
ENV_SERVICE_PORT = "KUBERNETES_SERVICE_PORT"
ENV_KUBECONFIG = "KUBECONFIG"
ENV_EXEC_INFO = "KUBERNETES_EXEC_INFO"  # the ExecCredential request a credential plugin reads
DEFAULT_KUBECONFIG = Path("~/.kube/config")
TOKEN_REREAD_SECONDS = 60.0  # the kubelet rotates projected tokens well before they expire
EXEC_EXPIRY_MARGIN_SECONDS = 30.0  # ask the plugin again this long before its token expires
EXEC_TIMEOUT_SECONDS = 60.0
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class ConfigError(Exception):
    """No usable cluster configuration; the message says which file or field."""


# --------------------------------------------------------------------------------------------------
# Credentials


class Auth:
    """Headers that authenticate a request. `invalidate` after a 401: the next call fetches anew."""

    expires: datetime | None = None  # when the credentials last fetched stop working, if known

    def headers(self) -> dict[str, str]:
        return {}

    def invalidate(self) -> None:
        return None


@dataclass
class StaticToken(Auth):
    token: str

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class BasicAuth(Auth):
    username: str
    password: str

    def headers(self) -> dict[str, str]:
        pair = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}


class FetchedToken(Auth):
    """A bearer token fetched on demand (`token`) and kept until it ages or a 401 invalidates it.
    Subclasses are dataclasses holding `_token` and `_lock`."""

    _token: str | None
    _lock: threading.Lock

    def token(self) -> str:
        raise NotImplementedError

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}"}

    def invalidate(self) -> None:
        with self._lock:
            self._token = None


@dataclass
class TokenFile(FetchedToken):
    """A token in a file that something else rewrites (the kubelet, a sidecar): read again once
    `max_age` seconds old or after a 401."""

    path: Path
    max_age: float = TOKEN_REREAD_SECONDS
    clock: Callable[[], float] = time.monotonic
    _token: str | None = field(default=None, repr=False)
    _read_at: float = field(default=0.0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def token(self) -> str:
        with self._lock:
            now = self.clock()
            if self._token is None or now - self._read_at >= self.max_age:
                try:
                    self._token = self.path.read_text().strip()
                except OSError as exc:
                    raise ConfigError(f"cannot read the token file {self.path}: {exc}") from None
                self._read_at = now
            return self._token


@dataclass
class ExecPlugin(FetchedToken):
    """A client.authentication.k8s.io credential plugin: run `command`, read an ExecCredential from
    its stdout, keep its token until `expirationTimestamp` (minus a margin), or for the process's
    life when it gives none, and run it again after a 401."""

    command: str
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    api_version: str = EXEC_API_VERSIONS[0]
    cluster: Mapping[str, Any] = field(default_factory=dict)  # provideClusterInfo's spec.cluster
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    runs: int = 0  # how many times the plugin ran (tests and logs)
    _token: str | None = field(default=None, repr=False)
    _expires: datetime | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def expires(self) -> datetime | None:  # type: ignore[override]
        return self._expires

    def token(self) -> str:
        with self._lock:
            fresh = self._expires is None or (
                (self._expires - self.clock()).total_seconds() > EXEC_EXPIRY_MARGIN_SECONDS
            )
            if self._token is None or not fresh:
                self._token, self._expires = self._run()
            return self._token

    def _run(self) -> tuple[str, datetime | None]:
        request: dict[str, Any] = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {}}
        request["spec"]["interactive"] = False
        if self.cluster:
            request["spec"]["cluster"] = dict(self.cluster)
        env = {**os.environ, **self.env, ENV_EXEC_INFO: json.dumps(request)}
        self.runs += 1
        try:
            done = subprocess.run(
                [self.command, *self.args],
                env=env,
                capture_output=True,
                text=True,
                timeout=EXEC_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"the credential plugin {self.command} did not run: {exc}") from None
        if done.returncode != 0:
            tail = done.stderr.strip()[-500:]
            raise ConfigError(f"the credential plugin {self.command} exited {done.returncode}: {tail}")
        return parse_exec_credential(done.stdout, self.command)


def parse_exec_credential(stdout: str, command: str) -> tuple[str, datetime | None]:
    """(token, expiry) from an ExecCredential; only token credentials are taken."""
    try:
        status = (json.loads(stdout) or {}).get("status") or {}
    except (ValueError, AttributeError):
        raise ConfigError(f"the credential plugin {command} printed no ExecCredential JSON") from None
    token = status.get("token")
    if not token:
        if status.get("clientCertificateData"):
            raise ConfigError(
                f"the credential plugin {command} returned a client certificate; only plugins that "
                "return a token are supported"
            )
        raise ConfigError(f"the credential plugin {command} returned no status.token")
    expiry = status.get("expirationTimestamp")
    if not expiry:
        return str(token), None
    try:
        when = datetime.fromisoformat(str(expiry).replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"the credential plugin {command}: bad expirationTimestamp {expiry!r}") from None
    return str(token), when if when.tzinfo else when.replace(tzinfo=UTC)


# --------------------------------------------------------------------------------------------------
# The connection


@dataclass
class Connection:
    """Everything a request needs: where, which CA to trust, which client certificate to show, and
    the Auth that adds the Authorization header."""

    server: str
    auth: Auth = field(default_factory=Auth)
    ca_file: str | None = None
    ca_data: str | None = None  # PEM
    insecure: bool = False
    tls_server_name: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    proxy_url: str | None = None
    namespace: str | None = None  # the context's default namespace (or the pod's)
    context: str | None = None  # the kubeconfig context's name; None in a pod


def in_cluster(env: Mapping[str, str] | None = None, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> Connection | None:
    """The pod's ServiceAccount, or None when this process is not in a pod."""
    env = os.environ if env is None else env
    host, port = env.get(ENV_SERVICE_HOST), env.get(ENV_SERVICE_PORT) or "443"
    if not host or not (sa_dir / "token").is_file():
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    namespace_file = sa_dir / "namespace"
    return Connection(
        server=f"https://{host}:{port}",
        auth=TokenFile(sa_dir / "token"),
        ca_file=str(sa_dir / "ca.crt") if (sa_dir / "ca.crt").is_file() else None,
        namespace=namespace_file.read_text().strip() if namespace_file.is_file() else None,
    )


def kubeconfig_paths(explicit: str | None = None, env: Mapping[str, str] | None = None) -> list[Path]:
    """The files kubectl would read: the one given, else $KUBECONFIG's list, else ~/.kube/config."""
    env = os.environ if env is None else env
    if explicit:
        return [Path(explicit).expanduser()]
    listed = [p for p in (env.get(ENV_KUBECONFIG) or "").split(os.pathsep) if p]
    return [Path(p).expanduser() for p in listed] if listed else [DEFAULT_KUBECONFIG.expanduser()]


def read_kubeconfigs(paths: Sequence[Path]) -> dict[str, Any]:
    """The merged kubeconfig: per name, the first file's cluster, user and context win, as does the
    first current-context. Relative file references are resolved against their own file's folder."""
    merged: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}, "current-context": None}
    found = False
    for path in paths:
        if not path.is_file():
            continue
        found = True
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"kubeconfig {path} is not a mapping")
        for section, inner in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for entry in doc.get(section) or []:
                if isinstance(entry, dict) and entry.get("name") and entry["name"] not in merged[section]:
                    merged[section][entry["name"]] = {**(entry.get(inner) or {}), "_dir": str(path.parent)}
        merged["current-context"] = merged["current-context"] or doc.get("current-context")
    if not found:
        raise ConfigError(f"no kubeconfig found (looked at {', '.join(str(p) for p in paths)})")
    return merged


def _file(entry: Mapping[str, Any], key: str) -> str | None:
    value = entry.get(key)
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else Path(entry["_dir"]) / path)


def _data(entry: Mapping[str, Any], key: str, what: str) -> bytes | None:
    value = entry.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise ConfigError(f"{what}: {key} is not base64") from None


def _private_file(content: bytes, suffix: str) -> str:
    """Client certificates and keys given inline must be files for TLS: 0600, removed at exit."""
    handle = tempfile.NamedTemporaryFile(prefix="accelbench-kube-", suffix=suffix, delete=False)  # noqa: SIM115
    with handle:
        handle.write(content)
    os.chmod(handle.name, 0o600)
    _TEMP_FILES.append(handle.name)
    return handle.name


_TEMP_FILES: list[str] = []


@atexit.register
def _remove_temp_files() -> None:
    for name in _TEMP_FILES:
        with contextlib.suppress(OSError):
            os.unlink(name)


LEGACY_AUTH_PROVIDERS = {
    "gcp": "gke-gcloud-auth-plugin (gcloud components install gke-gcloud-auth-plugin)",
    "azure": "kubelogin (az aks install-cli)",
    "oidc": "kubelogin's oidc-login",
}


def connection_from_kubeconfig(merged: Mapping[str, Any], context: str | None = None) -> Connection:
    """The Connection of one context of a merged kubeconfig (`read_kubeconfigs`)."""
    name = context or merged.get("current-context")
    if not name:
        raise ConfigError("the kubeconfig has no current-context; name one with --context")
    ctx = merged["contexts"].get(name)
    if ctx is None:
        known = ", ".join(sorted(merged["contexts"])) or "none"
        raise ConfigError(f"context {name!r} is not in the kubeconfig (contexts: {known})")
    cluster = merged["clusters"].get(ctx.get("cluster"))
    if cluster is None or not cluster.get("server"):
        raise ConfigError(f"context {name!r}: cluster {ctx.get('cluster')!r} has no server")
    user = merged["users"].get(ctx.get("user")) or {"_dir": ctx["_dir"]}
    what = f"kubeconfig user {ctx.get('user')!r}"

    ca_data = _data(cluster, "certificate-authority-data", f"cluster {ctx.get('cluster')!r}")
    cert_file = _file(user, "client-certificate")
    key_file = _file(user, "client-key")
    if (cert := _data(user, "client-certificate-data", what)) is not None:
        cert_file = _private_file(cert, ".crt")
    if (key := _data(user, "client-key-data", what)) is not None:
        key_file = _private_file(key, ".key")
    if bool(cert_file) != bool(key_file):
        raise ConfigError(f"{what}: a client certificate needs both the certificate and its key")
    return Connection(
        server=str(cluster["server"]).rstrip("/"),
        auth=_auth_of(user, cluster, what),
        ca_file=_file(cluster, "certificate-authority"),
        ca_data=ca_data.decode() if ca_data else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name"),
        client_cert_file=cert_file,
        client_key_file=key_file,
        proxy_url=cluster.get("proxy-url"),
        namespace=ctx.get("namespace"),
        context=str(name),
    )


def _auth_of(user: Mapping[str, Any], cluster: Mapping[str, Any], what: str) -> Auth:
    if user.get("token"):
        return StaticToken(str(user["token"]))
    if token_file := _file(user, "tokenFile"):
        return TokenFile(Path(token_file))
    if exec_spec := user.get("exec"):
        api_version = exec_spec.get("apiVersion")
        if api_version not in EXEC_API_VERSIONS:
            known = ", ".join(EXEC_API_VERSIONS)
            raise ConfigError(f"{what}: exec apiVersion {api_version!r} is not one of {known}")
        if not exec_spec.get("command"):
            raise ConfigError(f"{what}: exec has no command")
        info: dict[str, Any] = {}
        if exec_spec.get("provideClusterInfo"):
            info = {"server": cluster.get("server")}
            if cluster.get("certificate-authority-data"):
                info["certificate-authority-data"] = cluster["certificate-authority-data"]
        command = str(exec_spec["command"])
        if os.sep in command and not Path(command).is_absolute():
            command = str(Path(user["_dir"]) / command)  # a path relative to the kubeconfig
        return ExecPlugin(
            command=command,
            args=[str(a) for a in exec_spec.get("args") or []],
            env={str(e["name"]): str(e["value"]) for e in exec_spec.get("env") or [] if "name" in e},
            api_version=str(api_version),
            cluster=info,
        )
    if provider := user.get("auth-provider"):
        provider_name = (provider or {}).get("name")
        instead = LEGACY_AUTH_PROVIDERS.get(str(provider_name), "its exec credential plugin")
        raise ConfigError(
            f"{what}: auth-provider {provider_name!r} was removed from Kubernetes clients in 1.26; "
            f"log in with {instead} instead"
        )
    if user.get("username") and user.get("password"):
        return BasicAuth(str(user["username"]), str(user["password"]))
    return Auth()  # a client certificate alone, or anonymous


def load_connection(kubeconfig: str | None = None, context: str | None = None) -> Connection:
    """An explicit kubeconfig or context wins; else in a pod its ServiceAccount; else the default
    kubeconfig (the local control plane, a user's laptop)."""
    if kubeconfig is None and context is None and (pod := in_cluster()) is not None:
        return pod
    return connection_from_kubeconfig(read_kubeconfigs(kubeconfig_paths(kubeconfig)), context)


def current_context(kubeconfig: str | None = None) -> str | None:
    """The kubeconfig's current context (None without a kubeconfig)."""
    try:
        return read_kubeconfigs(kubeconfig_paths(kubeconfig)).get("current-context")
    except ConfigError:
        return None
