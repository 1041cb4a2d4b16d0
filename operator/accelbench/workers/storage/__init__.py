"""Object storage for the workers and the serving engines' init container: gs:// and s3:// inputs
copied into a local cache before anything reads them (fetch), and a run's outputs uploaded after it
(upload_dir).

Clients: the stores' official SDKs (gcs.py: google-cloud-storage, s3.py: boto3). Both find
credentials the cloud way through the pod's ServiceAccount (GKE Workload Identity, EKS IRSA or Pod
Identity) or the usual environment, and both reach a local server for tests and on-prem stores
(STORAGE_EMULATOR_HOST for GCS; AWS_ENDPOINT_URL_S3 for any S3 API). Why copy instead of streaming:
both frameworks and every engine open safetensors and tokenizer files by path, and a copy on the
pod's disk can be verified and reused.

What a copy does (store-neutral, here):
- lists the objects under the prefix (or the one object the URI names) and checks the free space of
  the cache's file system first: a clear error, not a full disk halfway;
- downloads several objects at once, each to `<file>.part` resumed from its size when an earlier
  attempt left one, hashing while it writes, and verifies the store's checksum (GCS MD5 or CRC32C,
  S3 ETag, multipart ETags included) before renaming it;
- reuses a cached file whose size and checksum match, so a retried pod does not download again;
- logs progress and throughput, and returns bytes and seconds for the WorkerReport.
A missing object, a refused permission, a corrupt copy and a full disk raise the InvalidConfigError
subclasses below, whose `reason` names the case (the Job does not retry: the same input cannot
succeed). A store that cannot be reached is an ordinary error: the Job retries it.

An upload writes every file, then `manifest.json` (every file, its size and MD5) last: a reader that
finds the manifest finds a complete set. Transient failures are retried; one that persists raises
OutputError.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...api.contract import ENV_CACHE_DIR
from ...api.objects import ObjectUri, ObjectUriError, cache_path, is_object_store
from ...api.status import Reason
from .. import InvalidConfigError
from .stores import Store, StoredObject, StoreError, open_store

__all__ = [
    "MANIFEST_NAME",
    "Fetched",
    "ObjectCorruptError",
    "ObjectDeniedError",
    "ObjectMissingError",
    "ObjectUri",
    "OutputError",
    "Uploaded",
    "default_cache_dir",
    "fetch",
    "is_object_store",
    "parse_uri",
    "upload_dir",
]

CHUNK_BYTES = 8 << 20
DOWNLOAD_THREADS = 8
PROGRESS_EVERY_SECONDS = 5.0
MANIFEST_NAME = "manifest.json"
UPLOAD_ATTEMPTS = 4  # with backoff 2, 4, 8 s between them: a blip does not cost the run's outputs
UPLOAD_BACKOFF_SECONDS = 2.0

Log = Callable[[str], None]
Progress = Callable[[int, int], None]  # (bytes done, bytes in total)


class ObjectMissingError(InvalidConfigError):
    reason = Reason.OBJECT_NOT_FOUND.value


class ObjectDeniedError(InvalidConfigError):
    reason = Reason.OBJECT_ACCESS_DENIED.value


class ObjectCorruptError(InvalidConfigError):
    reason = Reason.OBJECT_CORRUPT.value


class CacheFullError(InvalidConfigError):
    reason = Reason.INSUFFICIENT_DISK.value


class StoreUnavailableError(RuntimeError):
    """The store could not be reached or failed (5xx, timeouts): the Job's retry may succeed."""


class OutputError(RuntimeError):
    """The run's outputs could not be written where the spec says (the run itself finished)."""

    reason = Reason.OUTPUT_NOT_WRITTEN.value


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """ENV_CACHE_DIR (a pod's emptyDir), else ~/.cache/accelbench/objects: a cache that survives runs."""
    env = os.environ if env is None else env
    return Path(env.get(ENV_CACHE_DIR) or Path.home() / ".cache" / "accelbench" / "objects")


def parse_uri(uri: str) -> ObjectUri:
    try:
        return ObjectUri.parse(uri)
    except ObjectUriError as exc:
        raise InvalidConfigError(str(exc)) from None


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


def fetch(
    uri: str,
    cache_root: Path,
    log: Log = print,
    *,
    threads: int = DOWNLOAD_THREADS,
    progress: Progress | None = None,
    store: Store | None = None,
) -> Fetched:
    """Copy the object or prefix `uri` names to api.objects.cache_path(cache_root, uri)."""
    where = parse_uri(uri)
    store = store or open_store(where)
    started = time.perf_counter()
    local_root = Path(cache_path(str(cache_root), uri))
    try:
        objects = store.list(where)
        if not objects:
            raise ObjectMissingError(f"{uri}: no such object or prefix")
        single = len(objects) == 1 and objects[0].key == where.prefix
        plan = [(obj, local_root if single else local_root / _relative(obj.key, where)) for obj in objects]
        todo = [(obj, path) for obj, path in plan if not _cached(obj, path)]
        reused = sum(obj.size for obj, path in plan if (obj, path) not in todo)
        _check_space(cache_root, todo, uri)
        meter = _Meter(sum(obj.size for obj, _ in todo), uri, log, progress)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            for future in [pool.submit(_download, store, obj, path, meter) for obj, path in todo]:
                future.result()
    except StoreError as exc:
        raise _input_error(uri, exc) from None
    seconds = time.perf_counter() - started
    fetched = Fetched(local_root, len(plan), meter.downloaded, reused, seconds)
    log(
        f"{uri}: {fetched.objects} objects, {fetched.bytes_downloaded / 1e6:.1f} MB downloaded "
        f"({fetched.bytes_per_second / 1e6:.1f} MB/s), {reused / 1e6:.1f} MB reused from the cache"
    )
    return fetched


def _input_error(uri: str, exc: StoreError) -> Exception:
    if exc.kind == StoreError.DENIED:
        return ObjectDeniedError(f"{uri}: permission denied ({exc.detail})")
    if exc.kind == StoreError.MISSING:
        return ObjectMissingError(f"{uri}: not found ({exc.detail})")
    return StoreUnavailableError(f"{uri}: {exc.detail}")


@dataclass(frozen=True)
class Uploaded:
    uri: str
    objects: list[dict[str, Any]]  # {"name", "bytes", "md5"} per file, as in the manifest
    bytes: int
    seconds: float


def upload_dir(
    local: Path,
    uri: str,
    log: Log = print,
    *,
    store: Store | None = None,
    attempts: int = UPLOAD_ATTEMPTS,
    backoff_seconds: float = UPLOAD_BACKOFF_SECONDS,
) -> Uploaded:
    """Copy every file under `local` to `uri`, several at once, then write MANIFEST_NAME there last,
    listing every file with its size and MD5 (hex): a reader that finds the manifest finds a complete
    set (an interrupted upload leaves none). A failure is retried `attempts` times in all (files
    already written are written again: uploads are idempotent); then OutputError."""
    where = parse_uri(uri)
    files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)
    started = time.perf_counter()
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        try:
            store = store or open_store(where)
            objects = _upload_once(store, local, where, files)
            break
        except StoreError as exc:
            if exc.kind != StoreError.TRANSIENT:  # a refusal or a missing bucket stays so
                raise OutputError(f"{uri}: {exc.describe()}") from None
            last = exc
        except OSError as exc:  # a local file that vanished or cannot be read
            raise OutputError(f"{uri}: cannot read the outputs in {local}: {exc}") from None
        if attempt < attempts:
            pause = backoff_seconds * 2 ** (attempt - 1)
            log(f"{uri}: upload attempt {attempt} failed ({last}); retrying in {pause:.0f} s")
            time.sleep(pause)
    else:
        raise OutputError(f"{uri}: the upload failed {attempts} times, last: {last}")
    total = sum(o["bytes"] for o in objects)
    seconds = time.perf_counter() - started
    log(f"{uri}: uploaded {len(objects)} files, {total / 1e6:.1f} MB in {seconds:.1f} s, and {MANIFEST_NAME}")
    return Uploaded(uri, objects, total, seconds)


def _upload_once(store: Store, local: Path, where: ObjectUri, files: list[Path]) -> list[dict[str, Any]]:
    def one(path: Path) -> dict[str, Any]:
        rel = path.relative_to(local).as_posix()
        store.upload_file(path, where.key(rel))
        return {"name": rel, "bytes": path.stat().st_size, "md5": _md5_hex(path)}

    with ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS) as pool:
        objects = list(pool.map(one, files))
    manifest = {"uri": str(where), "objects": objects}
    store.upload_bytes(json.dumps(manifest, indent=1).encode(), where.key(MANIFEST_NAME), "application/json")
    return objects


def read_manifest(uri: str, store: Store | None = None) -> dict[str, Any]:
    """The manifest an upload_dir wrote under `uri`; ObjectMissingError when there is none."""
    where = parse_uri(uri)
    store = store or open_store(where)
    try:
        return json.loads(store.read_bytes(where.key(MANIFEST_NAME)))
    except StoreError as exc:
        raise _input_error(str(where.child(MANIFEST_NAME)), exc) from None


def _md5_hex(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    _hash_file(digest, path)
    return digest.hexdigest()


def _relative(key: str, where: ObjectUri) -> str:
    rel = key[len(where.prefix) :].lstrip("/") if where.prefix else key
    if not rel or ".." in Path(rel).parts:
        raise InvalidConfigError(f"object {key!r} does not map to a file under the cache")
    return rel


def _check_space(cache_root: Path, todo: list[tuple[StoredObject, Path]], uri: str) -> None:
    cache_root.mkdir(parents=True, exist_ok=True)
    need = sum(obj.size - _part_size(path) for obj, path in todo)
    free = shutil.disk_usage(cache_root).free
    if need > free:
        raise CacheFullError(
            f"{uri}: needs {need / 1e6:.1f} MB in {cache_root}, which has {free / 1e6:.1f} MB free; "
            "give the pod a larger volume for the cache"
        )


def _part_size(path: Path) -> int:
    part = path.with_name(path.name + ".part")
    return part.stat().st_size if part.exists() else 0


def _cached(obj: StoredObject, path: Path) -> bool:
    if not path.is_file() or path.stat().st_size != obj.size:
        return False
    if obj.expected is None:
        return True
    digest = obj.expected.new()
    _hash_file(digest, path)
    return obj.expected.matches(digest)


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


class _HashingWriter:
    """A file object that feeds every byte written to a digest and the meter: verified in one pass."""

    def __init__(self, f: Any, digest: Any, meter: _Meter) -> None:
        self.f, self.digest, self.meter = f, digest, meter

    def write(self, data: bytes) -> int:
        if self.digest is not None:
            self.digest.update(data)
        self.meter.add(len(data))
        return self.f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


def _download(store: Store, obj: StoredObject, path: Path, meter: _Meter) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    start = part.stat().st_size if part.exists() else 0
    if start > obj.size:
        part.unlink()
        start = 0
    meter.add(start)  # resumed bytes count as done, not as downloaded
    meter.resumed(start)
    for attempt in (1, 2):  # a corrupt copy is downloaded once more from the start
        digest = obj.expected.new() if obj.expected is not None else None
        if digest is not None and start:
            _hash_file(digest, part, start)  # the part an earlier attempt left
        intact = True
        if start < obj.size:
            with part.open("ab") as f:
                try:
                    store.download(obj, _HashingWriter(f, digest, meter), start)
                except StoreError as exc:
                    if exc.kind != StoreError.CORRUPT:
                        raise
                    intact = False  # the SDK's own checksum failed: as our mismatch
        elif not part.exists():
            part.touch()  # an empty object
        if intact and (obj.expected is None or obj.expected.matches(digest)):
            part.replace(path)
            return
        part.unlink()
        start = 0
        if attempt == 2:
            label = obj.expected.label if obj.expected is not None else "checksum"
            raise ObjectCorruptError(
                f"{obj.uri}: the downloaded copy does not match the store's {label} "
                "(twice): the object or the transfer is corrupt"
            )


class _Meter:
    """Bytes done across threads, logged every few seconds with the rate so far."""

    def __init__(self, total: int, uri: str, log: Log, progress: Progress | None) -> None:
        self.total, self.uri, self.log, self.progress = total, uri, log, progress
        self.done = 0
        self.skipped = 0  # resumed from a .part: done, but not downloaded now
        self.started = self.last = time.perf_counter()
        self.lock = threading.Lock()

    def resumed(self, n: int) -> None:
        with self.lock:
            self.skipped += n

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            now = time.perf_counter()
            if self.progress is not None:
                self.progress(self.done, self.total)
            if now - self.last >= PROGRESS_EVERY_SECONDS:
                rate = (self.done - self.skipped) / max(now - self.started, 1e-9)
                self.log(
                    f"{self.uri}: {self.done / 1e6:.1f} of {self.total / 1e6:.1f} MB ({rate / 1e6:.1f} MB/s)"
                )
                self.last = now

    @property
    def downloaded(self) -> int:
        return self.done - self.skipped
