"""The seccomp filter, the keyring and the process cap, tried from inside a real sandbox.

Every call of the filter's list (runtime.seccomp.RULES) is made, raw, by a process that a
worker's `confine` put in bwrap, with arguments that meet the rule's condition: each must fail
with the rule's errno. A few calls the sandbox needs must still work. As root and as a
container's unprivileged user (tests/support/unprivileged.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyseccomp
import pytest

from mcpvisor.runtime import namespaces, seccomp
from mcpvisor.wire.sandboxing import SandboxPlan
from mcpvisor.workers import confine
from tests.support import sandboxes
from tests.support.unprivileged import CONTAINER_UID, as_container_user, missing_tools

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="system package missing: bubblewrap")

PROBE = r"""
import ctypes, errno, json, os, socket, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
calls = json.loads(sys.argv[1])
seen = {}
for name, number, args in calls:
    ctypes.set_errno(0)
    result = libc.syscall(number, *[ctypes.c_long(a) for a in args])
    if result == 0 and name == "clone":
        os._exit(0)  # a child made by an allowed clone: nothing to report from it
    seen[name + repr(args)] = "ok" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
def family(number):
    try:
        socket.socket(number, socket.SOCK_DGRAM).close()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, "?")
forked = os.waitpid(os.fork() or os._exit(0), 0)[1]
threads = []
def spawn():
    try:
        for _ in range(int(sys.argv[2])):
            thread = threading.Thread(target=threading.Event().wait, daemon=True)
            thread.start()
            threads.append(thread)
    except RuntimeError:
        pass
spawn()
print(json.dumps({
    "calls": seen,
    "families": {str(n): family(n) for n in (1, 2, 10, 16, 17, 40)},
    "fork": forked,
    "threads": len(threads),
    "keys": open("/proc/keys").read() if os.path.exists("/proc/keys") else "",
}))
"""


def arguments(rule: seccomp.Rule) -> list[int]:
    """Arguments that meet the rule's condition (zeros elsewhere)."""
    args = [0] * 6
    if rule.arg is not None:
        index, _mask, value = rule.arg
        args[index] = value + 1 if rule.differs else value
        if rule.call == "clone":
            args[index] |= 17  # SIGCHLD, as fork's clone passes
    return args


def calls() -> list[tuple[str, int, list[int]]]:
    arch = pyseccomp.system_arch()
    found = []
    for rule in seccomp.RULES:
        number = pyseccomp.resolve_syscall(arch, rule.call)
        if number >= 0:
            found.append((rule.call, number, arguments(rule)))
    return found


def check(seen: dict, *, max_processes: int) -> None:
    expected = {
        rule.call + repr(arguments(rule)): __import__("errno").errorcode[rule.errno]
        for rule in seccomp.RULES
        if pyseccomp.resolve_syscall(pyseccomp.system_arch(), rule.call) >= 0
    }
    assert seen["calls"] == expected
    # unix, inet, inet6 and netlink sockets work; packet and vsock (the VM's host) are refused.
    assert seen["families"] == {
        "1": "ok",
        "2": "ok",
        "10": "ok",
        "16": "ok",
        "17": "EAFNOSUPPORT",
        "40": "EAFNOSUPPORT",
    }
    assert seen["fork"] == 0  # clone without a new user namespace still works
    # Threads count as processes: the cap holds, with or without a pids cgroup (here none is used).
    assert 0 < seen["threads"] < max_processes


def plan(base: Path, *, uid: int | None) -> SandboxPlan:
    return SandboxPlan(home=str(base / "home"), network="none", max_processes=64, memory_mb=256, uid=uid)


def test_every_call_of_the_filter_is_refused_from_inside_as_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the unprivileged test below covers an ordinary user")
    confined = confine.confine(
        plan(tmp_path, uid=sandboxes.TEST_UID),
        "alice/probe",
        sys.executable,
        ["-c", PROBE, json.dumps(calls()), "500"],
        {},
        None,
    )
    done = sandboxes.run(confined)
    assert done.returncode == 0, done.stderr
    check(json.loads(done.stdout), max_processes=64)


DRIVE = r"""
import json, os, subprocess, sys
from mcpvisor.wire.sandboxing import SandboxPlan
from mcpvisor.workers import confine
from tests.support import sandboxes
work, probe, calls = sys.argv[1:4]
plan = SandboxPlan(home=os.path.join(work, "home"), network="none", max_processes=64, memory_mb=256)
confined = confine.confine(plan, "alice/probe", sys.executable, ["-c", probe, calls, "500"], {}, None)
done = sandboxes.run(confined)
print(done.stdout.strip() if done.returncode == 0 else json.dumps({"failed": done.stderr[-2000:]}))
"""


@pytest.mark.skipif(missing_tools() is not None, reason=missing_tools() or "")
def test_every_call_of_the_filter_is_refused_from_inside_as_an_ordinary_user(tmp_path: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="mcpvisor-filter-"))
    try:
        os.chown(work, CONTAINER_UID, CONTAINER_UID)
        stash = tmp_path / "stash"
        stash.mkdir()
        command = [sys.executable, "-c", DRIVE, str(work), PROBE, json.dumps(calls())]
        argv = as_container_user(command, stash, readable=[REPO, work])
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "PYTHONPATH": str(REPO.parent)}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert "failed" not in seen, seen
        check(seen, max_processes=64)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_each_sandbox_starts_in_a_session_keyring_of_its_own() -> None:
    """The child joins a new anonymous session keyring before bwrap: not the one mcpvisor was given."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    keyctl = pyseccomp.resolve_syscall(pyseccomp.system_arch(), "keyctl")
    ours = libc.syscall(keyctl, 0, -3, 1)  # KEYCTL_GET_KEYRING_ID of @s, creating it
    assert ours > 0
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        namespaces.new_session_keyring()
        os.write(write_end, str(libc.syscall(keyctl, 0, -3, 0)).encode())
        os._exit(0)
    os.close(write_end)
    theirs = int(os.read(read_end, 64) or b"0")
    os.waitpid(child, 0)
    os.close(read_end)
    assert theirs > 0 and theirs != ours
