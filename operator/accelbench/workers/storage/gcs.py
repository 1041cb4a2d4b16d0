"""gs:// through google-cloud-storage. Credentials: Application Default Credentials (GKE Workload
Identity through the pod's ServiceAccount); STORAGE_EMULATOR_HOST points it at a local server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from ...api.objects import ObjectUri
from .stores import Expected, StoredObject, StoreError, crc32c_base64, md5_base64


@contextmanager
def _translated() -> Iterator[None]:
    from google.api_core import exceptions
    from google.auth.exceptions import DefaultCredentialsError, RefreshError

    try:
        yield
    except exceptions.NotFound as exc:
        raise StoreError(StoreError.MISSING, exc.message) from None
    except (exceptions.Forbidden, exceptions.Unauthorized) as exc:
        raise StoreError(StoreError.DENIED, exc.message) from None
    except (DefaultCredentialsError, RefreshError) as exc:
        raise StoreError(StoreError.DENIED, f"no usable credentials: {exc}") from None
    except (exceptions.GoogleAPICallError, exceptions.RetryError, ConnectionError) as exc:
        raise StoreError(StoreError.TRANSIENT, str(exc)) from None


def _expected(blob: Any) -> Expected | None:
    if blob.md5_hash:
        return md5_base64(blob.md5_hash)
    if blob.crc32c:  # composite objects carry only this
        return crc32c_base64(blob.crc32c)
    return None


class GcsStore:
    def __init__(self, bucket: str, client: Any = None) -> None:
        from google.cloud import storage

        with _translated():
            self.client = client or storage.Client()
        self.bucket_name = bucket
        self.bucket = self.client.bucket(bucket)

    def _object(self, blob: Any) -> StoredObject:
        uri = f"gs://{self.bucket_name}/{blob.name}"
        return StoredObject(uri, blob.name, int(blob.size or 0), _expected(blob), blob)

    def list(self, where: ObjectUri) -> list[StoredObject]:
        with _translated():
            if where.prefix:
                exact = self.bucket.get_blob(where.prefix)
                if exact is not None:
                    return [self._object(exact)]
            under = f"{where.prefix}/" if where.prefix else ""
            blobs = self.client.list_blobs(self.bucket_name, prefix=under)
            return [self._object(b) for b in blobs if not b.name.endswith("/")]

    def download(self, obj: StoredObject, sink: BinaryIO, start: int) -> None:
        with _translated():
            # We verify the whole file; no Range header for a download from the start.
            obj.handle.download_to_file(sink, start=start or None, checksum=None)

    def read_bytes(self, key: str) -> bytes:
        with _translated():
            return bytes(self.bucket.blob(key).download_as_bytes())

    def upload_file(self, path: Path, key: str) -> None:
        with _translated():
            self.bucket.blob(key).upload_from_filename(str(path), checksum="md5")

    def upload_bytes(self, data: bytes, key: str, content_type: str) -> None:
        with _translated():
            self.bucket.blob(key).upload_from_string(data, content_type=content_type, checksum="md5")
