"""An upstream's stdout cut into lines: any chunking, large lines in linear time, oversized ones dropped."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from mcpvisor.workers.lines import LineReader, Oversized


def feed_all(reader: LineReader, chunks: list[bytes]) -> list[bytes | Oversized]:
    out: list[bytes | Oversized] = []
    for chunk in chunks:
        out += reader.feed(chunk)
    return out


def cut(data: bytes, sizes: list[int]) -> list[bytes]:
    chunks, at = [], 0
    for size in sizes:
        chunks.append(data[at : at + size])
        at += size
    return [*chunks, data[at:]]


@given(
    st.lists(st.binary(max_size=50).filter(lambda b: b"\n" not in b), max_size=10),
    st.lists(st.integers(min_value=1, max_value=40), max_size=30),
)
def test_any_chunking_gives_back_the_same_lines(lines: list[bytes], sizes: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    assert feed_all(LineReader(limit=1000), cut(data, sizes)) == lines


def test_an_unfinished_line_waits_for_its_end() -> None:
    reader = LineReader(limit=1000)
    assert reader.feed(b'{"id":1') == []
    assert reader.pending == 7
    assert reader.feed(b"}\n{") == [b'{"id":1}']
    assert reader.pending == 1


def test_a_line_at_the_limit_is_kept_and_one_past_it_is_dropped_with_its_size() -> None:
    reader = LineReader(limit=100)
    at_limit = b'{"jsonrpc":"2.0","id":3,"result":"' + b"x" * (100 - 36) + b'"}'
    assert len(at_limit) == 100
    assert reader.feed(at_limit + b"\n") == [at_limit]
    over = b'{"jsonrpc":"2.0","id":4,"result":"' + b"x" * (101 - 36) + b'"}'
    assert reader.feed(over + b"\n") == [Oversized(101, 4)]


def test_an_oversized_line_holds_only_its_ends_while_it_streams() -> None:
    reader = LineReader(limit=1024 * 1024)
    reader.feed(b'{"jsonrpc":"2.0","id":"mcpvisor-9","result":{"text":"')
    for _ in range(64):
        reader.feed(b"x" * 65536)
        assert sum(len(part) for part in reader._parts) <= 1024 * 1024 + 65536
    assert reader.feed(b'"}}\n') == [Oversized(reader_size(64), "mcpvisor-9")]


def reader_size(pieces: int) -> int:
    return len(b'{"jsonrpc":"2.0","id":"mcpvisor-9","result":{"text":"') + pieces * 65536 + len(b'"}}')


def test_the_id_of_an_oversized_answer_is_found_at_its_end_too() -> None:
    """The TypeScript SDK writes `id` after `result`."""
    reader = LineReader(limit=50)
    answer = json.dumps({"result": {"text": "y" * 200}, "jsonrpc": "2.0", "id": 12}).encode()
    assert feed_all(reader, cut(answer + b"\n", [10, 100, 7])) == [Oversized(len(answer), 12)]


def test_an_id_inside_the_result_is_not_taken_for_the_answers() -> None:
    reader = LineReader(limit=50)
    answer = json.dumps({"jsonrpc": "2.0", "result": {"id": 99, "text": "z" * 200}}).encode()
    assert reader.feed(answer + b"\n") == [Oversized(len(answer), None)]
