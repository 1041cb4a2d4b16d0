"""SSE framing and OpenAI event meaning: the edge cases that break load generators."""

from __future__ import annotations

import json

from accelbench.workers.bench.client import apply_events, settle
from accelbench.workers.bench.openai import chat_body, completions_body, parse_event
from accelbench.workers.bench.records import RequestRecord
from accelbench.workers.bench.sse import SseParser


def _feed_all(pieces: list[bytes]) -> list[bytes]:
    parser = SseParser()
    out: list[bytes] = []
    for piece in pieces:
        out += parser.feed(piece)
    return out + parser.close()


STREAM = (
    b'data: {"choices":[{"text":"a"}]}\n\n'
    b": keep-alive comment\n\n"
    b'event: message\ndata: {"choices":[{"text":"bc"}]}\n\n'
    b"data: [DONE]\n\n"
)


def test_whole_stream() -> None:
    assert _feed_all([STREAM]) == [b'{"choices":[{"text":"a"}]}', b'{"choices":[{"text":"bc"}]}', b"[DONE]"]


def test_every_split_point_gives_the_same_events() -> None:
    expected = _feed_all([STREAM])
    for cut in range(1, len(STREAM)):
        assert _feed_all([STREAM[:cut], STREAM[cut:]]) == expected, cut


def test_byte_by_byte_and_crlf() -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    assert _feed_all([bytes([b]) for b in crlf]) == _feed_all([STREAM])


def test_event_completed_by_a_later_read_is_returned_then() -> None:
    parser = SseParser()
    assert parser.feed(b'data: {"x"') == []
    assert parser.feed(b":1}\n") == []  # line done, event not yet (no blank line)
    assert parser.feed(b"\n") == [b'{"x":1}']


def test_multiline_data_and_missing_space() -> None:
    assert _feed_all([b"data:one\ndata: two\n\n"]) == [b"one\ntwo"]


def test_final_event_without_blank_line() -> None:
    assert _feed_all([b'data: {"a":1}\n\ndata: [DONE]']) == [b'{"a":1}', b"[DONE]"]


def test_utf8_split_across_reads() -> None:
    payload = json.dumps({"choices": [{"text": "é€"}]}, ensure_ascii=False).encode()
    raw = b"data: " + payload + b"\n\n"
    cut = raw.index("€".encode()) + 1  # in the middle of a multi-byte character
    [event] = _feed_all([raw[:cut], raw[cut:]])
    assert parse_event(event).text == "é€"


def test_parse_completions_chat_usage_and_errors() -> None:
    assert parse_event(b'{"choices":[{"text":"hi"}]}').text == "hi"
    chat = parse_event(b'{"choices":[{"delta":{"content":"yo"}}]}')
    assert chat.text == "yo" and chat.has_token
    role_only = parse_event(b'{"choices":[{"delta":{"role":"assistant"}}]}')
    assert not role_only.has_token
    usage = parse_event(b'{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9}}')
    assert (usage.prompt_tokens, usage.completion_tokens, usage.has_token) == (7, 9, False)
    assert parse_event(b"[DONE]").done
    cached = b'{"choices":[],"usage":{"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":5}}}'
    assert parse_event(cached).cached_prompt_tokens == 5
    assert parse_event(b'{"choices":[],"usage":{"prompt_tokens_details":null}}').cached_prompt_tokens is None
    assert parse_event(b"not json").error == "invalid_json"
    assert parse_event(b'{"error":{"message":"overloaded"}}').error.startswith("server_error")
    # Exact per-chunk token counts, when the server provides them.
    assert parse_event(b'{"choices":[{"text":"ab","logprobs":{"tokens":["a","b"]}}]}').tokens == 2
    assert (
        parse_event(b'{"choices":[{"delta":{"content":"x"},"logprobs":{"content":[{},{},{}]}}]}').tokens == 3
    )
    held_back = parse_event(b'{"choices":[{"text":"","token_ids":[17]}]}')
    assert held_back.has_token and held_back.tokens == 1  # split multi-byte char: token, no text yet


def test_apply_events_times_tokens_and_usage() -> None:
    record = RequestRecord(scheduled=0.0, sent=0.0)
    events = [
        (0.1, b'{"choices":[{"delta":{"role":"assistant"}}]}'),
        (0.2, b'{"choices":[{"text":"a"}]}'),
        (0.3, b'{"choices":[{"text":"bcd"}]}'),
        (0.3, b'{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4}}'),
        (0.31, b"[DONE]"),
    ]
    apply_events(record, events)
    assert record.ok and record.chunk_times == [0.2, 0.3]
    assert (record.server_output_tokens, record.server_prompt_tokens, record.end) == (4, 5, 0.31)


def test_request_bodies() -> None:
    body = completions_body("m", "p", 16, True)
    assert (
        body["stream_options"] == {"include_usage": True} and body["ignore_eos"] and body["min_tokens"] == 16
    )
    chat = chat_body("m", "p", 16, False)
    assert chat["messages"] == [{"role": "user", "content": "p"}] and "prompt" not in chat
    assert "ignore_eos" not in chat


def test_settle_parses_once_and_leaves_errors_alone() -> None:
    record = RequestRecord(scheduled=0.0, sent=0.0)
    record.events = [(0.2, b'{"choices":[{"text":"a"}]}'), (0.3, b"[DONE]")]
    assert settle(record) is record and record.ok and record.events == []
    assert settle(record).chunk_times == [0.2]  # a second call changes nothing
    failed = RequestRecord(scheduled=0.0, sent=0.0, error="timeout", end=1.0)
    assert settle(failed).error == "timeout"
    empty = RequestRecord(scheduled=0.0, sent=0.0)
    assert settle(empty).error == "empty_stream"  # a stream that ended without one event
