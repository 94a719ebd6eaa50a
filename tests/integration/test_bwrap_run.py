"""The argv `runtime.bwrap` builds, run by the real bubblewrap: what the process inside can see and do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mcpvisor.runtime.bwrap import HOME, Bind, Mask, SandboxSpec, bwrap_argv, system_binds

BWRAP = shutil.which("bwrap")
pytestmark = pytest.mark.skipif(BWRAP is None, reason="system package missing: bubblewrap")

PROBE = r"""
import json, os, socket, sys
def can_read(path):
    try:
        with open(path) as f:
            f.read()
        return True
    except OSError:
        return False
def listing(path):
    try:
        return os.listdir(path)
    except OSError:
        return []
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
open(os.path.join(os.environ["HOME"], "written"), "w").write("ok")
open("/dev/shm/shared", "w").write("ok")
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
    "no_new_privs": status["NoNewPrivs"].strip(),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "interfaces": [name for _, name in socket.if_nameindex()],
    "env": sorted(os.environ),
    "shadow": can_read("/etc/shadow"),
    "secret_dir": listing(sys.argv[1]),
    "secret_file": can_read(sys.argv[2]),
    "outside": os.path.exists(sys.argv[3]),
}))
"""


def python_prefix() -> list[Bind]:
    """The running interpreter's install prefix and virtualenv, as an upstream's would be bound."""
    real = Path(os.path.realpath(sys.executable)).parents[1]
    binds = [Bind(source=str(real))]
    if sys.prefix != str(real):
        binds.append(Bind(source=sys.prefix))
    return binds


def test_a_process_in_the_sandbox_sees_only_what_was_bound(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    hidden = tmp_path / "shown" / "config"
    hidden.mkdir(parents=True)
    (hidden / "admin.token").write_text("not for the sandbox")
    secret = tmp_path / "shown" / "secret.txt"
    secret.write_text("s3cret")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    privileged = os.geteuid() == 0
    uid = 1_234_567 if privileged else os.getuid()
    os.chown(home, uid, uid)
    spec = SandboxSpec(
        system=system_binds(),
        binds=(*python_prefix(), Bind(source=str(tmp_path / "shown"))),
        home=str(home),
        masks=(Mask(path=str(hidden)), Mask(path=str(secret), directory=False)),
        network=False,
        uid=uid,
    )
    argv = bwrap_argv(
        spec,
        [sys.executable, "-c", PROBE, str(hidden), str(secret), str(elsewhere)],
        privileged=privileged,
        bwrap=BWRAP or "bwrap",
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": HOME, "LANG": "C.UTF-8", "ONLY_THIS": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["uid"] == uid and seen["gid"] == uid
    assert seen["cap_eff"] == "0000000000000000" and seen["cap_bnd"] == "0000000000000000"
    assert seen["no_new_privs"] == "1"
    # Its own PID namespace: bwrap's init and the probe, nothing of the host.
    assert max(seen["pids"]) < 10
    assert seen["interfaces"] == ["lo"]
    # What it was given, and the PWD bwrap sets when it changes dir: nothing of the caller's.
    assert seen["env"] == ["HOME", "LANG", "ONLY_THIS", "PATH", "PWD"]
    assert seen["shadow"] is False
    assert seen["secret_dir"] == [] and seen["secret_file"] is False
    assert seen["outside"] is False
    # The home is the host dir, writable, owned by the sandbox's uid.
    assert (home / "written").read_text() == "ok"
    assert (home / "written").stat().st_uid == uid


@pytest.mark.skipif(os.geteuid() != 0, reason="the test above runs this way already when not root")
def test_an_ordinary_user_gets_the_same_sandbox_through_a_user_namespace(tmp_path: Path) -> None:
    """A workstation: bwrap as an ordinary user (here nobody), no setpriv, a user namespace."""
    python = "/usr/bin/python3"
    if not os.path.exists(python):
        pytest.skip("no system python3 to run as an ordinary user")
    # pytest's tmp dirs are root's alone (0700): nobody's home must be where nobody can reach it.
    home = Path(tempfile.mkdtemp(prefix="sandbox-home-", dir="/tmp"))
    os.chown(home, 65534, 65534)
    spec = SandboxSpec(system=system_binds(), home=str(home), network=False)
    argv = bwrap_argv(spec, [python, "-c", PROBE, "/nonexistent", "/nonexistent", "/root"], privileged=False)
    assert "--unshare-user" in argv and "--cap-add" not in argv

    def become_nobody() -> None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    env = {"PATH": "/usr/bin:/bin", "HOME": HOME, "LANG": "C.UTF-8"}
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=60, check=False, preexec_fn=become_nobody
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["uid"] == 65534 and seen["cap_eff"] == "0000000000000000"
    assert seen["interfaces"] == ["lo"] and max(seen["pids"]) < 10
    assert seen["shadow"] is False and seen["outside"] is False
    try:
        assert (home / "written").stat().st_uid == 65534
    finally:
        shutil.rmtree(home)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("capsh") is None, reason="needs root and capsh (libcap2-bin)")
def test_root_without_cap_sys_admin_is_told_to_run_unprivileged() -> None:
    """A container's root under the default capabilities: no sandbox mapped to root, a clear line."""
    code = "from mcpvisor.runtime import bwrap; print(bwrap.probe())"
    done = subprocess.run(
        ["capsh", "--drop=cap_sys_admin", "--", "-c", f"{sys.executable} -c '{code}'"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "without CAP_SYS_ADMIN" in done.stdout and "unprivileged user" in done.stdout


def test_a_hidden_file_in_a_system_dir_stays_hidden_when_the_host_replaces_it(tmp_path: Path) -> None:
    """A config save renames a new file over the old one, which drops a mount on the file itself."""
    system = tmp_path / "etc"
    (system / "mcpvisor").mkdir(parents=True)
    config = system / "mcpvisor" / "secret.toml"
    config.write_text("old = 1\n")
    (system / "hosts").write_text("shown\n")
    for path in (tmp_path, system, system / "mcpvisor"):
        path.chmod(0o755)
    for path in (config, system / "hosts"):
        path.chmod(0o644)
    privileged = os.geteuid() == 0
    spec = SandboxSpec(
        # Shown at a path of its own, as /etc is: pytest's tmp dirs above it are closed to the uid.
        system=(*system_binds(), Bind(source=str(system), dest="/sysdir")),
        masks=(Mask(path=str(config), directory=False),),
        network=False,
        uid=1_234_567 if privileged else None,
    )
    inside = "/sysdir/mcpvisor/secret.toml"
    script = f"echo ready; read line; cat /sysdir/hosts; cat {inside}; echo new > {inside}; ls /sysdir/mcpvisor"
    argv = bwrap_argv(spec, ["/bin/sh", "-c", script], privileged=privileged, bwrap=BWRAP or "bwrap")
    process = subprocess.Popen(
        argv, env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        # Once the sandbox is up, the host saves the config as mcpvisor does: a new file renamed over.
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        replacement = system / "mcpvisor" / "secret.toml.tmp"
        replacement.write_text("new_secret = 2\n")
        replacement.chmod(0o666)
        os.replace(replacement, config)
        out, _ = process.communicate(b"go\n", timeout=60)
    finally:
        process.kill()
    seen = out.decode()
    assert "shown" in seen
    assert "new_secret" not in seen and "old" not in seen, seen
    assert config.read_text() == "new_secret = 2\n"
