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

from mcpvisor.wire.logs import RotatingFile
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
async def _answering(tmp_path: Path) -> AsyncIterator[StdioChannel]:
    """The answering script as an upstream; no SDK session, so its streams are closed at once."""
    script = tmp_path / "answering.py"
    script.write_text(ANSWERING)
    stderr = RotatingFile(tmp_path / "stderr.log")
    try:
        async with open_stdio_upstream(sys.executable, [str(script)], child_environment({}), None, stderr) as (
            read_stream,
            write_stream,
            channel,
        ):
            read_stream.close()
            write_stream.close()
            yield channel
    finally:
        stderr.close()


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
