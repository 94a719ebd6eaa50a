"""The code_execution settings, allow_private_registry_fetch and `[registries.ID]` tables in the config file."""

from __future__ import annotations

import pytest

from mcpvisor.supervisor.config import loads
from mcpvisor.wire import frontend_spec
from mcpvisor.wire.config import ConfigError, RegistryConfig


def test_defaults_follow_mcpproxy() -> None:
    settings = loads("").mcpvisor
    assert settings.enable_code_execution is False
    assert settings.code_execution_timeout_ms == 120000
    assert settings.code_execution_max_tool_calls == 0
    assert settings.code_execution_max_parallel == 8
    assert settings.allow_private_registry_fetch is False
    assert loads("").registries == {}


def test_settings_are_read() -> None:
    config = loads(
        "[mcpvisor]\n"
        "enable_code_execution = true\n"
        "code_execution_timeout_ms = 5000\n"
        "code_execution_max_tool_calls = 20\n"
        "code_execution_max_parallel = 32\n"
        "allow_private_registry_fetch = true\n"
    )
    s = config.mcpvisor
    assert (s.enable_code_execution, s.code_execution_timeout_ms) == (True, 5000)
    assert (s.code_execution_max_tool_calls, s.code_execution_max_parallel) == (20, 32)
    assert s.allow_private_registry_fetch is True


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("code_execution_max_parallel = 33", "code_execution_max_parallel"),
        ("code_execution_max_parallel = 0", "code_execution_max_parallel"),
        ("code_execution_timeout_ms = 0", "code_execution_timeout_ms"),
        ("code_execution_max_tool_calls = -1", "code_execution_max_tool_calls"),
        ("enable_code_execution = 'yes'", "enable_code_execution"),
    ],
)
def test_out_of_range_settings_name_key_and_line(line: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads(f"[mcpvisor]\nlisten = '127.0.0.1:8080'\n{line}\n")
    assert key in str(err.value)
    assert "line 3" in str(err.value)


def test_registry_table() -> None:
    config = loads(
        "[registries.corp]\n"
        'name = "Corp registry"\n'
        'url = "https://registry.example.com"\n'
        'token = "${env:CORP_REGISTRY_TOKEN}"\n'
    )
    reg = config.registries["corp"]
    assert reg == RegistryConfig(
        name="Corp registry",
        url="https://registry.example.com",
        protocol="modelcontextprotocol/registry",
        token="${env:CORP_REGISTRY_TOKEN}",
    )


def test_registry_reaches_the_frontend_spec() -> None:
    config = loads('[registries.corp]\nname = "Corp"\nurl = "http://127.0.0.1:9/"\n')
    spec = frontend_spec.FrontendSpec(
        settings=config.mcpvisor,
        servers={},
        calls_endpoint="ipc:///x",
        control_endpoint="ipc:///y",
        events_endpoint="ipc:///z",
        registries=config.registries,
    )
    assert frontend_spec.decode(frontend_spec.encode(spec)).registries == config.registries


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('name = "x"\nurl = "ftp://example.com"\n', "url must start with http"),
        ('name = "x"\nurl = "https://example.com"\ntoken = "abc123"\n', "secret reference"),
        ('name = "x"\nurl = "https://example.com"\nprotocol = "pulse"\n', "protocol"),
        ('name = "x"\nurl = "https://example.com"\ncolour = "red"\n', "unknown key `registries.corp.colour`"),
        ('url = "https://example.com"\n', "name"),
    ],
)
def test_bad_registry_tables_are_refused(body: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads("[registries.corp]\n" + body)
    assert needle in str(err.value)
    # A literal token never appears in the error.
    assert "abc123" not in str(err.value)


def test_bad_registry_id() -> None:
    with pytest.raises(ConfigError, match="registry id"):
        loads('[registries."a b"]\nname = "x"\nurl = "https://example.com"\n')
