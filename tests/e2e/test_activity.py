"""The activity log against a real stack: a row for every call, read, and prompt, on both endpoints and eras."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpvisor.frontend.gate.activity import META_KEY
from tests.support.stack import Stack, echo_server, open_stack

READ = {"operation_type": "read"}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def rows(stack: Stack) -> list[dict[str, Any]]:
    """Every row of the log, oldest first, read from the frontend's file as an operator's tool would."""
    uri = (stack.data_dir / "state.sqlite").resolve().as_uri()
    db = sqlite3.connect(f"{uri}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in db.execute("SELECT * FROM calls ORDER BY id")]
    finally:
        db.close()


def request_id(result: Any) -> str:
    meta = result.meta or {}
    assert isinstance(meta.get(META_KEY), str) and meta[META_KEY], result
    return meta[META_KEY]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_every_call_read_and_prompt_gets_a_row_whose_id_the_client_was_given(tmp_path: Path, mode: str) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}, settings={"log_level": "debug"}) as stack:
        given: dict[str, str] = {}
        async with stack.client("/mcp/direct", mode=mode) as client:
            given["direct ok"] = request_id(await client.call_tool("echo:echo", {"text": "secret-ish"}))
            trace = {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
            given["traced"] = request_id(await client.call_tool("echo:echo", {"text": "t"}, meta=trace))
            failed = await client.call_tool("echo:fail", {"message": "no"})
            assert failed.is_error
            given["direct error"] = request_id(failed)
            given["read"] = request_id(await client.read_resource("test://readme"))
            given["prompt"] = request_id(await client.get_prompt("echo:greet", {"who": "Ada"}))
        async with stack.client("/mcp", mode=mode) as searcher:
            answer = await searcher.call_tool(
                "call_tool_read", {"name": "echo:echo", "args": {"text": "via search"}, "intent": READ}
            )
            assert not answer.is_error, answer
            given["search"] = request_id(answer)

        logged = {row["request_id"]: row for row in rows(stack)}
        assert set(given.values()) <= set(logged), (given, logged)
        ok = logged[given["direct ok"]]
        assert (ok["endpoint"], ok["kind"], ok["server"], ok["tool"], ok["variant"], ok["outcome"]) == (
            "/mcp/direct",
            "tool",
            "echo",
            "echo",
            "direct",
            "ok",
        )
        assert ok["result_bytes"] > len("secret-ish") and ok["duration_ms"] >= 0 and ok["time"] > 0
        assert ok["arguments"] is None and ok["result"] is None  # not stored unless the operator asks
        assert logged[given["direct error"]]["outcome"] == "error"
        traced = logged[given["traced"]]
        assert (traced["traceparent"], traced["tracestate"]) == (TRACEPARENT, "vendor=1")
        assert ok["traceparent"] == ""
        read = logged[given["read"]]
        assert (read["kind"], read["server"], read["tool"], read["outcome"]) == (
            "resource",
            "echo",
            "test://readme",
            "ok",
        )
        prompt = logged[given["prompt"]]
        assert (prompt["kind"], prompt["tool"], prompt["outcome"]) == ("prompt", "greet", "ok")
        assert prompt["result_bytes"] > 0
        search = logged[given["search"]]
        assert (search["endpoint"], search["variant"]) == ("/mcp", "call_tool_read")
        assert search["intent"] is not None and '"read"' in search["intent"]
        # The handshake names the client, on the SDK's sessions and the short path alike; a
        # 2026-07-28 client may leave it out.
        named = [logged[given[key]]["client"] for key in ("direct ok", "read", "prompt", "search")]
        if mode == "legacy":
            assert all(named), named

        # The worker's log lines for a call carry its request id.
        worker_log = stack.log("echo.worker.log")
        assert given["direct ok"] in worker_log and given["read"] in worker_log


async def test_ctl_activity_filters_by_server_and_time(tmp_path: Path) -> None:
    servers = {"echo": echo_server(), "two": echo_server("two")}
    async with open_stack(tmp_path, servers) as stack:
        async with stack.client("/mcp/direct") as client:
            for text in ("a", "b"):
                await client.call_tool("echo:echo", {"text": text})
            await client.call_tool("two:echo", {"text": "c"})

        code, result = await stack.actl("activity", "--server", "two")
        assert code == 0, result
        assert [(row["server"], row["tool"]) for row in result["rows"]] == [("two", "echo")]
        code, result = await stack.actl("activity", "--since", "10m", "-n", "2")
        assert code == 0, result
        assert [row["server"] for row in result["rows"]] == ["echo", "two"]  # the newest two, oldest first
        code, result = await stack.actl("activity", "--server", "echo")
        assert code == 0 and len(result["rows"]) == 2
        code, text = await stack.actl("activity", json_output=False)
        assert code == 0 and "two:echo" in text and "echo:echo" in text
        code, error = await stack.actl("activity", "--since", "yesterday")
        assert code == 2, error
        assert "--since takes a duration" in str(error)

        # -f prints the newest rows, then each new call as it is logged.
        command = [sys.executable, "-P", "-m", "mcpvisor.supervisor", "ctl", "-c", str(stack.config_path)]
        follower = subprocess.Popen(
            [*command, "--json", "activity", "-f", "--server", "two", "-n", "1"],
            stdout=subprocess.PIPE,
            env=stack.env,
            text=True,
        )
        try:
            assert follower.stdout is not None
            first = json.loads(await trio.to_thread.run_sync(follower.stdout.readline))
            assert (first["server"], first["tool"]) == ("two", "echo")
            async with stack.client("/mcp/direct") as client:
                await client.call_tool("echo:echo", {"text": "not followed"})
                followed = await client.call_tool("two:add", {"a": 1, "b": 2})
            with trio.fail_after(10):
                line = json.loads(await trio.to_thread.run_sync(follower.stdout.readline))
            assert (line["server"], line["tool"]) == ("two", "add")
            assert line["request_id"] == followed.meta[META_KEY]
        finally:
            follower.terminate()
            code = follower.wait(timeout=10)
            follower.stdout.close()
        assert code == 0


async def test_arguments_are_stored_redacted_when_asked_and_old_rows_are_pruned(tmp_path: Path) -> None:
    settings = {"activity_record_arguments": True, "activity_max_rows": 3}
    async with open_stack(tmp_path, {"echo": echo_server()}, settings=settings) as stack:
        token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
        async with stack.client("/mcp/direct") as client:
            for n in range(5):
                await client.call_tool("echo:echo", {"text": f"call {n} {token}"})
        stored = rows(stack)
        assert len(stored) == 5  # pruned on start and then periodically, not on every call
        assert all(row["arguments"] and token not in row["arguments"] for row in stored), stored
        assert "call 4" in stored[-1]["arguments"] and "call 4" in stored[-1]["result"]
        assert token not in stored[-1]["result"]

        # A new frontend prunes at once: the newest `activity_max_rows` stay.
        code, result = await stack.actl("restart", "frontend")
        assert code == 0, result
        await stack.wait_ready(["echo"])
        # (The restart itself is an operator's change, which the new frontend may record after pruning.)
        kept = [row for row in rows(stack) if row["kind"] != "operator"]
        assert [row["id"] for row in kept] == [row["id"] for row in stored[-3:]]
