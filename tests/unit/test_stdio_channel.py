"""The stdio channel's pass-through path against a real child process: whole lines both ways, however
large or concurrent, and a clear error once the child is gone."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpvisor.runtime.logs import RotatingFile
from mcpvisor.workers.stdio import RawError, StdioChannel, child_environment, open_stdio_upstream

# Answers each request with the size of its params and their first and last characters, so a
# line that arrived cut or mixed with another shows in the answer (or breaks the JSON).
ANSWERING = """
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "quit":
        break
    if "id" in msg:
        text = msg["params"]["text"]
        result = {"size": len(text), "ends": text[:1] + text[-1:], "pad": text}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\\n")
        sys.stdout.flush()
"""


async def _call(channel: StdioChannel, text: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(await channel.request("tools/call", json.dumps({"text": text}).encode()))
    return answer


@asynccontextmanager
async def _spawned(tmp_path: Path, source: str) -> AsyncIterator[Any]:
    """A script as an upstream: the SDK session's two streams and the pass-through channel."""
    script = tmp_path / "upstream.py"
    script.write_text(source)
    stderr = RotatingFile(tmp_path / "stderr.log")
    try:
        async with open_stdio_upstream(sys.executable, [str(script)], child_environment({}), None, stderr) as opened:
            yield opened
    finally:
        stderr.close()


@asynccontextmanager
async def _upstream(tmp_path: Path, source: str) -> AsyncIterator[StdioChannel]:
    """A script as an upstream; no SDK session, so its streams are closed at once."""
    async with _spawned(tmp_path, source) as (read_stream, write_stream, channel):
        read_stream.close()
        write_stream.close()
        yield channel


@asynccontextmanager
async def _answering(tmp_path: Path) -> AsyncIterator[StdioChannel]:
    async with _upstream(tmp_path, ANSWERING) as channel:
        yield channel


async def test_large_concurrent_requests_go_out_and_come_back_as_whole_lines(tmp_path: Path) -> None:
    async with _answering(tmp_path) as channel:
        # Each line is far larger than a pipe holds: the writes block part way, and the others wait.
        texts = [letter + "x" * (300_000 + i) + letter for i, letter in enumerate("abcdef")]
        answers: dict[int, dict[str, Any]] = {}

        async def one(index: int) -> None:
            answers[index] = await _call(channel, texts[index])

        async with trio.open_nursery() as nursery:
            for index in range(len(texts)):
                nursery.start_soon(one, index)
        for index, text in enumerate(texts):
            assert answers[index]["size"] == len(text)
            assert answers[index]["ends"] == text[0] * 2
            assert answers[index]["pad"] == text
        # Small calls after the large ones still take the pipe at once.
        for i in range(20):
            assert (await _call(channel, f"small {i}"))["pad"] == f"small {i}"


async def test_a_line_that_is_not_json_rpc_is_skipped_and_never_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What an upstream writes may be a user's data: a line that is not JSON-RPC is counted in the log, not quoted."""
    noisy = 'import sys\nsys.stdout.write("a stray print: sk-stdio-secret-42\\n")\n' + ANSWERING
    async with _spawned(tmp_path, noisy) as (read_stream, write_stream, channel):
        seen: list[object] = []

        async def session() -> None:  # the SDK session's side: it is handed what is not a pass-through answer
            async for message in read_stream:
                seen.append(message)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(session)
            assert (await _call(channel, "hello"))["pad"] == "hello"
            nursery.cancel_scope.cancel()
        assert len(seen) == 1 and isinstance(seen[0], Exception)
        read_stream.close()
        write_stream.close()
    assert "not JSON-RPC" in caplog.text and "sk-stdio-secret-42" not in caplog.text


async def test_a_request_to_a_child_that_has_gone_fails_at_once(tmp_path: Path) -> None:
    async with _answering(tmp_path) as channel:
        assert (await _call(channel, "hello"))["pad"] == "hello"
        await channel.write_line(b'{"jsonrpc":"2.0","method":"quit"}\n')
        await channel.process.wait()
        with trio.fail_after(10):
            while not channel.closed:  # the reader sees the end of the child's stdout
                await trio.sleep(0.01)
        with pytest.raises((RawError, trio.BrokenResourceError)):
            await _call(channel, "anyone there?")
        # Writing to the dead child's pipe says so as the stream would, never as a bare OSError.
        with pytest.raises(trio.BrokenResourceError):
            await channel.write_line(b'{"jsonrpc":"2.0","method":"ping"}\n')


# Holds a request whose text is "hold" until told it was cancelled, then says so (as a log
# notification) and answers it anyway, late; answers every other request at once.
HOLDING = """
import json, sys
held = None
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "notifications/cancelled":
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                     "params": {"cancelled": msg["params"]["requestId"]}}) + "\\n")
        if held is not None:
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": held, "result": {"late": True}}) + "\\n")
    elif msg["params"]["text"] == "hold":
        held = msg["id"]
    else:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"pad": msg["params"]["text"]}}) + "\\n")
    sys.stdout.flush()
"""


@asynccontextmanager
async def _holding(tmp_path: Path) -> AsyncIterator[tuple[StdioChannel, list[bytes]]]:
    """The holding script as an upstream, and the params of the notifications it sends."""
    notes: list[bytes] = []

    async def on_notification(method: str, params: bytes) -> None:
        notes.append(params)
        await trio.lowlevel.checkpoint()

    async with _upstream(tmp_path, HOLDING) as channel:
        channel.on_notification = on_notification
        yield channel, notes


async def test_a_request_sent_without_waiting_gets_its_outcome_from_the_reader(tmp_path: Path) -> None:
    async with _holding(tmp_path) as (channel, _notes):
        outcomes: list[bytes | RawError] = []
        params = json.dumps({"text": "hi"}).encode()
        assert channel.send_request("tools/call", params, outcomes.append) is not None
        with trio.fail_after(10):
            while not outcomes:
                await trio.sleep(0.01)
        assert outcomes == [b'{"pad": "hi"}']
        # A line a pipe might take only in part is not sent this way: the caller uses request().
        long = json.dumps({"text": "x" * 10_000}).encode()
        assert channel.send_request("tools/call", long, outcomes.append) is None
        assert json.loads(await channel.request("tools/call", long))["pad"] == "x" * 10_000
        assert len(outcomes) == 1


async def test_an_abandoned_request_is_cancelled_upstream_and_its_late_answer_dropped(tmp_path: Path) -> None:
    async with _holding(tmp_path) as (channel, notes):
        outcomes: list[bytes | RawError] = []
        request_id = channel.send_request("tools/call", json.dumps({"text": "hold"}).encode(), outcomes.append)
        assert request_id is not None
        channel.abandon(request_id)
        channel.abandon(request_id)  # a second time does nothing
        with trio.fail_after(10):
            while not notes:
                await trio.sleep(0.01)
        assert json.loads(notes[0]) == {"cancelled": request_id}
        # The late answer came after the note: the channel is still in step, and dropped it.
        assert json.loads(await channel.request("tools/call", json.dumps({"text": "next"}).encode())) == {"pad": "next"}
        assert outcomes == []


async def test_a_request_sent_without_waiting_fails_when_the_child_goes(tmp_path: Path) -> None:
    async with _holding(tmp_path) as (channel, _notes):
        outcomes: list[bytes | RawError] = []
        assert channel.send_request("tools/call", json.dumps({"text": "hold"}).encode(), outcomes.append)
        assert channel.process.stdin is not None
        await channel.process.stdin.aclose()  # the script's loop ends, and so does the child
        with trio.fail_after(10):
            while not outcomes:
                await trio.sleep(0.01)
        assert isinstance(outcomes[0], RawError) and outcomes[0].code == -32000
        assert channel.send_request("tools/call", b'{"text":"late"}', outcomes.append) is None
