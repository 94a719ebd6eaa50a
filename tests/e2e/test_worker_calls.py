"""A call's life in the worker: its deadline, renewed by progress, and the frontend's cancel, told
apart from it."""

from __future__ import annotations

from pathlib import Path

import trio
from mcp.shared.exceptions import MCPError

from tests.support.stack import echo_server, open_stack


async def test_progress_keeps_a_call_alive_past_its_timeout_and_silence_ends_it(tmp_path: Path) -> None:
    servers = {"echo": echo_server(policy={"call_timeout": 1.5})}
    async with open_stack(tmp_path, servers) as stack, stack.client(mode="legacy") as client:
        steps: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            steps.append(value)

        # Eight reports 0.3 s apart: the call outlives its timeout, but never goes quiet that long.
        result = await client.call_tool(
            "echo:progress_stamps", {"count": 8, "interval": 0.3}, progress_callback=on_progress
        )
        assert not result.is_error, result
        assert steps == [float(i) for i in range(1, 9)]
        # Without progress the same timeout ends a call, and says it was the timeout.
        with trio.fail_after(10):
            try:
                await client.call_tool("echo:slow", {"seconds": 30})
            except MCPError as exc:
                assert "no answer from server 'echo' within 1.5s" in str(exc)
            else:
                raise AssertionError("a silent call outlived its timeout")


async def test_calls_short_and_too_long_for_one_pipe_write_each_get_their_own_answer(tmp_path: Path) -> None:
    # A short call goes out as one write with no task waiting for it; one longer than a pipe takes
    # whole goes by a task of its own. Mixed and concurrent, each answer must reach its caller.
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack, stack.client(mode="legacy") as client:
        texts = [f"{i}:" + "x" * (20_000 if i % 2 else 10) for i in range(8)]
        answers: dict[int, str] = {}

        async def one(index: int) -> None:
            result = await client.call_tool("echo:echo", {"text": texts[index]})
            assert not result.is_error, result
            assert result.structured_content is not None
            answers[index] = result.structured_content["result"]

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for index in range(len(texts)):
                    nursery.start_soon(one, index)
        assert answers == dict(enumerate(texts))
