"""The TOML configuration: what is accepted, what is refused and how the refusal reads; writing it back."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from mcpvisor.supervisor import configstore
from mcpvisor.supervisor.config import Config, data_dir, load, loads
from mcpvisor.wire.config import ConfigError, Policy, ServerConfig, Settings, parse_listen

GOOD = """\
[mcpvisor]
listen = "127.0.0.1:9090"
tools_limit = 20

[servers.time]
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]

[servers.remote]
url = "https://example.com/mcp"
headers = { Authorization = "Bearer ${env:REMOTE_TOKEN}" }

[servers.remote.policy]
startretries = 3
"""


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        loads(text, source="mcpvisor.toml")
    return str(info.value)


# -- a good file ------------------------------------------------------------------------------------


def test_a_good_file_loads_with_defaults_filled_in() -> None:
    config = loads(GOOD)

    assert config.mcpvisor.listen == "127.0.0.1:9090"
    assert config.mcpvisor.tools_limit == 20
    assert config.mcpvisor.call_timeout == Settings().call_timeout == 120
    assert config.servers["time"].args == ["--local-timezone", "UTC"]
    assert config.servers["time"].policy == Policy()
    assert config.servers["remote"].policy.startretries == 3
    assert config.servers["remote"].policy.backoff_max == Policy().backoff_max == 300
    assert config.servers["remote"].headers == {"Authorization": "Bearer ${env:REMOTE_TOKEN}"}


def test_policy_defaults_are_the_documented_ones() -> None:
    policy = loads('[servers.s]\ncommand = "x"\n').servers["s"].policy

    assert (policy.init_timeout, policy.discovery_timeout, policy.poll_interval) == (30, 30, 300)
    assert (policy.startsecs, policy.startretries, policy.backoff_max) == (1, 5, 300)
    assert policy.autorestart is True
    assert policy.exitcodes == (0,)
    assert policy.stopsignal == "TERM"
    assert policy.call_timeout is None  # falls back to [mcpvisor].call_timeout


def test_an_empty_file_is_all_defaults() -> None:
    assert loads("") == Config()
    assert loads("").mcpvisor.listen == "127.0.0.1:8080"


def test_defaults_of_one_server_are_not_shared_with_another() -> None:
    config = loads('[servers.a]\ncommand = "x"\n[servers.b]\ncommand = "y"\n')
    config.servers["a"].env["ONLY_A"] = "1"
    assert config.servers["b"].env == {}
    assert config.servers["b"].policy.exitcodes == (0,)  # immutable: nothing to share


def test_a_server_under_a_dotted_quoted_name_loads() -> None:
    assert loads('[servers."my.server"]\ncommand = "x"\n').servers["my.server"].command == "x"


# -- unknown keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ('bogus = 1\n\n[mcpvisor]\nlisten = "127.0.0.1:1"\n', 1, "bogus"),
        ('[mcpvisor]\nlisten = "127.0.0.1:1"\nlisen = "x"\n', 3, "mcpvisor.lisen"),
        ('[servers.time]\ncommand = "x"\ncomand = "y"\n', 3, "servers.time.comand"),
        (
            '[servers.time]\ncommand = "x"\n\n[servers.time.policy]\nstartsecs = 1\nstartsec = 2\n',
            6,
            "servers.time.policy.startsec",
        ),
        ('[servers.time]\ncommand = "x"\npolicy = { startsecs = 1, bogus = 2 }\n', 3, "servers.time.policy.bogus"),
        ('[servers]\ntime = { command = "x", bogus = 1 }\n', 2, "servers.time.bogus"),
        ('[servers.a]\ncommand = "x"\n\n[servers.b]\ncommand = "y"\ncomand = "z"\n', 6, "servers.b.comand"),
        ('[servers."my.server"]\ncommand = "x"\ncomand = "y"\n', 3, "servers.my.server.comand"),
    ],
    ids=[
        "top-level",
        "mcpvisor",
        "server",
        "policy-table",
        "policy-inline",
        "server-inline",
        "second-server",
        "dotted-name",
    ],
)
def test_an_unknown_key_is_refused_with_its_path_and_line(text: str, line: int, key: str) -> None:
    message = refused(text)
    assert message.startswith("mcpvisor.toml: ")
    assert f"line {line}: unknown key `{key}`" in message


def test_a_refusal_is_a_single_line() -> None:
    assert "\n" not in refused('[servers.time]\ncommand = "x"\ncomand = "y"\n')


# -- wrong types ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "key", "why"),
    [
        ('[mcpvisor]\n\ntools_limit = "many"\n', 3, "mcpvisor.tools_limit", "Expected `int`, got `str`"),
        ("[mcpvisor]\ntools_limit = 1000\n", 2, "mcpvisor.tools_limit", "<= 100"),
        ('[servers.time]\ncommand = "x"\nargs = "--utc"\n', 3, "servers.time.args", "Expected `array`, got `str`"),
        (
            '[servers.time]\ncommand = "x"\n[servers.time.policy]\nstartretries = "five"\n',
            4,
            "servers.time.policy.startretries",
            "Expected `int`",
        ),
        (
            '[servers.time]\ncommand = "x"\n\n[servers.time.policy]\nstartsecs = -1\n',
            5,
            "servers.time.policy.startsecs",
            ">= 0",
        ),
        (
            '[servers.time]\ncommand = "x"\npolicy = { stopsignal = "STOP" }\n',
            3,
            "servers.time.policy.stopsignal",
            "Invalid enum value 'STOP'",
        ),
        (
            '[servers.time]\ncommand = "x"\nenv = { DEBUG = 1 }\n',
            3,
            "servers.time.env.DEBUG",
            "Expected `str`, got `int`",
        ),
    ],
)
def test_a_wrong_type_names_the_key_and_its_line(text: str, line: int, key: str, why: str) -> None:
    message = refused(text)
    assert f"line {line}: `{key}`" in message
    assert why in message


def test_a_toml_syntax_error_names_the_line() -> None:
    message = refused('[mcpvisor]\nlisten = "127.0.0.1:8080"\ntools_limit = \n')
    assert message.startswith("mcpvisor.toml: ")
    assert "line 3" in message


# -- servers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["a:b", "a/b", "-leading-dash", "a" * 64, "with space"],
    ids=["colon", "slash", "leading-dash", "too-long", "space"],
)
def test_a_bad_server_name_is_refused(name: str) -> None:
    message = refused(f'[mcpvisor]\n\n[servers."{name}"]\ncommand = "x"\n')
    assert f"mcpvisor.toml:3: server name {name!r}" in message
    assert "at most 63 characters" in message


def test_a_server_name_ending_in_a_newline_is_refused() -> None:
    assert "server name 'vault\\n' must be" in refused('[servers."vault\\n"]\ncommand = "x"\n')
    assert "tenant name 'bob\\n'" in refused('[tenants."bob\\n"]\nservers = []\n')


def test_a_server_name_of_63_characters_is_fine() -> None:
    assert list(loads(f'[servers.{"a" * 63}]\ncommand = "x"\n').servers) == ["a" * 63]


def test_frontend_is_a_reserved_server_name() -> None:
    assert "'frontend' is reserved" in refused('[servers.frontend]\ncommand = "x"\n')


@pytest.mark.parametrize(
    "body",
    ['command = "x"\nurl = "https://example.com/mcp"\n', 'args = ["x"]\n'],
    ids=["both", "neither"],
)
def test_a_server_needs_exactly_one_of_command_and_url(body: str) -> None:
    message = refused(f"[servers.s]\n{body}")
    assert "mcpvisor.toml:1: server 's': needs exactly one of `command` (stdio) or `url` (HTTP)" in message


@pytest.mark.parametrize("url", ["ftp://example.com/mcp", "example.com/mcp", "file:///tmp/sock"])
def test_a_url_must_be_http_or_https(url: str) -> None:
    assert "server 's': `url` must start with http:// or https://" in refused(f'[servers.s]\nurl = "{url}"\n')


@pytest.mark.parametrize("transport", ["sse", "streamable-http"])
def test_a_command_server_cannot_use_an_http_transport(transport: str) -> None:
    message = refused(f'[servers.s]\ncommand = "x"\ntransport = "{transport}"\n')
    assert "server 's': has a command, so its transport is stdio" in message


def test_a_url_server_cannot_use_stdio() -> None:
    message = refused('[servers.s]\nurl = "https://example.com/mcp"\ntransport = "stdio"\n')
    assert "server 's': has a url, so its transport cannot be stdio" in message


@pytest.mark.parametrize("table", ["env", "headers"])
def test_an_env_reference_with_a_bad_variable_name_is_refused(table: str) -> None:
    message = refused(f'[servers.s]\nurl = "https://example.com/mcp"\n{table} = {{ T = "x ${{env:BAD NAME}}" }}\n')
    assert "server 's': T: bad variable name in ${env:BAD NAME}" in message


def test_an_env_reference_may_name_the_tenant_and_is_checked_with_a_name_in_place() -> None:
    text = '[servers.s]\ncommand = "x"\nenv = { T = "${env:SLACK_{tenant}}" }\n'
    assert loads(text).servers["s"].env == {"T": "${env:SLACK_{tenant}}"}
    message = refused('[servers.s]\ncommand = "x"\nenv = { T = "${env:BAD {tenant}}" }\n')
    assert "server 's': T: bad variable name in ${env:BAD {tenant}}" in message


def test_good_secret_references_are_accepted_as_written() -> None:
    text = '[servers.s]\ncommand = "x"\nenv = { T = "${env:MY_TOKEN}", K = "${file:~/.keys/k}" }\n'
    assert loads(text).servers["s"].env == {"T": "${env:MY_TOKEN}", "K": "${file:~/.keys/k}"}


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ('command = "x"', "stdio"),
        ('command = "x"\ntransport = "stdio"', "stdio"),
        ('url = "https://example.com/mcp"', "streamable-http"),
        ('url = "https://example.com/sse"', "sse"),
        ('url = "https://example.com/sse/"', "sse"),
        ('url = "https://example.com/sse"\ntransport = "streamable-http"', "streamable-http"),
        ('url = "https://example.com/events"\ntransport = "sse"', "sse"),
        ('url = "https://example.com/ssefeed"', "streamable-http"),
    ],
)
def test_kind_is_the_transport_actually_used(body: str, kind: str) -> None:
    assert loads(f"[servers.s]\n{body}\n").servers["s"].kind == kind


# -- [mcpvisor] listen and data_dir -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("listen", "address"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        ("[::1]:8443", ("::1", 8443)),
        (":9000", ("127.0.0.1", 9000)),
        ("localhost:1", ("localhost", 1)),
    ],
)
def test_parse_listen(listen: str, address: tuple[str, int]) -> None:
    assert parse_listen(listen) == address


@pytest.mark.parametrize("listen", ["8080", "localhost", "localhost:http", "host:-1", "host:"])
def test_parse_listen_refuses_what_is_not_host_port(listen: str) -> None:
    with pytest.raises(ConfigError, match="listen must be HOST:PORT"):
        parse_listen(listen)


def test_a_bad_listen_in_the_file_names_its_line() -> None:
    assert "mcpvisor.toml:3: listen must be HOST:PORT (IPv6 as [::1]:PORT), got 'nope'" in refused(
        '[mcpvisor]\n\nlisten = "nope"\n'
    )


def test_data_dir_relative_to_the_config_file(tmp_path: Path) -> None:
    config = loads('[mcpvisor]\ndata_dir = "state"\n')
    assert data_dir(config, tmp_path / "mcpvisor.toml") == tmp_path / "state"


def test_data_dir_absolute_and_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data_dir(loads(f'[mcpvisor]\ndata_dir = "{tmp_path}/abs"\n'), Path("/elsewhere/c.toml")) == tmp_path / "abs"
    assert data_dir(loads('[mcpvisor]\ndata_dir = "~/d"\n'), Path("/elsewhere/c.toml")) == tmp_path / "d"


def test_data_dir_default_prefers_systemds_state_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/mcpvisor:/var/lib/other")
    monkeypatch.setenv("XDG_DATA_HOME", "/xdg")
    assert data_dir(Config()) == Path("/var/lib/mcpvisor")


def test_data_dir_default_falls_back_to_xdg_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", "/xdg")
    assert data_dir(Config()) == Path("/xdg/mcpvisor")
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data_dir(Config()) == tmp_path / ".local" / "share" / "mcpvisor"


# -- load -------------------------------------------------------------------------------------------


def test_load_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(GOOD)
    assert load(path) == loads(GOOD)


def test_load_names_the_file_in_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text('[servers.s]\ncommand = "x"\nbogus = 1\n')
    with pytest.raises(ConfigError, match=rf"^{path}: line 3: unknown key `servers.s.bogus`$"):
        load(path)


def test_load_of_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read: No such file or directory"):
        load(tmp_path / "absent.toml")


# -- writing the file back --------------------------------------------------------------------------


def test_write_atomic_creates_then_replaces_keeping_the_previous_file_as_bak(tmp_path: Path) -> None:
    path = tmp_path / "mcpvisor.toml"
    configstore.write_atomic(path, "first\n")
    assert path.read_text() == "first\n"
    assert not (tmp_path / "mcpvisor.toml.bak").exists()

    configstore.write_atomic(path, "second\n")

    assert path.read_text() == "second\n"
    assert (tmp_path / "mcpvisor.toml.bak").read_text() == "first\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mcpvisor.toml", "mcpvisor.toml.bak"]


def test_a_rename_that_fails_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(GOOD)

    def failing_replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(configstore.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        configstore.write_atomic(path, "half a fi")

    assert path.read_text() == GOOD


def test_a_temporary_file_that_cannot_be_written_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(GOOD)
    (tmp_path / ".mcpvisor.toml.tmp").mkdir()  # the temporary path is taken by a directory

    with pytest.raises(IsADirectoryError):
        configstore.write_atomic(path, "new content\n")

    assert path.read_text() == GOOD
    assert not (tmp_path / "mcpvisor.toml.bak").exists()


def test_dumps_round_trips_to_an_equal_config() -> None:
    config = loads(GOOD + '\n[servers.local]\ncommand = "x"\nenv = { "A B" = "${file:/run/k}" }\nquarantined = true\n')
    settings = msgspec.structs.replace(config.mcpvisor, enable_direct_endpoint=True, direct_tool_names="underscore")
    config = msgspec.structs.replace(config, mcpvisor=settings)

    assert loads(configstore.dumps(config)) == config


def test_dumps_leaves_defaults_out() -> None:
    text = configstore.dumps(loads('[servers.s]\ncommand = "x"\n[servers.s.policy]\nstartretries = 2\n'))
    assert "startretries = 2" in text
    assert "backoff_max" not in text
    assert "enabled" not in text


def test_save_writes_a_config_that_loads_back(tmp_path: Path) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(GOOD)
    config = configstore.with_server(loads(GOOD), "extra", ServerConfig(command="extra-server"))

    configstore.save(path, config)

    assert load(path) == config
    assert (tmp_path / "mcpvisor.toml.bak").read_text() == GOOD


@pytest.mark.parametrize(
    "server",
    [ServerConfig(command="x", url="https://example.com/mcp"), ServerConfig(url="gopher://example.com")],
    ids=["command-and-url", "bad-scheme"],
)
def test_save_refuses_a_config_it_would_not_load_back(tmp_path: Path, server: ServerConfig) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(GOOD)

    with pytest.raises(ConfigError, match="server 'broken'"):
        configstore.save(path, configstore.with_server(loads(GOOD), "broken", server))

    assert path.read_text() == GOOD
    assert sorted(os.listdir(tmp_path)) == ["mcpvisor.toml"]


def test_with_server_adds_replaces_and_removes_without_touching_the_original() -> None:
    original = loads(GOOD)
    added = configstore.with_server(original, "new", ServerConfig(command="n"))
    replaced = configstore.with_server(original, "time", ServerConfig(command="other"))
    removed = configstore.with_server(original, "time", None)

    assert list(added.servers) == ["time", "remote", "new"]
    assert replaced.servers["time"].command == "other"
    assert list(removed.servers) == ["remote"]
    assert configstore.with_server(original, "absent", None) == original
    assert original == loads(GOOD)
    assert added.mcpvisor == original.mcpvisor


def test_server_from_table_checks_a_table_as_if_it_stood_in_the_file() -> None:
    server = configstore.server_from_table(
        "gh", {"command": "gh-mcp", "policy": {"startsecs": 2}}, source="server 'gh'"
    )
    assert server.command == "gh-mcp"
    assert server.policy.startsecs == 2
    assert server.policy.startretries == Policy().startretries


def test_server_from_table_refuses_unknown_keys_naming_the_server() -> None:
    with pytest.raises(ConfigError, match=r"unknown key `servers\.gh\.comand`"):
        configstore.server_from_table("gh", {"comand": "gh-mcp"}, source="server 'gh'")
    with pytest.raises(ConfigError, match=r"unknown key `servers\.gh\.policy\.retries`"):
        configstore.server_from_table("gh", {"command": "x", "policy": {"retries": 1}}, source="server 'gh'")


@pytest.mark.parametrize(
    ("table", "why"),
    [
        (["gh-mcp"], "server 'gh' must be a table"),
        ({"command": "x", "cwd": None}, "server 'gh'.*leave the key out"),
        ({}, "server 'gh': needs exactly one of"),
        ({"command": 7}, r"`servers\.gh\.command`: Expected `str \| null`, got `int`"),
    ],
    ids=["not-a-table", "null", "empty", "wrong-type"],
)
def test_server_from_table_refuses_bad_tables_with_a_config_error(table: object, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        configstore.server_from_table("gh", table, source="server 'gh'")


COMMENTED = """\
# mcpvisor on my workstation
[mcpvisor]
listen = "127.0.0.1:9090"  # the port my editor expects

# Local time, for the agent's calendar work.
[servers.time]
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
transport = "stdio"  # spelled out though it is the default

[servers.time.policy]
startretries = 5  # it is slow to start on battery

# The remote one.
[servers.remote]
url = "https://example.com/mcp"
headers = { Authorization = "Bearer ${env:REMOTE_TOKEN}" }
"""


def _change(path: Path, name: str, server: ServerConfig | None) -> None:
    config = configstore.with_server(load(path), name, server)
    configstore.save_server(path, config, name, server)
    assert load(path) == config


def test_disable_then_enable_gives_back_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(COMMENTED)
    time = load(path).servers["time"]

    _change(path, "time", msgspec.structs.replace(time, enabled=False))
    text = path.read_text()
    assert "enabled = false" in text
    assert "# Local time, for the agent's calendar work." in text and "# it is slow to start on battery" in text
    assert (tmp_path / "mcpvisor.toml.bak").read_text() == COMMENTED

    _change(path, "time", time)
    assert path.read_text() == COMMENTED


def test_a_nested_change_touches_only_its_line(tmp_path: Path) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(COMMENTED)
    time = load(path).servers["time"]

    _change(path, "time", msgspec.structs.replace(time, policy=msgspec.structs.replace(time.policy, startretries=2)))

    assert path.read_text() == COMMENTED.replace("startretries = 5", "startretries = 2")


def test_adding_and_removing_a_server_keeps_the_others_as_written(tmp_path: Path) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(COMMENTED)

    _change(path, "extra", ServerConfig(command="extra-server", enabled=False))
    assert path.read_text().startswith(COMMENTED)
    _change(path, "remote", None)
    text = path.read_text()
    assert "[servers.remote]" not in text and "REMOTE_TOKEN" not in text
    assert "# the port my editor expects" in text and "# spelled out though it is the default" in text
    assert "[servers.extra]" in text


def test_edits_in_the_file_not_yet_applied_survive_a_change(tmp_path: Path) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(COMMENTED)
    running = load(path)
    path.write_text(COMMENTED.replace('"127.0.0.1:9090"', '"127.0.0.1:9191"'))  # edited, no `update` yet
    time = running.servers["time"]

    new = configstore.with_server(running, "time", msgspec.structs.replace(time, enabled=False))
    configstore.save_server(path, new, "time", new.servers["time"])

    assert load(path).mcpvisor.listen == "127.0.0.1:9191"
    assert load(path).servers["time"].enabled is False


def test_a_file_broken_since_it_was_loaded_is_rewritten_whole(tmp_path: Path) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(COMMENTED)
    running = load(path)
    path.write_text(COMMENTED + "[servers.half\n")
    new = configstore.with_server(running, "time", msgspec.structs.replace(running.servers["time"], enabled=False))

    configstore.save_server(path, new, "time", new.servers["time"])

    assert load(path) == new
    assert (tmp_path / "mcpvisor.toml.bak").read_text().endswith("[servers.half\n")


def test_save_server_refuses_a_server_it_would_not_load_back(tmp_path: Path) -> None:
    path = tmp_path / "mcpvisor.toml"
    path.write_text(COMMENTED)
    server = ServerConfig(command="x", url="https://example.com/mcp")

    with pytest.raises(ConfigError, match="server 'broken'"):
        configstore.save_server(path, configstore.with_server(load(path), "broken", server), "broken", server)

    assert path.read_text() == COMMENTED
