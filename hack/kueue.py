"""Kueue on the local control plane (issue 17: real neighbours), built from its pinned Go module by
hack/build-servers.sh into .servers/kueue, with the CRDs and webhook manifests of the same version.

- Kueue runs as a process against the admin kubeconfig, leader election off, the batch/job
  integration on (the one our runs use), the on-demand visibility API server off (it would need an
  aggregated APIService).
- Its webhooks are real: the serving certificate is signed by the cluster's CA, and the
  MutatingWebhookConfiguration / ValidatingWebhookConfiguration from the module are registered with
  `url: https://127.0.0.1:<port><path>` instead of an in-cluster Service (nothing routes Service
  IPs here). Only the webhooks of what is enabled are registered (Kueue's own kinds and batch/v1
  Jobs); a Kueue install registers the others too, where they do nothing without their CRDs.
- Kueue reads its metrics-serving certificate from a fixed path when it does not manage its own
  certificates (/etc/kueue/metrics/certs, in cmd/kueue/main.go): the same certificate is written
  there.

`Kueue.stop()` deregisters the webhooks before it stops the process: with failurePolicy Fail a
webhook whose server is gone refuses every Job create in the cluster.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import localcluster
import yaml

REPO = Path(__file__).resolve().parents[1]
SERVERS = REPO / ".servers"
BINARY = SERVERS / "kueue"
CRDS = SERVERS / "kueue-crds"
WEBHOOKS = SERVERS / "kueue-webhooks" / "manifests.yaml"
METRICS_CERTS = Path("/etc/kueue/metrics/certs")  # fixed in Kueue's main.go
NAMESPACE = "kueue-system"
WEBHOOK_PREFIX = "kueue-"
# The webhooks registered: Kueue's own kinds and the integration runs use.
REGISTERED_GROUPS = {("kueue.x-k8s.io", "*"), ("batch", "jobs")}


def kueue_missing() -> list[str]:
    """What of Kueue is missing from .servers/ (empty when all is there)."""
    wanted = {"kueue": BINARY, "kueue-crds": CRDS, "kueue-webhooks": WEBHOOKS}
    return [name for name, path in wanted.items() if not path.exists()]


def config(health: int, metrics: int, webhook: int, cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
    }


def _registered(hook: dict[str, Any]) -> bool:
    return any(
        (group, resource) in REGISTERED_GROUPS or (group, "*") in REGISTERED_GROUPS
        for rule in hook.get("rules") or []
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
    )


def webhook_configurations(manifests: str, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The module's webhook configurations, reaching Kueue at https://127.0.0.1:port, trimmed to
    the webhooks of what is enabled (REGISTERED_GROUPS)."""
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        hooks = [h for h in doc.get("webhooks") or [] if _registered(h)]
        for hook in hooks:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
        if hooks:
            doc["metadata"]["name"] = WEBHOOK_PREFIX + doc["metadata"]["name"]
            doc["webhooks"] = hooks
            out.append(doc)
    return out


@dataclass
class Kueue:
    workdir: Path
    kubeconfig: Path
    kubectl: Path
    process: subprocess.Popen[bytes] | None = None
    health_port: int = 0
    webhook_names: list[tuple[str, str]] = field(default_factory=list)  # (kind, name)

    @property
    def log_path(self) -> Path:
        return self.workdir / "kueue.log"

    def logs(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(kueue: no log)"
        return "--- kueue.log\n" + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kubectl_run(self, *args: str, input_text: str | None = None, timeout: float = 90) -> str:
        done = subprocess.run(
            [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"kueue exited with {self.process.returncode}\n{self.logs()}")

    def stop(self) -> None:
        for kind, name in self.webhook_names:
            subprocess.run(
                [
                    str(self.kubectl),
                    f"--kubeconfig={self.kubeconfig}",
                    "delete",
                    kind,
                    name,
                    "--ignore-not-found",
                ],
                capture_output=True,
                timeout=60,
            )
        self.webhook_names.clear()
        if self.process is not None:
            localcluster.stop_process(self.process)
        self.process = None


def install_crds(kueue: Kueue) -> None:
    files = sorted(CRDS.glob("*.yaml"))
    args = [arg for f in files for arg in ("-f", str(f.resolve()))]
    kueue.kubectl_run("apply", "--server-side", *args)
    names = [f"crd/{f.name.split('_', 1)[1].removesuffix('.yaml')}.{f.name.split('_', 1)[0]}" for f in files]
    kueue.kubectl_run("wait", "--for=condition=Established", "--timeout=60s", *names)


def start_kueue(
    workdir: Path, cluster_workdir: Path, kubeconfig: Path, kubectl: Path, timeout: float = 90.0
) -> Kueue:
    """Kueue's CRDs, the process, then its webhooks once it is ready. `cluster_workdir` holds the
    control plane's pki/ (the CA that signs Kueue's serving certificate)."""
    missing = kueue_missing()
    if missing:
        raise FileNotFoundError(
            f"{', '.join(missing)} not in {SERVERS}: run hack/build-servers.sh (make servers)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    kueue = Kueue(workdir, kubeconfig, kubectl)
    try:
        cert, key = localcluster.issue_serving_cert(cluster_workdir, "kueue-webhook", ["IP:127.0.0.1"])
        certs = workdir / "certs"
        for target in (certs, METRICS_CERTS):
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cert, target / "tls.crt")
            shutil.copyfile(key, target / "tls.key")
        install_crds(kueue)
        namespace = yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        kueue.kubectl_run("apply", "-f", "-", input_text=namespace)
        kueue.health_port, webhook_port = localcluster.free_port(), localcluster.free_port()
        cfg = workdir / "config.yaml"
        metrics_port = localcluster.free_port()
        cfg.write_text(yaml.safe_dump(config(kueue.health_port, metrics_port, webhook_port, certs)))
        kueue.process = subprocess.Popen(
            [str(BINARY), f"--config={cfg}", "--feature-gates=VisibilityOnDemand=false"],
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            stdout=kueue.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
        deadline = time.monotonic() + timeout
        while not localcluster.http_ok(f"http://127.0.0.1:{kueue.health_port}/readyz"):
            kueue.check_running()
            if time.monotonic() > deadline:
                raise RuntimeError(f"kueue not ready within {timeout:.0f}s\n{kueue.logs()}")
            time.sleep(0.3)
        ca = (cluster_workdir / "pki" / "ca.crt").read_bytes()
        for doc in webhook_configurations(WEBHOOKS.read_text(), webhook_port, ca):
            kueue.kubectl_run("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump(doc))
            kueue.webhook_names.append((doc["kind"].lower(), doc["metadata"]["name"]))
    except BaseException:
        kueue.stop()
        raise
    return kueue
