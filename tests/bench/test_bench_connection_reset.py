"""A server that closes a connection under the client (an idle keep-alive timing out just as the
client reuses it) must not fail the bench's set-up probes: seen on a busy node against uvicorn."""

from __future__ import annotations

import asyncio

from accelbench.workers.bench.client import make_session, probe

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def _probe_a_server_that_drops_the_first_connection() -> tuple[tuple[int, str], int]:
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        if connections == 1:  # closed before answering, as a server whose idle timeout just fired
            await reader.readuntil(b"\r\n\r\n")
            writer.close()
            return
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)  # the JSON body: {}
        writer.write(ANSWER)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, make_session(pool_size=1) as session:
        answer = await probe(session, f"http://127.0.0.1:{port}/v1/completions", {})
    return answer, connections


def test_a_probe_whose_connection_the_server_closed_is_sent_again_once() -> None:
    answer, connections = asyncio.run(_probe_a_server_that_drops_the_first_connection())
    assert answer == (200, "{}") and connections == 2
