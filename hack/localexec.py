"""Local executor: a kubelet stand-in that runs pods bound to the local-exec node as processes.

The local control plane has no container runtime. Pods scheduled to the node labeled
`accelbench.io/local-exec=true` get their container's command run as a local process in the
project's environment (the image is ignored), and their status written back the way a kubelet
would: Running, then Succeeded or Failed with the exit code and the termination message. That makes
the demo and the end-to-end tests run the real workers through the real Job controller.

What differs from a kubelet, on purpose:
- one container per pod after its init containers, which run in order first (sidecars are not run);
  a failing init container fails the pod with its exit code and termination message, as a kubelet
  with restartPolicy Never does;
- env `value`, `fieldRef`, `secretKeyRef` and `configMapKeyRef`, and `envFrom` (secretRef,
  configMapRef, prefix) are resolved (the refs read through the API with the executor's
  credentials, as a kubelet reads them);
- an emptyDir volume is a directory of the pod's own; its mountPath in env values and in the
  command line is rewritten to that directory (a bind mount, as a runtime makes). Other volumes
  are not mounted;
- there is no cluster DNS: hosts under `.svc` (Services, headless pod names) resolve to 127.0.0.1,
  and each pod that declares a `metrics` port gets its own free local port instead (parallel workers
  would fight over one), written to ENV_METRICS_PORT and to the pod's ANNOTATION_PORT
  annotation, where the operator looks when it scrapes progress (a port mapping, as a runtime's);
- every pod shares 127.0.0.1, where a cluster gives each its own IP, so a Service port that targets
  a pod's serving port (named `http`) gets a free local port of its own: the server's `--port`
  argument is rewritten to it, and a client's `<service>.<namespace>.svc:<port>` reaches it (two
  InferenceBenches at once would otherwise both bind 8000, each client reaching either server);
- the termination-message path maps to a file in the work directory;
- a pod reaches the API server as its own ServiceAccount, like a kubelet-mounted token: the
  executor requests a token bound to the pod (TokenRequest) and hands the pod a kubeconfig with it
  (KUBECONFIG); a pod with automountServiceAccountToken: false gets no credentials at all.

Usage: `python hack/localexec.py --kubeconfig .cluster/kubeconfig [--node local-exec-0]`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from accelbench.api.contract import (
    ANNOTATION_PORT,
    ENV_JAX_COORDINATOR,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_METRICS_PORT,
    ENV_NNODES,
    ENV_POD_NAMESPACE,
    ENV_TERMINATION_LOG,
    METRICS_PORT_NAME,
)
from accelbench.render.inference import SERVER_PORT_NAME

LOG = logging.getLogger("localexec")
REPO = Path(__file__).resolve().parents[1]
DEFAULT_NODE = "local-exec-0"
TERMINATION_LIMIT = 4096  # what the kubelet keeps of a termination message
FALLBACK_LOG_LINES = 80
SVC_HOST = re.compile(r"\b[a-z0-9]([-a-z0-9.]*[a-z0-9])?\.svc(\.cluster\.local)?\b")
# `<service>.<namespace>.svc:<port>` exactly (not a pod's `<pod>.<service>.<namespace>.svc`).
SERVICE_ADDRESS = re.compile(
    r"(?<![-\w.])([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\.([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\.svc"
    r"(?:\.cluster\.local)?:(\d+)\b"
)
SERVICE_WAIT_S = 10.0  # a serving pod may start a moment before the operator's Service exists
FIELD_ANNOTATION = re.compile(r"metadata\.(annotations|labels)\['([^']+)'\]")


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_field(pod: dict[str, Any], path: str) -> str:
    """The value a kubelet would give a `fieldRef` env var."""
    meta = pod["metadata"]
    match = FIELD_ANNOTATION.fullmatch(path)
    if match:
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    return simple.get(path, "")


def localize(value: str) -> str:
    """Cluster DNS names point at this machine: every pod and Service runs here."""
    return SVC_HOST.sub("127.0.0.1", value)


class ConfigError(Exception):
    """What a kubelet reports as CreateContainerConfigError (a missing Secret or key)."""


# (kind, namespace, name) -> the Secret's (decoded) or ConfigMap's data, None when it does not exist
DataReader = Callable[[str, str, str], "dict[str, str] | None"]


def mounted_paths(pod: dict[str, Any], container: dict[str, Any], podir: Path) -> dict[str, str]:
    """mountPath -> the pod's own directory, for each emptyDir the container mounts."""
    empty = {v["name"] for v in pod["spec"].get("volumes") or [] if "emptyDir" in v}
    paths = {}
    for mount in container.get("volumeMounts") or []:
        if mount["name"] in empty:
            local = podir / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            paths[mount["mountPath"].rstrip("/")] = str(local)
    return paths


def remap(value: str, paths: dict[str, str]) -> str:
    for mount, local in sorted(paths.items(), key=lambda item: -len(item[0])):
        if value == mount or value.startswith(mount + "/"):
            return local + value[len(mount) :]
    return value


def container_env(
    pod: dict[str, Any],
    container: dict[str, Any],
    termination_file: Path,
    kubeconfig: str | None = None,
    read_data: DataReader | None = None,
    paths: dict[str, str] | None = None,
    services: Callable[[str], str] = lambda value: value,
) -> dict[str, str]:
    """The pod's environment; `kubeconfig` holds its own ServiceAccount token (None: no API access).

    The executor's own credentials never leak in: its KUBECONFIG is dropped from the inherited env."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    namespace = pod["metadata"]["namespace"]
    for source in container.get("envFrom") or []:
        if read_data is None:
            break
        kind = "Secret" if "secretRef" in source else "ConfigMap"
        ref = source.get("secretRef") or source.get("configMapRef") or {}
        data = read_data(kind, namespace, ref["name"])
        if data is None and not ref.get("optional"):
            raise ConfigError(f"{kind.lower()} {ref['name']!r} does not exist (envFrom)")
        env.update({f"{source.get('prefix', '')}{key}": value for key, value in (data or {}).items()})
    for item in container.get("env") or []:
        source = item.get("valueFrom") or {}
        if "value" in item:
            env[item["name"]] = remap(localize(services(str(item["value"]))), paths or {})
        elif "fieldRef" in source:
            env[item["name"]] = resolve_field(pod, source["fieldRef"]["fieldPath"])
        elif ("secretKeyRef" in source or "configMapKeyRef" in source) and read_data is not None:
            kind = "Secret" if "secretKeyRef" in source else "ConfigMap"
            ref = source.get("secretKeyRef") or source.get("configMapKeyRef")
            value = (read_data(kind, namespace, ref["name"]) or {}).get(ref["key"])
            if value is None and not ref.get("optional"):
                raise ConfigError(
                    f"{kind.lower()} {ref['name']!r} has no key {ref['key']!r} (or does not exist)"
                )
            if value is not None:
                env[item["name"]] = value
        else:
            LOG.warning("pod %s: env %s uses an unsupported source; left unset", name_of(pod), item["name"])
    for key in (ENV_MASTER_ADDR, ENV_JAX_COORDINATOR):
        if key in env:
            host, sep, port = env[key].rpartition(":") if key == ENV_JAX_COORDINATOR else (env[key], "", "")
            if not re.fullmatch(r"[0-9.]+", host):
                env[key] = f"127.0.0.1{sep}{port}"
    if env.get(ENV_MASTER_PORT) and env.get(ENV_NNODES, "1") == "1":
        # One host's torchrun rendezvous: in a cluster the pod's own IP keeps the fixed port apart
        # from other pods'; here every pod shares 127.0.0.1, so each gets a free port of its own.
        env[ENV_MASTER_PORT] = str(free_port())
    env[ENV_TERMINATION_LOG] = str(termination_file)
    env[ENV_METRICS_PORT] = "0"  # start() maps a declared metrics port to a free one
    env["POD_NAME"] = pod["metadata"]["name"]
    env.setdefault(ENV_POD_NAMESPACE, pod["metadata"]["namespace"])
    return env


def listen_on(argv: list[str], declared: int, local: int) -> list[str]:
    """The server's `--port <declared>` (or `--port=<declared>`) as the local port."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == str(declared) and i and out[i - 1].lstrip("-").endswith("port"):
            out[i] = str(local)
        elif "=" in arg and arg.startswith("-") and arg.endswith(f"port={declared}"):
            out[i] = f"{arg.rpartition('=')[0]}={local}"
    return out


def free_port() -> int:
    """A port nothing listens on now (the worker binds it a moment later: a small race, local only)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def name_of(pod: dict[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def termination_message(
    container: dict[str, Any], termination_file: Path, log_file: Path, failed: bool
) -> str:
    """The file's content, or the log's tail for FallbackToLogsOnError when the file is empty."""
    text = ""
    if termination_file.exists():
        text = termination_file.read_bytes()[:TERMINATION_LIMIT].decode(errors="replace")
    policy = container.get("terminationMessagePolicy", "File")
    if not text.strip() and failed and policy == "FallbackToLogsOnError" and log_file.exists():
        lines = log_file.read_text(errors="replace").splitlines()[-FALLBACK_LOG_LINES:]
        text = "\n".join(lines)[-2048:]
    return text


def terminated(started: str, code: int, message: str) -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",  # no cgroup here, so never OOMKilled
        "startedAt": started,
        "finishedAt": now(),
    }
    if message:
        state["message"] = message
    return {"terminated": state}


def container_status(container: dict[str, Any], state: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "ready": False,
        "started": False,
        "restartCount": 0,
        "state": state,
        **extra,
    }


def running_status(
    pod: dict[str, Any], container: dict[str, Any], started: str, pid: int, init: list[dict[str, Any]]
) -> dict[str, Any]:
    running = container_status(
        container, {"running": {"startedAt": started}}, ready=True, started=True, containerID=f"local://{pid}"
    )
    return {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "startTime": started,
        "conditions": conditions(ready=True, at=started),
        **({"initContainerStatuses": init} if init else {}),
        "containerStatuses": [running],
    }


def terminated_status(
    container: dict[str, Any], started: str, code: int, message: str, init: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "phase": "Succeeded" if code == 0 else "Failed",
        "conditions": conditions(ready=False, at=now()),
        **({"initContainerStatuses": init} if init else {}),
        "containerStatuses": [container_status(container, terminated(started, code, message))],
    }


def init_failed_status(pod: dict[str, Any], init: list[dict[str, Any]]) -> dict[str, Any]:
    """An init container failed under restartPolicy Never: the pod fails, its containers never ran."""
    waiting = {"waiting": {"reason": "PodInitializing"}}
    return {
        "phase": "Failed",
        "conditions": conditions(ready=False, at=now(), initialized=False),
        "initContainerStatuses": init,
        "containerStatuses": [container_status(c, waiting) for c in pod["spec"]["containers"]],
    }


def conditions(ready: bool, at: str, initialized: bool = True) -> list[dict[str, str]]:
    value = "True" if ready else "False"
    return [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": at},
        {"type": "Initialized", "status": "True" if initialized else "False", "lastTransitionTime": at},
        {"type": "ContainersReady", "status": value, "lastTransitionTime": at},
        {"type": "Ready", "status": value, "lastTransitionTime": at},
    ]


@dataclass
class Running:
    process: subprocess.Popen[bytes] | None  # the container running now (an init one, then the main one)
    container: dict[str, Any]
    started: str
    termination_file: Path
    log_file: Path
    deleting: bool = False


@dataclass
class Executor:
    core: client.CoreV1Api
    node: str
    workdir: Path
    kubeconfig: str | None = None
    running: dict[str, Running] = field(default_factory=dict)
    service_ports: dict[tuple[str, str, int], int] = field(default_factory=dict)  # (ns, svc, port) -> local
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    def handle(self, pod: dict[str, Any]) -> None:
        key = name_of(pod)
        if pod["metadata"].get("deletionTimestamp"):
            self.delete(pod)
            return
        phase = (pod.get("status") or {}).get("phase", "Pending")
        with self.lock:
            known = key in self.running
        if phase == "Pending" and not known:
            self.start(pod)

    def pod_kubeconfig(self, pod: dict[str, Any], podir: Path) -> str | None:
        """A kubeconfig for the pod's own ServiceAccount (a token bound to the pod, as the kubelet
        projects one), or None when the pod opts out of a token."""
        spec = pod["spec"]
        if spec.get("automountServiceAccountToken") is False or self.kubeconfig is None:
            return None
        meta = pod["metadata"]
        account = spec.get("serviceAccountName") or "default"
        request = {
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            }
        }
        token = self.core.create_namespaced_service_account_token(account, meta["namespace"], request)
        admin = yaml.safe_load(Path(self.kubeconfig).read_text())
        cluster = dict(admin["clusters"][0]["cluster"])
        if "certificate-authority" in cluster:  # make the CA path absolute: the pod runs in another cwd
            cluster["certificate-authority"] = str(
                (Path(self.kubeconfig).parent / cluster["certificate-authority"]).resolve()
            )
        name = f"{meta['namespace']}-{account}"
        config_doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": name, "user": {"token": token.status.token}}],
            "contexts": [{"name": name, "context": {"cluster": "local", "user": name}}],
            "current-context": name,
        }
        path = podir / "kubeconfig"
        path.write_text(yaml.safe_dump(config_doc))
        path.chmod(0o600)
        return str(path)

    def read_data(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's (decoded) or ConfigMap's data, as the kubelet reads it for env; None when absent."""
        try:
            if kind == "Secret":
                data = self.core.read_namespaced_secret(name, namespace).data or {}
                return {key: base64.b64decode(value).decode() for key, value in data.items()}
            return dict(self.core.read_namespaced_config_map(name, namespace).data or {})
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def local_port(self, namespace: str, service: str, port: int) -> int:
        """The local port standing for a Service's port: the same for its server and its clients."""
        with self.lock:
            key = (namespace, service, port)
            if key not in self.service_ports:
                self.service_ports[key] = free_port()
            return self.service_ports[key]

    def serves_http(self, namespace: str, name: str, port: int) -> bool:
        """Does Service `name` have `port`, targeting a serving port (named SERVER_PORT_NAME)? A
        Service not there yet is waited for a moment: the operator makes it with the client's Job."""
        deadline = time.monotonic() + SERVICE_WAIT_S
        while True:
            try:
                service = self.core.read_namespaced_service(name, namespace)
                return any(
                    p.port == port and p.target_port == SERVER_PORT_NAME for p in service.spec.ports or []
                )
            except ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline or self.stopping.is_set():
                    return False
            time.sleep(0.5)

    def reach_services(self, value: str) -> str:
        """A client's `<svc>.<ns>.svc:<port>` of a serving Service -> 127.0.0.1:<its local port>."""

        def address(match: re.Match[str]) -> str:
            service, namespace, port = match.group(1), match.group(2), int(match.group(3))
            if not self.serves_http(namespace, service, port):
                return match.group(0)
            return f"127.0.0.1:{self.local_port(namespace, service, port)}"

        return SERVICE_ADDRESS.sub(address, value) if ".svc" in value else value

    def serving_port(self, pod: dict[str, Any], container: dict[str, Any]) -> tuple[int, int] | None:
        """(containerPort, local port) of a container's serving port that a Service targets."""
        declared = [p for p in container.get("ports") or [] if p.get("name") == SERVER_PORT_NAME]
        if not declared:
            return None
        namespace, labels = pod["metadata"]["namespace"], pod["metadata"].get("labels") or {}
        deadline = time.monotonic() + SERVICE_WAIT_S
        while True:
            for service in self.core.list_namespaced_service(namespace).items:
                selector = service.spec.selector or {}
                if not selector or any(labels.get(k) != v for k, v in selector.items()):
                    continue
                for p in service.spec.ports or []:
                    if p.target_port == SERVER_PORT_NAME:
                        local = self.local_port(namespace, service.metadata.name, p.port)
                        return int(declared[0]["containerPort"]), local
            if time.monotonic() > deadline or self.stopping.is_set():
                return None
            time.sleep(0.5)

    def start(self, pod: dict[str, Any]) -> None:
        key = name_of(pod)
        podir = self.workdir / pod["metadata"]["namespace"] / pod["metadata"]["name"]
        podir.mkdir(parents=True, exist_ok=True)
        main = pod["spec"]["containers"][0]
        run = Running(None, main, now(), podir / "termination-log", podir / "container.log")
        with self.lock:
            self.running[key] = run  # known from now on: init containers run first
        threading.Thread(target=self.run_pod, args=(pod, run, podir), daemon=True).start()

    def launch(self, pod: dict[str, Any], container: dict[str, Any], run: Running, podir: Path) -> str | None:
        """Start one container as a process into `run`; the reason it could not start, else None."""
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if not argv:
            return "the local executor needs an explicit container command"
        suffix = "" if container is run.container else f"-{container['name']}"
        run.termination_file = podir / f"termination-log{suffix}"
        run.log_file = podir / f"container{suffix}.log"
        run.termination_file.write_text("")
        paths = mounted_paths(pod, container, podir)
        try:
            kubeconfig = self.pod_kubeconfig(pod, podir)
            env = container_env(
                pod, container, run.termination_file, kubeconfig, self.read_data, paths, self.reach_services
            )
            serving = self.serving_port(pod, container)
        except (ConfigError, ApiException) as exc:
            return f"CreateContainerConfigError: {exc}"
        if any(p.get("name") == METRICS_PORT_NAME for p in container.get("ports") or []):
            port = free_port()
            env[ENV_METRICS_PORT] = str(port)
            self.patch_annotations(pod, {ANNOTATION_PORT: str(port)})
        argv = [remap(localize(self.reach_services(a)), paths) for a in argv]
        if serving is not None:
            argv = listen_on(argv, *serving)
        if argv[0] == "python":
            argv[0] = sys.executable  # the project's environment, whatever `python` is on PATH
        with run.log_file.open("wb") as log:
            try:
                run.process = subprocess.Popen(
                    argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            except OSError as exc:
                return f"cannot start {argv[0]}: {exc}"
        run.started = now()
        LOG.info(
            "started %s %s (pid %d): %s", name_of(pod), container["name"], run.process.pid, " ".join(argv[:4])
        )
        return None

    def run_pod(self, pod: dict[str, Any], run: Running, podir: Path) -> None:
        key = name_of(pod)
        done: list[dict[str, Any]] = []  # the init containers' terminated statuses
        for init in pod["spec"].get("initContainers") or []:
            problem = self.launch(pod, init, run, podir)
            code = 128 if problem else self.exit_code(run)
            if run.deleting or self.stopping.is_set():
                return
            message = problem or termination_message(
                init, run.termination_file, run.log_file, failed=code != 0
            )
            done.append(container_status(init, terminated(run.started, code, message)))
            if code != 0:
                LOG.info("%s init container %s exited %d", key, init["name"], code)
                with self.lock:
                    self.running.pop(key, None)
                self.patch_status(pod, init_failed_status(pod, done))
                return
        problem = self.launch(pod, run.container, run, podir)
        if problem is not None:
            with self.lock:
                self.running.pop(key, None)
            self.fail_to_start(pod, run.container, problem, done)
            return
        assert run.process is not None
        self.patch_status(pod, running_status(pod, run.container, run.started, run.process.pid, done))
        self.wait(pod, run, done)

    def exit_code(self, run: Running) -> int:
        assert run.process is not None
        code = run.process.wait()
        return 128 - code if code < 0 else code  # killed by a signal: as a container runtime says it

    def wait(self, pod: dict[str, Any], run: Running, done: list[dict[str, Any]]) -> None:
        code = self.exit_code(run)
        key = name_of(pod)
        with self.lock:
            self.running.pop(key, None)
        if run.deleting or self.stopping.is_set():
            return
        message = termination_message(run.container, run.termination_file, run.log_file, failed=code != 0)
        LOG.info("%s exited %d", key, code)
        self.patch_status(pod, terminated_status(run.container, run.started, code, message, done))

    def fail_to_start(
        self, pod: dict[str, Any], container: dict[str, Any], message: str, done: list[dict[str, Any]]
    ) -> None:
        LOG.warning("%s: %s", name_of(pod), message)
        self.patch_status(pod, terminated_status(container, now(), 128, message, done))

    def delete(self, pod: dict[str, Any]) -> None:
        key = name_of(pod)
        with self.lock:
            run = self.running.get(key)
        if run is not None:
            run.deleting = True
            if run.process is not None:
                stop_process(run.process)
        # The kubelet confirms a graceful delete by deleting with grace 0 once the containers stopped.
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                pod["metadata"]["name"],
                pod["metadata"]["namespace"],
                grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0),
            )

    def patch_annotations(self, pod: dict[str, Any], annotations: dict[str, str]) -> None:
        try:
            self.core.patch_namespaced_pod(
                pod["metadata"]["name"],
                pod["metadata"]["namespace"],
                {"metadata": {"annotations": annotations}},
            )
        except ApiException as exc:
            if exc.status != 404:
                LOG.warning("annotations of %s not written: %s", name_of(pod), exc.reason)

    def patch_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(
                pod["metadata"]["name"], pod["metadata"]["namespace"], {"status": status}
            )
        except ApiException as exc:
            if exc.status != 404:
                LOG.warning("status of %s not written: %s", name_of(pod), exc.reason)

    def stop_all(self) -> None:
        self.stopping.set()
        with self.lock:
            runs = list(self.running.values())
        for run in runs:
            if run.process is not None:
                stop_process(run.process)


def stop_process(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run(kubeconfig: str, node: str, workdir: Path) -> None:
    config.load_kube_config(kubeconfig)
    api = client.ApiClient()
    core = client.CoreV1Api(api)
    executor = Executor(core, node, workdir, kubeconfig=str(Path(kubeconfig).resolve()))
    signal.signal(signal.SIGTERM, lambda *_: (executor.stop_all(), sys.exit(0)))
    selector = f"spec.nodeName={node}"
    LOG.info("local executor watching pods on %s", node)
    try:
        while True:
            resource_version = ""
            try:
                listing = core.list_pod_for_all_namespaces(field_selector=selector)
                resource_version = listing.metadata.resource_version
                for pod in listing.items:
                    executor.handle(api.sanitize_for_serialization(pod))
                stream = watch.Watch().stream(
                    core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=resource_version,
                    timeout_seconds=60,
                )
                for event in stream:
                    if event["type"] in ("ADDED", "MODIFIED"):
                        executor.handle(api.sanitize_for_serialization(event["object"]))
            except ApiException as exc:
                LOG.warning("watch broke (%s); listing again", exc.reason)
                time.sleep(1)
            except Exception as exc:  # a dropped connection must not end the executor
                LOG.warning("watch error %r; listing again", exc)
                time.sleep(1)
    finally:
        executor.stop_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node", default=DEFAULT_NODE)
    parser.add_argument("--workdir", default=str(REPO / ".cluster" / "localexec"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s localexec %(levelname)s %(message)s")
    run(args.kubeconfig, args.node, Path(args.workdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
