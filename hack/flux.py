"""Flux on the local control plane: a Git server on loopback, Flux's CRDs, source-controller and
kustomize-controller as processes (issue 16, GitOps with real Flux in the tests).

- Git: `git http-backend` (git's own smart-HTTP server, a CGI program) behind a small threaded
  HTTP handler; serves every repository under a root directory at http://127.0.0.1:PORT/<name>.
  Flux's GitRepository clones it with go-git like any HTTPS remote (no auth, plain HTTP).
- Flux: source-controller and kustomize-controller built from their pinned Go modules by
  hack/build-servers.sh into .servers/, with the CRDs of the same module versions in
  .servers/flux-crds/. Each runs against a kubeconfig (KUBECONFIG), watches all namespaces, has
  leader election off and its metrics and health endpoints on free loopback ports;
  source-controller serves its artifacts on loopback, where kustomize-controller downloads them.

Logs go to files in the work directory (`source-controller.log`, `kustomize-controller.log`,
`git-http.log`); `Flux.logs()` gives their tails for a failure message.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import localcluster

REPO = Path(__file__).resolve().parents[1]
SERVERS = REPO / ".servers"
CRDS = SERVERS / "flux-crds"
CONTROLLERS = ("source-controller", "kustomize-controller")


def flux_missing() -> list[str]:
    """What of Flux is missing from .servers/ (empty when the controllers and CRDs are there)."""
    missing = [name for name in CONTROLLERS if not (SERVERS / name).exists()]
    if not CRDS.is_dir() or not any(CRDS.glob("*.yaml")):
        missing.append("flux-crds")
    return missing


# --- Git over smart HTTP --------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` with a fixed identity; its stdout."""
    done = subprocess.run(
        ["git", "-c", "user.name=accelbench", "-c", "user.email=accelbench@localhost", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stdout}{done.stderr}")
    return done.stdout


def init_repo(path: Path, branch: str = "main") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", f"--initial-branch={branch}")
    return path


def commit_all(repo: Path, message: str) -> str:
    """Commit everything in the work tree (additions and removals); the new commit's SHA."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


class _GitHandler(BaseHTTPRequestHandler):
    """Hands each request to `git http-backend` (CGI) and relays its answer."""

    server: _GitHTTPServer

    def do_GET(self) -> None:
        self._cgi()

    def do_POST(self) -> None:
        self._cgi()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _cgi(self) -> None:
        path, _, query = self.path.partition("?")
        body = self._body()
        cgi_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/"),
            "GIT_PROJECT_ROOT": str(self.server.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": unquote(path),
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
            "SERVER_PROTOCOL": self.request_version,
        }
        if self.headers.get("Content-Encoding"):
            cgi_env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        if self.headers.get("Git-Protocol"):
            cgi_env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        done = subprocess.run(
            ["git", "http-backend"], input=body, env=cgi_env, capture_output=True, timeout=120
        )
        head, sep, payload = done.stdout.partition(b"\r\n\r\n")
        if not sep or done.returncode != 0:
            self.send_error(500, f"git http-backend: {done.stderr.decode(errors='replace')[-300:]}")
            return
        status, headers = 200, []
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        with self.server.log.open("a") as log:
            log.write(f"{self.address_string()} {format % args}\n")


class _GitHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, log: Path) -> None:
        self.root, self.log = root, log
        super().__init__(("127.0.0.1", 0), _GitHandler)


@dataclass
class GitServer:
    """Serves the repositories under `root` read-only over smart HTTP on loopback."""

    root: Path
    log: Path
    _server: _GitHTTPServer | None = None

    def start(self) -> GitServer:
        if shutil.which("git") is None:
            raise FileNotFoundError("git is not installed (Debian/Ubuntu: apt-get install git)")
        self._server = _GitHTTPServer(self.root, self.log)
        threading.Thread(target=self._server.serve_forever, name="git-http", daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


# --- the controllers ------------------------------------------------------------------------------


def _log_tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"({path.name}: no log)"
    return f"--- {path.name} (last {lines} lines)\n" + "\n".join(
        path.read_text(errors="replace").splitlines()[-lines:]
    )


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@dataclass
class Flux:
    workdir: Path
    kubeconfig: Path
    git_server: GitServer
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    health_ports: dict[str, int] = field(default_factory=dict)
    storage_port: int = 0

    def logs(self, lines: int = 40) -> str:
        names = [*CONTROLLERS, "git-http"]
        return "\n".join(_log_tail(self.workdir / f"{name}.log", lines) for name in names)

    def check_running(self) -> None:
        """Fail with the logs if a controller exited."""
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}\n{self.logs()}")

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.processes.clear()
        self.git_server.stop()

    def _wait(self, check: object, what: str, timeout: float) -> None:
        assert callable(check)
        deadline = time.monotonic() + timeout
        while not check():
            self.check_running()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready within {timeout:.0f}s\n{self.logs()}")
            time.sleep(0.2)


def install_crds(kubectl: Path, kubeconfig: Path) -> list[str]:
    """Apply the Flux CRDs from .servers/flux-crds and wait until they are established; their names."""
    files = sorted(CRDS.glob("*.yaml"))
    base = [str(kubectl), f"--kubeconfig={kubeconfig}"]
    names = [f"crd/{p.name.split('_', 1)[1].removesuffix('.yaml')}.{p.name.split('_', 1)[0]}" for p in files]
    for args in (
        ["apply", "--server-side", *[arg for p in files for arg in ("-f", str(p.resolve()))]],
        ["wait", "--for=condition=Established", "--timeout=60s", *names],
    ):
        done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=90)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stdout}{done.stderr}")
    return names


def start_flux(workdir: Path, kubeconfig: Path, kubectl: Path, timeout: float = 60.0) -> Flux:
    """Git server on loopback (repositories under workdir/git), Flux CRDs, both controllers."""
    missing = flux_missing()
    if missing:
        raise FileNotFoundError(
            f"{', '.join(missing)} not in {SERVERS}: run hack/build-servers.sh (make servers)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "git").mkdir(exist_ok=True)
    git_server = GitServer(workdir / "git", workdir / "git-http.log").start()
    flux = Flux(workdir, kubeconfig, git_server)
    try:
        install_crds(kubectl, kubeconfig)
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "RUNTIME_NAMESPACE": "default"}
        flux.storage_port = localcluster.free_port()
        storage = workdir / "artifacts"
        storage.mkdir(exist_ok=True)
        for name in CONTROLLERS:
            health, metrics = localcluster.free_port(), localcluster.free_port()
            flux.health_ports[name] = health
            args = [
                "--watch-all-namespaces=true",
                "--enable-leader-election=false",
                f"--metrics-addr=127.0.0.1:{metrics}",
                f"--health-addr=127.0.0.1:{health}",
                "--log-level=debug",
                "--log-encoding=console",
            ]
            if name == "source-controller":
                args += [
                    f"--storage-path={storage}",
                    f"--storage-addr=127.0.0.1:{flux.storage_port}",
                    f"--storage-adv-addr=127.0.0.1:{flux.storage_port}",
                ]
            flux.processes[name] = subprocess.Popen(
                [str(SERVERS / name), *args],
                env=env,
                stdout=(workdir / f"{name}.log").open("ab"),
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )
        for name, port in flux.health_ports.items():
            ready = f"http://127.0.0.1:{port}/readyz"
            flux._wait(lambda url=ready: localcluster.http_ok(url), f"{name} /readyz", timeout)
        flux._wait(lambda: _port_open(flux.storage_port), "source-controller's artifact server", timeout)
    except BaseException:
        flux.stop()
        raise
    return flux


def main() -> int:
    """`python hack/flux.py KUBECONFIG [DIR]`: Flux and the Git server until interrupted (by hand)."""
    import sys

    flux = start_flux(
        Path(sys.argv[2] if len(sys.argv) > 2 else ".flux"),
        Path(sys.argv[1]),
        localcluster.bin_dir() / "kubectl",
    )
    print(f"git repositories under {flux.git_server.root}, served at {flux.git_server.url('<name>')}")
    try:
        while all(p.poll() is None for p in flux.processes.values()):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        flux.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
