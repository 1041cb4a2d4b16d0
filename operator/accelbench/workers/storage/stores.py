"""What the copy engine (storage/__init__.py) needs of an object store, and how each store's
checksums are checked. One Store per bucket; gcs.py and s3.py implement it with the official SDKs."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ...api.objects import GCS_SCHEME, S3_SCHEME, ObjectUri


class StoreError(Exception):
    """A store's refusal in store-neutral terms; `kind` decides what the caller does."""

    MISSING = "missing"  # no such bucket or object: the input is wrong
    DENIED = "denied"  # no credentials, or they may not read/write it: the setup is wrong
    TRANSIENT = "transient"  # unreachable, throttled, 5xx: worth another try
    CORRUPT = "corrupt"  # the SDK's own check of the bytes it received failed

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail

    def describe(self) -> str:
        return {self.MISSING: "not found", self.DENIED: "permission denied"}.get(self.kind, "failed") + (
            f" ({self.detail})"
        )


class Digest(Protocol):
    def update(self, data: bytes) -> None: ...


@dataclass(frozen=True)
class Expected:
    """The store's checksum of an object and how to compute ours: `new()` gives a running digest
    fed while downloading, `matches()` compares its final value."""

    label: str  # what the error message calls it: "MD5", "CRC32C", "ETag"
    value: str  # as the store states it
    new: Callable[[], Digest]
    encode: Callable[[Any], str]  # the final value of a digest `new()` made, as the store states it

    def matches(self, digest: Digest | None) -> bool:
        return digest is not None and self.encode(digest) == self.value


def _base64(digest: Any) -> str:
    return base64.b64encode(digest.digest()).decode()


def md5_base64(value: str) -> Expected:
    """GCS's md5Hash (base64 of the 16 bytes)."""
    return Expected("MD5", value, lambda: hashlib.md5(usedforsecurity=False), _base64)


def crc32c_base64(value: str) -> Expected:
    """GCS's crc32c (base64, big-endian): the only checksum of a composed object."""

    def new() -> Digest:
        import google_crc32c

        return google_crc32c.Checksum()

    return Expected("CRC32C", value, new, _base64)


def s3_etag(etag: str, part_size: int | None) -> Expected:
    """S3's ETag of an unencrypted or SSE-S3 object: the MD5 (hex) of a single-part upload, or for a
    multipart one `md5(md5(part 1) + md5(part 2) + ...)-N`, which needs the part size."""
    value = etag.strip('"')
    if part_size is None:
        return Expected("ETag", value, lambda: hashlib.md5(usedforsecurity=False), lambda d: d.digest().hex())
    size = part_size
    return Expected("ETag", value, lambda: MultipartMd5(size), lambda d: d.etag())


class MultipartMd5:
    """The multipart ETag computed while streaming: an MD5 per `part_size` bytes, then the MD5 of
    their concatenation and the part count."""

    def __init__(self, part_size: int) -> None:
        self.part_size = part_size
        self.parts: list[bytes] = []
        self.current = hashlib.md5(usedforsecurity=False)
        self.filled = 0

    def update(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            take = min(len(view), self.part_size - self.filled)
            self.current.update(view[:take])
            self.filled += take
            view = view[take:]
            if self.filled == self.part_size:
                self.parts.append(self.current.digest())
                self.current, self.filled = hashlib.md5(usedforsecurity=False), 0

    def etag(self) -> str:
        parts = self.parts + ([self.current.digest()] if self.filled else [])
        return f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"


@dataclass(frozen=True)
class StoredObject:
    uri: str  # scheme://bucket/key, for messages
    key: str
    size: int
    expected: Expected | None  # None: the store gave nothing we can check (the size is all there is)
    handle: Any = field(default=None, compare=False, hash=False)  # the SDK's own object, if any


class Store(Protocol):
    """One bucket of one store."""

    def list(self, where: ObjectUri) -> list[StoredObject]:
        """The object named exactly by where.prefix, else every object under `prefix/`."""
        ...

    def download(self, obj: StoredObject, sink: BinaryIO, start: int) -> None:
        """Write the object's bytes from offset `start` to `sink`."""
        ...

    def read_bytes(self, key: str) -> bytes: ...

    def upload_file(self, path: Path, key: str) -> None:
        """Write a local file; the SDK checks it arrived intact."""
        ...

    def upload_bytes(self, data: bytes, key: str, content_type: str) -> None: ...


def open_store(where: ObjectUri) -> Store:
    if where.scheme == GCS_SCHEME:
        from .gcs import GcsStore

        return GcsStore(where.bucket)
    if where.scheme == S3_SCHEME:
        from .s3 import S3Store

        return S3Store(where.bucket)
    raise ValueError(f"no store for {where.scheme}://")
