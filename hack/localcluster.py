#!/usr/bin/env python3
"""A real, local Kubernetes control plane for end-to-end tests.

Runs etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok as
plain processes bound to 127.0.0.1 on free ports, with real TLS, RBAC and
service-account tokens. Accelerator nodes are kwok fakes (see nodepools.yaml);
one extra node, ``local-exec-0``, is left for a local executor.

Library use (e.g. from a pytest fixture)::

    cluster = start_cluster(tmp_path / "cluster")
    try:
        api = cluster.api_client()
        create_node_pools(api)
        ...
    finally:
        cluster.stop()

CLI::

    python hack/localcluster.py up      [--dir DIR] [--no-node-pools] [--kwok-pod-stages fast|general]
    python hack/localcluster.py status  [--dir DIR]
    python hack/localcluster.py down    [--dir DIR]

Binaries come from ``$ACCELBENCH_BIN_DIR`` or ``<repo>/.bin`` (built by
hack/build-binaries.sh, which is run automatically when a binary is missing).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WORKDIR = REPO_ROOT / ".cluster"
DEFAULT_NODE_POOLS = Path(__file__).resolve().parent / "nodepools.yaml"
PID_FILE = "pids.json"
STATE_FILE = "cluster.json"
KUBECONFIG_NAME = "kubeconfig"
AUDIT_LOG_NAME = "audit.log"
AUDIT_POLICY_NAME = "audit-policy.yaml"
# Metadata (who, verb, resource, response code) of every request made with a ServiceAccount token,
# except kube-system's (the controllers'): the operator's and the pods' API use, for RBAC checks.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}

KWOK_NODE_KEY = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
# The apiserver's Service range is only used for allocation; no traffic goes there.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
# Pod IPs that kwok writes into pod status; nothing is routed to them.
KWOK_POD_CIDR = "10.244.0.0/16"
CLUSTER_NAME = "accelbench-local"
# kwok pod-lifecycle profiles written by hack/build-binaries.sh (kwok-stages-<profile>.yaml):
# "fast" runs pods (and completes Job pods) at once; "general" honours per-pod
# annotations such as pod-complete.stage.kwok.x-k8s.io/delay: "1h".
KWOK_PROFILES = ("fast", "general")
DEFAULT_KWOK_PROFILE = os.environ.get("ACCELBENCH_KWOK_POD_STAGES", "fast")
# Stages every profile gets: what a kubelet does that kwok's stock stages do not (see the file).
KWOK_KUBELET_STAGES = Path(__file__).resolve().parent / "kwok-stages-kubelet.yaml"

# Stop order: dependants first, etcd last.
COMPONENTS = ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


# --------------------------------------------------------------------------- binaries


def bin_dir() -> Path:
    """Directory holding the control-plane binaries."""
    return Path(os.environ.get("ACCELBENCH_BIN_DIR", REPO_ROOT / ".bin"))


def ensure_binaries(names: Iterable[str] = COMPONENTS) -> Path:
    """Return the binary dir, running hack/build-binaries.sh if anything is missing.

    The script is a no-op (seconds) when its cache is warm; a cold build takes
    tens of minutes, which is why we say so before starting it.
    """
    directory = bin_dir()
    missing = [n for n in names if not (directory / n).exists()]
    if missing and "ACCELBENCH_BIN_DIR" not in os.environ:
        print(
            f"localcluster: missing {missing}; running hack/build-binaries.sh "
            "(a cold build takes a long time)",
            file=sys.stderr,
        )
        subprocess.run([str(REPO_ROOT / "hack" / "build-binaries.sh")], check=True)
        missing = [n for n in names if not (directory / n).exists()]
    if missing:
        raise FileNotFoundError(f"binaries not found in {directory}: {missing}")
    return directory


# --------------------------------------------------------------------------- PKI


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _new_ec_key(path: Path) -> None:
    # P-256 keys are generated instantly, unlike RSA, and Go's TLS stack accepts them.
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", path.name, cwd=path.parent)


def _make_ca(pki: Path) -> None:
    _new_ec_key(pki / "ca.key")
    (pki / "ca.ext").write_text(
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign,digitalSignature\n"
    )
    _openssl("req", "-new", "-key", "ca.key", "-subj", f"/CN={CLUSTER_NAME}-ca", "-out", "ca.csr", cwd=pki)
    _openssl(
        "x509",
        "-req",
        "-in",
        "ca.csr",
        "-signkey",
        "ca.key",
        "-days",
        "3650",
        "-extfile",
        "ca.ext",
        "-out",
        "ca.crt",
        cwd=pki,
    )


def _make_cert(pki: Path, name: str, subject: str, *, server_sans: list[str] | None = None) -> None:
    """Issue ``name``.crt/.key signed by the cluster CA (client cert unless SANs given)."""
    _new_ec_key(pki / f"{name}.key")
    ext = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
    if server_sans:
        ext += ["extendedKeyUsage=serverAuth,clientAuth", "subjectAltName=" + ",".join(server_sans)]
    else:
        ext.append("extendedKeyUsage=clientAuth")
    (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "3650",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.crt",
        cwd=pki,
    )


def issue_serving_cert(cluster_workdir: Path, name: str, sans: list[str]) -> tuple[Path, Path]:
    """A serving certificate signed by the cluster's CA (its ca.crt is what the apiserver trusts as
    a webhook's caBundle), for a server beside the control plane: (cert, key) paths."""
    pki = cluster_workdir / "pki"
    _make_cert(pki, name, f"/CN={name}", server_sans=sans)
    return pki / f"{name}.crt", pki / f"{name}.key"


# Client identities: the CNs/groups are the ones the built-in RBAC roles bind to.
CLIENT_IDENTITIES = {
    "admin": "/O=system:masters/CN=accelbench-admin",
    "kube-controller-manager": "/CN=system:kube-controller-manager",
    "kube-scheduler": "/CN=system:kube-scheduler",
    # kwok patches node/pod status and node leases cluster-wide, like a fleet of kubelets.
    "kwok": "/O=system:masters/CN=kwok",
    # The apiserver's identity towards aggregated APIs (front proxy).
    "front-proxy-client": "/CN=front-proxy-client",
}


def generate_pki(pki: Path) -> None:
    """Create the CA, serving/client certificates and the service-account key pair."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl CLI is required to generate certificates")
    pki.mkdir(parents=True, exist_ok=True)
    _make_ca(pki)
    sans = [
        "IP:127.0.0.1",
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
        f"IP:{KUBERNETES_SERVICE_IP}",
    ]
    _make_cert(pki, "apiserver", "/CN=kube-apiserver", server_sans=sans)
    for name, subject in CLIENT_IDENTITIES.items():
        _make_cert(pki, name, subject)
    # RSA for the service-account signer: RS256 is what every token consumer supports.
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=pki)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{user}.crt"),
                    "client-key": str(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": CLUSTER_NAME,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    """A currently free loopback TCP port (the tiny reuse race is acceptable for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_ok(url: str) -> bool:
    """A GET of `url` answered 200 within 2 s: a server beside the control plane is up or ready."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def stop_process(process: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM a server we started, SIGKILL after `timeout`; reaped either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _die_with_parent() -> None:
    """preexec_fn: new process group, and SIGKILL when the launching thread dies.

    The process group lets stop() kill a component together with anything it
    forked; PR_SET_PDEATHSIG means a crashed pytest run leaves nothing behind.
    SIGKILL rather than SIGTERM because a terminated kube-apiserver keeps
    retrying its (also dying) etcd for a long time; the data is throw-away.
    Caveat: the signal fires when the *thread* that started the cluster exits,
    so start clusters from a long-lived thread (pytest fixtures are fine).
    """
    os.setsid()
    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):  # not Linux: best effort only
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def spawn(name: str, argv: list[str], logdir: Path, *, detach: bool) -> subprocess.Popen[bytes]:
    log = (logdir / f"{name}.log").open("ab")
    preexec: Callable[[], None] | None = None if detach else _die_with_parent
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=detach,  # detached: own session, survives the CLI exiting
        preexec_fn=preexec,
        close_fds=True,
    )
    log.close()
    return proc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _owned_by(pid: int, workdir: Path) -> bool:
    """True if ``pid`` is one of our components: every command line names the workdir.

    Guards `down` against killing an unrelated process that reused a stale pid.
    """
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return str(workdir).encode() in cmdline


def terminate(pid: int, timeout: float = 15.0) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL after ``timeout``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _reap(pid)
            if not _pid_alive(pid):
                return
            time.sleep(0.1)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child (e.g. `down`)
        os.waitpid(pid, os.WNOHANG)


# --------------------------------------------------------------------------- readiness


def wait_until(
    check: Callable[[], bool],
    what: str,
    timeout: float,
    procs: dict[str, subprocess.Popen[bytes]] | None = None,
    logdir: Path | None = None,
) -> None:
    """Poll ``check`` until true; fail fast with the log tail if a component died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, proc in (procs or {}).items():
            if proc.poll() is not None:
                tail = _log_tail(logdir, name) if logdir else ""
                raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for {what}\n{tail}")
        try:
            if check():
                return
        except Exception:  # anything short of success means "not yet"
            pass
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _log_tail(logdir: Path, name: str, lines: int = 30) -> str:
    path = logdir / f"{name}.log"
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _https_ok(url: str, context: ssl.SSLContext) -> bool:
    with urllib.request.urlopen(url, context=context, timeout=2) as resp:
        return resp.status == 200


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return resp.status == 200


def _admin_ssl_context(pki: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def _self_signed_ok_context() -> ssl.SSLContext:
    # kube-controller-manager/scheduler serve /healthz with an in-memory self-signed cert.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# --------------------------------------------------------------------------- cluster


@dataclass
class Cluster:
    """Handle on a running local control plane."""

    workdir: Path
    kubeconfig: Path
    server: str
    ports: dict[str, int]
    pids: dict[str, int]
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: one JSON event per request a ServiceAccount made outside
        kube-system (AUDIT_POLICY), so what the operator and the pods did can be read back."""
        return self.workdir / AUDIT_LOG_NAME

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient authenticated as the cluster admin."""
        from kubernetes import config as kube_config

        return kube_config.new_client_from_config(config_file=str(self.kubeconfig))

    def stop(self) -> None:
        """Stop every component (process groups), dependants first. Idempotent."""
        for name in COMPONENTS:
            pid = self.pids.pop(name, None)
            if pid is not None:
                terminate(pid)
            proc = self._procs.pop(name, None)
            if proc is not None:
                proc.wait(timeout=5)
        (self.workdir / PID_FILE).unlink(missing_ok=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _component_args(
    workdir: Path, bins: Path, ports: dict[str, int], kwok_profile: str
) -> dict[str, list[str]]:
    pki = workdir / "pki"
    kc = workdir / "kubeconfigs"
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
    return {
        "etcd": [
            str(bins / "etcd"),
            "--name=default",
            f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            # Throw-away test data: durability is not worth the fsync latency.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(bins / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-apiserver']}",
            "--advertise-address=127.0.0.1",
            # Loopback IPs are invalid in Endpoints, so don't publish the apiserver
            # behind the `kubernetes` Service (nothing in this cluster dials it).
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            # Request-header (front-proxy) auth: besides enabling aggregated APIs, it
            # fills kube-system/extension-apiserver-authentication, without which the
            # controller-manager and scheduler log an error every few seconds.
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
            "--allow-privileged=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--cert-dir={workdir / 'certs' / 'kube-apiserver'}",
            "--profiling=false",
            f"--audit-policy-file={workdir / AUDIT_POLICY_NAME}",
            f"--audit-log-path={workdir / AUDIT_LOG_NAME}",
            "--audit-log-format=json",
        ],
        "kube-controller-manager": [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={kc / 'kube-controller-manager'}",
            f"--authentication-kubeconfig={kc / 'kube-controller-manager'}",
            f"--authorization-kubeconfig={kc / 'kube-controller-manager'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-controller-manager']}",
            f"--cert-dir={workdir / 'certs' / 'kube-controller-manager'}",
            # All default controllers: job, garbage-collector, serviceaccount(-token),
            # namespace, node-lifecycle, replicaset, ...
            "--controllers=*",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--cluster-name={CLUSTER_NAME}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # local-exec-0 has no kubelet renewing its lease; a ~10 year grace period
            # keeps the node-lifecycle controller from marking it Unknown and
            # evicting pods, while it still lifts the not-ready taint from new nodes.
            "--node-monitor-grace-period=87600h",
            # The default client rate (20 qps) made the Job controller the bottleneck of the
            # 1,000-job scale benchmark (pods started at ~5.7/s); a local cluster can afford more.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--leader-elect=false",
            "--profiling=false",
        ],
        "kube-scheduler": [
            str(bins / "kube-scheduler"),
            f"--kubeconfig={kc / 'kube-scheduler'}",
            f"--authentication-kubeconfig={kc / 'kube-scheduler'}",
            f"--authorization-kubeconfig={kc / 'kube-scheduler'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-scheduler']}",
            f"--cert-dir={workdir / 'certs' / 'kube-scheduler'}",
            "--leader-elect=false",
            "--profiling=false",
        ],
        "kwok": [
            str(bins / "kwok"),
            f"--kubeconfig={kc / 'kwok'}",
            f"--config={bins / f'kwok-stages-{kwok_profile}.yaml'}",
            f"--config={KWOK_KUBELET_STAGES}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-label-selector={KWOK_NODE_KEY}={KWOK_NODE_VALUE}",
            f"--cidr={KWOK_POD_CIDR}",
            "--node-ip=10.0.0.1",
        ],
    }


def _start(name: str, args: dict[str, list[str]], workdir: Path, cluster: Cluster, detach: bool) -> None:
    proc = spawn(name, args[name], workdir / "logs", detach=detach)
    cluster._procs[name] = proc
    cluster.pids[name] = proc.pid
    _write_pids(workdir, cluster.pids)


def _write_pids(workdir: Path, pids: dict[str, int]) -> None:
    (workdir / PID_FILE).write_text(json.dumps(pids, indent=2) + "\n")


def start_cluster(
    workdir: Path | str = DEFAULT_WORKDIR,
    *,
    detach: bool = False,
    timeout: float = 120.0,
    kwok_pod_stages: str = DEFAULT_KWOK_PROFILE,
) -> Cluster:
    """Start a fresh control plane in ``workdir`` (wiped first) and wait until usable.

    ``detach=False`` (library/pytest): components die with this process and are
    also stopped at interpreter exit. ``detach=True`` (CLI ``up``): they keep
    running until ``down``. ``kwok_pod_stages`` picks a KWOK_PROFILES entry.
    Nodes are not created here: call create_node_pools() (the CLI does).
    """
    workdir = Path(workdir).resolve()
    if kwok_pod_stages not in KWOK_PROFILES:
        raise ValueError(f"kwok_pod_stages must be one of {KWOK_PROFILES}, not {kwok_pod_stages!r}")
    bins = ensure_binaries((*COMPONENTS, f"kwok-stages-{kwok_pod_stages}.yaml"))
    _prepare_workdir(workdir)
    ports = {
        name: free_port()
        for name in ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    }
    server = f"https://127.0.0.1:{ports['kube-apiserver']}"
    pki = workdir / "pki"
    generate_pki(pki)
    for user in ("admin", "kube-controller-manager", "kube-scheduler", "kwok"):
        write_kubeconfig(workdir / "kubeconfigs" / user, server, pki, user)
    kubeconfig = workdir / KUBECONFIG_NAME
    (workdir / AUDIT_POLICY_NAME).write_text(json.dumps(AUDIT_POLICY))
    write_kubeconfig(kubeconfig, server, pki, "admin")

    cluster = Cluster(workdir=workdir, kubeconfig=kubeconfig, server=server, ports=ports, pids={})
    if not detach:
        atexit.register(cluster.stop)
    try:
        _boot(cluster, bins, detach, timeout, kwok_pod_stages)
    except BaseException:
        cluster.stop()
        raise
    (workdir / STATE_FILE).write_text(
        json.dumps(
            {
                "server": server,
                "kubeconfig": str(kubeconfig),
                "ports": ports,
                "kwok_pod_stages": kwok_pod_stages,
            },
            indent=2,
        )
        + "\n"
    )
    return cluster


def _prepare_workdir(workdir: Path) -> None:
    pid_file = workdir / PID_FILE
    if pid_file.exists() and any(_pid_alive(p) for p in json.loads(pid_file.read_text()).values()):
        raise RuntimeError(f"a cluster is already running in {workdir}; run `down` first")
    if workdir.exists():
        # Only ever wipe a directory this module created (or an empty one): a
        # mistyped --dir must not delete someone's files.
        ours = (workdir / "pki").is_dir() or (workdir / STATE_FILE).exists()
        if not ours and any(workdir.iterdir()):
            raise RuntimeError(f"{workdir} is not empty and not a localcluster workdir")
        shutil.rmtree(workdir)
    for sub in (
        "logs",
        "pki",
        "kubeconfigs",
        "certs/kube-apiserver",
        "certs/kube-controller-manager",
        "certs/kube-scheduler",
    ):
        (workdir / sub).mkdir(parents=True, exist_ok=True)


def _boot(cluster: Cluster, bins: Path, detach: bool, timeout: float, kwok_profile: str) -> None:
    workdir, ports, logs = cluster.workdir, cluster.ports, cluster.workdir / "logs"
    args = _component_args(workdir, bins, ports, kwok_profile)
    procs = cluster._procs

    _start("etcd", args, workdir, cluster, detach)
    wait_until(lambda: _http_ok(f"http://127.0.0.1:{ports['etcd']}/health"), "etcd", timeout, procs, logs)

    _start("kube-apiserver", args, workdir, cluster, detach)
    admin_ctx = _admin_ssl_context(workdir / "pki")
    wait_until(
        lambda: _https_ok(f"{cluster.server}/readyz", admin_ctx),
        "kube-apiserver /readyz",
        timeout,
        procs,
        logs,
    )

    for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
        _start(name, args, workdir, cluster, detach)
    insecure = _self_signed_ok_context()
    for name in ("kube-controller-manager", "kube-scheduler"):
        url = f"https://127.0.0.1:{ports[name]}/healthz"
        wait_until(lambda url=url: _https_ok(url, insecure), f"{name} /healthz", timeout, procs, logs)

    # The serviceaccount controller creates `default` in every namespace; pods
    # cannot be admitted before it exists, so tests would race without this.
    sa_url = f"{cluster.server}/api/v1/namespaces/default/serviceaccounts/default"
    wait_until(lambda: _https_ok(sa_url, admin_ctx), "default service account", timeout, procs, logs)


# --------------------------------------------------------------------------- node pools


def _core_v1(api: Any) -> Any:
    from kubernetes import client

    return api if isinstance(api, client.CoreV1Api) else client.CoreV1Api(api)


def load_node_pools(path: Path = DEFAULT_NODE_POOLS) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _ready_status(capacity: dict[str, str], allocatable: dict[str, str], address: str) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "capacity": capacity,
        "allocatable": allocatable,
        "addresses": [{"type": "InternalIP", "address": address}],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "set by hack/localcluster.py",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ],
    }


def build_pool_nodes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Node manifests (with desired status) for every kwok-managed pool node."""
    defaults = spec.get("defaults", {})
    nodes = []
    for pool in spec["pools"]:
        capacity = {**defaults.get("capacity", {}), **pool.get("capacity", {})}
        allocatable = {**capacity, **pool.get("allocatable", {})}
        for index in range(int(pool.get("count", 1))):
            name = f"{pool['name']}-{index}"
            labels = {
                **defaults.get("labels", {}),
                **pool.get("labels", {}),
                "kubernetes.io/hostname": name,
                KWOK_NODE_KEY: KWOK_NODE_VALUE,
            }
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": labels,
                        "annotations": {KWOK_NODE_KEY: KWOK_NODE_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
                    },
                    "spec": {"taints": pool.get("taints", [])},
                    # kwok's node-initialize stage keeps capacity/allocatable we set.
                    "status": {"capacity": capacity, "allocatable": allocatable},
                }
            )
    return nodes


def _host_memory() -> str:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return f"{line.split()[1]}Ki"
    return "4Gi"


def build_local_exec_node(spec: dict[str, Any]) -> dict[str, Any]:
    """The executor node: host cpu/memory, Ready, not managed by kwok."""
    local = spec["localExec"]
    capacity = {"cpu": str(os.cpu_count() or 1), "memory": _host_memory(), **local.get("capacity", {})}
    labels = {
        **spec.get("defaults", {}).get("labels", {}),
        **local.get("labels", {}),
        "kubernetes.io/hostname": local["name"],
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": local["name"], "labels": labels},
        "spec": {"taints": local.get("taints", [])},
        "status": _ready_status(capacity, dict(capacity), "127.0.0.1"),
    }


def create_node_pools(api: Any, pools_file: Path = DEFAULT_NODE_POOLS) -> list[str]:
    """Create the fake accelerator pools and local-exec-0; return node names.

    Status is patched after create because the API server may drop status on
    create; patching is idempotent either way.
    """
    core = _core_v1(api)
    spec = load_node_pools(pools_file)
    names = []
    for node in [*build_pool_nodes(spec), build_local_exec_node(spec)]:
        status = node.pop("status")
        core.create_node(body=node)
        core.patch_node_status(node["metadata"]["name"], {"status": status})
        names.append(node["metadata"]["name"])
    return names


def wait_nodes_ready(api: Any, names: Iterable[str], timeout: float = 60.0) -> None:
    """Wait until every node is Ready and free of the not-ready taint (schedulable)."""
    core = _core_v1(api)
    pending = set(names)

    def check() -> bool:
        for node in core.list_node().items:
            ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
            tainted = any(t.key.startswith("node.kubernetes.io/") for t in node.spec.taints or [])
            if ready and not tainted:
                pending.discard(node.metadata.name)
        return not pending

    wait_until(check, "nodes Ready", timeout)
    if pending:
        raise TimeoutError(f"nodes not ready: {sorted(pending)}")


# --------------------------------------------------------------------------- CLI


def _wait_reaped(pid: int, timeout: float = 10.0) -> None:
    """Wait for init to reap a detached component we just killed.

    After `up` exits, the components are re-parented to PID 1, which reaps
    lazily; until then `pgrep` still lists the zombies, confusing checks that
    nothing is left behind.
    """
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def stop_from_pid_file(workdir: Path) -> list[str]:
    """Stop the components recorded in ``workdir``'s pid file; return what was stopped."""
    pid_file = workdir / PID_FILE
    if not pid_file.exists():
        return []
    pids: dict[str, int] = json.loads(pid_file.read_text())
    stopped = []
    for name in COMPONENTS:
        pid = pids.get(name)
        if pid is not None and _pid_alive(pid) and _owned_by(pid, workdir):
            terminate(pid)
            _wait_reaped(pid)
            stopped.append(f"{name} ({pid})")
    pid_file.unlink()
    return stopped


def cluster_status(workdir: Path) -> dict[str, Any]:
    pid_file = workdir / PID_FILE
    pids: dict[str, int] = json.loads(pid_file.read_text()) if pid_file.exists() else {}
    state_file = workdir / STATE_FILE
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    return {
        **state,
        "components": {
            name: ("running" if pid and _pid_alive(pid) else "stopped")
            for name in COMPONENTS
            for pid in [pids.get(name)]
        },
    }


def _cmd_up(workdir: Path, node_pools: bool, kwok_profile: str) -> int:
    started = time.monotonic()
    cluster = start_cluster(workdir, detach=True, kwok_pod_stages=kwok_profile)
    if node_pools:
        api = cluster.api_client()
        names = create_node_pools(api)
        wait_nodes_ready(api, names)
        print(f"created {len(names)} nodes: {', '.join(names)}")
    print(f"cluster up in {time.monotonic() - started:.1f}s; logs in {workdir / 'logs'}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_WORKDIR, help="work directory (default .cluster/)"
    )
    parser.add_argument("--no-node-pools", action="store_true", help="up: skip creating nodes")
    parser.add_argument(
        "--kwok-pod-stages",
        choices=KWOK_PROFILES,
        default=DEFAULT_KWOK_PROFILE,
        help="up: kwok pod lifecycle profile (default $ACCELBENCH_KWOK_POD_STAGES or fast)",
    )
    args = parser.parse_args(argv)
    workdir = args.dir.resolve()
    if args.command == "up":
        return _cmd_up(workdir, not args.no_node_pools, args.kwok_pod_stages)
    if args.command == "down":
        stopped = stop_from_pid_file(workdir)
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        return 0
    status = cluster_status(workdir)
    print(json.dumps(status, indent=2))
    return 0 if status["components"] and all(v == "running" for v in status["components"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
