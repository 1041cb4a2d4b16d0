"""Object-store URIs (gs://, s3://) and where a copy of one lives on a pod's disk.

Pure: shared by the renderer (which tells an engine the local path its init container fills) and by
workers.storage (which fills it), so both agree on the layout without talking to each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

GCS_SCHEME = "gs"
S3_SCHEME = "s3"
OBJECT_STORE_SCHEMES = (GCS_SCHEME, S3_SCHEME)


class ObjectUriError(ValueError):
    """Not a usable gs:// or s3:// URI."""


def is_object_store(uri: str) -> bool:
    return uri.startswith(tuple(f"{scheme}://" for scheme in OBJECT_STORE_SCHEMES))


@dataclass(frozen=True)
class ObjectUri:
    scheme: str  # GCS_SCHEME or S3_SCHEME
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the whole bucket

    @classmethod
    def parse(cls, uri: str) -> ObjectUri:
        scheme, sep, rest = uri.partition("://")
        if not sep or scheme not in OBJECT_STORE_SCHEMES:
            raise ObjectUriError(f"{uri!r} is not a gs:// or s3:// URI")
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ObjectUriError(f"{uri!r} names no bucket; use {scheme}://BUCKET/PATH")
        prefix = prefix.strip("/")
        if ".." in PurePosixPath(prefix).parts:
            raise ObjectUriError(f"{uri!r}: '..' is not allowed in an object path")
        return cls(scheme, bucket, prefix)

    def __str__(self) -> str:
        return (
            f"{self.scheme}://{self.bucket}/{self.prefix}"
            if self.prefix
            else f"{self.scheme}://{self.bucket}"
        )

    def key(self, relative: str) -> str:
        """The object name of `relative` under this prefix."""
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def child(self, relative: str) -> ObjectUri:
        return ObjectUri(self.scheme, self.bucket, self.key(relative.strip("/")))


def cache_path(cache_root: str, uri: str) -> str:
    """Where a copy of `uri` lives under `cache_root`: <root>/<scheme>/<bucket>/<prefix>. The copy of a
    prefix is a directory, of one object a file."""
    where = ObjectUri.parse(uri)
    parts = [cache_root.rstrip("/"), where.scheme, where.bucket, *([where.prefix] if where.prefix else [])]
    return "/".join(parts)
