"""code_execution's script process inside bubblewrap: even a script that escaped V8 reaches nothing.

V8 already gives a script no file system, network or process. These tests assume the worst, that a
script broke out of V8 and runs arbitrary code in the process: they run a Python probe in exactly
the bwrap argv and environment the frontend starts its script processes with, on a host laid out
as mcpvisor's (data dir, config, a secret file, the control socket, a TCP service on loopback),
and every attempt must be refused. They run as this machine's root (bwrap as root, the script as
an unprivileged uid) and as a container's unprivileged user (bwrap with a user namespace).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpvisor.frontend.tools.code_execution import Confinement, SandboxPool, execute_code
from mcpvisor.runtime import script_runner
from mcpvisor.supervisor import config as config_mod
from mcpvisor.supervisor.supervisor import hidden_paths
from tests.support.unprivileged import CONTAINER_UID, as_container_user, missing_tools

BWRAP = shutil.which("bwrap") or "bwrap"
BWRAP_REAL = Path(BWRAP).resolve()
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="system package missing: bubblewrap")

PROBE = r"""
import errno, json, os, signal, socket, sys

targets = json.loads(sys.argv[1])
seen = {}

def attempt(name, action):
    try:
        seen[name] = {"ok": True, "value": action()}
    except OSError as exc:
        seen[name] = {"ok": False, "errno": errno.errorcode.get(exc.errno, str(exc.errno))}

def read(path):
    with open(path, "rb") as f:
        return len(f.read())

def tcp(host, port):
    with socket.create_connection((host, port), timeout=3) as s:
        return s.recv(100).decode()

def unix(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        return "connected"

def write(path):
    with open(path, "w") as f:
        f.write("x")
    return "written"

for name, path in targets["read"].items():
    attempt("read " + name, lambda path=path: read(path))
for name, path in targets["list"].items():
    attempt("list " + name, lambda path=path: os.listdir(path))
attempt("tcp loopback service", lambda: tcp("127.0.0.1", targets["port"]))
attempt("tcp other host", lambda: tcp("192.0.2.1", 80))
attempt("unix control socket", lambda: unix(targets["socket"]))
attempt("signal host process", lambda: os.kill(targets["host_pid"], 0))
attempt("write prefix", lambda: write(os.path.join(targets["prefix"], "planted")))
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({
    "attempts": seen,
    "uid": os.getuid(),
    "cap_eff": status["CapEff"].strip(),
    "no_new_privs": status["NoNewPrivs"].strip(),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "interfaces": [name for _, name in socket.if_nameindex()],
    "env": sorted(os.environ),
    "root": sorted(os.listdir("/")),
}))
"""


class Host:
    """A host laid out as mcpvisor's: what a script must never reach."""

    def __init__(self, base: Path) -> None:
        self.config_dir = base / "etc-mcpvisor"
        self.config = self.config_dir / "mcpvisor.toml"
        self.data_dir = base / "data"
        self.runtime = base / "run"
        self.secret = base / "secrets" / "github_token"
        self.admin_token = base / "secrets" / "admin_token"
        for directory in (self.config_dir, self.data_dir / "logs", self.runtime, self.secret.parent):
            directory.mkdir(parents=True)
        reference = "${file:" + str(self.secret) + "}"
        self.config.write_text(
            f'[mcpvisor]\nadmin_token_files = ["{self.admin_token}"]\n'
            f'[servers.gh]\ncommand = "gh-mcp"\nenv = {{ T = "{reference}" }}\n'
        )
        (self.data_dir / "state.sqlite").write_text("tokens and approvals")
        (self.data_dir / "logs" / "supervisor.log").write_text("log lines")
        self.secret.write_text("ghp_not-for-scripts")
        self.admin_token.write_text("mcpv_admin-not-for-scripts")
        for path in (self.config, self.data_dir / "state.sqlite", self.secret, self.admin_token):
            path.chmod(0o644)  # readable by anyone: only the sandbox may keep a script away from them
        self.control = socket.socket(socket.AF_UNIX)
        self.control.bind(str(self.runtime / "control.sock"))
        self.control.listen()
        self.service = socket.socket()
        self.service.bind(("127.0.0.1", 0))
        self.service.listen()

    def hidden(self) -> list[str]:
        # What the supervisor hands the frontend (FrontendSpec.hidden) for this host's config.
        return hidden_paths(config_mod.load(self.config), self.config, self.data_dir, self.runtime)

    def targets(self) -> dict:
        return {
            "read": {
                "config": str(self.config),
                "state store": str(self.data_dir / "state.sqlite"),
                "secret file": str(self.secret),
                "admin token": str(self.admin_token),
                "passwd": "/etc/passwd",
                "the caller's environ": f"/proc/{os.getpid()}/environ",
            },
            "list": {"data dir": str(self.data_dir), "runtime dir": str(self.runtime), "homes": "/home", "var": "/var"},
            "port": self.service.getsockname()[1],
            "socket": str(self.runtime / "control.sock"),
            "host_pid": os.getpid(),
            "prefix": sys.prefix,
        }

    def close(self) -> None:
        self.control.close()
        self.service.close()


@pytest.fixture
def host() -> Iterator[Host]:
    # Under /tmp and open to every user, so that only the sandbox stands between a script and it.
    base = Path(tempfile.mkdtemp(prefix="mcpvisor-host-"))
    base.chmod(0o755)
    laid_out = Host(base)
    try:
        yield laid_out
    finally:
        laid_out.close()
        shutil.rmtree(base, ignore_errors=True)


def check_refused(seen: dict, *, container_user: bool) -> None:
    attempts = seen["attempts"]
    opened = {name: attempt for name, attempt in attempts.items() if attempt["ok"]}
    assert opened == {}, f"reached from the script process: {opened}"
    # Not there at all, rather than merely unreadable: the sandbox shows no file of the host.
    for name in ("config", "state store", "secret file", "admin token", "passwd", "the caller's environ"):
        assert attempts[f"read {name}"]["errno"] == "ENOENT", name
    for name in ("data dir", "runtime dir", "homes", "var"):
        assert attempts[f"list {name}"]["errno"] == "ENOENT", name
    # Its own network namespace: the host's loopback service is not on its loopback.
    assert attempts["tcp loopback service"]["errno"] == "ECONNREFUSED"
    assert attempts["tcp other host"]["errno"] == "ENETUNREACH"
    assert attempts["unix control socket"]["errno"] == "ENOENT"
    # Its own PID namespace: the caller's pid is no process there (or another, unrelated one).
    assert attempts["signal host process"]["errno"] in ("ESRCH", "EPERM")
    assert attempts["write prefix"]["errno"] == "EROFS"
    assert seen["cap_eff"] == "0000000000000000"
    assert seen["no_new_privs"] == "1"
    assert seen["uid"] != 0
    if container_user:
        assert seen["uid"] == CONTAINER_UID  # a user namespace maps the user to itself
    assert max(seen["pids"]) < 10  # bwrap's init and the probe: no process of the host
    assert seen["interfaces"] == ["lo"]
    # Nothing of mcpvisor's environment: what it was given, bwrap's PWD, and the LC_CTYPE that
    # Python itself sets when the locale is C (PEP 538).
    assert set(seen["env"]) <= {"PATH", "PWD", "PYTHONPATH", "LC_CTYPE"} and "PATH" in seen["env"]
    assert "etc" not in seen["root"] and "var" not in seen["root"] and "home" not in seen["root"]


def probe_command(host: Host) -> list[str]:
    return [sys.executable, "-c", PROBE, json.dumps(host.targets())]


def test_a_script_that_escaped_v8_reaches_nothing_of_the_host(host: Host) -> None:
    decision = script_runner.decide(sys.executable, host.hidden(), required=True)
    assert decision.confined and decision.warning is None
    argv = decision.argv(probe_command(host))
    assert argv[0].endswith("bwrap")
    done = subprocess.run(
        argv, env=script_runner.environment(sys.executable), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    check_refused(json.loads(done.stdout), container_user=False)


DRIVER = r"""
import json, sys
from mcpvisor.supervisor import config as config_mod
from mcpvisor.supervisor.supervisor import hidden_paths
from mcpvisor.runtime import script_runner
hidden, command = json.loads(sys.argv[1]), json.loads(sys.argv[2])
decision = script_runner.decide(sys.executable, hidden, required=True)
print(json.dumps({"privileged": decision.privileged, "warning": decision.warning,
                  "argv": decision.argv(command), "env": script_runner.environment(sys.executable)}))
"""


@pytest.mark.skipif(missing_tools() is not None, reason=missing_tools() or "")
def test_as_a_containers_unprivileged_user_too(host: Host, tmp_path: Path) -> None:
    # The decision and the argv are made by the unprivileged user itself, as in the container.
    made = as_container_user(
        [sys.executable, "-c", DRIVER, json.dumps(host.hidden()), json.dumps(probe_command(host))], tmp_path
    )
    done = subprocess.run(made, env={"PATH": os.defpath}, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["privileged"] is False and plan["warning"] is None
    assert "--unshare-user" in plan["argv"]
    run = as_container_user(plan["argv"], tmp_path)
    done = subprocess.run(run, env=plan["env"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    check_refused(json.loads(done.stdout), container_user=True)


def inside_process(bwrap_pid: int) -> dict[str, object]:
    """What the host sees of the interpreter bwrap started: its status, environment and namespaces."""
    found, queue = [], [bwrap_pid]
    while queue:
        current = queue.pop()
        for task in Path(f"/proc/{current}/task").iterdir():
            children = [int(child) for child in (task / "children").read_text().split()]
            found += children
            queue += children
    # bwrap's own init inside shares its command line; the interpreter is the one that is not bwrap.
    inner = [pid for pid in found if Path(f"/proc/{pid}/exe").resolve() != BWRAP_REAL]
    assert len(inner) == 1, inner
    pid = inner[0]
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {
        "exe": Path(f"/proc/{bwrap_pid}/exe").resolve(),
        "cmdline": Path(f"/proc/{pid}/cmdline").read_text().split("\0"),
        "status": {key: value.strip() for key, value in status.items()},
        "environ": Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")[:-1],
        "ns": {name: os.readlink(f"/proc/{pid}/ns/{name}") for name in ("net", "pid", "mnt", "ipc", "uts")},
    }


async def test_the_pools_script_processes_run_in_that_sandbox(host: Host) -> None:
    pool = SandboxPool(size=1, heap_mb=64, confinement=Confinement(required=True, hidden=tuple(host.hidden())))
    try:

        async def answer(server: str, tool: str, args: dict, intent: dict | None) -> tuple[bool, dict]:
            return True, {"content": [{"type": "text", "text": "ok"}]}

        outcome = await execute_code({"code": "call_tool('a', 'b', {}).ok"}, answer, pool=pool)
        assert not outcome.is_error, outcome.text
        assert outcome.data["value"] is True
        # The process the pool holds is bwrap; the interpreter running V8 is inside it.
        seen = inside_process(pool._idle[0].pid)
        assert seen["exe"] == BWRAP_REAL
        assert "mcpvisor.workers.sandbox" in seen["cmdline"]
        status = seen["status"]
        assert status["NoNewPrivs"] == "1" and status["CapEff"] == "0000000000000000"
        # The filter every upstream's sandbox has (runtime.seccomp), loaded by bwrap.
        assert status["Seccomp"] == "2" and int(status["Seccomp_filters"]) >= 1
        assert status["Uid"].split()[0] != "0"
        expected_env = script_runner.environment(sys.executable)
        assert seen["environ"] == [f"{key}={value}".encode() for key, value in expected_env.items()] + [b"PWD=/"]
        for name, namespace in seen["ns"].items():
            assert namespace != os.readlink(f"/proc/self/ns/{name}"), name
    finally:
        await pool.aclose()


async def test_a_required_sandbox_that_cannot_be_built_refuses_scripts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # No bwrap on the PATH: with tenants (required) nothing runs, and the client learns no host detail.
    monkeypatch.setenv("PATH", str(tmp_path))
    required = SandboxPool(size=1, heap_mb=64, confinement=Confinement(required=True, hidden=(str(tmp_path),)))
    outcome = await execute_code({"code": "1"}, _no_calls, pool=required)
    await required.aclose()
    assert outcome.is_error
    error = outcome.data["error"]
    assert error["code"] == "SANDBOX_UNAVAILABLE"
    assert "sandbox cannot be built" in error["message"] and "/" not in error["message"]
    decision = await required.decision()
    assert decision is not None and decision.refused and required.started == 0
    assert decision.warning is not None and "install bubblewrap" in decision.warning
    # On a workstation (not required) the script runs in V8 alone, and the log says why.
    preferred = SandboxPool(size=1, heap_mb=64, confinement=Confinement(hidden=(str(tmp_path), "x")))
    try:
        outcome = await execute_code({"code": "6 * 7"}, _no_calls, pool=preferred)
        assert outcome.data["value"] == 42
        decision = await preferred.decision()
        assert decision is not None and not decision.confined and not decision.refused
        assert decision.warning is not None and decision.warning.startswith("code_execution runs in V8 alone")
    finally:
        await preferred.aclose()


async def _no_calls(server: str, tool: str, args: dict, intent: dict | None) -> tuple[bool, dict]:
    raise AssertionError("no call expected")


def mcpvisor_check(config: Path, path: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mcpvisor.supervisor", "check", "-c", str(config)]
    env = {"PATH": path, "HOME": str(config.parent), "XDG_DATA_HOME": str(config.parent / "data")}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_mcpvisor_check_says_whether_scripts_can_be_sandboxed(tmp_path: Path) -> None:
    workstation = tmp_path / "workstation.toml"
    workstation.write_text('[mcpvisor]\nenable_code_execution = true\n[servers.time]\ncommand = "mcp-server-time"\n')
    # Tenants whose only server is remote: no upstream process needs a sandbox, code_execution does.
    hosted = tmp_path / "hosted.toml"
    hosted.write_text(
        '[mcpvisor]\nenable_code_execution = true\n[servers.remote]\nurl = "https://example.com/mcp"\n'
        '[tenants.alice]\nservers = ["remote"]\n'
    )
    without_bwrap = str(tmp_path / "empty")
    # Here bwrap works: nothing to say.
    for config in (workstation, hosted):
        done = mcpvisor_check(config, os.defpath)
        assert done.returncode == 0 and done.stderr == "", done.stderr
    # Without bwrap, tenants make the sandbox required: the check fails and names the fix.
    done = mcpvisor_check(hosted, without_bwrap)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "mcpvisor: code_execution is refused: its sandbox cannot be built here: bwrap is not installed:"
        " install bubblewrap (apt-get install bubblewrap, dnf install bubblewrap)"
    )
    # On a workstation the scripts would run in V8 alone: a warning, not a failure.
    done = mcpvisor_check(workstation, without_bwrap)
    assert done.returncode == 0
    assert done.stderr.startswith("mcpvisor: code_execution runs in V8 alone, without its bubblewrap sandbox")
