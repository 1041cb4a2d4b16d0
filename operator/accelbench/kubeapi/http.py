"""Requests to the apiserver: one urllib3 pool per process, TLS and credentials from a Connection.

Bodies are plain dicts in and out (JSON), the shapes render/ produces and observe/ reads. A 401 is
answered once by fetching the credentials again (a rotated token, an expired plugin token)."""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any
from urllib.parse import urlencode

import urllib3
from urllib3.exceptions import HTTPError

from .config import ConfigError, Connection

UNAUTHORIZED = 401
MERGE_PATCH = "application/merge-patch+json"  # RFC 7386: a partial object, null deletes a key


class ApiError(Exception):
    """The apiserver answered with an error status. `body` is its Status object (JSON text)."""

    def __init__(
        self, status: int, reason: str = "", body: str = "", headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason
        self.body = body
        self.headers = dict(headers or {})

    @property
    def message(self) -> str:
        """The apiserver's own message (a Status object), which is what a user needs to read."""
        try:
            found = json.loads(self.body or "{}").get("message")
        except (ValueError, AttributeError):
            found = None
        return str(found or self.reason or f"HTTP {self.status}")

    def __str__(self) -> str:
        return f"({self.status}) {self.reason + ': ' if self.reason else ''}{self.message}"


class CredentialError(HTTPError):
    """The credentials could not be had for this request (the token file unreadable, the exec
    plugin failing): like the apiserver being away, something to retry, so an HTTPError."""


@dataclass(frozen=True)
class Response:
    status: int
    data: bytes
    headers: Mapping[str, str]
    reason: str = ""

    def json(self) -> dict[str, Any]:
        return json.loads(self.data) if self.data else {}

    def raise_for_status(self) -> Response:
        if not 200 <= self.status < 300:
            raise ApiError(self.status, self.reason, self.data.decode(errors="replace"), self.headers)
        return self


def _json_default(value: Any) -> str:
    """Timestamps in a body are written as RFC 3339, as the apiserver reads them."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def ssl_context(conn: Connection) -> ssl.SSLContext:
    """Trust the cluster's CA (not the system's, as kubectl does when one is given); show the
    client certificate if there is one."""
    if conn.insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif conn.ca_file or conn.ca_data:
        ctx = ssl.create_default_context(cafile=conn.ca_file, cadata=conn.ca_data)
    else:
        ctx = ssl.create_default_context()
    if conn.client_cert_file and conn.client_key_file:
        ctx.load_cert_chain(conn.client_cert_file, conn.client_key_file)
    return ctx


class KubeHTTP:
    """Thread-safe: the pool hands each thread its own keep-alive connection, up to `connections`
    kept open (more are opened and closed when that many are busy)."""

    def __init__(self, conn: Connection, connections: int = 10) -> None:
        self.conn = conn
        pool: dict[str, Any] = {"maxsize": max(connections, 1), "block": False, "retries": False}
        if conn.server.startswith("https"):
            pool["ssl_context"] = ssl_context(conn)
            if conn.insecure:
                pool |= {"cert_reqs": "CERT_NONE", "assert_hostname": False}
            elif conn.tls_server_name:
                pool |= {"server_hostname": conn.tls_server_name, "assert_hostname": conn.tls_server_name}
        self.pool: urllib3.PoolManager = (
            urllib3.ProxyManager(conn.proxy_url, **pool) if conn.proxy_url else urllib3.PoolManager(**pool)
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
        timeout: float = 30.0,
    ) -> Response:
        url = self.conn.server + path + (f"?{urlencode(list(query))}" if query else "")
        payload = json.dumps(body, default=_json_default).encode() if body is not None else None
        raw = self._send(method, url, payload, content_type, timeout)
        if raw.status == UNAUTHORIZED:
            self.conn.auth.invalidate()  # a rotated or expired token: fetch it again, once
            raw = self._send(method, url, payload, content_type, timeout)
        return Response(raw.status, raw.data, raw.headers, raw.reason or "")  # headers: case-insensitive

    def _send(
        self, method: str, url: str, payload: bytes | None, content_type: str | None, timeout: float
    ) -> urllib3.BaseHTTPResponse:
        try:
            auth = self.conn.auth.headers()
        except ConfigError as exc:
            raise CredentialError(f"no credentials for {self.conn.server}: {exc}") from None
        headers = {"Accept": "application/json", "Content-Type": content_type or "application/json", **auth}
        return self.pool.request(
            method, url, body=payload, headers=headers, timeout=timeout, redirect=False, retries=False
        )
