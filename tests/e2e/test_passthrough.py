"""Everything MCP can say passes through mcpvisor: progress, cancellation, logs, sampling,
elicitation, subscriptions, pagination, and clients of every protocol era."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from tests.support.peers import everything_stdio_server
from tests.support.stack import echo_server, open_stack


async def test_progress_reaches_the_calling_client_only_and_in_order(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"ev": everything_stdio_server()}) as stack:
        seen_by_other: list[Any] = []

        async def other_handler(message: Any) -> None:
            if isinstance(message, types.ServerNotification) and message.method == "notifications/progress":
                seen_by_other.append(message)

        async with (
            stack.client(mode="legacy") as caller,
            stack.client(mode="legacy", message_handler=other_handler) as other,
        ):
            await other.list_tools()
            progress: list[tuple[float, float | None]] = []

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append((value, total))

            result = await caller.call_tool(
                "ev:trigger-long-running-operation", {"duration": 1, "steps": 5}, progress_callback=on_progress
            )
            assert "completed" in result.content[0].text
            assert progress == [(float(i), 5.0) for i in range(1, 6)]
        assert seen_by_other == []
        # A 2026-07-28 client gets its progress too.
        async with stack.client() as modern:
            progress = []

            async def modern_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append((value, total))

            await modern.call_tool(
                "ev:trigger-long-running-operation", {"duration": 1, "steps": 3}, progress_callback=modern_progress
            )
            assert progress == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)]
        # Through the search-first endpoint's call_tool_* too.
        async with stack.client("/mcp", mode="legacy") as searcher:
            progress = []
            result = await searcher.call_tool(
                "call_tool_write",
                {
                    "name": "ev:trigger-long-running-operation",
                    "args": {"duration": 1, "steps": 2},
                    "intent": {"operation_type": "write"},
                },
                progress_callback=modern_progress,
            )
            assert not result.is_error, result
            assert progress == [(1.0, 2.0), (2.0, 2.0)]


async def test_cancelling_a_call_stops_it_upstream_and_frees_its_slot(tmp_path: Path) -> None:
    servers = {"echo": echo_server(policy={"max_inflight": 1})}
    async with open_stack(tmp_path, servers) as stack, stack.client(mode="legacy") as client:
        marker = tmp_path / "finished"
        started = trio.current_time()
        with trio.move_on_after(0.7) as scope:
            await client.call_tool("echo:slow_touch", {"path": str(marker), "seconds": 4})
        assert scope.cancelled_caught
        # The only slot is freed once the cancellation is in, long before the slow call would have
        # ended. The cancel notice and the next call are separate POSTs that the server may take
        # in either order, so a call may still be refused as busy for a moment.
        with trio.fail_after(2.5):
            while True:
                try:
                    result = await client.call_tool("echo:echo", {"text": "next"})
                    break
                except MCPError as exc:
                    assert "calls in flight" in exc.error.message, exc.error.message
                    await trio.sleep(0.05)
        assert result.content[0].text == "next"
        await trio.sleep_until(started + 4.5)
        assert not marker.exists(), "the upstream kept running a cancelled call"


async def test_a_2026_client_answers_an_upstream_question_over_rounds(tmp_path: Path) -> None:
    """The upstream asks mid-call; a 2026-07-28 client gets input_required, then calls again with the answer."""

    async def elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("this test answers by hand")

    teal = types.ElicitResult(action="accept", content={"color": "teal"})
    servers = {"ev": everything_stdio_server()}
    async with (
        open_stack(tmp_path, servers) as stack,
        stack.client(mode="auto", elicitation_callback=elicitation) as client,
    ):
        session = client.session
        tool = "ev:trigger-elicitation-request"
        first = await session.call_tool(tool, {}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult), first
        assert first.input_requests is not None and first.request_state
        ((key, request),) = first.input_requests.items()
        assert request.method == "elicitation/create"
        assert request.params.requested_schema["properties"]  # the upstream's own question

        # A tampered state is refused, and the upstream keeps waiting for the real one.
        with pytest.raises(MCPError, match="requestState"):
            await session.call_tool(
                tool, {}, input_responses={key: teal}, request_state=first.request_state[:-2] + "xx"
            )
        final = await session.call_tool(
            tool, {}, input_responses={key: teal}, request_state=first.request_state, allow_input_required=True
        )
        assert isinstance(final, types.CallToolResult), final
        assert any("teal" in getattr(block, "text", "") for block in final.content)
        # A state is good for the one call it continued.
        with pytest.raises(MCPError, match="requestState"):
            await session.call_tool(tool, {}, input_responses={key: teal}, request_state=first.request_state)


async def test_sampling_and_elicitation_round_trip_to_the_calling_client(tmp_path: Path) -> None:
    asked: list[str] = []

    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append("sampling")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="forty-two"), model="test-model"
        )

    async def elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append("elicitation")
        return types.ElicitResult(action="accept", content={"color": "teal"})

    async with open_stack(tmp_path, {"ev": everything_stdio_server()}) as stack:
        async with stack.client(mode="legacy", sampling_callback=sampling, elicitation_callback=elicitation) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"ev:trigger-sampling-request", "ev:trigger-elicitation-request"} <= names
            sampled = await client.call_tool("ev:trigger-sampling-request", {"prompt": "the answer?", "maxTokens": 20})
            assert "forty-two" in sampled.content[0].text
            elicited = await client.call_tool("ev:trigger-elicitation-request", {})
            assert any("teal" in block.text for block in elicited.content)
            assert asked == ["sampling", "elicitation"]
        # A 2026-07-28 client is asked over rounds: input_required, then a second call with the answers.
        async with stack.client(mode="auto", sampling_callback=sampling, elicitation_callback=elicitation) as client:
            sampled = await client.call_tool("ev:trigger-sampling-request", {"prompt": "the answer?", "maxTokens": 20})
            assert "forty-two" in sampled.content[0].text
            elicited = await client.call_tool("ev:trigger-elicitation-request", {})
            assert any("teal" in block.text for block in elicited.content)
            assert asked == ["sampling", "elicitation"] * 2
        # ... and through the search-first endpoint's call_tool_* the same way.
        async with stack.client("/mcp", mode="auto", elicitation_callback=elicitation) as searcher:
            elicited = await searcher.call_tool(
                "call_tool_read",
                {"name": "ev:trigger-elicitation-request", "args": {}, "intent": {"operation_type": "read"}},
            )
            assert not elicited.is_error, elicited
            assert any("teal" in block.text for block in elicited.content)
            assert asked == ["sampling", "elicitation"] * 2 + ["elicitation"]
        # A client without the capability, in either era, gets a clear answer, not a hang.
        for mode in ("legacy", "auto"):
            async with stack.client(mode=mode) as client:
                with trio.fail_after(10):
                    result = await client.call_tool("ev:trigger-sampling-request", {"prompt": "x", "maxTokens": 5})
                text = " ".join(getattr(block, "text", "") for block in result.content)
                assert result.is_error or "error" in text.lower(), text
                assert "sampling" in text.lower() or "capability" in text.lower() or "2026-07-28" in text, text


async def test_upstream_logs_reach_clients_at_their_level_tagged_with_the_server(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        logs: dict[str, list[types.LoggingMessageNotificationParams]] = {"warning": [], "debug": [], "none": []}

        def collector(name: str) -> Any:
            async def on_log(params: types.LoggingMessageNotificationParams) -> None:
                logs[name].append(params)

            return on_log

        async with (
            stack.client(mode="legacy", logging_callback=collector("warning")) as picky,
            stack.client(mode="legacy", logging_callback=collector("debug")) as chatty,
            stack.client(mode="legacy", logging_callback=collector("none")) as silent,
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)  # logging/setLevel is the handshake era's
                await picky.set_logging_level("warning")
                await chatty.set_logging_level("debug")
            await silent.list_tools()
            assert (await picky.call_tool("echo:log_levels", {})).content[0].text == "logged"
            with trio.fail_after(10):
                while len(logs["warning"]) < 2 or len(logs["debug"]) < 4:
                    await trio.sleep(0.05)
            await trio.sleep(0.3)
        assert [entry.level for entry in logs["warning"]] == ["warning", "error"]
        assert [entry.level for entry in logs["debug"]] == ["debug", "info", "warning", "error"]
        assert logs["none"] == []  # never asked for logs
        assert {entry.logger for entry in logs["debug"]} == {"echo:demo"}
        assert logs["warning"][0].data == "a warning line"


async def test_resource_updates_fan_out_to_each_uris_subscribers_only(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"ev": everything_stdio_server()}) as stack:
        updates: dict[str, list[str]] = {"a": [], "b": []}

        def collector(name: str) -> Any:
            async def handler(message: Any) -> None:
                if (
                    isinstance(message, types.ServerNotification)
                    and message.method == "notifications/resources/updated"
                ):
                    updates[name].append(str(message.params.uri))

            return handler

        async with (
            stack.client(mode="legacy", message_handler=collector("a")) as a,
            stack.client(mode="legacy", message_handler=collector("b")) as b,
        ):
            resources = [str(r.uri) for r in (await a.list_resources()).resources]
            first, second = resources[0], resources[1]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)  # the handshake era's way to subscribe
                await a.subscribe_resource(first)
                await b.subscribe_resource(second)
            await a.call_tool("ev:toggle-subscriber-updates", {})
            with trio.fail_after(20):
                while not (updates["a"] and updates["b"]):
                    await trio.sleep(0.1)
            await a.call_tool("ev:toggle-subscriber-updates", {})
        assert set(updates["a"]) == {first}
        assert set(updates["b"]) == {second}


async def test_lists_are_paged_with_cursors_a_client_cannot_forge(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"ev": everything_stdio_server()}, settings={"page_size": 4}) as stack:
        for mode in ("legacy", "auto"):
            async with stack.client(mode=mode) as client:
                names: list[str] = []
                cursor = None
                pages = 0
                while True:
                    page = await client.session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
                    assert len(page.tools) <= 4
                    names += [t.name for t in page.tools]
                    pages += 1
                    cursor = page.next_cursor
                    if cursor is None:
                        break
                assert pages > 2
                assert len(names) == len(set(names))
                assert {"ev:echo", "ev:get-sum", "upstream_servers"} <= set(names)
                with pytest.raises(MCPError) as caught:
                    await client.session.list_tools(params=types.PaginatedRequestParams(cursor="forged"))
                assert caught.value.error.code == -32602


async def test_clients_of_every_protocol_era_use_one_running_mcpvisor(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        for mode in ("legacy", "auto", "2026-07-28"):
            async with stack.client(mode=mode) as client:
                assert (await client.call_tool("echo:echo", {"text": mode})).content[0].text == mode
        # A 2025-06-18 client, spoken to by hand: initialize, then a call on the session.
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        async with httpx2.AsyncClient(timeout=10) as http:
            init = await http.post(
                stack.direct_url,
                headers=headers,
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "old-client", "version": "1"},
                    },
                },
            )
            assert init.status_code == 200
            assert '"protocolVersion":"2025-06-18"' in init.text.replace(" ", "")
            session = {
                **headers,
                "Mcp-Session-Id": init.headers["mcp-session-id"],
                "MCP-Protocol-Version": "2025-06-18",
            }
            await http.post(
                stack.direct_url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
            )
            call = await http.post(
                stack.direct_url,
                headers=session,
                json={
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "echo:echo", "arguments": {"text": "old"}},
                },
            )
            assert call.status_code == 200
            assert '"text":"old"' in call.text.replace(" ", "")


async def test_2026_clients_hear_list_changes_and_resource_updates_on_listen_streams(tmp_path: Path) -> None:
    from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged

    servers = {"ev": everything_stdio_server(), "echo": echo_server()}
    async with open_stack(tmp_path, servers) as stack, stack.client() as client:
        resources = [str(r.uri) for r in (await client.list_resources()).resources if str(r.uri).startswith("demo://")]
        uri = resources[0]
        # Updates start only while some subscriber holds the upstream subscription: this stream.
        async with (
            client.listen(tools_list_changed=True, resource_subscriptions=[uri]) as stream,
            stack.client(mode="legacy") as toggler,
        ):
            await toggler.call_tool("ev:toggle-subscriber-updates", {})
            events: list[Any] = []
            with trio.fail_after(20):
                async for event in stream:
                    events.append(event)
                    if isinstance(event, ResourceUpdated):
                        break
            assert any(isinstance(e, ResourceUpdated) and str(e.uri) == uri for e in events)
            code, _ = await stack.actl("disable", "echo")
            assert code == 0
            with trio.fail_after(10):
                async for event in stream:
                    if isinstance(event, ToolsListChanged):
                        break
            await toggler.call_tool("ev:toggle-subscriber-updates", {})
        names = {t.name for t in (await client.list_tools()).tools}
        assert not any(name.startswith("echo:") for name in names)
