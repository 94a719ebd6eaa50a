"""The rules of a server table, written once (`ServerConfig.problem`, `server_name_problem`).

The config file's loader, a client's `upstream_servers add` and the supervisor's own checks of a
proposal refuse the same tables for the same reason, each in its readers' words: `url` in a config
file's message, 'url' in a tool's answer.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import tomli_w

from mcpvisor.frontend.tool_args import ToolInputError
from mcpvisor.frontend.tools.management import UpstreamServers
from mcpvisor.supervisor.commands import CommandError
from mcpvisor.supervisor.commands.server_propose import check_name
from mcpvisor.supervisor.config import loads
from mcpvisor.wire.config import CLIENT_FIELDS, ConfigError, ServerConfig, Settings, server_name_problem

BAD_TABLES: dict[str, tuple[dict[str, Any], str]] = {
    "neither": ({"args": ["x"]}, "needs exactly one of `command` (stdio) or `url` (HTTP)"),
    "both": ({"command": "x", "url": "https://example.com/mcp"}, "needs exactly one of `command`"),
    "command over http": ({"command": "x", "transport": "sse"}, "has a command, so its transport is stdio"),
    "url over stdio": ({"url": "https://example.com/mcp", "transport": "stdio"}, "has a url, so its transport"),
    "not http": ({"url": "ftp://example.com/mcp"}, "`url` must start with http:// or https://"),
    "a space": ({"url": "https://example.com/m cp"}, "`url` must not contain spaces, quotes"),
    "a quote": ({"url": 'https://u:p"w@example.com/mcp'}, "`url` must not contain spaces, quotes"),
    "a bad port": ({"url": "https://example.com:99999/mcp"}, "`url` is not a valid URL: its host or port"),
    "no host": ({"url": "https://:8080/mcp"}, "`url` has no host"),
}


def refused_by_the_loader(name: str, table: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        loads(tomli_w.dumps({"servers": {name: table}}), source="mcpvisor.toml")
    return str(info.value)


async def refused_by_the_tool(name: str, table: dict[str, Any]) -> str:
    # Only what the tool reads before it would ask the supervisor: no server is configured yet.
    upstreams = SimpleNamespace(servers={}, settings=Settings())
    tool = UpstreamServers(upstreams, control=None)  # type: ignore[arg-type]
    with pytest.raises(ToolInputError) as info:
        await tool({"operation": "add", "name": name, **table})
    return info.value.message


@pytest.mark.parametrize(("table", "problem"), BAD_TABLES.values(), ids=BAD_TABLES)
async def test_the_config_file_and_a_client_are_refused_the_same_table_for_the_same_reason(
    table: dict[str, Any], problem: str
) -> None:
    assert msgspec.convert(table, ServerConfig).problem() is not None
    assert f"mcpvisor.toml:1: server 'new': {problem}" in refused_by_the_loader("new", table)
    in_a_tool = problem.replace("`", "'")
    assert f"Server 'new': {in_a_tool}" in await refused_by_the_tool("new", table)


@pytest.mark.parametrize("name", ["frontend", "bad:name", "a/b", "-dash", "x" * 64, "trailing\n"])
async def test_every_way_of_adding_a_server_refuses_the_same_names(name: str) -> None:
    problem = server_name_problem(name)
    assert problem is not None
    assert f"server name {name!r} {problem}" in refused_by_the_loader(name, {"command": "x"})
    assert f"Invalid server name '{name}': {problem}" in await refused_by_the_tool(name, {"command": "x"})
    with pytest.raises(CommandError, match="invalid server name"):
        check_name(name)


@pytest.mark.parametrize(
    "table",
    [{"command": "x"}, {"url": "https://example.com/mcp"}, {"url": "http://[::1]:8080/sse", "transport": "auto"}],
)
def test_a_good_table_has_no_problem_in_either_place(table: dict[str, Any]) -> None:
    assert msgspec.convert(table, ServerConfig).problem() is None
    assert loads(tomli_w.dumps({"servers": {"good": table}})).servers["good"].problem() is None


def test_a_client_sets_none_of_what_is_the_operators_alone() -> None:
    assert set(CLIENT_FIELDS) <= set(ServerConfig.__struct_fields__)
    assert not {"quarantined", "oauth", "sandbox", "endpoint"} & set(CLIENT_FIELDS)
