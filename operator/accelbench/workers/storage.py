"""Object storage for the fine-tuning worker: `gs://` inputs copied into a local cache before the
worker reads them, and a run's outputs uploaded to `gs://` after it (upload_dir).

Client: the official google-cloud-storage SDK. It finds credentials the cloud way (GKE Workload
Identity through the pod's ServiceAccount, Application Default Credentials elsewhere) and talks to
a local server when STORAGE_EMULATOR_HOST names one (the tests run fake-gcs-server). Why copy
instead of streaming: both frameworks open safetensors and tokenizer files by path, and a copy on
the pod's disk can be verified and reused.

What a copy does:
- lists the objects under the prefix (or the one object the URI names) and checks the free space
  of the cache's file system first: a clear error, not a full disk halfway;
- downloads several objects at once, each to `<file>.part` resumed from its size when an earlier
  attempt left one, then verifies it against the store's MD5 (or CRC32C) before renaming it;
- reuses a cached file whose size and checksum match, so a retried pod does not download again;
- logs progress and throughput, and returns bytes and seconds for the WorkerReport.
A missing object, a refused permission or a corrupt copy raise InvalidConfigError naming the
object (the Job does not retry it: the same input cannot succeed).

An upload writes every file, each checked by the client against its MD5, then `manifest.json`
(every file, size and MD5) last; an upload that fails raises OutputError.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import InvalidConfigError

GCS_SCHEME = "gs://"
CHUNK_BYTES = 8 << 20
DOWNLOAD_THREADS = 8
PROGRESS_EVERY_SECONDS = 5.0


@dataclass(frozen=True)
class ObjectUri:
    bucket: str
    prefix: str  # "" for the whole bucket

    @classmethod
    def parse(cls, uri: str) -> ObjectUri:
        if not uri.startswith(GCS_SCHEME):
            raise InvalidConfigError(f"{uri!r} is not a gs:// URI")
        bucket, _, prefix = uri.removeprefix(GCS_SCHEME).partition("/")
        if not bucket:
            raise InvalidConfigError(f"{uri!r} names no bucket; use gs://BUCKET/PATH")
        return cls(bucket, prefix.strip("/"))


@dataclass(frozen=True)
class Fetched:
    path: Path  # local directory (a prefix) or file (one object)
    objects: int
    bytes_downloaded: int
    bytes_reused: int
    seconds: float

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_downloaded / self.seconds if self.seconds > 0 else 0.0


def is_object_store(uri: str) -> bool:
    return uri.startswith(GCS_SCHEME)


def fetch(uri: str, cache_root: Path, log: Callable[[str], None] = print, client: Any = None) -> Fetched:
    """Copy the object or prefix `uri` names under `cache_root/<bucket>/<prefix>`; see the module doc."""
    from google.api_core import exceptions

    where = ObjectUri.parse(uri)
    client = client or _client()
    started = time.perf_counter()
    try:
        blobs = _listing(client, where)
        if not blobs:
            raise InvalidConfigError(f"{uri}: no such object or prefix")
        local_root = cache_root / where.bucket / where.prefix
        single = len(blobs) == 1 and blobs[0].name == where.prefix
        plan = [
            (blob, local_root if single else local_root / _relative(blob.name, where.prefix))
            for blob in blobs
        ]
        todo = [(blob, path) for blob, path in plan if not _cached(blob, path)]
        reused = sum(int(blob.size or 0) for blob, path in plan if (blob, path) not in todo)
        _check_space(cache_root, todo, uri)
        meter = _Meter(sum(int(b.size or 0) for b, _ in todo), uri, log)
        with ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS) as pool:
            for future in [pool.submit(_download, blob, path, meter) for blob, path in todo]:
                future.result()
    except exceptions.NotFound as exc:
        raise InvalidConfigError(f"{uri}: not found ({exc.message})") from None
    except exceptions.Forbidden as exc:
        raise InvalidConfigError(f"{uri}: permission denied ({exc.message})") from None
    seconds = time.perf_counter() - started
    fetched = Fetched(local_root, len(plan), meter.done, reused, seconds)
    log(
        f"{uri}: {fetched.objects} objects, {fetched.bytes_downloaded / 1e6:.1f} MB downloaded "
        f"({fetched.bytes_per_second / 1e6:.1f} MB/s), {reused / 1e6:.1f} MB reused from the cache"
    )
    return fetched


@dataclass(frozen=True)
class Uploaded:
    uri: str
    objects: list[dict[str, Any]]  # {"name", "bytes", "md5"} per file, as in the manifest
    bytes: int
    seconds: float


MANIFEST_NAME = "manifest.json"


def upload_dir(local: Path, uri: str, log: Callable[[str], None] = print, client: Any = None) -> Uploaded:
    """Copy every file under `local` to `uri` (gs://BUCKET/PREFIX/...), several at once, each
    verified by the client against the checksum it computed, then write MANIFEST_NAME there last,
    listing every file with its size and MD5: a reader that finds the manifest finds a complete
    set (an interrupted upload leaves none)."""
    import json

    from google.api_core import exceptions

    where = ObjectUri.parse(uri)
    client = client or _client()
    bucket = client.bucket(where.bucket)
    started = time.perf_counter()
    files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)

    def name_of(path: Path) -> str:
        rel = path.relative_to(local).as_posix()
        return f"{where.prefix}/{rel}" if where.prefix else rel

    def one(path: Path) -> dict[str, Any]:
        blob = bucket.blob(name_of(path))
        blob.upload_from_filename(str(path), checksum="md5")
        return {
            "name": path.relative_to(local).as_posix(),
            "bytes": path.stat().st_size,
            "md5": blob.md5_hash,
        }

    try:
        with ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS) as pool:
            objects = list(pool.map(one, files))
        manifest = {"uri": uri, "objects": objects}
        bucket.blob(name_of(local / MANIFEST_NAME)).upload_from_string(
            json.dumps(manifest, indent=1), content_type="application/json", checksum="md5"
        )
    except exceptions.Forbidden as exc:
        raise OutputError(f"{uri}: permission denied ({exc.message})") from None
    except exceptions.NotFound as exc:
        raise OutputError(f"{uri}: not found ({exc.message})") from None
    total = sum(o["bytes"] for o in objects)
    seconds = time.perf_counter() - started
    log(f"{uri}: uploaded {len(objects)} files, {total / 1e6:.1f} MB in {seconds:.1f} s, and {MANIFEST_NAME}")
    return Uploaded(uri, objects, total, seconds)


class OutputError(RuntimeError):
    """The run's outputs could not be written where the spec says (the run itself finished)."""


def _client() -> Any:
    from google.cloud import storage

    return storage.Client()


def _listing(client: Any, where: ObjectUri) -> list[Any]:
    """The object named exactly by the prefix, else every object under `prefix/`."""
    bucket = client.bucket(where.bucket)
    if where.prefix:
        exact = bucket.get_blob(where.prefix)
        if exact is not None:
            return [exact]
    under = f"{where.prefix}/" if where.prefix else ""
    return [b for b in client.list_blobs(where.bucket, prefix=under) if not b.name.endswith("/")]


def _relative(name: str, prefix: str) -> str:
    rel = name[len(prefix) :].lstrip("/") if prefix else name
    if not rel or ".." in Path(rel).parts:
        raise InvalidConfigError(f"object {name!r} does not map to a file under the cache")
    return rel


def _check_space(cache_root: Path, todo: list[tuple[Any, Path]], uri: str) -> None:
    cache_root.mkdir(parents=True, exist_ok=True)
    need = sum(int(blob.size or 0) - _part_size(path) for blob, path in todo)
    free = shutil.disk_usage(cache_root).free
    if need > free:
        raise InvalidConfigError(
            f"{uri}: needs {need / 1e9:.2f} GB in {cache_root}, which has {free / 1e9:.2f} GB free; "
            "give the pod a larger volume for the cache"
        )


def _part_size(path: Path) -> int:
    part = path.with_name(path.name + ".part")
    return part.stat().st_size if part.exists() else 0


def _cached(blob: Any, path: Path) -> bool:
    return path.is_file() and path.stat().st_size == int(blob.size or 0) and _verified(blob, path)


def _new_digest(blob: Any) -> tuple[Any, str] | None:
    """(running digest, expected base64) for the store's MD5, else its CRC32C (composite objects
    carry only that); None when the store gave no checksum (the size is then all there is)."""
    if blob.md5_hash:
        return hashlib.md5(usedforsecurity=False), blob.md5_hash
    if blob.crc32c:
        import google_crc32c

        return google_crc32c.Checksum(), blob.crc32c
    return None


def _hash_file(digest: Any, path: Path, limit: int | None = None) -> None:
    with path.open("rb") as f:
        left = limit
        while left is None or left > 0:
            chunk = f.read(CHUNK_BYTES if left is None else min(CHUNK_BYTES, left))
            if not chunk:
                return
            digest.update(chunk)
            if left is not None:
                left -= len(chunk)


def _matches(check: tuple[Any, str] | None) -> bool:
    return check is None or base64.b64encode(check[0].digest()).decode() == check[1]


def _verified(blob: Any, path: Path) -> bool:
    check = _new_digest(blob)
    if check is not None:
        _hash_file(check[0], path)
    return _matches(check)


class _HashingWriter:
    """A file object that feeds every byte written to a digest: verified in one pass, no re-read."""

    def __init__(self, f: Any, digest: Any) -> None:
        self.f, self.digest = f, digest

    def write(self, data: bytes) -> int:
        if self.digest is not None:
            self.digest.update(data)
        return self.f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


def _download(blob: Any, path: Path, meter: _Meter) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    size = int(blob.size or 0)
    start = part.stat().st_size if part.exists() else 0
    if start > size:
        part.unlink()
        start = 0
    for attempt in (1, 2):  # a corrupt copy is downloaded once more from the start
        check = _new_digest(blob)
        if check is not None and start:
            _hash_file(check[0], part, start)  # the part an earlier attempt left
        if start < size:
            with part.open("ab") as f:
                blob.download_to_file(
                    _HashingWriter(f, check[0] if check else None), start=start, checksum=None
                )
        elif not part.exists():
            part.touch()  # an empty object
        meter.add(size - start)
        if _matches(check):
            part.replace(path)
            return
        part.unlink()
        start = 0
        if attempt == 2:
            raise InvalidConfigError(
                f"gs://{blob.bucket.name}/{blob.name}: the downloaded copy does not match the store's "
                "checksum (twice): the object or the transfer is corrupt"
            )


class _Meter:
    """Bytes done across threads, logged every few seconds with the rate so far."""

    def __init__(self, total: int, uri: str, log: Callable[[str], None]) -> None:
        self.total, self.uri, self.log = total, uri, log
        self.done = 0
        self.started = self.last = time.perf_counter()
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            now = time.perf_counter()
            if now - self.last >= PROGRESS_EVERY_SECONDS or self.done >= self.total:
                rate = self.done / max(now - self.started, 1e-9)
                self.log(
                    f"{self.uri}: {self.done / 1e6:.1f} of {self.total / 1e6:.1f} MB ({rate / 1e6:.1f} MB/s)"
                )
                self.last = now
