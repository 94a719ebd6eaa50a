"""Per-tenant secret references: filled from the tenant table, checked, and listed when missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from mcpvisor.wire.config import ServerConfig
from mcpvisor.wire.tenant_secrets import TenantSecretError, fill, for_tenant, missing_by_tenant, server_names_tenant


def test_the_tenant_is_filled_in_only_inside_references() -> None:
    server = ServerConfig(
        command="x",
        env={"KEY": "${file:/run/secrets/{tenant}/key}", "LABEL": "{tenant}", "BOTH": "a-${env:TOKEN_{tenant}}"},
        headers={"X-Api-Key": "${file:/s/{tenant}}"},
    )
    assert server_names_tenant(server)
    filled = for_tenant(server, "alice")
    assert filled.env == {"KEY": "${file:/run/secrets/alice/key}", "LABEL": "{tenant}", "BOTH": "a-${env:TOKEN_alice}"}
    assert filled.headers == {"X-Api-Key": "${file:/s/alice}"}
    assert for_tenant(server, "") is server  # the operators' worker: nothing is filled in
    plain = ServerConfig(command="x", env={"KEY": "${env:KEY}"})
    assert not server_names_tenant(plain) and for_tenant(plain, "alice") is plain


@pytest.mark.parametrize("name", ["../bob", "a/b", "", ".hidden", "x" * 70])
def test_a_name_that_is_not_a_tenant_name_is_refused(name: str) -> None:
    with pytest.raises(TenantSecretError):
        fill("${file:/s/{tenant}/k}", name)


def test_missing_secrets_are_listed_by_tenant_without_their_values(tmp_path: Path) -> None:
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "k").write_text("value-of-alice")
    servers = {
        "keyed": ServerConfig(command="x", env={"K": f"${{file:{tmp_path}/{{tenant}}/k}}"}),
        "envd": ServerConfig(command="x", env={"K": "${env:KEY_{tenant}}"}),
        "off": ServerConfig(command="x", enabled=False, env={"K": "${env:NONE_{tenant}}"}),
    }
    found = missing_by_tenant(servers, {"alice": ["keyed", "envd", "off"], "bob": ["keyed"]}, {"KEY_alice": "v"})
    assert found == [("bob", "keyed", f"${{file:{tmp_path}/bob/k}}")]
    assert "value-of-alice" not in str(found)


def test_check_lists_the_tenants_that_lack_their_secrets(tmp_path: Path) -> None:
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "api_key").write_text("k")
    config = tmp_path / "mcpvisor.toml"
    keyed = {"command": "true", "env": {"API_KEY": f"${{file:{tmp_path}/{{tenant}}/api_key}}"}}
    document = {
        "servers": {"keyed": keyed, "plain": {"command": "true"}},
        "tenants": {"alice": {"servers": ["keyed", "plain"]}, "bob": {"servers": ["keyed"]}},
    }
    config.write_text(tomli_w.dumps(document))
    result = subprocess.run(
        [sys.executable, "-P", "-m", "mcpvisor.supervisor", "check", "-c", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("tenant ")]
    assert lines == [f"tenant bob lacks ${{file:{tmp_path}/bob/api_key}} (server keyed): it waits for the operator"]
