"""`reread`: which workers a new config file starts, restarts and stops."""

from __future__ import annotations

import pytest

from mcpvisor.supervisor.commands.reread import diff_result
from mcpvisor.supervisor.commands.reread import render as reread_render
from mcpvisor.supervisor.commands.update import render as update_render
from mcpvisor.supervisor.config import loads
from mcpvisor.supervisor.supervisor import diff_configs

BEFORE = """\
[mcpvisor]
listen = "127.0.0.1:8080"

[servers.time]
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]

[servers.remote]
url = "https://example.com/mcp"

[servers.files]
command = "mcp-server-files"
"""


def test_the_same_file_is_an_empty_diff() -> None:
    diff = diff_configs(loads(BEFORE), loads(BEFORE))
    assert diff.empty
    assert (diff.added, diff.changed, diff.removed, diff.settings_changed) == ([], [], [], False)


def test_servers_added_changed_and_removed_are_reported_sorted() -> None:
    after = """\
[mcpvisor]
listen = "127.0.0.1:8080"

[servers.time]
command = "mcp-server-time"
args = ["--local-timezone", "Europe/Paris"]

[servers.remote]
url = "https://example.com/mcp"

[servers.zeta]
command = "zeta"

[servers.alpha]
command = "alpha"
"""
    diff = diff_configs(loads(BEFORE), loads(after))

    assert diff.added == ["alpha", "zeta"]
    assert diff.changed == ["time"]
    assert diff.removed == ["files"]
    assert diff.settings_changed is False
    assert not diff.empty


def test_quarantining_a_server_does_not_restart_it() -> None:
    after = BEFORE.replace('command = "mcp-server-files"', 'command = "mcp-server-files"\nquarantined = true')
    assert loads(after).servers["files"].quarantined

    assert diff_configs(loads(BEFORE), loads(after)).empty


@pytest.mark.parametrize(
    ("edit", "server"),
    [
        (
            ('command = "mcp-server-files"', 'command = "mcp-server-files"\n[servers.files.policy]\nstartsecs = 5'),
            "files",
        ),
        (('command = "mcp-server-files"', 'command = "mcp-server-files"\npolicy = { call_timeout = 9 }'), "files"),
        (('args = ["--local-timezone", "UTC"]', 'args = ["--local-timezone", "UTC", "--verbose"]'), "time"),
        (('args = ["--local-timezone", "UTC"]', 'args = ["UTC", "--local-timezone"]'), "time"),
        (('url = "https://example.com/mcp"', 'url = "https://example.com/mcp"\nheaders = { A = "b" }'), "remote"),
        (('command = "mcp-server-files"', 'command = "mcp-server-files"\nenv = { DEBUG = "1" }'), "files"),
        (('command = "mcp-server-files"', 'command = "mcp-server-files"\nenabled = false'), "files"),
    ],
    ids=["policy-table", "policy-inline", "args-added", "args-reordered", "headers", "env", "disabled"],
)
def test_a_change_the_worker_sees_is_a_change(edit: tuple[str, str], server: str) -> None:
    diff = diff_configs(loads(BEFORE), loads(BEFORE.replace(*edit)))
    assert diff.changed == [server]
    assert (diff.added, diff.removed, diff.settings_changed) == ([], [], False)


def test_quarantine_together_with_a_real_change_is_still_a_change() -> None:
    after = BEFORE.replace('command = "mcp-server-files"', 'command = "other"\nquarantined = true')
    assert diff_configs(loads(BEFORE), loads(after)).changed == ["files"]


def test_writing_a_default_out_explicitly_is_not_a_change() -> None:
    after = BEFORE.replace('command = "mcp-server-files"', 'command = "mcp-server-files"\nenabled = true\nargs = []')
    assert diff_configs(loads(BEFORE), loads(after)).empty


@pytest.mark.parametrize(
    "edit",
    [
        ('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:9090"'),
        ('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:8080"\ntools_limit = 30'),
        ('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:8080"\ndirect_tool_names = "underscore"'),
    ],
)
def test_a_change_of_mcpvisor_settings_is_reported_apart_from_servers(edit: tuple[str, str]) -> None:
    diff = diff_configs(loads(BEFORE), loads(BEFORE.replace(*edit)))
    assert diff.settings_changed is True
    assert (diff.added, diff.changed, diff.removed) == ([], [], [])
    assert not diff.empty


def test_from_nothing_every_server_is_added_and_to_nothing_every_server_is_removed() -> None:
    empty, full = loads(""), loads(BEFORE)
    assert diff_configs(empty, full).added == ["files", "remote", "time"]
    assert diff_configs(full, empty).removed == ["files", "remote", "time"]
    assert not diff_configs(empty, full).settings_changed  # [mcpvisor] as written equals the defaults


def test_a_telemetry_change_is_reported_as_waiting_for_a_restart() -> None:
    after = BEFORE + '\n[telemetry]\nexporter = "otlp"\n'
    diff = diff_configs(loads(BEFORE), loads(after))
    assert diff.telemetry_changed and not diff.empty
    assert (diff.added, diff.changed, diff.removed, diff.settings_changed) == ([], [], [], False)
    shown = update_render(diff_result(diff))
    assert shown == "[telemetry]: changed; it takes effect when mcpvisor restarts (every process sets it up once)"
    assert reread_render(diff_result(diff)) == shown
