"""The sandbox's second attacker's pass: each hole of the table tried from inside tenant alice's shell.

A host with two tenants: alice's workspace shell (tests/upstreams/shell_server.py, a tool that runs
any command) and bob's vault. Every row of the table is tried from inside alice's sandbox, as a
prompt-injected agent with only alice's token would, once with mcpvisor as root (a cgroup, a uid
per sandbox) and once as a container's unprivileged user (no writable cgroup, so the operator opts
into the watchdog; tests/support/unprivileged.py). Each attempt must be refused.

| row | attempt |
| --- | --- |
| H1 | a symlink planted in a writable place redirects a bind of another sandbox on its next start |
| H2 | the kernel keyrings: read mcpvisor's, add to the session's |
| H3 | fill the home, the volume of the state and logs, and stop the activity log |
| H4 | memory no RSS shows: an unmapped memfd, SysV shm in slices, a tmpfs in a nested namespace |
| H5 | another worker's uid |
| H6 | an `ro` bind nested in an `rw` one |
| H7 | the host's loopback services, its other addresses, link-local, abstract sockets, /proc/net |
| H8 | more threads than max_processes |
| L1 | nested user namespaces, io_uring, keyctl, userfaultfd |
| L2 | CPU beyond one core; sandboxes/ dirs; cgroups left behind |
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pyseccomp
import pytest
import trio

from tests.e2e.test_tenants import Modern, add_token
from tests.e2e.test_upstream_sandbox import upstream_pid
from tests.support import internet
from tests.support.stack import Stack, echo_server, free_port, python_server, stop_stack, write_config
from tests.support.unprivileged import CONTAINER_UID, as_container_user, missing_tools

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.trio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="system package missing: bubblewrap"),
    pytest.mark.skipif(shutil.which("pasta") is None, reason="system package missing: passt"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: to run mcpvisor as root and as another user"),
]
MODES = [pytest.param(False, id="as-root"), pytest.param(True, id="as-an-ordinary-user")]


@dataclass
class Host:
    stack: Stack
    clients: dict[str, Modern]
    base: Path
    user: bool

    async def shell(self, command: str, *, tenant: str = "alice", server: str = "shell") -> str:
        answer = await self.clients[tenant].call(f"{server}:run", {"command": command, "timeout": 60})
        assert "result" in answer, answer
        return answer["result"]["content"][0]["text"]

    async def python(self, code: str, *args: str) -> Any:
        """Run `code` with the shell server's own Python inside alice's sandbox; its last stdout line as JSON."""
        quoted = " ".join("'" + part.replace("'", "'\\''") + "'" for part in (code, *args))
        text = await self.shell(f"{sys.executable} -c {quoted}")
        out = text.split("stdout:\n", 1)[1].split("\nstderr:", 1)[0].strip()
        assert out, text
        return json.loads(out.splitlines()[-1])


@asynccontextmanager
async def tenant_host(
    *,
    user: bool,
    servers: dict[str, Any] | None = None,
    tenants: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
    base: Path | None = None,
) -> AsyncIterator[Host]:
    """mcpvisor serving alice and bob, as root or as CONTAINER_UID; stopped and removed afterwards."""
    if user and missing_tools() is not None:
        pytest.skip(missing_tools() or "")
    own_base = base is None
    base = base or Path(tempfile.mkdtemp(prefix="second-pass-", dir="/tmp"))
    base.chmod(0o755)
    data, run = base / "data", base / "run"
    for path in (data, run):
        path.mkdir(exist_ok=True)
    port = free_port()
    shell = python_server("shell_server.py")
    servers = servers or {"shell": shell, "vault": echo_server("vault")}
    tenants = tenants or {"alice": {"servers": ["shell"]}, "bob": {"servers": ["vault"]}}
    config = base / "mcpvisor.toml"
    all_settings = {"listen": f"127.0.0.1:{port}", "enable_direct_endpoint": True, "data_dir": str(data)}
    if user:
        # No cgroup is writable for that user here: the operator accepts the watchdog, in so many words.
        all_settings["sandbox"] = {"limits": "watchdog"}
    all_settings.update(settings or {})
    write_config(config, servers, all_settings, {"tenants": tenants})
    tokens = {tenant: add_token(config, tenant) for tenant in tenants}
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(base),
        "LANG": "C.UTF-8",
        "XDG_RUNTIME_DIR": str(run),
    }
    argv = [sys.executable, "-P", "-m", "mcpvisor.supervisor", "serve", "-c", str(config)]
    stash = Path(tempfile.mkdtemp(prefix="stash-", dir="/tmp"))
    if user:
        for directory, dirs, files in os.walk(base):
            for name in [".", *dirs, *files]:
                os.lchown(os.path.join(directory, name), CONTAINER_UID, CONTAINER_UID)
        argv = as_container_user(argv, stash, readable=[REPO, base])
    with open(base / "supervisor.out", "ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=out, env=env, start_new_session=True)
    stack = Stack(process, config, data, run / "mcpvisor", port, env)
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            await stack.wait_ready([], timeout=120)
            clients = {tenant: Modern(http, stack.base_url, token) for tenant, token in tokens.items()}
            yield Host(stack, clients, base, user)
    finally:
        await stop_stack(stack)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(stash, ignore_errors=True)
        if own_base:
            shutil.rmtree(base, ignore_errors=True)


def syscall(name: str) -> int:
    return pyseccomp.resolve_syscall(pyseccomp.system_arch(), name)


ATTACK = r"""
import ctypes, errno, json, os, socket, sys, threading, urllib.request
t = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(name, *args):
    ctypes.set_errno(0)
    result = libc.syscall(t["calls"][name], *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return "ok" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
def attempt(action):
    try:
        return action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))
def tcp(host, port):
    with socket.create_connection((host, port), timeout=3):
        return "connected"
def abstract(name):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect("\0" + name)
        return "connected"
def fetch(url):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()
def read(path):
    with open(path) as f:
        return f.read()
seen = {}
# H2: keyrings
seen["keyctl @s"] = call("keyctl", 0, -3, 0)
seen["add_key @s"] = call("add_key", b"user", b"planted", b"x", 1, -3)
seen["/proc/keys"] = attempt(lambda: read("/proc/keys"))
# L1
seen["unshare user"] = call("unshare", 0x10000000)
seen["clone user"] = call("clone", 0x10000000 | 17, 0, 0, 0, 0)
seen["io_uring_setup"] = call("io_uring_setup", 1, ctypes.create_string_buffer(120))
seen["userfaultfd user-mode"] = call("userfaultfd", 1)
seen["bpf"] = call("bpf", 0, 0, 0)
seen["perf_event_open"] = call("perf_event_open", 0, 0, -1, -1, 0)
# H7
seen["tcp"] = {name: attempt(lambda h=h, p=p: tcp(h, p)) for name, (h, p) in t["tcp"].items()}
seen["abstract socket"] = attempt(lambda: abstract(t["abstract"]))
seen["/proc/net/tcp"] = attempt(lambda: read("/proc/net/tcp") + read("/proc/net/tcp6"))
seen["/proc/net/unix"] = attempt(lambda: read("/proc/net/unix"))
seen["internet"] = attempt(lambda: fetch(t["internet"])) if t["internet"] else "none"
# H8
held = []
try:
    for _ in range(t["threads"]):
        thread = threading.Thread(target=threading.Event().wait, daemon=True)
        thread.start()
        held.append(thread)
except RuntimeError:
    pass
seen["threads"] = len(held)
# Held: remounts, sysrq, /sys, a terminal to type into, its own uid
seen["remount /usr"] = call("mount", b"none", b"/usr", None, 0x20 | 0x1000, None)
seen["sysrq"] = attempt(lambda: open("/proc/sysrq-trigger", "w").write("h"))
seen["/sys"] = os.path.exists("/sys/kernel")
seen["TIOCSTI"] = call("ioctl", 0, 0x5412, ctypes.c_char_p(b"x"))
seen["uid"] = os.getuid()
print(json.dumps(seen))
"""


@pytest.mark.parametrize("user", MODES)
async def test_the_second_attack_table_is_refused(user: bool) -> None:
    if internet.missing() is not None:
        pytest.skip(internet.missing() or "")
    # What lies on the host: a service on its loopback (bob's upstream, a database), an abstract
    # socket, and a key in the session keyring mcpvisor is started with.
    service = socket.socket()
    service.bind(("0.0.0.0", 0))
    service.listen()
    port = service.getsockname()[1]
    hidden_socket = socket.socket(socket.AF_UNIX)
    abstract = f"mcpvisor-host-{secrets.token_hex(4)}"
    hidden_socket.bind("\0" + abstract)
    hidden_socket.listen()
    libc = ctypes.CDLL(None, use_errno=True)
    key_secret = secrets.token_hex(12)
    key_name = f"mcpvisor-test-{secrets.token_hex(4)}".encode()
    assert libc.syscall(syscall("add_key"), b"user", key_name, key_secret.encode(), len(key_secret), -3) > 0
    try:
        with internet.internet() as net:
            async with tenant_host(user=user) as host:
                await host.clients["alice"].wait_tools("shell:run", timeout=120)
                await host.clients["bob"].wait_tools("vault:echo", timeout=120)
                targets = {
                    "calls": {name: syscall(name) for name in ("keyctl", "add_key", "unshare", "clone", "io_uring_setup",
                                                               "userfaultfd", "bpf", "perf_event_open", "mount", "ioctl")},
                    "tcp": {
                        "host loopback service": ("127.0.0.1", port),
                        "host's own address on another interface": (net.host_side, port),
                        "cloud metadata (link-local)": ("169.254.169.254", 80),
                        "a private address": ("10.255.255.53", 53),
                        "mcpvisor's listener": ("127.0.0.1", host.stack.port),
                    },
                    "abstract": abstract,
                    "internet": net.url,
                    "threads": 400,
                }  # fmt: skip
                seen = await host.python(ATTACK, json.dumps(targets))
                print(json.dumps(seen, indent=1)[:4000])  # the table, for `pytest -s`
                status = host.stack.status()

                # H2: no keyring call at all, and nothing of mcpvisor's keys shows.
                assert seen["keyctl @s"] == seen["add_key @s"] == "EPERM"
                assert key_secret not in json.dumps(seen) and key_name.decode() not in str(seen["/proc/keys"])
                # L1: no user namespace, io_uring, userfaultfd (its user-mode-only form too), bpf, perf.
                for name in ("unshare user", "clone user", "io_uring_setup", "userfaultfd user-mode", "bpf",
                             "perf_event_open"):  # fmt: skip
                    assert seen[name] == "EPERM", name
                # H7: outbound works; the host's loopback is the sandbox's own; link-local, private
                # and the host's other addresses are refused at once; no host socket is listed.
                assert seen["internet"] == "hello from the internet"
                assert seen["tcp"]["host loopback service"] == "ECONNREFUSED"
                assert seen["tcp"]["mcpvisor's listener"] == "ECONNREFUSED"
                for name in ("host's own address on another interface", "cloud metadata (link-local)",
                             "a private address"):  # fmt: skip
                    assert seen["tcp"][name] == "EACCES", (name, seen["tcp"][name])
                assert seen["abstract socket"] == "ECONNREFUSED"
                assert f":{port:04X}" not in seen["/proc/net/tcp"]
                assert abstract not in seen["/proc/net/unix"] and "control.sock" not in seen["/proc/net/unix"]
                # H8: threads stop below max_processes (256), with or without a pids cgroup.
                assert 0 < seen["threads"] < 256
                # Held: no remount, no sysrq, no /sys, no typing into a terminal.
                assert seen["remount /usr"] == "EPERM" and seen["TIOCSTI"] == "EPERM"
                assert seen["sysrq"] in ("EROFS", "EACCES", "ENOENT") and seen["/sys"] is False
                # H5: as root, each worker its own uid from the table, kept in the state store.
                if not user:
                    bob_uid = upstream_uid(host.stack, status, "bob/vault")
                    assert seen["uid"] >= 2**30 and bob_uid >= 2**30 and seen["uid"] != bob_uid
                    rows = dict(sqlite3.connect(host.stack.data_dir / "state.sqlite").execute(
                        "SELECT worker, uid FROM sandbox_uids").fetchall())  # fmt: skip
                    assert rows["alice/shell"] == seen["uid"] and rows["bob/vault"] == bob_uid
                else:
                    assert seen["uid"] == CONTAINER_UID
                # L2: one core for a tenant, in its cgroup (as root); sandboxes/ dirs closed.
                leaves = sandbox_cgroups(host.stack.data_dir)
                if not user:
                    cpu = [leaf for leaf in leaves if "/cpu/" in leaf]
                    assert cpu and all(quota(leaf) == (100_000, 100_000) for leaf in cpu), cpu
                for directory in ("sandboxes", "sandboxes/tenants", "sandboxes/tenants/alice"):
                    assert (host.stack.data_dir / directory).stat().st_mode & 0o777 == 0o700, directory
                # A 25 MiB tool result crosses the sandbox's pipes whole (once: it takes a while to make).
                if not user:
                    big = await host.clients["alice"].call(
                        "shell:run", {"command": "head -c 26214400 /dev/zero | tr '\\0' x", "timeout": 120}
                    )
                    assert "result" in big, str(big)[:500]
                    assert "stdout:\n" + "x" * 26214400 + "\nstderr:" in big["result"]["content"][0]["text"]
                # Bob noticed nothing.
                echoed = await host.clients["bob"].call("vault:echo", {"text": "still here"})
                assert "still here" in str(echoed["result"])
            # Stopped: no cgroup of its sandboxes is left behind.
            assert [leaf for leaf in leaves if Path(leaf).exists()] == []  # noqa: ASYNC240
    finally:
        service.close()
        hidden_socket.close()


def upstream_uid(stack: Stack, status: dict[str, Any], worker: str) -> int:
    pid = upstream_pid(stack, worker, "echo_server.py")
    with open(f"/proc/{pid}/status") as lines:
        return int(next(line for line in lines if line.startswith("Uid:")).split()[1])


def sandbox_cgroups(data_dir: Path) -> list[str]:
    """The cgroup dirs of this stack's sandboxes (named for the worker and a hash of its home)."""
    import zlib

    found = []
    for tenant, server in (("alice", "shell"), ("bob", "vault")):
        home = str(data_dir.resolve() / "sandboxes" / "tenants" / tenant / server)
        leaf = f"{tenant}_{server}-{zlib.crc32(home.encode()):08x}"
        for root, dirs, _files in os.walk("/sys/fs/cgroup"):
            if leaf in dirs:
                found.append(os.path.join(root, leaf))
            if root.count("/") > 12:
                dirs.clear()
    return found


def quota(leaf: str) -> tuple[int, int]:
    with open(os.path.join(leaf, "cpu.cfs_quota_us")) as q, open(os.path.join(leaf, "cpu.cfs_period_us")) as p:
        return int(q.read()), int(p.read())


@pytest.mark.parametrize("user", MODES)
async def test_binds_cannot_be_redirected_and_nested_ones_keep_their_mode(user: bool) -> None:
    base = Path(tempfile.mkdtemp(prefix="second-pass-", dir="/tmp"))
    teams = base / "teams"
    (teams / "alice" / "work" / "cache").mkdir(parents=True)
    (teams / "alice" / "work" / "cache" / "note").write_text("alice-cache\n")
    (teams / "bob" / "secret").mkdir(parents=True)
    (teams / "bob" / "secret" / "plans").write_text("BOB-DATA\n")
    # Beside the teams' dirs, not among them: `{tenant}` stands for any name there, a tenant added later's too.
    shared = base / "shared"
    (shared / "scratch").mkdir(parents=True)
    shared.chmod(0o777)
    (shared / "scratch").chmod(0o777)
    for directory, _dirs, files in os.walk(teams):
        os.chmod(directory, 0o777)  # whatever uid the table hands alice's sandboxes
        for name in files:
            os.chmod(os.path.join(directory, name), 0o666)
    work = f"{teams}/{{tenant}}/work"
    servers = {
        # Alice's shell writes her team's work dir; her `files` server shows its cache read-only.
        "shell": python_server("shell_server.py", sandbox={"rw": [work]}),
        "files": python_server(
            "shell_server.py",
            sandbox={"ro": [f"{work}/cache", str(shared)], "rw": [f"{shared}/scratch"]},
        ),
        # H6: a read-only dir inside a writable one.
        "nested": python_server("shell_server.py", sandbox={"rw": [work], "ro": [f"{work}/policy"]}),
        # H1 as the attacker found it: a bind nested in the tenant's own writable one.
        "h1": python_server(
            "shell_server.py", sandbox={"rw": [f"{teams}/{{tenant}}", f"{teams}/{{tenant}}/cfg/cache"]}
        ),
        "vault": echo_server("vault"),
    }
    (teams / "carol" / "work" / "policy").mkdir(parents=True)
    (teams / "carol" / "cfg" / "cache").mkdir(parents=True)
    # Carol's `nested` is never asked for: `ctl inspect` tells the operator before it would start.
    tenants = {
        "alice": {"servers": ["shell", "files"]},
        "bob": {"servers": ["vault"]},
        "carol": {"servers": ["nested", "h1"]},
    }
    try:
        async with tenant_host(user=user, servers=servers, tenants=tenants, base=base) as host:
            await host.clients["alice"].wait_tools("shell:run", "files:run", timeout=120)
            seen = await host.shell(
                f"cat {teams}/alice/work/cache/note; touch {shared}/scratch/ok && echo scratch-writable;"
                f" touch {shared}/nope",
                server="files",
            )
            # Parent first: the rw dir inside the ro one is writable, the rest of it is not.
            assert "alice-cache" in seen and "scratch-writable" in seen and "Read-only file system" in seen, seen
            # H1: alice swaps the cache for a relative symlink up to every team, and ends her processes.
            swap = f"cd {teams}/alice/work && mv cache cache.old && ln -s ../../bob cache; kill -9 -1"
            await host.clients["alice"].call("shell:run", {"command": swap})  # ends her shell, and the call
            assert (teams / "alice" / "work" / "cache").is_symlink()
            # Her `files` server starts again (it died, was restarted, went idle): its bind is resolved anew.
            os.kill(upstream_pid(host.stack, "alice/files", "shell_server.py"), signal.SIGKILL)
            with trio.fail_after(120):
                while "not followed" not in (text := json.dumps(host.stack.status().get("alice/files", {}))):
                    await trio.sleep(0.5)
            assert "which a sandbox can write" in text, text
            answer = await host.clients["alice"].call("files:run", {"command": f"cat {teams}/alice/work/cache/*/plans"})
            assert "BOB-DATA" not in json.dumps(answer)
            # H6: the nested read-only bind is refused, and `ctl inspect` says so before anything starts.
            code, inspected = host.stack.ctl("inspect", "nested")
            assert code == 0, inspected
            refused = inspected["sandboxes"]["carol/nested"]["refused"]
            assert any("inside the writable bind" in why for why in refused), refused
            code, inspected = host.stack.ctl("inspect", "h1")
            refused = inspected["sandboxes"]["carol/h1"]["refused"]
            assert any(f"{teams}/carol/cfg/cache lies inside the writable bind" in why for why in refused), refused
    finally:
        shutil.rmtree(base, ignore_errors=True)


@asynccontextmanager
async def small_volume(base: Path, size_mb: int, *, user: bool) -> AsyncIterator[Path]:
    """The data dir on a tmpfs of its own: a volume small enough to fill."""
    data = base / "data"
    data.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(data)], check=True)
    try:
        if user:
            os.chown(data, CONTAINER_UID, CONTAINER_UID)
        yield data
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)


def fill(path: Path) -> None:
    """Write zeros to `path` until the volume is full."""
    with suppress(OSError), open(path, "wb") as out:
        while True:
            out.write(bytes(1 << 20))
            out.flush()


async def killed_for(host: Host, tenant: str, command: str) -> str:
    """Run `command` in the tenant's shell until the sandbox is stopped; the client's error text."""
    answer = await host.clients[tenant].call("shell:run", {"command": command, "timeout": 120})
    text = json.dumps(answer)
    assert "the upstream was killed" in text, text
    return text


async def until_running(host: Host, tenant: str) -> str:
    with trio.fail_after(120):
        while True:
            answer = await host.clients[tenant].call("shell:run", {"command": "echo back"})
            if "result" in answer and "back" in json.dumps(answer["result"]):
                return json.dumps(answer)
            await trio.sleep(0.5)


@pytest.mark.parametrize("user", MODES)
async def test_one_tenant_cannot_fill_the_disk_nor_stop_its_calls_being_recorded(user: bool) -> None:
    base = Path(tempfile.mkdtemp(prefix="second-pass-", dir="/tmp"))
    servers = {"shell": python_server("shell_server.py")}
    tenants = {
        "alice": {"servers": ["shell"], "sandbox": {"home_mb": 8}},
        "bob": {"servers": ["shell"], "sandbox": {"home_mb": 500}},
    }
    try:
        async with (
            small_volume(base, 112, user=user) as data,
            tenant_host(
                user=user, servers=servers, tenants=tenants, settings={"data_reserve_mb": 48}, base=base
            ) as host,
        ):
            await host.clients["alice"].wait_tools("shell:run", timeout=120)
            await host.clients["bob"].wait_tools("shell:run", timeout=120)
            # Her home's limit: stopped, and told why.
            text = await killed_for(host, "alice", "head -c 16M /dev/zero > $HOME/big; sleep 60")
            assert "its home went over its size limit (8 MiB)" in text, text
            homes = data / "sandboxes" / "tenants"
            (homes / "alice" / "shell" / "big").unlink()
            await until_running(host, "alice")
            # The volume of the state and logs: bob's home may be large, never past the reserve.
            text = await killed_for(host, "bob", "head -c 64M /dev/zero > $HOME/big; sleep 60")
            assert "less than 48 MiB free (data_reserve_mb)" in text, text
            usage = os.statvfs(data)
            assert usage.f_bavail * usage.f_frsize > 16 << 20  # stopped well before the volume was full
            (homes / "bob" / "shell" / "big").unlink()
            await until_running(host, "bob")
            # However the volume fills, a call the activity log cannot record does not run.
            await trio.to_thread.run_sync(fill, data / "filler")
            refusals = []
            for _ in range(20):
                answer = await host.clients["alice"].call("shell:run", {"command": "echo ran"})
                if "audit_required" in json.dumps(answer):
                    refusals.append(answer)
                    break
            assert refusals, "calls kept running while the activity log could not record them"
            answer = await host.clients["bob"].call("shell:run", {"command": "echo ran"})
            assert "audit_required" in json.dumps(answer) and "ran\\n" not in json.dumps(answer)
            (data / "filler").unlink()
            await until_running(host, "alice")
    finally:
        shutil.rmtree(base, ignore_errors=True)


MEMORY = r"""
import ctypes, json, os, sys, time
kind = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
if kind == "memfd":
    # Held by an fd, never mapped: no process's RSS shows it.
    fd = os.memfd_create("held")
    for _ in range(200):
        os.write(fd, bytes(1 << 20))
    print(json.dumps({"memfd": os.fstat(fd).st_size >> 20}), flush=True)
    time.sleep(60)
else:
    # SysV shm in slices, each attached, written and detached: kept by the IPC namespace alone.
    big = libc.shmget(0, 200 << 20, 0o1600)
    made = 0
    for _ in range(10):
        shmid = libc.shmget(0, 20 << 20, 0o1600)
        if shmid < 0:
            break
        address = libc.shmat(shmid, None, 0)
        ctypes.memset(address, 1, 20 << 20)
        libc.shmdt(ctypes.c_void_p(address))
        made += 1
    print(json.dumps({"one big segment": big, "slices": made}), flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("user", MODES)
async def test_memory_no_process_shows_is_counted_too(user: bool) -> None:
    tenants = {"alice": {"servers": ["shell"], "sandbox": {"memory_mb": 128}}, "bob": {"servers": ["vault"]}}
    async with tenant_host(user=user, tenants=tenants) as host:
        await host.clients["alice"].wait_tools("shell:run", timeout=120)
        quoted = "'" + MEMORY.replace("'", "'\\''") + "'"
        text = await killed_for(host, "alice", f"{sys.executable} -c {quoted} memfd")
        assert "memory limit (128 MiB)" in text, text
        await until_running(host, "alice")
        # SysV shm: a segment over the limit is refused, and slices stop at it (or the sandbox is stopped).
        answer = await host.clients["alice"].call(
            "shell:run", {"command": f"{sys.executable} -c {quoted} shm", "timeout": 120}
        )
        text = json.dumps(answer)
        print(text[:600])  # which of the two stopped it, for `pytest -s`
        if "the upstream was killed" in text:
            assert "memory limit (128 MiB)" in text, text
        else:
            seen = json.loads(answer["result"]["content"][0]["text"].split("stdout:\n", 1)[1].split("\nstderr:")[0])
            assert seen["one big segment"] == -1 and seen["slices"] < 7, seen
