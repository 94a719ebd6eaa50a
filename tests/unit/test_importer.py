"""Importing the `mcpServers` JSON that Claude Desktop, Cursor and VS Code use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mcpvisor.supervisor.config import Config, load, loads
from mcpvisor.supervisor.importer import import_servers, read_servers
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


CLAUDE_CODE = {
    "numStartups": 12,
    "mcpServers": {
        "context7": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"X-Api-Key": "k-123"}},
        "time": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"], "env": {}},
    },
    "projects": {
        "/home/me/shop": {
            "allowedTools": [],
            "mcpServers": {
                "postgres": {
                    "type": "stdio",
                    "command": "npx",
                    "args": ["-y", "@modelcontextprotocol/server-postgres"],
                    "env": {"DATABASE_URL": "${DATABASE_URL}"},
                },
                "time": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"], "env": {}},
            },
        },
        "/home/me/blog": {
            "mcpServers": {
                "postgres": {"type": "stdio", "command": "pg-mcp", "args": ["--read-only"]},
                "events": {"type": "sse", "url": "https://events.example.com/sse"},
            }
        },
        "/home/me/empty": {"mcpServers": {}},
    },
}

CODEX = """
model = "o4-mini"

[mcp_servers.time]
command = "uvx"
args = ["mcp-server-time", "--local-timezone", "UTC"]
env = { "TZ" = "UTC", "API_TOKEN" = "tok-literal" }

[mcp_servers.docs]
url = "https://docs.example.com/mcp"
bearer_token_env_var = "DOCS_TOKEN"
http_headers = { "X-Team" = "core" }
env_http_headers = { "X-Org" = "DOCS_ORG" }

[mcp_servers.off]
command = "off-mcp"
enabled = false

[mcp_servers.nothing]
startup_timeout_sec = 20
"""

GEMINI = {
    "theme": "Default",
    "mcp": {"allowed": ["files"]},
    "mcpServers": {
        "files": {
            "command": "python",
            "args": ["-m", "files_server"],
            "cwd": "./servers",
            "env": {"API_KEY": "$MY_API_TOKEN", "MODE": "fast"},
            "timeout": 30000,
            "trust": False,
        },
        "stream": {"httpUrl": "https://stream.example.com/mcp", "headers": {"Authorization": "Bearer sekret-1"}},
        "legacy": {"url": "https://legacy.example.com/sse"},
    },
}


def test_claude_code_servers_of_the_user_and_of_every_project_are_read(tmp_path: Path) -> None:
    source = tmp_path / ".claude.json"
    source.write_text(json.dumps(CLAUDE_CODE))
    new, added, skipped = import_servers(source, Config())
    assert added == ["context7", "time", "postgres", "postgres-blog", "events"]
    assert skipped == []
    assert new.servers["context7"].kind == "streamable-http"
    assert new.servers["context7"].headers == {"X-Api-Key": "${env:X_API_KEY}"}
    assert new.servers["postgres"].env == {"DATABASE_URL": "${env:DATABASE_URL}"}
    assert new.servers["postgres-blog"].command == "pg-mcp"
    assert new.servers["events"].kind == "sse"


def test_codex_config_toml_is_read(tmp_path: Path) -> None:
    source = tmp_path / "config.toml"
    source.write_text(CODEX)
    new, added, skipped = import_servers(source, Config())
    assert added == ["time", "docs", "off"]
    assert skipped == ["nothing: neither a command nor a url"]
    time = new.servers["time"]
    assert time.args == ["mcp-server-time", "--local-timezone", "UTC"]
    assert time.env == {"TZ": "UTC", "API_TOKEN": "${env:API_TOKEN}"}
    docs = new.servers["docs"]
    assert docs.kind == "streamable-http"
    assert docs.headers == {
        "X-Team": "core",
        "X-Org": "${env:DOCS_ORG}",
        "Authorization": "Bearer ${env:DOCS_TOKEN}",
    }
    assert new.servers["off"].enabled is False
    from mcpvisor.supervisor.configstore import dumps

    assert "tok-literal" not in dumps(new)


def test_gemini_settings_are_read_with_its_url_meaning_sse(tmp_path: Path) -> None:
    source = tmp_path / "settings.json"
    source.write_text(json.dumps(GEMINI))
    new, added, _ = import_servers(source, Config())
    assert added == ["files", "stream", "legacy"]
    files = new.servers["files"]
    assert files.cwd == "./servers"
    assert files.env == {"API_KEY": "${env:MY_API_TOKEN}", "MODE": "fast"}
    assert new.servers["stream"].kind == "streamable-http"
    assert new.servers["stream"].headers == {"Authorization": "Bearer ${env:AUTHORIZATION}"}
    assert new.servers["legacy"].kind == "sse"


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("claude_desktop_config.json", json.dumps(CLAUDE), "mcpservers"),
        (".claude.json", json.dumps(CLAUDE_CODE), "claude-code"),
        ("config.toml", CODEX, "codex"),
        ("settings.json", json.dumps(GEMINI), "gemini"),
        (".gemini/settings.json", json.dumps({"mcpServers": {"a": {"url": "http://x/sse"}}}), "gemini"),
        ("mcp.json", json.dumps({"servers": {"t": {"command": "t"}}}), "mcpservers"),
    ],
)
def test_the_format_is_recognised_from_the_file(tmp_path: Path, name: str, content: str, expected: str) -> None:
    source = tmp_path / name
    source.parent.mkdir(exist_ok=True)
    source.write_text(content)
    assert read_servers(source)[0] == expected


def test_a_forced_format_wins(tmp_path: Path) -> None:
    """A plain mcpServers file read as Gemini's: its `url` means SSE there."""
    source = tmp_path / "mcp.json"
    source.write_text(json.dumps({"mcpServers": {"remote": {"url": "https://example.com/events"}}}))
    assert import_servers(source, Config())[0].servers["remote"].kind == "streamable-http"
    assert import_servers(source, Config(), fmt="gemini")[0].servers["remote"].kind == "sse"
    with pytest.raises(ConfigError, match="unknown format 'yaml'"):
        import_servers(source, Config(), fmt="yaml")


@pytest.mark.parametrize(
    ("content", "fmt", "message"),
    [
        ("model = 'x'\n", "codex", r"no \[mcp_servers\] tables"),
        ("[mcp_servers\n", "auto", "not TOML"),
        ('{"mcpServers": {"x": {"command": "c", "env": ["A=1"]}}}', "auto", None),
    ],
)
def test_broken_files_and_entries_are_refused_clearly(
    tmp_path: Path, content: str, fmt: str, message: str | None
) -> None:
    source = tmp_path / "input"
    source.write_text(content)
    if message is None:
        _new, added, skipped = import_servers(source, Config(), fmt=fmt)
        assert added == [] and skipped == ["x: `env` must be an object"]
        return
    with pytest.raises(ConfigError, match=message):
        import_servers(source, Config(), fmt=fmt)


def test_the_command_takes_a_format(tmp_path: Path) -> None:
    source = tmp_path / "config.toml"
    source.write_text(CODEX)
    config = tmp_path / "mcpvisor.toml"
    result = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "mcpvisor.supervisor",
            "import",
            str(source),
            "-c",
            str(config),
            "--format",
            "codex",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "imported time, docs, off" in result.stdout
    assert set(load(config).servers) == {"time", "docs", "off"}
    assert "tok-literal" not in config.read_text()
