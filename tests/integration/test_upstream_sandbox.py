"""An upstream's sandbox as the worker builds it from a real config, run by the real bubblewrap.

Each test writes a config, computes what no sandbox may see the way the supervisor does
(`hidden_paths`), confines a shell the way the worker does (`confine`), and looks from inside.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import trio

from mcpvisor.supervisor import config as config_mod
from mcpvisor.supervisor.supervisor import hidden_paths
from mcpvisor.wire import sandboxing
from mcpvisor.workers import confine, limits
from tests.support import sandboxes
from tests.support.sandboxes import TEST_UID

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="system package missing: bubblewrap")


def write_config(tmp_path: Path, servers: dict[str, Any], **tables: Any) -> Path:
    path = tmp_path / "conf" / "mcpvisor.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(tomli_w.dumps({"mcpvisor": {"data_dir": str(tmp_path / "data")}, "servers": servers, **tables}))
    return path


def plan_for(config_path: Path, worker: str) -> sandboxing.SandboxPlan:
    """The plan the supervisor hands a worker, hidden paths included."""
    config = config_mod.load(config_path)
    data_dir = config_mod.data_dir(config, config_path)
    tenant, _, server = worker.rpartition("/")
    hidden = hidden_paths(config, config_path, data_dir, data_dir / "run")
    found = sandboxing.plan(
        worker,
        config.mcpvisor,
        config.servers[server],
        config.tenants.get(tenant) if tenant else None,
        data_dir=str(data_dir),
        hidden=hidden,
        writable=sandboxing.writable_places(config.mcpvisor, config.servers, config.tenants),
        uid=TEST_UID if os.geteuid() == 0 else None,
    )
    assert found is not None
    return found


def run_in(plan: sandboxing.SandboxPlan, worker: str, script: str, *, stdin: str = "") -> str:
    """What a shell in the sandbox prints (stdout and stderr)."""
    confined = confine.confine(plan, worker, "/bin/sh", ["-c", script], {}, None)
    done = sandboxes.run(confined, input=stdin)
    return done.stdout + done.stderr


def readable_tree(root: Path) -> None:
    """pytest's dirs are root's alone (0700): what a bind shows must be open to the sandbox's uid."""
    for directory in (root, *root.parents):
        if directory == Path("/"):
            break
        directory.chmod(directory.stat().st_mode | 0o755)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o644)


def test_a_tenants_secret_file_is_hidden_from_every_tenant(tmp_path: Path) -> None:
    project = tmp_path / "project"
    for tenant in ("alice", "bob", "carol"):  # carol is not configured yet: her key is there already
        (project / "secrets" / tenant).mkdir(parents=True)
        (project / "secrets" / tenant / "slack_token").write_text(f"{tenant.upper()}-KEY\n")
    (project / "README").write_text("shown\n")
    readable_tree(project)
    slack = {
        "command": "/bin/sh",
        "env": {"SLACK_TOKEN": f"${{file:{project}/secrets/{{tenant}}/slack_token}}"},
        "sandbox": {"ro": [str(project)]},
    }
    config = write_config(
        tmp_path, {"slack": slack}, tenants={"alice": {"servers": ["slack"]}, "bob": {"servers": ["slack"]}}
    )
    seen = run_in(
        plan_for(config, "alice/slack"),
        "alice/slack",
        f"cat {project}/README; for t in alice bob carol; do cat {project}/secrets/$t/slack_token; done",
    )
    assert "shown" in seen  # the bind works
    for key in ("ALICE-KEY", "BOB-KEY", "CAROL-KEY"):
        assert key not in seen, seen


def test_a_template_inside_a_name_hides_each_tenants_file(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {"slack": {"command": "x", "env": {"T": "${file:/srv/keys/slack-{tenant}.key} and ${file:/srv/plain}"}}},
        tenants={"alice": {"servers": ["slack"]}, "bob": {"servers": ["slack"]}},
    )
    loaded = config_mod.load(config)
    hidden = hidden_paths(loaded, config, tmp_path / "data", tmp_path / "run")
    assert {"/srv/keys/slack-alice.key", "/srv/keys/slack-bob.key", "/srv/plain"} <= set(hidden)
    assert "/srv/keys" not in hidden and not any("{" in path for path in hidden)


@pytest.mark.parametrize("key", ["ro", "rw"])
def test_a_bind_that_would_show_the_config_or_a_secret_file_is_refused(tmp_path: Path, key: str) -> None:
    """A file cannot stay hidden inside a bind: the next config save renames a new one over it."""
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "api.key").write_text("KEY\n")
    server = {"command": "/bin/sh", "env": {"K": f"${{file:{keys / 'api.key'}}}"}}
    config = write_config(tmp_path, {"conf": {**server, "sandbox": {key: [str(tmp_path / "conf")]}}})
    with pytest.raises(confine.SandboxError, match=r"mcpvisor\.toml.*bind a narrower path"):
        run_in(plan_for(config, "conf"), "conf", "true")
    config = write_config(tmp_path, {"keys": {**server, "sandbox": {key: [str(keys)]}}})
    with pytest.raises(confine.SandboxError, match=r"api\.key.*bind a narrower path"):
        run_in(plan_for(config, "keys"), "keys", "true")
    # A dir next to them is bound as asked.
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes").write_text("shown\n")
    readable_tree(tmp_path / "work")
    config = write_config(tmp_path, {"work": {**server, "sandbox": {key: [str(tmp_path / "work")]}}})
    assert "shown" in run_in(plan_for(config, "work"), "work", f"cat {tmp_path}/work/notes")


def test_the_sandbox_writes_to_its_tmp_and_shm(tmp_path: Path) -> None:
    """Also as root, where the command runs as an unprivileged uid of its own."""
    config = write_config(tmp_path, {"tool": {"command": "/bin/sh", "sandbox": True}})
    seen = run_in(
        plan_for(config, "tool"),
        "tool",
        'echo x > "$TMPDIR/a" && echo x > /dev/shm/b && ls -ld /tmp /dev/shm && echo wrote',
    )
    assert "wrote" in seen, seen
    assert seen.count("drwxrwxrwt") == 2, seen


def test_a_bind_through_a_symlink_hides_what_the_real_path_would(tmp_path: Path) -> None:
    project = tmp_path / "review"
    (project / "data").mkdir(parents=True)  # mcpvisor's data dir, inside what is bound
    (project / "data" / "state").write_text("STATE\n")
    (project / "notes").write_text("shown\n")
    readable_tree(project)
    (tmp_path / "review-link").symlink_to(project)
    link = tmp_path / "review-link"
    path = tmp_path / "conf" / "mcpvisor.toml"
    path.parent.mkdir()
    tool = {"command": "/bin/sh", "sandbox": {"ro": [str(link)]}}
    path.write_text(tomli_w.dumps({"mcpvisor": {"data_dir": str(project / "data")}, "servers": {"tool": tool}}))
    seen = run_in(plan_for(path, "tool"), "tool", f"cat {link}/notes {link}/data/state; ls {link}/data")
    assert "shown" in seen
    assert "STATE" not in seen and "sandboxes" not in seen, seen


def test_a_tool_installed_in_a_home_runs_without_showing_the_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "rev"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE-KEY\n")
    script = f"#!/bin/sh\necho ran $0; cat {home}/.ssh/id_ed25519; ls -a {home} {home}/.local\n"
    (home / "bin").mkdir()
    (home / "bin" / "mytool").write_text(script)
    real = home / ".local" / "share" / "uv" / "tools" / "srv" / "bin" / "srv"
    real.parent.mkdir(parents=True)
    real.write_text(script)
    (home / ".local" / "bin").mkdir()
    (home / ".local" / "bin" / "srv").symlink_to(real)
    readable_tree(home)
    for path in (home / "bin" / "mytool", real):
        path.chmod(0o755)
    (home / ".ssh" / "id_ed25519").chmod(0o644)  # only the sandbox's binds keep it from the uid
    monkeypatch.setenv("HOME", str(home))
    config = write_config(tmp_path, {"tool": {"command": "x", "sandbox": True}})
    plan = plan_for(config, "tool")
    for command in (home / "bin" / "mytool", home / ".local" / "bin" / "srv"):
        confined = confine.confine(plan, "tool", str(command), [], {}, None)
        done = sandboxes.run(confined)
        seen = done.stdout + done.stderr
        assert f"ran {command}" in seen, seen
        assert "PRIVATE-KEY" not in seen and ".ssh" not in seen.splitlines(), seen


def test_what_the_upstream_can_write_never_chooses_its_next_binds(tmp_path: Path) -> None:
    """pyvenv.cfg, a `#!` line and symlinks in a writable bind are the upstream's to rewrite."""
    alice, bob = tmp_path / "x" / "alice", tmp_path / "x" / "bob"
    (bob / "bin").mkdir(parents=True)
    (bob / "bin" / "python3").write_text("")
    (bob / "secret").write_text("BOB-DATA\n")
    venv = alice / ".venv"
    (venv / "bin").mkdir(parents=True)
    # As the upstream left them after its last run:
    (venv / "pyvenv.cfg").write_text(f"home = /usr/bin\nhome = {bob / 'bin'}\n")
    (venv / "bin" / "tool").write_text(f"#!/bin/sh\necho ran; cat {bob}/secret; ls {bob}\n# {bob}/bin/python3\n")
    (alice / "script.sh").symlink_to(bob / "secret")
    (alice / "run").write_text(f"#!{bob}/bin/python3\n")
    readable_tree(tmp_path / "x")
    (venv / "bin" / "tool").chmod(0o755)
    config = write_config(tmp_path, {"tool": {"command": "x", "sandbox": {"rw": [str(alice)]}}})
    plan = plan_for(config, "tool")
    for command, args in (
        (venv / "bin" / "tool", []),
        (Path("/bin/sh"), [str(alice / "run"), str(alice / "script.sh")]),
    ):
        confined = confine.confine(plan, "tool", str(command), [str(a) for a in args], {}, None)
        confined.close()
        assert not any(str(bob) in arg for arg in confined.argv[: confined.argv.index("--")]), confined.argv
    seen = run_in(plan, "tool", f"{venv}/bin/tool")
    assert "ran" in seen and "BOB-DATA" not in seen, seen


def test_tmp_and_shm_hold_no_more_than_the_memory_limit(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"tool": {"command": "/bin/sh", "sandbox": {"memory_mb": 64}}})
    seen = run_in(
        plan_for(config, "tool"),
        "tool",
        "for d in /tmp /dev/shm; do head -c 100M /dev/zero > $d/fill; echo $d $(stat -c %s $d/fill); done",
    )
    sizes = dict(line.split() for line in seen.splitlines() if line.startswith("/"))
    assert sizes.keys() == {"/tmp", "/dev/shm"}, seen
    assert all(int(size) <= 64 << 20 for size in sizes.values()), seen


@pytest.mark.trio
async def test_the_watchdog_counts_what_tmp_and_shm_hold(tmp_path: Path) -> None:
    """Where no cgroup is writable: files in the sandbox's tmpfs are memory the RSS does not show."""
    config = write_config(tmp_path, {"tool": {"command": "/bin/sh", "sandbox": {"memory_mb": 64}}})
    plan = plan_for(config, "tool")
    # Each below the limit, together above it; the processes themselves hold next to nothing.
    script = "head -c 40M /dev/zero > /tmp/a && head -c 40M /dev/zero > /dev/shm/b && echo full && exec sleep 600"
    confined = confine.confine(plan, "tool", "/bin/sh", ["-c", script], {}, None)
    with sandboxes.popen(confined, stdout=subprocess.PIPE) as process:
        assert process.stdout is not None
        assert await trio.to_thread.run_sync(process.stdout.readline) == b"full\n"
        assert limits.private_memory(limits.tree_pids(process.pid)) < 64 * limits.MIB
        watchdog = limits.Watchdog.for_plan(plan, memory=True)
        with trio.fail_after(60):
            await watchdog.watch(process.pid, process.kill)
        assert watchdog.fired and "memory limit (64 MiB)" in watchdog.reason
        assert process.wait(timeout=60) != 0
        process.stdout.close()


def test_a_read_only_bind_inside_a_writable_one_is_refused_not_mounted_writable(tmp_path: Path) -> None:
    """bwrap mounted every `ro` before every `rw`: one nested in a writable bind came out writable."""
    work = tmp_path / "work"
    (work / "policy").mkdir(parents=True)
    readable_tree(work)
    config = write_config(
        tmp_path, {"tool": {"command": "/bin/sh", "sandbox": {"rw": [str(work)], "ro": [f"{work}/policy"]}}}
    )
    with pytest.raises(confine.SandboxError, match=r"policy lies inside the writable bind .*work"):
        run_in(plan_for(config, "tool"), "tool", "true")
    # In a read-only bind, a writable one is mounted after its parent and keeps its mode.
    (work / "policy").chmod(0o777)  # the sandbox's uid may write there; only the mount may refuse it
    config = write_config(
        tmp_path, {"tool": {"command": "/bin/sh", "sandbox": {"ro": [str(work)], "rw": [f"{work}/policy"]}}}
    )
    seen = run_in(plan_for(config, "tool"), "tool", f"touch {work}/policy/ok && echo inner-writable; touch {work}/no")
    assert "inner-writable" in seen and "Read-only file system" in seen, seen
