"""Which upstreams get a sandbox and what it allows: the config's layers merged, without processes."""

from __future__ import annotations

import msgspec
import pytest

from mcpvisor.wire.config import SandboxConfig, ServerConfig, Settings, TenantConfig
from mcpvisor.wire.sandboxing import UID_FLOOR, describe, home_dir, plan, refused_bind, sandbox_uid

STDIO = ServerConfig(command="server")
REMOTE = ServerConfig(url="https://example.com/mcp")


def test_off_on_a_workstation_until_one_line_turns_it_on() -> None:
    assert plan("time", Settings(), STDIO, None, data_dir="/d") is None
    assert plan("time", Settings(sandbox=True), STDIO, None, data_dir="/d") is not None
    assert plan("time", Settings(), ServerConfig(command="x", sandbox=True), None, data_dir="/d") is not None
    # A server's own `false` wins over the global switch.
    assert plan("time", Settings(sandbox=True), ServerConfig(command="x", sandbox=False), None, data_dir="/d") is None


def test_always_on_for_a_tenants_server_and_never_for_a_remote_one() -> None:
    off = ServerConfig(command="x", sandbox=False)
    assert plan("alice/x", Settings(), off, TenantConfig(servers=["x"]), data_dir="/d") is not None
    assert plan("alice/r", Settings(sandbox=True), REMOTE, TenantConfig(servers=["r"]), data_dir="/d") is None


def test_defaults_and_the_tenants_limits_win() -> None:
    base = plan("alice/x", Settings(), STDIO, TenantConfig(), data_dir="/d")
    assert base is not None and (base.memory_mb, base.max_processes, base.network) == (1024, 256, True)
    server = ServerConfig(command="x", sandbox=SandboxConfig(memory_mb=512, network=False, cpu=0.5))
    tenant = TenantConfig(sandbox=SandboxConfig(memory_mb=256, max_processes=32))
    merged = plan("alice/x", Settings(), server, tenant, data_dir="/d")
    assert merged is not None
    assert (merged.memory_mb, merged.max_processes, merged.network, merged.cpu) == (256, 32, False, 0.5)


def test_tenant_templates_expand_only_for_tenants() -> None:
    server = ServerConfig(command="x", sandbox=SandboxConfig(rw=["/srv/teams/{tenant}"], ro=["/srv/shared"]))
    tenant = TenantConfig(sandbox=SandboxConfig(ro=["/srv/docs/{tenant}"]))
    alice = plan("alice/x", Settings(), server, tenant, data_dir="/d")
    assert alice is not None
    assert alice.rw == ("/srv/teams/alice",) and alice.ro == ("/srv/shared", "/srv/docs/alice")
    plain = plan("x", Settings(), server, None, data_dir="/d")
    assert plain is not None and plain.rw == () and plain.ro == ("/srv/shared",)


def test_binds_must_be_absolute_without_dot_dot() -> None:
    for bad in ("relative/path", "/srv/../etc", "/srv/{tenant}/../x"):
        with pytest.raises(msgspec.ValidationError, match="absolute path"):
            msgspec.convert({"command": "x", "sandbox": {"ro": [bad]}}, ServerConfig)


def test_homes_of_tenants_and_servers_never_nest() -> None:
    assert home_dir("/d", "alice") == "/d/sandboxes/servers/alice"
    assert home_dir("/d", "alice/shell") == "/d/sandboxes/tenants/alice/shell"


def test_binds_into_hidden_paths_are_refused() -> None:
    sandbox = plan("x", Settings(sandbox=True), STDIO, None, data_dir="/d", hidden=["/var/lib/mcpvisor", "/run/s/t"])
    assert sandbox is not None
    assert refused_bind("/var/lib/mcpvisor/logs", sandbox) is not None
    assert refused_bind("/var/lib/mcpvisor", sandbox) is not None
    assert refused_bind("/run/s/t", sandbox) is not None
    assert refused_bind("/var/lib/mcpvisor-other", sandbox) is None
    assert refused_bind("/var", sandbox) is None  # covers it: the hidden path is masked inside


def test_uids_are_unprivileged_stable_and_inside_the_map() -> None:
    uid = sandbox_uid("alice/shell")
    assert uid >= UID_FLOOR and uid == sandbox_uid("alice/shell") and uid != sandbox_uid("bob/shell")
    # A rootless container maps 65536 ids: the uid stays inside them, away from the low ones.
    narrow = sandbox_uid("alice/shell", [(0, 1), (1, 65536)])
    assert 32768 <= narrow < 65537


def test_describe_says_what_it_allows() -> None:
    shown = describe(plan("alice/x", Settings(), STDIO, TenantConfig(), data_dir="/d"))
    assert shown["enabled"] is True and shown["memory_mb"] == 1024 and "the data dir" in shown["never"]
    assert describe(None) == {"enabled": False}
