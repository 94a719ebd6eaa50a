"""Tenants' upstreams in sandboxes, tried as an attacker would: a two-tenant host with default settings.

Alice's team has a workspace shell (tests/upstreams/shell_server.py), driven here as a
prompt-injected agent would drive it, with only alice's token. Bob has a vault server whose
token comes from a `${file:}` secret. Every attempt of the attack table is made from inside
alice's sandbox, and each must be refused; bob's server must keep running throughout.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import tomli_w
import trio

from mcpvisor.runtime.logs import log_stem
from tests.e2e.test_tenants import Modern, add_token
from tests.support.stack import Stack, descendants, echo_server, open_stack, python_server

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="system package missing: bubblewrap")


@dataclass
class Host:
    stack: Stack
    alice: Modern
    bob: Modern
    admin_token: str
    bob_token: str
    vault_secret: str
    files: dict[str, Path]


@asynccontextmanager
async def two_tenants(tmp_path: Path, *, settings: dict[str, Any] | None = None) -> AsyncIterator[Host]:
    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir()
    admin_token, bob_token, vault_secret = (secrets.token_urlsafe(24) for _ in range(3))
    files = {"admin": secret_dir / "admin.token", "bob": secret_dir / "bob.token", "vault": secret_dir / "vault.key"}
    for name, value in (("admin", admin_token), ("bob", bob_token), ("vault", vault_secret)):
        files[name].write_text(value + "\n")
        files[name].chmod(0o600)
    servers = {
        "shell": python_server("shell_server.py"),
        "vault": echo_server("vault", env={"VAULT_TOKEN": f"${{file:{files['vault']}}}"}),
    }
    tenants = {
        "alice": {"servers": ["shell"]},
        "bob": {"servers": ["vault"], "token_files": [str(files["bob"])]},
    }
    all_settings = {"admin_token_files": [str(files["admin"])], **(settings or {})}
    config = tmp_path / "mcpvisor.toml"
    config.write_text(
        tomli_w.dumps(
            {"mcpvisor": {"data_dir": str(tmp_path / "data"), **all_settings}, "servers": servers, "tenants": tenants}
        )
    )
    alice_token = add_token(config, "alice")
    async with (
        open_stack(tmp_path, servers, settings=all_settings, wait_for=[], tables={"tenants": tenants}) as stack,
        httpx2.AsyncClient(timeout=90) as http,
    ):
        alice, bob = Modern(http, stack.base_url, alice_token), Modern(http, stack.base_url, bob_token)
        # Each tenant's first request starts its sandboxed worker; a loaded machine may take a while.
        await alice.wait_tools("shell:run", timeout=120)
        await bob.wait_tools("vault:echo", timeout=120)
        yield Host(stack, alice, bob, admin_token, bob_token, vault_secret, files)


async def shell(host: Host, command: str) -> str:
    answer = await host.alice.call("shell:run", {"command": command})
    assert "result" in answer, answer
    return answer["result"]["content"][0]["text"]


def upstream_pid(stack: Stack, worker: str, script: str) -> int:
    """The host pid of the program a worker runs in its sandbox (bwrap's are its parents)."""
    for pid in sorted(descendants(stack.status()[worker]["pid"])):
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read().split(b"\0")
        if b"bwrap" not in argv[0] and any(script.encode() in arg for arg in argv):
            return pid
    raise AssertionError(f"{worker} runs no {script}")


@pytest.mark.trio
async def test_every_attempt_of_the_attack_table_is_refused(tmp_path: Path) -> None:
    async with two_tenants(tmp_path) as host:
        stack = host.stack
        data_dir, run_dir = stack.data_dir, stack.run_dir
        bob_pid = upstream_pid(stack, "bob/vault", "echo_server.py")
        secrets_seen = (host.admin_token, host.bob_token, host.vault_secret)
        table: dict[str, str] = {}

        table["read the admin token file"] = await shell(host, f"cat {host.files['admin']}")
        table["read bob's token file"] = await shell(host, f"cat {host.files['bob']}")
        table["read bob's ${file:} secret"] = await shell(host, f"cat {host.files['vault']}")
        table["read bob's upstream's environ"] = await shell(
            host, f"cat /proc/{bob_pid}/environ; cat /proc/*/environ | tr '\\0' '\\n' | grep -a VAULT"
        )
        table["list the data dir"] = await shell(host, f"ls -la {data_dir} {data_dir}/logs; ls {data_dir}/..")
        table["find the control socket"] = await shell(
            host, f"ls -la {run_dir}; cat /proc/*/environ | tr '\\0' '\\n' | grep -a -i -E 'mcpvisor|runtime'"
        )
        ctl = f"{sys.executable} -P -m mcpvisor.supervisor ctl -c {stack.config_path}"
        table["ctl status"] = await shell(host, f"{ctl} status; {ctl} stop bob/vault")
        table["ctl over zmq by hand"] = await shell(
            host,
            f'{sys.executable} -c "import zmq; s = zmq.Context().socket(zmq.DEALER); '
            f"s.setsockopt(zmq.SNDTIMEO, 2000); s.setsockopt(zmq.RCVTIMEO, 2000); "
            f"s.connect('ipc://{run_dir}/control.sock'); s.send(b'x'); print(s.recv())\"",
        )
        table["see bob's processes"] = await shell(host, "ps -eo pid,user,args")
        table["signal bob's processes"] = await shell(host, f"kill -9 {bob_pid}; kill -TERM {bob_pid - 1}; echo done")
        for attempt, output in table.items():
            print(f"--- {attempt}:\n{output.strip()[:600]}")  # the table, for `pytest -s`
            for secret in secrets_seen:
                assert secret not in output, attempt

        assert "No such file" in table["read the admin token file"]
        assert "No such file" in table["read bob's token file"]
        assert "No such file" in table["read bob's ${file:} secret"]
        assert "VAULT" not in table["read bob's upstream's environ"].split("stderr:")[0]
        assert "No such file" in table["list the data dir"] and "state.sqlite" not in table["list the data dir"]
        assert "control.sock" not in table["find the control socket"].split("stderr:")[0]
        assert "exit: 0" not in table["ctl status"] and "RUNNING" not in table["ctl status"]
        assert "exit: 0" not in table["ctl over zmq by hand"]
        listing = table["see bob's processes"].split("stderr:")[0].splitlines()[3:]
        assert listing and not any("vault" in line or "echo_server" in line for line in listing), listing
        assert all(int(line.split()[0]) < 100 for line in listing if line.strip())
        assert "No such process" in table["signal bob's processes"]

        # Bob's server lived through all of it, untouched, and answers him.
        assert Path(f"/proc/{bob_pid}").exists()  # noqa: ASYNC240
        assert stack.status()["bob/vault"]["state"] == "RUNNING"
        echoed = await host.bob.call("vault:echo", {"text": "still here"})
        assert "still here" in str(echoed["result"])
        # Alice's shell has the home the sandbox gives it, and it persists.
        assert "exit: 0" in await shell(host, "echo kept > $HOME/note && cat $HOME/note")
        homes = data_dir / "sandboxes" / "tenants"
        assert (homes / "alice" / "shell" / "note").read_text() == "kept\n"
        assert not (homes / "bob" / "vault" / "note").exists()


@pytest.mark.trio
async def test_a_tenant_that_takes_too_much_memory_is_killed_and_restarted(tmp_path: Path) -> None:
    async with two_tenants(tmp_path) as host:
        stack = host.stack
        before = upstream_pid(stack, "alice/shell", "shell_server.py")
        answer = await host.alice.call("shell:allocate", {"mib": 1536})
        text = str(answer)
        # The client's call fails, and says why.
        assert "result" not in answer or answer["result"].get("isError"), answer
        assert "memory limit (1024 MiB)" in text, text
        assert "memory limit" in stack.log(f"{log_stem('alice/shell')}.worker.log")
        # Restarted by policy: alice's shell answers again, in a new process.
        with trio.fail_after(120):
            while True:
                retry = await host.alice.call("shell:run", {"command": "echo back"})
                if "result" in retry and not retry["result"].get("isError"):
                    break
                await trio.sleep(0.5)
        assert upstream_pid(stack, "alice/shell", "shell_server.py") != before
        # Bob never noticed.
        assert stack.status()["bob/vault"]["state"] == "RUNNING"


@pytest.mark.trio
async def test_no_network_means_loopback_only(tmp_path: Path) -> None:
    async with two_tenants(tmp_path, settings={"sandbox": {"network": False}}) as host:
        out = await shell(host, "cat /proc/net/dev | tail -n +3 | cut -d: -f1")
        assert out.split("stdout:\n")[1].split("stderr:")[0].split() == ["lo"]
        # `ctl inspect` shows the operator what each sandbox of the server allows.
        code, shown = await host.stack.actl("inspect", "shell")
        assert code == 0, shown
        alice = shown["sandboxes"]["alice/shell"]
        assert alice["enabled"] is True and alice["network"] == "none (loopback only)"
        assert (alice["memory_mb"], alice["max_processes"]) == (1024, 256)
        code, text = await host.stack.actl("inspect", "shell", json_output=False)
        assert "sandbox (alice/shell):" in text and "1024 MiB, 256 processes" in text
        # The admin API (and the console's server page, which shows it) says the same.
        response = await host.alice.http.get(
            f"{host.stack.base_url}/api/v1/servers/shell", headers={"Authorization": f"Bearer {host.admin_token}"}
        )
        assert response.status_code == 200, response.text
        assert response.json()["sandboxes"]["alice/shell"]["network"] == "none (loopback only)"


def test_check_names_the_fix_when_bwrap_is_missing(tmp_path: Path) -> None:
    config = tmp_path / "mcpvisor.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "mcpvisor": {"data_dir": str(tmp_path / "data"), "sandbox": True},
                "servers": {"time": {"command": "true"}},
            }
        )
    )
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    done = subprocess.run(
        [sys.executable, "-P", "-m", "mcpvisor.supervisor", "check", "-c", str(config)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode != 0
    assert re.search(r"bubblewrap", done.stdout + done.stderr), done.stdout + done.stderr
