"""The object stores the tests, the demo and the storage benchmark run beside the operator, on loopback.

- GCS: fake-gcs-server (github.com/fsouza/fake-gcs-server), the GCS JSON API; the official client
  reaches it through STORAGE_EMULATOR_HOST. It has no access control.
- S3: versitygw (github.com/versity/versitygw, Apache-2.0), an S3 gateway over a directory, with
  its own accounts: a root that owns the buckets and a `reader` that may touch none of them (the
  permission-denied case). boto3 reaches it through AWS_ENDPOINT_URL_S3. MinIO, which issue 13
  names, is AGPL-3.0 and its server module lists no versions on the Go module proxy.
Both are built from pinned Go modules by hack/build-servers.sh into .servers/.

Each store keeps its objects as files under the work directory, so a test can corrupt an object
behind the store's back (the store still reports the old checksum): `object_file`.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SERVERS = REPO / ".servers"
S3_ROOT_KEY, S3_ROOT_SECRET = "accelbench-root", "accelbench-root-secret"
S3_READER_KEY, S3_READER_SECRET = "accelbench-reader", "accelbench-reader-secret"
S3_REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode} before listening") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on {port} within {timeout:.0f}s") from None
            time.sleep(0.1)


def servers_built() -> list[str]:
    """Names of the servers missing from .servers/ (empty when both are there)."""
    return [name for name in ("fake-gcs-server", "versitygw") if not (SERVERS / name).exists()]


@dataclass
class ObjectStores:
    workdir: Path
    gcs_port: int
    s3_port: int
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def gcs_host(self) -> str:
        return f"http://127.0.0.1:{self.gcs_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self, s3_key: str = S3_ROOT_KEY, s3_secret: str = S3_ROOT_SECRET) -> dict[str, str]:
        """What a client needs to reach both stores (as an account of the S3 store)."""
        return {
            "STORAGE_EMULATOR_HOST": self.gcs_host,
            "AWS_ENDPOINT_URL_S3": self.s3_endpoint,
            "AWS_ACCESS_KEY_ID": s3_key,
            "AWS_SECRET_ACCESS_KEY": s3_secret,
            "AWS_REGION": S3_REGION,
        }

    def gcs_client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="accelbench-test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.gcs_host},
        )

    def s3_client(self, key: str = S3_ROOT_KEY, secret: str = S3_ROOT_SECRET) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name=S3_REGION,
        )

    def create_bucket(self, uri: str) -> None:
        scheme, _, rest = uri.partition("://")
        bucket = rest.split("/", 1)[0]
        if scheme == "gs":
            self.gcs_client().create_bucket(bucket)
        else:
            self.s3_client().create_bucket(Bucket=bucket)

    def put_dir(self, local: Path, uri: str) -> int:
        """Upload every file under `local` to `uri` with the SDK (as a user would); bytes written."""
        total = 0
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            self.put_file(path, f"{uri.rstrip('/')}/{path.relative_to(local).as_posix()}")
            total += path.stat().st_size
        return total

    def put_file(self, path: Path, uri: str) -> None:
        scheme, _, rest = uri.partition("://")
        bucket, _, key = rest.partition("/")
        if scheme == "gs":
            self.gcs_client().bucket(bucket).blob(key).upload_from_filename(str(path))
        else:
            self.s3_client().upload_file(str(path), bucket, key)

    def object_file(self, uri: str) -> Path:
        """The file the S3 store keeps an s3:// object in (versitygw maps keys to paths)."""
        scheme, _, rest = uri.partition("://")
        if scheme != "s3":
            raise ValueError("only the S3 store keeps objects as plain files here")
        return self.workdir / "s3" / "data" / rest

    def stop(self) -> None:
        for proc in self.processes:
            proc.terminate()
        for proc in self.processes:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.processes.clear()


def start_object_stores(workdir: Path) -> ObjectStores:
    missing = servers_built()
    if missing:
        raise FileNotFoundError(
            f"{', '.join(missing)} not in {SERVERS}: run hack/build-servers.sh (make servers)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    stores = ObjectStores(workdir, free_port(), free_port())
    try:
        gcs_args = ["-scheme", "http", "-host", "127.0.0.1", "-port", str(stores.gcs_port)]
        gcs_args += ["-backend", "filesystem", "-filesystem-root", str(workdir / "gcs")]
        gcs_args += ["-public-host", f"127.0.0.1:{stores.gcs_port}", "-log-level", "warn"]
        gcs = subprocess.Popen(
            [str(SERVERS / "fake-gcs-server"), *gcs_args],
            stdout=(workdir / "gcs.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        stores.processes.append(gcs)
        data = workdir / "s3" / "data"
        data.mkdir(parents=True, exist_ok=True)
        s3 = subprocess.Popen(
            [
                str(SERVERS / "versitygw"),
                "--access",
                S3_ROOT_KEY,
                "--secret",
                S3_ROOT_SECRET,
                "--region",
                S3_REGION,
                "--port",
                f"127.0.0.1:{stores.s3_port}",
                "--iam-dir",
                str(workdir / "s3"),
                "posix",
                str(data),
            ],
            stdout=(workdir / "s3.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        stores.processes.append(s3)
        _wait_port(stores.gcs_port, gcs, "fake-gcs-server")
        _wait_port(stores.s3_port, s3, "versitygw")
        subprocess.run(
            [
                str(SERVERS / "versitygw"),
                "admin",
                "--access",
                S3_ROOT_KEY,
                "--secret",
                S3_ROOT_SECRET,
                "--endpoint-url",
                stores.s3_endpoint,
                "create-user",
                "--access",
                S3_READER_KEY,
                "--secret",
                S3_READER_SECRET,
                "--role",
                "user",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except BaseException:
        stores.stop()
        raise
    return stores


def main() -> int:
    """`python hack/objectstores.py DIR`: run both stores until interrupted (for a manual try)."""
    import sys

    stores = start_object_stores(Path(sys.argv[1] if len(sys.argv) > 1 else ".objectstores"))
    for key, value in stores.env().items():
        print(f"export {key}={value}")
    try:
        while all(p.poll() is None for p in stores.processes):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        stores.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
