"""s3:// through boto3, the AWS SDK. Credentials: its default chain (EKS IRSA or Pod Identity through
the pod's ServiceAccount, instance roles, AWS_* env from a Secret). Any S3 API (on-prem stores, the
tests' local server) through AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, which boto3 reads itself."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from ...api.objects import ObjectUri
from .stores import Expected, StoredObject, StoreError, s3_etag

CHUNK_BYTES = 1 << 20
MISSING_CODES = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
DENIED_CODES = {
    "AccessDenied",
    "403",
    "Forbidden",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AllAccessDisabled",
    "ExpiredToken",
    "InvalidToken",
}
# Encryption whose ETag is not an MD5 of the bytes (SSE-KMS, DSSE-KMS); SSE-C shows up as a
# customer algorithm instead. Such objects are checked by size only.
OPAQUE_ETAG_ENCRYPTION = {"aws:kms", "aws:kms:dsse"}


def _client_error(exc: Any) -> StoreError:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    detail = f"{code}: {error.get('Message') or exc}"
    if code in MISSING_CODES:
        return StoreError(StoreError.MISSING, detail)
    if code in DENIED_CODES:
        return StoreError(StoreError.DENIED, detail)
    return StoreError(StoreError.TRANSIENT, detail)


@contextmanager
def _translated() -> Iterator[None]:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        FlexibleChecksumError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    try:
        yield
    except ClientError as exc:
        raise _client_error(exc) from None
    except S3UploadFailedError as exc:  # upload_file wraps the ClientError it met
        inner = exc.__context__
        if isinstance(inner, ClientError):
            raise _client_error(inner) from None
        raise StoreError(StoreError.TRANSIENT, str(exc)) from None
    except FlexibleChecksumError as exc:  # botocore checks a whole-object GET against the stored CRC
        raise StoreError(StoreError.CORRUPT, str(exc)) from None
    except (NoCredentialsError, PartialCredentialsError) as exc:
        raise StoreError(StoreError.DENIED, f"no usable credentials: {exc}") from None
    except BotoCoreError as exc:  # endpoint unreachable, read timeout, ...
        raise StoreError(StoreError.TRANSIENT, str(exc)) from None


class S3Store:
    def __init__(self, bucket: str, client: Any = None) -> None:
        import boto3

        with _translated():
            # A session of its own: boto3's default session caches the first credentials it found.
            self.client = client or boto3.session.Session().client("s3")
        self.bucket = bucket

    def _expected(self, key: str, head: dict[str, Any]) -> Expected | None:
        etag = str(head.get("ETag") or "").strip('"')
        encryption = head.get("ServerSideEncryption")
        opaque = encryption in OPAQUE_ETAG_ENCRYPTION or head.get("SSECustomerAlgorithm")
        if not etag or opaque:
            return None
        if "-" not in etag:
            return s3_etag(etag, None)
        # A multipart ETag: part 1's size is the part size every part but the last had.
        part = self.client.head_object(Bucket=self.bucket, Key=key, PartNumber=1)
        return s3_etag(etag, int(part["ContentLength"]))

    def _object(self, key: str, head: dict[str, Any]) -> StoredObject:
        uri = f"s3://{self.bucket}/{key}"
        return StoredObject(uri, key, int(head["ContentLength"]), self._expected(key, head))

    def _head(self, key: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            return dict(self.client.head_object(Bucket=self.bucket, Key=key))
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) in MISSING_CODES:
                return None
            raise

    def list(self, where: ObjectUri) -> list[StoredObject]:
        with _translated():
            if where.prefix:
                exact = self._head(where.prefix)
                if exact is not None:
                    return [self._object(where.prefix, exact)]
            under = f"{where.prefix}/" if where.prefix else ""
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=under)
            keys = [
                item["Key"]
                for page in pages
                for item in page.get("Contents", ())
                if not item["Key"].endswith("/")
            ]
            # HEAD each: the listing gives no encryption, and the ETag check depends on it.
            found = [(key, self._head(key)) for key in keys]
            return [self._object(key, head) for key, head in found if head is not None]

    def download(self, obj: StoredObject, sink: BinaryIO, start: int) -> None:
        with _translated():
            extra = {"Range": f"bytes={start}-"} if start else {}
            body = self.client.get_object(Bucket=self.bucket, Key=obj.key, **extra)["Body"]
            for chunk in body.iter_chunks(CHUNK_BYTES):
                sink.write(chunk)

    def read_bytes(self, key: str) -> bytes:
        with _translated():
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def upload_file(self, path: Path, key: str) -> None:
        with _translated():
            # Multipart above 8 MiB, parts in parallel; botocore sends a checksum the store verifies.
            self.client.upload_file(str(path), self.bucket, key)

    def upload_bytes(self, data: bytes, key: str, content_type: str) -> None:
        with _translated():
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type)
