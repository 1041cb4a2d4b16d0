"""A zero-latency OpenAI-compatible streaming server for measuring load generators, not servers.

Raw asyncio Protocol, HTTP/1.1 keep-alive, chunked transfer encoding. Every answer is produced at
once: `max_tokens` SSE events of one token each (pre-encoded), a usage event and [DONE], written
without any delay, so whatever latency a client reports is its own (plus loopback). The bench
client calibrates itself against it before a run (calibration.py); benchmarks/client_overhead
measures clients against it. Runs in its own process(es):

    python -m accelbench.workers.bench.nullserver --port 8150 [--processes 4]

`--port 0` takes a port the kernel picks. Either way the first line on stdout, `listening <port>`,
is written once the port listens, so a parent waits for that line instead of polling a port it
picked in advance (which another process may take before the server binds it).

One process answers ~4,600 req/s of 64-token streams; with --processes N, N processes listen on
the port with SO_REUSEPORT and the kernel spreads connections over them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import sys

_TOKEN = b'data: {"id":"z","object":"text_completion","model":"zero","choices":[{"index":0,"text":" a"}]}\n\n'
_CHAT_TOKEN = (
    b'data: {"id":"z","object":"chat.completion.chunk","model":"zero",'
    b'"choices":[{"index":0,"delta":{"content":" a"}}]}\n\n'
)
_MAX = re.compile(rb'"max(?:_completion)?_tokens"\s*:\s*(\d+)')
_STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_MODELS = json.dumps({"object": "list", "data": [{"id": "zero", "object": "model"}]}).encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Http(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            m = re.search(rb"(?i)content-length:\s*(\d+)", head)
            length = int(m.group(1)) if m else 0
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self.respond(head.split(b" ", 2)[1], body)

    def respond(self, path: bytes, body: bytes) -> None:
        if path.startswith(b"/v1/models") or path.startswith(b"/health"):
            self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(_MODELS), _MODELS))  # fmt: skip
            return
        m = _MAX.search(body)
        n = int(m.group(1)) if m else 16
        token = _CHAT_TOKEN if path.endswith(b"chat/completions") else _TOKEN
        usage = b'data: {"id":"z","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d}}\n\n' % n
        self.t.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for _ in range(n):
            self.t.write(_chunk(token))
        self.t.write(_chunk(usage) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


LISTENING = "listening"  # the first stdout line: `listening <port>`


def listen(port: int, reuse_port: bool) -> socket.socket:
    """A listening socket on 127.0.0.1 (`port` 0: one the kernel picks); with `reuse_port`, other
    processes may listen on the same port and the kernel spreads connections over them."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(4096)
    return sock


async def serve(sock: socket.socket) -> None:
    server = await asyncio.get_running_loop().create_server(Http, sock=sock)
    async with server:
        await server.serve_forever()


def _die_with_parent() -> None:
    """Linux: a forked server process gets SIGTERM when the first one ends, however it ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m accelbench.workers.bench.nullserver")
    p.add_argument("--port", type=int, default=8150, help="0: a free port the kernel picks")
    p.add_argument("--processes", type=int, default=1, help="processes sharing the port (SO_REUSEPORT)")
    args = p.parse_args()
    many = args.processes > 1
    first = listen(args.port, reuse_port=many)
    port = first.getsockname()[1]
    children = []
    for _ in range(args.processes - 1):  # forked before any event loop exists
        sock = listen(port, reuse_port=True)  # bound before the port is announced
        pid = os.fork()
        if pid == 0:
            _die_with_parent()
            first.close()
            asyncio.run(serve(sock))
            os._exit(0)
        sock.close()
        children.append(pid)

    def stop(signum: int, frame: object) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"{LISTENING} {port}", flush=True)
    try:
        asyncio.run(serve(first))
    except KeyboardInterrupt:
        stop(signal.SIGINT, None)


if __name__ == "__main__":
    main()
