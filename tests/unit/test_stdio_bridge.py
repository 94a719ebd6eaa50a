"""The stdio bridge's pure parts: where it connects, how it reads SSE, how it writes lines and headers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mcpvisor.client.stdio_bridge import (
    DEFAULT_URL,
    BridgeError,
    endpoint_from_config,
    header_value,
    one_line,
    parse_args,
    sse_messages,
)


@pytest.mark.parametrize(
    ("listen", "url"),
    [
        ("127.0.0.1:9000", "http://127.0.0.1:9000/mcp"),
        ("0.0.0.0:9000", "http://127.0.0.1:9000/mcp"),
        ("[::]:9000", "http://[::1]:9000/mcp"),
        ("[::1]:9001", "http://[::1]:9001/mcp"),
        ("localhost:8123", "http://localhost:8123/mcp"),
    ],
)
def test_the_endpoint_comes_from_listen(tmp_path: Path, listen: str, url: str) -> None:
    config = tmp_path / "mcpvisor.toml"
    config.write_text(f'[mcpvisor]\nlisten = "{listen}"\n')
    assert endpoint_from_config(config, "/mcp") == url


def test_a_config_without_listen_means_the_default_address(tmp_path: Path) -> None:
    config = tmp_path / "mcpvisor.toml"
    config.write_text('[servers.time]\ncommand = "mcp-server-time"\n')
    assert endpoint_from_config(config, "mcp/direct") == "http://127.0.0.1:8080/mcp/direct"


@pytest.mark.parametrize(
    ("content", "message"),
    [("[mcpvisor\n", "is not valid TOML"), ('[mcpvisor]\nlisten = "nowhere"\n', "listen must be HOST:PORT")],
)
def test_a_bad_config_is_refused(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "mcpvisor.toml"
    config.write_text(content)
    with pytest.raises(BridgeError, match=message):
        endpoint_from_config(config, "/mcp")


def test_a_missing_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BridgeError, match="cannot read"):
        endpoint_from_config(tmp_path / "absent.toml", "/mcp")


def test_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MCPVISOR_TOKEN", raising=False)
    assert parse_args([]).url == DEFAULT_URL
    assert parse_args(["http://127.0.0.1:1/mcp/direct", "--token", "t"]).token == "t"
    monkeypatch.setenv("MCPVISOR_TOKEN", "from-env")
    assert parse_args([]).token == "from-env"
    config = tmp_path / "c.toml"
    config.write_text('[mcpvisor]\nlisten = "127.0.0.1:7000"\n')
    options = parse_args(["--serve", "-c", str(config), "--path", "/mcp/direct"])
    assert options.url == "http://127.0.0.1:7000/mcp/direct" and options.serve_config == config
    with pytest.raises(SystemExit):
        parse_args(["ftp://example.com/mcp"])


async def _lines(*lines: str) -> AsyncIterator[str]:
    for line in lines:
        yield line


async def test_sse_events_become_messages_and_empty_events_are_skipped() -> None:
    stream = _lines(
        "id: 1",
        "data:",
        "",
        ": keep-alive",
        "event: message",
        'data: {"jsonrpc": "2.0",',
        'data: "method": "notifications/progress"}',
        "",
        'data:{"jsonrpc":"2.0","id":1,"result":{}}',
    )
    messages = [message async for message in sse_messages(stream)]
    assert [json.loads(message) for message in messages] == [
        {"jsonrpc": "2.0", "method": "notifications/progress"},
        {"jsonrpc": "2.0", "id": 1, "result": {}},
    ]


def test_a_message_is_written_as_one_line() -> None:
    assert one_line(b'{"a": 1}') == b'{"a": 1}'
    assert one_line(b'{"a":\n 1,\r\n "b": "x\\ny"}') == b'{"a":1,"b":"x\\ny"}'


@pytest.mark.parametrize(
    ("value", "sent"),
    [
        ("get_weather", "get_weather"),
        ("file:///tmp/a b", "file:///tmp/a b"),
        ("héllo", "=?base64?aMOpbGxv?="),
        (" padded", "=?base64?IHBhZGRlZA==?="),
        ("=?base64?eA==?=", "=?base64?PT9iYXNlNjQ/ZUE9PT89?="),
    ],
)
def test_header_values_that_http_cannot_carry_are_base64_wrapped(value: str, sent: str) -> None:
    assert header_value(value) == sent
