"""The operator's approval commands: `ctl pending`, `inspect`, `approve` and `block`, on a real stack.

A client proposes a server over MCP (`upstream_servers add`); nothing of it runs until the operator,
on the control socket, approves the proposal. Quarantined, its tools wait for the operator's review
and approval; blocking hides them again.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import trio
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent

from tests.support.stack import Stack, echo_server, open_stack


def text_of(result: CallToolResult) -> str:
    return "\n".join(item.text for item in result.content if isinstance(item, TextContent))


async def tool_names(client: Client) -> set[str]:
    with trio.fail_after(15):
        return {tool.name for tool in (await client.list_tools()).tools}


async def refused(client: Client, name: str, arguments: dict[str, Any]) -> bool:
    """Whether a call is turned away, as a protocol error or as an error result."""
    try:
        with trio.fail_after(15):
            return (await client.call_tool(name, arguments)).is_error
    except MCPError:
        return True


async def wait_until(condition: Any, what: str, timeout: float = 30.0) -> None:
    with trio.move_on_after(timeout):
        while not await condition():
            await trio.sleep(0.1)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def ctl(stack: Stack, *args: str) -> tuple[int, Any]:
    """`ctl --json ARGS`: (exit code, parsed JSON)."""
    code, output = await stack.actl(*args)
    assert not isinstance(output, str), f"not JSON: {output}"
    return code, output


async def ctl_text(stack: Stack, *args: str) -> tuple[int, str]:
    return await stack.actl(*args, json_output=False)


async def test_operator_reviews_approves_and_blocks_a_proposed_server(tmp_path: Path) -> None:
    # gamma is in the config file but quarantined: the operator has not reviewed its tools yet.
    gamma = echo_server("gamma", quarantined=True)
    servers = {"alpha": echo_server("alpha"), "gamma": gamma}
    async with open_stack(tmp_path, servers) as stack, stack.client("/mcp/direct") as client:
        # A client's proposal is listed beside it, and rejected.
        delta = echo_server("delta")
        with trio.fail_after(15):
            added = await client.call_tool(
                "upstream_servers",
                {
                    "operation": "add",
                    "name": "delta",
                    "command": delta["command"],
                    "args_json": json.dumps(delta["args"]),
                },
            )
        assert not added.is_error, text_of(added)
        code, pending = await ctl(stack, "pending")
        assert code == 0 and [(row["name"], row["action"]) for row in pending["proposals"]] == [("delta", "add")]
        code, text = await ctl_text(stack, "block", "delta")
        assert code == 0 and text.strip() == "delta: proposed add rejected"
        assert "delta" not in stack.config_path.read_text()

        async def gamma_hidden() -> bool:
            return not any(name.startswith("gamma:") for name in await tool_names(client))

        # Quarantined: listed as pending, its tools neither shown nor run.
        code, pending = await ctl(stack, "pending")
        assert code == 0
        assert [(row["name"], row["reason"]) for row in pending["servers"]] == [("gamma", "quarantined")]
        assert pending["servers"][0]["state"] == "ready" and pending["servers"][0]["tools"] > 0
        code, text = await ctl_text(stack, "pending")
        assert code == 0 and text.split()[:2] == ["gamma", "quarantined"]
        assert not any(name.startswith("gamma:") for name in await tool_names(client))
        assert await refused(client, "gamma:echo", {"text": "hi"})

        # What it runs, exactly, and what its tools say.
        code, inspection = await ctl(stack, "inspect", "gamma")
        assert code == 0
        assert inspection["command"] == [gamma["command"], *gamma["args"]]
        assert inspection["quarantined"] is True and inspection["connected"] is True
        assert inspection["transport"] == "stdio"
        reviews = {tool["tool"]: tool for tool in inspection["tools"]}
        assert {"echo", "touch", "pid"} <= set(reviews)
        assert {tool["approval"] for tool in reviews.values()} == {"not approved"}
        code, text = await ctl_text(stack, "inspect", "gamma")
        assert code == 0
        assert shlex.join([gamma["command"], *gamma["args"]]) in text
        assert "not approved" in text

        # Approved: its tools reach clients and run; the config file records the decision.
        code, decision = await ctl(stack, "approve", "gamma")
        assert code == 0
        assert decision["action"] == "approve" and decision["quarantined"] is False
        assert {"echo", "touch", "pid"} <= set(decision["approved_tools"])

        async def gamma_listed() -> bool:
            return "gamma:echo" in await tool_names(client)

        await wait_until(gamma_listed, "gamma's tools after approval")
        answered = await client.call_tool("gamma:echo", {"text": "approved"})
        assert not answered.is_error and text_of(answered) == "approved"
        assert "quarantined = true" not in stack.config_path.read_text().split("[servers.gamma]")[1]
        code, pending = await ctl(stack, "pending")
        assert code == 0 and pending["servers"] == [] and pending["proposals"] == []
        code, text = await ctl_text(stack, "pending")
        assert code == 0 and text.strip() == "Nothing is pending"

        # One tool blocked: withheld from listing and calls; the rest of the server stays.
        code, decision = await ctl(stack, "block", "gamma", "touch")
        assert code == 0 and decision["tools"] == ["touch"] and "touch" not in decision["approved_tools"]

        async def touch_hidden() -> bool:
            names = await tool_names(client)
            return "gamma:touch" not in names and "gamma:echo" in names

        await wait_until(touch_hidden, "gamma:touch to be withheld")
        assert await refused(client, "gamma:touch", {"path": str(tmp_path / "x")})
        assert not (tmp_path / "x").exists()
        code, inspection = await ctl(stack, "inspect", "gamma")
        assert {tool["tool"]: tool["approval"] for tool in inspection["tools"]}["touch"] == "new since approval"
        code, text = await ctl_text(stack, "approve", "gamma", "touch")
        assert code == 0 and "gamma: tools touch approved" in text

        async def touch_back() -> bool:
            return "gamma:touch" in await tool_names(client)

        await wait_until(touch_back, "gamma:touch approved again")

        # The whole server blocked: quarantined again, in the config file too.
        code, text = await ctl_text(stack, "block", "gamma")
        assert code == 0 and text.strip() == "gamma: blocked (quarantined)"

        await wait_until(gamma_hidden, "gamma hidden after block")
        assert "quarantined = true" in stack.config_path.read_text().split("[servers.gamma]")[1]
        code, decision = await ctl(stack, "block", "gamma")
        assert code == 0 and decision["quarantined"] is True
        code, pending = await ctl(stack, "pending")
        assert [row["name"] for row in pending["servers"]] == ["gamma"]
        assert "alpha:echo" in await tool_names(client)


async def test_operator_commands_refuse_bad_arguments_and_unknown_names(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"alpha": echo_server("alpha")}) as stack:
        for args, named in [
            (("inspect",), "NAME"),
            (("approve",), "NAME"),
            (("block", "--all"), "'--all'"),
            (("inspect", "alpha", "extra"), "'extra'"),
            (("pending", "now"), "'now'"),
        ]:
            code, text = await ctl_text(stack, *args)
            assert code == 2, (args, text)
            assert len(text.strip().splitlines()) == 1 and named in text, (args, text)
        code, answer = await ctl(stack, "inspect", "alpha", "extra")
        assert code == 2 and answer["exit_code"] == 2 and "'extra'" in answer["error"]

        code, text = await ctl_text(stack, "inspect", "alpha", "--json")
        assert code == 0 and json.loads(text)["name"] == "alpha"
        code, answer = await ctl(stack, "inspect", "nope")
        assert code == 4 and "no such server" in answer["error"]
        code, answer = await ctl(stack, "approve", "alpha", "no_such_tool")
        assert code == 4 and "no tool 'no_such_tool'" in answer["error"]
        code, text = await ctl_text(stack, "block", "nope")
        assert code == 4 and text.startswith("ERROR: 'nope': no such server")

        # A server from the config file, never approved, is not pending; its tools stay usable.
        code, pending = await ctl(stack, "pending")
        assert code == 0 and pending == {"kind": "pending", "servers": [], "proposals": []}
        code, inspection = await ctl(stack, "inspect", "alpha")
        assert code == 0 and inspection["quarantined"] is False and inspection["env"] == []
        code, help_text = await ctl_text(stack, "help", "approve")
        assert code == 0 and "usage: mcpvisor ctl approve NAME [TOOL...]" in help_text
