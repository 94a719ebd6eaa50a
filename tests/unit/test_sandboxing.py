"""Which upstreams get a sandbox and what it allows: the config's layers merged, without processes."""

from __future__ import annotations

import msgspec
import pytest

from mcpvisor.wire.config import SandboxConfig, ServerConfig, Settings, TenantConfig
from mcpvisor.wire.sandboxing import describe, home_dir, plan, refused_bind, writable_places

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
    assert base is not None
    # A tenant's: its own outbound network, one core, a 1 GiB home, limits by the kernel.
    assert (base.memory_mb, base.max_processes, base.network, base.cpu, base.home_mb, base.limits) == (
        1024,
        256,
        "outbound",
        1.0,
        1024,
        "cgroup",
    )
    server = ServerConfig(command="x", sandbox=SandboxConfig(memory_mb=512, network=False, cpu=0.5))
    tenant = TenantConfig(sandbox=SandboxConfig(memory_mb=256, max_processes=32))
    merged = plan("alice/x", Settings(), server, tenant, data_dir="/d")
    assert merged is not None
    assert (merged.memory_mb, merged.max_processes, merged.network, merged.cpu) == (256, 32, "none", 0.5)


def test_a_workstations_sandbox_keeps_the_hosts_network_unless_asked() -> None:
    plain = plan("x", Settings(sandbox=True), STDIO, None, data_dir="/d")
    assert plain is not None
    assert (plain.network, plain.cpu, plain.home_mb, plain.limits) == ("host", None, None, "auto")
    for value, network in ((True, "outbound"), ("outbound", "outbound"), ("host", "host"), (False, "none")):
        chosen = plan("x", Settings(sandbox=SandboxConfig(network=value)), STDIO, None, data_dir="/d")
        assert chosen is not None and chosen.network == network
    # The operator opts a tenant into the host's network, or into the watchdog, explicitly.
    tenant = TenantConfig(sandbox=SandboxConfig(network="host", limits="watchdog", private_networks=True))
    opted = plan("alice/x", Settings(), STDIO, tenant, data_dir="/d")
    assert opted is not None and (opted.network, opted.limits, opted.private_networks) == ("host", "watchdog", True)


def test_every_writable_place_of_the_config_is_known_to_every_sandbox() -> None:
    settings = Settings(sandbox=SandboxConfig(rw=["/srv/all"]))
    servers = {"x": ServerConfig(command="x", sandbox=SandboxConfig(rw=["/srv/teams/{tenant}"])), "y": STDIO}
    tenants = {"alice": TenantConfig(servers=["x"], sandbox=SandboxConfig(rw=["/home/alice/work"]))}
    places = writable_places(settings, servers, tenants)
    assert places == ["/srv/all", "/srv/teams/{tenant}", "/home/alice/work"]
    # Bob's sandbox of `y` knows alice's places too: what she writes is never followed for him.
    bob = plan("bob/y", settings, STDIO, TenantConfig(servers=["y"]), data_dir="/d", writable=places)
    assert bob is not None and set(places) | {"/d/sandboxes"} == set(bob.writable)


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


def test_describe_says_what_it_allows() -> None:
    shown = describe(plan("alice/x", Settings(), STDIO, TenantConfig(), data_dir="/d"), ["/srv/x: refused"])
    assert shown["enabled"] is True and shown["memory_mb"] == 1024 and "the data dir" in shown["never"]
    assert str(shown["network"]).startswith("its own, outbound only") and shown["refused"] == ["/srv/x: refused"]
    assert describe(None) == {"enabled": False}
