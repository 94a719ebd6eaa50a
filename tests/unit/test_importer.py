"""Importing the `mcpServers` JSON that Claude Desktop, Cursor and VS Code use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mcpvisor.supervisor.config import Config, load, loads
from mcpvisor.supervisor.importer import import_servers
from mcpvisor.wire.config import ConfigError

CLAUDE = {
    "mcpServers": {
        "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
        "GitHub MCP": {
            "command": "docker",
            "args": ["run", "-i", "ghcr.io/github/github-mcp-server"],
            "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_secretvalue123", "LOG_LEVEL": "debug"},
        },
        "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer abc.def.ghi"}},
        "legacy": {"type": "sse", "url": "https://example.com/sse-endpoint"},
        "broken": {"description": "neither a command nor a url"},
    }
}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps(data))
    return path


def test_servers_are_converted_and_secrets_become_references(tmp_path: Path) -> None:
    new, added, skipped = import_servers(write(tmp_path, CLAUDE), Config())
    assert added == ["filesystem", "GitHub-MCP", "remote", "legacy"]
    assert skipped == ["broken: neither a command nor a url"]
    assert new.servers["filesystem"].args == ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]
    github = new.servers["GitHub-MCP"]
    assert github.env == {"GITHUB_PERSONAL_ACCESS_TOKEN": "${env:GITHUB_PERSONAL_ACCESS_TOKEN}", "LOG_LEVEL": "debug"}
    assert new.servers["remote"].headers == {"Authorization": "Bearer ${env:AUTHORIZATION}"}
    assert new.servers["legacy"].kind == "sse"
    # No secret value made it into the result.
    from mcpvisor.supervisor.configstore import dumps

    text = dumps(new)
    assert "ghp_secretvalue123" not in text and "abc.def.ghi" not in text
    assert loads(text) == new


def test_existing_servers_are_kept_unless_replaced(tmp_path: Path) -> None:
    current = loads('[servers.filesystem]\ncommand = "mine"\n')
    new, added, skipped = import_servers(write(tmp_path, CLAUDE), current)
    assert new.servers["filesystem"].command == "mine"
    assert "filesystem" not in added
    assert any(line.startswith("filesystem: a server named 'filesystem' exists") for line in skipped)
    replaced, added, _ = import_servers(write(tmp_path, CLAUDE), current, replace=True)
    assert replaced.servers["filesystem"].command == "npx" and "filesystem" in added


def test_vs_code_servers_key_is_read_too(tmp_path: Path) -> None:
    new, added, _ = import_servers(
        write(tmp_path, {"servers": {"time": {"command": "uvx", "args": ["mcp-server-time"]}}}), Config()
    )
    assert added == ["time"] and new.servers["time"].command == "uvx"


@pytest.mark.parametrize(
    ("content", "message"),
    [("{nope", "line 1: not JSON"), ('{"other": {}}', "no `mcpServers`"), ("[]", "no `mcpServers`")],
)
def test_a_file_that_is_not_an_mcp_servers_file_is_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        import_servers(path, Config())


def test_the_command_writes_the_config_atomically(tmp_path: Path) -> None:
    source = write(tmp_path, CLAUDE)
    config = tmp_path / "mcpvisor.toml"
    original = '# my gateway\n[mcpvisor]\nlisten = "127.0.0.1:9000"  # the port my client knows\n'
    config.write_text(original)
    result = subprocess.run(
        [sys.executable, "-P", "-m", "mcpvisor.supervisor", "import", str(source), "-c", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "imported filesystem, GitHub-MCP, remote, legacy" in result.stdout
    assert "skipped broken" in result.stderr
    loaded = load(config)
    assert loaded.mcpvisor.listen == "127.0.0.1:9000"
    assert set(loaded.servers) == {"filesystem", "GitHub-MCP", "remote", "legacy"}
    assert (tmp_path / "mcpvisor.toml.bak").exists()
    assert config.read_text().startswith(original)  # what was there, comments included, stays
