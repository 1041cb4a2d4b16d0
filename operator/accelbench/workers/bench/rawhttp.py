"""A minimal HTTP/1.1 streaming client on asyncio Protocols: the measured hot path.

Why not aiohttp here: per network read aiohttp goes through a StreamReader, an async iterator and a
task wake-up; a Protocol's data_received is called by the event loop directly, so each read costs
one callback and is stamped the moment the loop sees it. Measured in benchmarks/client_overhead.
aiohttp still does the cold paths (health, /v1/models, /tokenize) and is a selectable transport.

Scope: plain http, POST with a known body, keep-alive, responses framed by Content-Length or
chunked transfer encoding (what every OpenAI-compatible server streams with), or by close.
One request per connection at a time; idle connections are reused, so the number of connections
equals the peak number in flight (closed loop: the concurrency; open loop: whatever the schedule
needs — never a client-side queue).
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

from .records import RequestRecord
from .sse import SseParser

_HEADER_END = b"\r\n\r\n"


class ResponseError(Exception):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class _Conn(asyncio.Protocol):
    """One keep-alive connection; `start` arms it for the next response."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._done: asyncio.Future | None = None
        self._clock = time.perf_counter

    # -- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._done is not None and not self._done.done():
            if self._mode == "close" and self._status == 200:
                self._finish_body()
            else:
                self._done.set_exception(ResponseError("disconnect"))

    def start(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        self._done = loop.create_future()
        self._head = bytearray()
        self._status = 0
        self._mode = ""  # length | chunked | close
        self._remaining = 0  # bytes left in the current chunk or body
        self._chunk_state = 0  # 0: size line, 1: data, 2: CRLF after data, 3: trailers
        self._line = bytearray()
        self._sse = SseParser()
        self.events: list[tuple[float, bytes]] = []
        self.keep_alive = True
        return self._done

    def data_received(self, data: bytes) -> None:
        t = self._clock()
        if self._done is None or self._done.done():
            return  # bytes after a finished response: ignore (server misbehaving)
        if not self._mode:
            self._head += data
            end = self._head.find(_HEADER_END)
            if end < 0:
                return
            data = bytes(self._head[end + 4 :])
            self._parse_head(bytes(self._head[:end]))
            if self._done.done():
                return
        if self._mode == "chunked":
            self._chunked(data, t)
        elif self._mode == "length":
            take = data[: self._remaining]
            self._remaining -= len(take)
            self._body(take, t)
            if self._remaining <= 0:
                self._finish_body()
        else:
            self._body(data, t)

    # -- framing
    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        try:
            self._status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            self._done.set_exception(ResponseError("invalid_response"))
            return
        chunked, length = False, None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value:
                chunked = True
            elif name == b"content-length":
                length = int(value)
            elif name == b"connection" and value == b"close":
                self.keep_alive = False
        if chunked:
            self._mode = "chunked"
        elif length is not None:
            self._mode = "length"
            self._remaining = length
            if length == 0:
                self._finish_body()
        else:
            self._mode = "close"
            self.keep_alive = False

    def _chunked(self, data: bytes, t: float) -> None:
        pos, size = 0, len(data)
        while pos < size and not self._done.done():
            state = self._chunk_state
            if state == 1:
                take = min(self._remaining, size - pos)
                self._body(data[pos : pos + take], t)
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._chunk_state = 2
                continue
            newline = data.find(b"\n", pos)
            if newline < 0:
                self._line += data[pos:]
                return
            line = bytes(self._line + data[pos:newline]).rstrip(b"\r")
            self._line.clear()
            pos = newline + 1
            if state == 0:
                try:
                    self._remaining = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    self._done.set_exception(ResponseError("invalid_response"))
                    return
                self._chunk_state = 1 if self._remaining else 3
            elif state == 2:
                self._chunk_state = 0
            elif state == 3 and not line:  # end of trailers: response complete
                self._chunk_state = 0
                self._finish_body()

    def _body(self, data: bytes, t: float) -> None:
        if self._status != 200:
            return  # error bodies are read (to keep the connection usable) but not parsed
        for payload in self._sse.feed(data):
            self.events.append((t, payload))

    def _finish_body(self) -> None:
        if self._status == 200:
            t = self._clock()
            self.events.extend((t, p) for p in self._sse.close())
        self._done.set_result(self._status)


class RawSession:
    """Keep-alive connections to one host:port, reused when idle, opened when none is."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise ValueError("the raw transport speaks plain http; use --transport aiohttp for https")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()
        self._host_header = f"{self.host}:{self.port}"

    async def __aenter__(self) -> RawSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        self._all.clear()
        self._idle.clear()

    def _take_idle(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _acquire(self) -> _Conn:
        conn = self._take_idle()
        if conn is not None:
            return conn
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Conn, self.host, self.port)
        except OSError as exc:
            raise ResponseError("connect") from exc
        self._all.add(conn)
        return conn

    def _request_bytes(self, path: str, body: bytes) -> bytes:
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self._host_header}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        return head + body

    def _write(self, conn: _Conn, path: str, body: bytes) -> asyncio.Future:
        done = conn.start(asyncio.get_running_loop())
        assert conn.transport is not None
        conn.transport.write(self._request_bytes(path, body))
        return done

    def send_now(self, path: str, body: bytes, record: RequestRecord, timeout_s: float) -> asyncio.Future:
        """Start one streaming request in the caller's turn of the event loop; the returned task
        finishes it (fills `record`, never raises).

        On an idle keep-alive connection the request is written before this returns, so it leaves at
        the moment the open-loop dispatcher woke for it, not one loop turn later (behind every
        callback queued meanwhile) as it would from a new task. Without an idle connection the
        task connects first, as `stream` does."""
        conn = self._take_idle()
        if conn is None:
            return asyncio.ensure_future(self.stream(path, body, record, timeout_s))
        deadline = asyncio.get_running_loop().time() + timeout_s
        record.sent = time.perf_counter()
        done = self._write(conn, path, body)
        return asyncio.ensure_future(self._receive(conn, done, record, deadline))

    async def stream(self, path: str, body: bytes, record: RequestRecord, timeout_s: float) -> None:
        """Send one streaming request and fill `record` (raw events: see client.settle); never
        raises (errors go in record.error)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        record.sent = time.perf_counter()  # connecting, when needed, is the request's time
        try:
            async with asyncio.timeout_at(deadline):
                conn = await self._acquire()
        except ResponseError as exc:
            record.error, record.end = exc.kind, time.perf_counter()
            return
        except TimeoutError:
            record.error, record.end = "timeout", time.perf_counter()
            return
        done = self._write(conn, path, body)
        await self._receive(conn, done, record, deadline)

    async def _receive(
        self, conn: _Conn, done: asyncio.Future, record: RequestRecord, deadline: float
    ) -> None:
        clock = time.perf_counter
        try:
            async with asyncio.timeout_at(deadline):
                status = await done
        except ResponseError as exc:
            record.error, record.end = exc.kind, clock()
            self._drop(conn)
            return
        except TimeoutError:
            record.error, record.end = "timeout", clock()
            self._drop(conn)
            return
        if conn.keep_alive and not conn.closed:
            self._idle.append(conn)
        else:
            self._drop(conn)
        if status != 200:
            record.error, record.end = f"http_{status}", clock()
            return
        record.events = conn.events

    def _drop(self, conn: _Conn | None) -> None:
        if conn is None:
            return
        if conn.transport is not None:
            conn.transport.close()
        self._all.discard(conn)
