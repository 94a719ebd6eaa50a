"""Registries: entries to proposals, the built-in list, and the MCP Registry v0.1 client against a
registry served on loopback from recorded responses (tests/upstreams/registry_server.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mcpvisor.frontend.tools.registries import (
    BUILTIN_ID,
    MAX_RESPONSE_BYTES,
    RegistryError,
    answer_list_registries,
    answer_search_servers,
    entry_to_hit,
    list_registries,
    proposal_from_registry,
    search_servers,
    suggested_name,
)
from mcpvisor.runtime.addresses import public_address as _public_address
from mcpvisor.wire.config import RegistryConfig, ServerConfig

SERVER = Path(__file__).parent.parent / "upstreams" / "registry_server.py"
RECORDED = json.loads((SERVER.parent / "registry_data" / "servers.json").read_text())["servers"]
TOKEN = "registry-test-token"


def recorded(name: str) -> dict[str, Any]:
    return next(
        e
        for e in RECORDED
        if e["server"]["name"] == name and e["_meta"]["io.modelcontextprotocol.registry/official"]["isLatest"]
    )


@pytest.fixture(scope="module")
def registry_port() -> Iterator[int]:
    # Pages of at most 5 servers, so that a search has to follow cursors.
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", "0", "--max-page", "5", "--token", TOKEN],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        yield int(line.split()[-1])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def registries(port: int, token: str | None = None) -> dict[str, RegistryConfig]:
    base = f"http://127.0.0.1:{port}"
    configs = {"test": RegistryConfig(name="Test registry", url=base)}
    for prefix in ("broken", "notjson", "wrongshape", "huge", "redirect", "offhost"):
        configs[prefix] = RegistryConfig(name=prefix, url=f"{base}/{prefix}/")
    configs["private"] = RegistryConfig(name="private", url=f"{base}/private", token=token)
    configs["down"] = RegistryConfig(name="down", url="http://127.0.0.1:1")
    return configs


# -- entries to proposals (no I/O) ------------------------------------------------------------------


def test_npm_package_with_a_secret_env_variable() -> None:
    hit = entry_to_hit(recorded("io.github.example/weather"))
    assert hit.source == "npm"
    assert hit.config == {
        "command": "npx",
        "args": ["-y", "@example/weather-mcp@1.4.0"],
        "env": {"WEATHER_UNITS": "metric"},
    }
    needs = hit.needs.as_dict()
    assert needs["env"] == ["WEATHER_API_KEY"] and needs["needs_secrets"] is True
    assert hit.suggested_name == "weather" and hit.version == "1.4.0"


def test_pypi_package_with_named_arguments() -> None:
    hit = entry_to_hit(recorded("io.github.example/sqlite-explorer"))
    assert hit.config == {"command": "uvx", "args": ["sqlite-explorer-mcp==0.9.1", "--readonly=true"]}
    assert hit.needs.arguments == ["--db"]
    assert hit.needs.as_dict()["needs_secrets"] is False


def test_oci_package_passes_its_env_names_to_docker() -> None:
    hit = entry_to_hit(recorded("com.example.containers/kube-inspector"))
    assert hit.config == {
        "command": "docker",
        "args": ["run", "-i", "--rm", "-e", "KUBECONFIG", "example/kube-inspector:2.0.0"],
    }
    assert hit.needs.env == ["KUBECONFIG"]


def test_remotes_keep_url_and_transport_and_name_their_headers() -> None:
    hit = entry_to_hit(recorded("com.example/hosted-search"))
    assert hit.config == {"url": "https://mcp.example.com/search/mcp", "transport": "streamable-http"}
    assert hit.needs.headers == ["X-API-Key"] and hit.needs.secrets == ["X-API-Key"]
    sse = entry_to_hit(recorded("com.example/legacy-events"))
    assert sse.config == {"url": "https://mcp.example.com/events/sse", "transport": "sse"}


def test_an_entry_nothing_here_can_run_has_no_config() -> None:
    hit = entry_to_hit(recorded("io.github.example/desktop-bundle"))
    assert hit.config is None and hit.source == ""
    assert "nothing here can run it" in hit.note


def test_every_proposed_config_is_a_valid_server_config() -> None:
    for entry in RECORDED:
        hit = entry_to_hit(entry)
        if hit.config is not None and "{{" not in json.dumps(hit.config):
            msgspec.convert(hit.config, ServerConfig)


def test_malformed_entries_are_refused() -> None:
    with pytest.raises(RegistryError, match="no server name"):
        entry_to_hit({"server": {"description": "x"}})


@pytest.mark.parametrize(
    ("name", "expected"),
    [("io.github.acme/weather-server", "weather-server"), ("a/b c:d", "b-c-d"), ("x/_odd", "odd"), ("x/...", "server")],
)
def test_suggested_names_are_valid_server_names(name: str, expected: str) -> None:
    assert suggested_name(name) == expected


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("192.168.1.1", False),
        ("172.16.0.1", False),
        ("169.254.169.254", False),
        ("::1", False),
        ("::ffff:127.0.0.1", False),
        ("fe80::1%eth0", False),
        ("fc00::1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("8.8.8.8", True),
        ("2001:4860::8888", True),
    ],
)
def test_public_address(address: str, public: bool) -> None:
    assert _public_address(address) is public


def test_list_registries_shows_the_builtin_one_and_never_a_token() -> None:
    listing = list_registries({"corp": RegistryConfig(name="Corp", url="https://r.example.com", token="${env:T}")})
    assert [r["id"] for r in listing] == [BUILTIN_ID, "corp"]
    assert listing[0]["builtin"] is True and listing[0]["url"] is None
    assert listing[1] == {
        "id": "corp",
        "name": "Corp",
        "url": "https://r.example.com",
        "protocol": "modelcontextprotocol/registry",
        "builtin": False,
        "has_token": True,
    }
    assert "${env:T}" not in json.dumps(listing)


# -- the built-in list (offline) --------------------------------------------------------------------


async def test_builtin_registry_works_offline() -> None:
    hits = await search_servers(BUILTIN_ID, "time", configured={})
    assert [h["name"] for h in hits] == ["io.modelcontextprotocol/time"]
    assert hits[0]["config"] == {"command": "uvx", "args": ["mcp-server-time"]}
    everything = await search_servers(BUILTIN_ID, "every", configured={})
    assert everything[0]["config"] == {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"]}
    pypi = await search_servers(BUILTIN_ID, tag="pypi", configured={})
    assert {h["suggested_name"] for h in pypi} == {"fetch", "git", "time"}
    assert len(await search_servers(BUILTIN_ID, limit=3, configured={})) == 3
    proposal = await proposal_from_registry(BUILTIN_ID, "io.modelcontextprotocol/filesystem", configured={})
    assert proposal.name == "filesystem" and proposal.needs.arguments == ["allowed_directory"]
    with pytest.raises(RegistryError, match="no server"):
        await proposal_from_registry(BUILTIN_ID, "io.modelcontextprotocol/nope", configured={})


@pytest.mark.parametrize("limit", [0, 51, "10", True, 2.5])
async def test_limit_is_checked(limit: Any) -> None:
    with pytest.raises(RegistryError, match="limit must be an integer from 1 to 50"):
        await search_servers(BUILTIN_ID, limit=limit, configured={})


async def test_unknown_registry_names_the_known_ones() -> None:
    with pytest.raises(RegistryError, match="known: reference, corp"):
        await search_servers("nope", configured={"corp": RegistryConfig(name="c", url="https://r.example.com")})


# -- the MCP Registry API over HTTP -----------------------------------------------------------------


async def test_search_follows_cursors_and_keeps_the_latest_versions(registry_port: int) -> None:
    configured = registries(registry_port)
    hits = await search_servers("test", limit=50, configured=configured, allow_private=True)
    names = [h["name"] for h in hits]
    # 21 recorded entries: one older version and one deleted server are not shown; pages hold 5.
    assert len(names) == 19 == len(set(names))
    assert "io.github.example/retired-tool" not in names
    weather = await search_servers("test", "weather", configured=configured, allow_private=True)
    assert [(h["name"], h["version"]) for h in weather] == [("io.github.example/weather", "1.4.0")]
    assert len(await search_servers("test", "paged", limit=7, configured=configured, allow_private=True)) == 7


async def test_search_by_tag_reads_further_pages(registry_port: int) -> None:
    configured = registries(registry_port)
    remote = await search_servers("test", tag="remote", configured=configured, allow_private=True)
    assert {h["name"] for h in remote} == {
        "com.example/hosted-search",
        "com.example/legacy-events",
        "io.mcpvisor.test/conformance",
    }
    oci = await search_servers("test", tag="oci", configured=configured, allow_private=True)
    assert [h["config"]["command"] for h in oci] == ["docker"]


async def test_proposal_from_the_registry(registry_port: int) -> None:
    configured = registries(registry_port)
    proposal = await proposal_from_registry(
        "test", "io.github.example/sqlite-explorer", configured=configured, allow_private=True
    )
    assert (proposal.name, proposal.registry, proposal.registry_server) == (
        "sqlite-explorer",
        "test",
        "io.github.example/sqlite-explorer",
    )
    assert proposal.config["command"] == "uvx" and proposal.version == "0.9.1"
    with pytest.raises(RegistryError, match="not found"):
        await proposal_from_registry("test", "io.github.example/missing", configured=configured, allow_private=True)
    with pytest.raises(RegistryError, match="cannot be run here"):
        await proposal_from_registry(
            "test", "io.github.example/desktop-bundle", configured=configured, allow_private=True
        )


async def test_loopback_registry_is_refused_unless_allowed(registry_port: int) -> None:
    configured = registries(registry_port)
    with pytest.raises(RegistryError, match="allow_private_registry_fetch"):
        await search_servers("test", configured=configured)
    localhost = {"local": RegistryConfig(name="l", url=f"http://localhost:{registry_port}")}
    with pytest.raises(RegistryError, match="loopback, private or link-local"):
        await search_servers("local", configured=localhost)
    with pytest.raises(RegistryError, match="allow_private_registry_fetch"):
        await proposal_from_registry("test", "io.github.example/weather", configured=configured)


async def test_token_by_secret_reference(registry_port: int) -> None:
    with_token = registries(registry_port, token="${env:REG_TOKEN}")
    hits = await search_servers(
        "private", "weather", configured=with_token, allow_private=True, environ={"REG_TOKEN": TOKEN}
    )
    assert len(hits) == 1
    with pytest.raises(RegistryError, match="HTTP 401") as err:
        await search_servers("private", configured=with_token, allow_private=True, environ={"REG_TOKEN": "wrong-value"})
    assert "wrong-value" not in str(err.value)
    with pytest.raises(RegistryError, match="token cannot be read"):
        await search_servers("private", configured=with_token, allow_private=True, environ={})
    with pytest.raises(RegistryError, match="HTTP 401"):
        await search_servers("private", configured=registries(registry_port), allow_private=True)


@pytest.mark.parametrize(
    ("registry", "message"),
    [
        ("broken", "answered HTTP 500"),
        ("notjson", "did not answer with JSON"),
        ("wrongshape", "without a `servers` list"),
        ("huge", f"larger than {MAX_RESPONSE_BYTES // (1024 * 1024)} MB"),
        ("redirect", "redirect, which is not followed"),
        ("offhost", "another host"),
        ("down", "cannot be reached"),
    ],
)
async def test_a_broken_registry_gives_a_clear_error(registry_port: int, registry: str, message: str) -> None:
    with pytest.raises(RegistryError, match=message) as err:
        await search_servers(registry, "paged", configured=registries(registry_port), allow_private=True)
    assert registry in str(err.value)


# -- the tools' answers -----------------------------------------------------------------------------


async def test_search_servers_tool_answers() -> None:
    listing = answer_list_registries({})
    assert listing["isError"] is False and listing["structuredContent"]["registries"][0]["id"] == BUILTIN_ID
    found = await answer_search_servers({"registry": BUILTIN_ID, "search": "memory"}, {})
    assert found["isError"] is False
    assert [s["suggested_name"] for s in found["structuredContent"]["servers"]] == ["memory"]
    for bad, fragment in [
        ({}, "'registry' is required"),
        ({"registry": BUILTIN_ID, "limit": 99}, "from 1 to 50"),
        ({"registry": BUILTIN_ID, "colour": 1}, "Unknown parameter"),
        ({"registry": "nope"}, "unknown registry"),
    ]:
        answer = await answer_search_servers(bad, {})
        assert answer["isError"] is True and fragment in answer["content"][0]["text"], bad
