"""Server-sent events, parsed incrementally from the bytes as they arrive.

Network reads do not respect event boundaries: one read may hold half an event, several events,
or end between the `\\r` and `\\n` of a line ending. The parser keeps the unfinished tail and hands
back only complete events, each stamped with the time of the read that completed it (an event is
not visible to a user before its last byte arrives).

Only `data:` lines matter for OpenAI-compatible streams; comments (`: ping`), `event:`, `id:` and
`retry:` lines are skipped. Multi-line data is joined with `\\n` as the SSE spec says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DONE = b"[DONE]"


@dataclass
class SseParser:
    """Feed raw bytes; get back the payloads of the events that the bytes completed."""

    _buffer: bytearray = field(default_factory=bytearray)
    _data: list[bytes] = field(default_factory=list)

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        events: list[bytes] = []
        start = 0
        buf = self._buffer
        while True:
            newline = buf.find(b"\n", start)
            if newline < 0:
                break
            line = bytes(buf[start:newline])
            start = newline + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            self._line(line, events)
        # A lone trailing `\r` may be the first half of `\r\n`: keep it with the tail.
        del buf[:start]
        return events

    def close(self) -> list[bytes]:
        """End of stream: a final event without its blank line still counts (servers do this)."""
        events: list[bytes] = []
        if self._buffer:
            line = bytes(self._buffer).rstrip(b"\r")
            self._buffer.clear()
            self._line(line, events)
        if self._data:
            events.append(b"\n".join(self._data))
            self._data = []
        return events

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if not line:
            if self._data:
                events.append(b"\n".join(self._data))
                self._data = []
            return
        if line.startswith(b"data:"):
            value = line[5:]
            if value.startswith(b" "):
                value = value[1:]
            self._data.append(value)
        # Comments, event:, id:, retry: carry nothing we measure.
