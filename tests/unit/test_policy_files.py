"""The [policy] files as the supervisor reads them, and `mcpvisor policy test` and `check` on them, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcpvisor.supervisor import cli
from mcpvisor.supervisor.config import loads
from mcpvisor.supervisor.policy_files import load_policies, policy_warnings
from mcpvisor.wire.config import ConfigError

CONFIG = """\
[mcpvisor]
data_dir = "data"

[servers.echo]
command = "echo-server"

[servers.time]
command = "mcp-server-time"

[tenants.alice]
servers = ["echo"]

[tenants.bob]
servers = ["echo", "time"]

[policy]
files = ["policies.cedar"]
approval_timeout = 60

[[policy.limits]]
tools = "echo:add"
tenant = "alcie"
calls_per_minute = 2

[[policy.limits]]
tools = "tiem:*"
max_in_flight = 1
"""
POLICIES = """\
@id("baseline")
permit(principal, action, resource);

@id("alice-read-only")
@reason("alice may only read")
forbid(principal == Tenant::"alice", action == Action::"call", resource is Tool) unless { resource.read_only };

@id("destructive-waits")
@approval("operator")
permit(principal, action == Action::"call", resource is Tool) when { resource.destructive };

@id("repos")
forbid(principal, action == Action::"call", resource == Tool::"echo:touch")
unless { context.args has path && context.args.path like "/srv/*" };
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "policies.cedar").write_text(POLICIES)
    path = tmp_path / "mcpvisor.toml"
    path.write_text(CONFIG)
    return path


def run(*argv: str) -> int:
    args = cli.build_parser().parse_args(list(argv))
    return args.func(args)


def test_the_bundle_holds_the_files_text_and_the_table(config: Path) -> None:
    parsed = loads(config.read_text())
    bundle = load_policies(parsed, config)
    assert bundle is not None
    assert [source.path for source in bundle.sources] == ["policies.cedar"]
    assert bundle.sources[0].text == POLICIES
    assert bundle.config.approval_timeout == 60
    assert load_policies(loads("[servers.echo]\ncommand = 'x'\n"), config) is None  # no [policy]: nothing


def test_a_tenant_named_local_is_refused_with_policies(config: Path) -> None:
    parsed = loads(CONFIG.replace("[tenants.bob]", "[tenants.local]"))
    with pytest.raises(ConfigError, match="tenant 'local': with \\[policy\\]"):
        load_policies(parsed, config)


def test_a_missing_file_is_named(config: Path) -> None:
    (config.parent / "policies.cedar").unlink()
    with pytest.raises(ConfigError, match=r"policies\.cedar: cannot read the policy file: No such file"):
        load_policies(loads(config.read_text()), config)


def test_limits_need_a_limit() -> None:
    with pytest.raises(ConfigError, match="give calls_per_minute, max_in_flight or both"):
        loads('[policy]\n[[policy.limits]]\ntools = "a:*"\n')


def test_check_names_the_policies_and_warns_about_unknown_names(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("check", "-c", str(config)) == 0
    out = capsys.readouterr().out
    assert "policies: 4 in 1 files, enforce" in out
    assert "warning: [policy] limits[0]: tenant 'alcie' is not configured" in out
    assert "warning: [policy] limits[1]: tools 'tiem:*' names no configured server 'tiem'" in out
    bundle = load_policies(loads(config.read_text()), config)
    assert bundle is not None and len(policy_warnings(bundle, loads(config.read_text()), config.parent / "data")) == 2


def test_check_refuses_a_broken_file_with_its_line(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (config.parent / "policies.cedar").write_text(
        POLICIES + "\nforbid(principal, action, resource) when { resource.nope };\n"
    )
    assert run("check", "-c", str(config)) == 2
    assert "policies.cedar:16: attribute `nope`" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("tenant", "tool", "args", "effect", "policies"),
    [
        ("alice", "echo:add", "{}", "deny", ["alice-read-only"]),
        ("bob", "echo:add", "{}", "approval", ["destructive-waits"]),
        ("bob", "echo:touch", '{"path": "/etc/passwd"}', "deny", ["repos"]),
        ("local", "time:get_current_time", "{}", "approval", ["destructive-waits"]),
    ],
)
def test_policy_test_decides_offline(
    config: Path,
    capsys: pytest.CaptureFixture[str],
    tenant: str,
    tool: str,
    args: str,
    effect: str,
    policies: list[str],
) -> None:
    code = run("policy", "test", "-c", str(config), "--tenant", tenant, "--tool", tool, "--args", args, "--json")
    assert code == 0
    decided = json.loads(capsys.readouterr().out)
    assert (decided["decision"], decided["policies"]) == (effect, policies)
    assert any("no approved definition of this tool is stored" in note for note in decided["notes"])


def test_policy_test_with_annotations_expectations_and_list(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    read_only = '{"readOnlyHint": true}'
    assert (
        run(
            "policy",
            "test",
            "-c",
            str(config),
            "--tenant",
            "alice",
            "--tool",
            "echo:echo",
            "--annotations",
            read_only,
            "--expect",
            "allow",
        )
        == 0
    )
    assert capsys.readouterr().out.startswith("decision: allow\npolicies: baseline\n")
    assert run("policy", "test", "-c", str(config), "--tenant", "alice", "--tool", "echo:add", "--expect", "allow") == 1
    out = capsys.readouterr().out
    assert "because:  refused by policy 'alice-read-only': alice may only read" in out
    assert run("policy", "test", "-c", str(config), "--tenant", "alice", "--tool", "time:now", "--action", "list") == 0
    assert "not one of tenant 'alice'" in capsys.readouterr().out
    assert run("policy", "test", "-c", str(config), "--tenant", "carol", "--tool", "echo:add") == 4
    assert run("policy", "test", "-c", str(config), "--tool", "echo:add", "--args", "[1]") == 2
    assert run("policy", "test", "-c", str(config), "--tool", "nocolon") == 2
