"""The bubblewrap command line built from a sandbox description, checked without running it."""

from __future__ import annotations

import pytest

from mcpvisor.runtime.bwrap import HOME, Bind, Mask, SandboxSpec, Symlink, bwrap_argv

SYSTEM = (
    Bind(source="/usr"),
    Symlink(path="/lib", target="usr/lib"),
    Symlink(path="/bin", target="usr/bin"),
    Bind(source="/etc"),
)


def pairs(argv: list[str], flag: str, width: int = 1) -> list[tuple[str, ...]]:
    """Every occurrence of `flag` in argv (before the command) with its `width` arguments."""
    head = argv[: argv.index("--")]
    return [tuple(head[i + 1 : i + 1 + width]) for i, arg in enumerate(head) if arg == flag]


def test_root_runs_the_command_as_the_sandbox_uid_without_a_user_namespace() -> None:
    spec = SandboxSpec(system=SYSTEM, uid=1234567, gid=1234568, network=True)
    argv = bwrap_argv(spec, ["server", "--flag"], privileged=True, bwrap="/usr/bin/bwrap")
    assert argv[0] == "/usr/bin/bwrap"
    assert "--unshare-user" not in argv and "--unshare-all" not in argv
    for flag in ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert "--unshare-net" not in argv
    assert pairs(argv, "--cap-drop") == [("ALL",)]
    assert pairs(argv, "--cap-add") == [("CAP_SETUID",), ("CAP_SETGID",), ("CAP_SETPCAP",)]
    tail = argv[argv.index("--") + 1 :]
    assert tail == [
        "/usr/bin/setpriv",
        "--reuid=1234567",
        "--regid=1234568",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        "server",
        "--flag",
    ]


def test_an_ordinary_user_gets_a_user_namespace_and_no_capabilities_at_all() -> None:
    argv = bwrap_argv(SandboxSpec(system=SYSTEM, uid=1000), ["server"], privileged=False)
    assert "--unshare-user" in argv
    assert pairs(argv, "--cap-add") == []
    assert argv[argv.index("--") + 1 :] == ["server"]


def test_no_network_is_its_own_namespace() -> None:
    assert "--unshare-net" in bwrap_argv(SandboxSpec(network=False), ["x"], privileged=True)


def test_system_is_read_only_and_symlinks_stay_symlinks() -> None:
    argv = bwrap_argv(SandboxSpec(system=SYSTEM), ["x"], privileged=True)
    assert pairs(argv, "--ro-bind", 2)[:2] == [("/usr", "/usr"), ("/etc", "/etc")]
    assert pairs(argv, "--symlink", 2) == [("usr/lib", "/lib"), ("usr/bin", "/bin")]
    assert ("/proc",) in pairs(argv, "--proc") and ("/tmp",) in pairs(argv, "--tmpfs")
    assert "--bind" not in argv  # nothing writable was asked for


def test_binds_get_enterable_parents_and_the_home_is_writable() -> None:
    spec = SandboxSpec(
        system=SYSTEM,
        binds=(
            Bind(source="/root/.pyenv/versions/3.11.7"),
            Bind(source="/srv/teams/alice", dest="/workspace", writable=True),
            Bind(source="/usr/local/lib/node"),
        ),
        home="/var/lib/mcpvisor/sandboxes/alice/shell",
    )
    argv = bwrap_argv(spec, ["x"], privileged=True)
    assert ("/root/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7") in pairs(argv, "--ro-bind", 2)
    assert pairs(argv, "--bind", 2) == [
        ("/srv/teams/alice", "/workspace"),
        ("/var/lib/mcpvisor/sandboxes/alice/shell", HOME),
    ]
    dirs = pairs(argv, "--dir")
    for parent in ("/root", "/root/.pyenv", "/root/.pyenv/versions", "/home"):
        assert (parent,) in dirs
        assert argv[argv.index(parent) - 3 : argv.index(parent) - 1] == ["--perms", "0755"]
    # /usr is bound already: nothing is made inside it.
    assert ("/usr/local",) not in dirs
    assert pairs(argv, "--chdir") == [(HOME,)]


def test_masks_cover_what_a_bind_would_show() -> None:
    spec = SandboxSpec(
        system=SYSTEM,
        binds=(Bind(source="/srv/project", dest="/project"),),
        masks=(
            Mask(path="/etc/mcpvisor"),
            Mask(path="/srv/project/.secrets/token", directory=False),
            Mask(path="/var/lib/mcpvisor"),  # not shown by any bind: nothing to cover
        ),
    )
    argv = bwrap_argv(spec, ["x"], privileged=True)
    # A hidden file is covered by a tmpfs on its dir, which a rename of the file cannot undo.
    assert pairs(argv, "--tmpfs") == [("/dev/shm",), ("/tmp",), ("/etc/mcpvisor",), ("/project/.secrets",)]
    assert argv[argv.index("/etc/mcpvisor") - 3 : argv.index("/etc/mcpvisor")] == ["--perms", "0000", "--tmpfs"]
    assert "/dev/null" not in argv
    assert "/var/lib/mcpvisor" not in argv


def test_a_hidden_file_at_the_top_of_a_bind_is_covered_alone() -> None:
    """Its dir is the bind itself, which must stay shown: the file alone is covered (binds of
    the operator's that would show one are refused before this, in workers.confine)."""
    spec = SandboxSpec(system=SYSTEM, masks=(Mask(path="/etc/x.key", directory=False),))
    argv = bwrap_argv(spec, ["x"], privileged=True)
    assert ("/dev/null", "/etc/x.key") in pairs(argv, "--ro-bind", 2)


def test_a_mask_on_a_bound_dir_itself_covers_it_whole() -> None:
    spec = SandboxSpec(binds=(Bind(source="/srv/data"),), masks=(Mask(path="/srv/data"),))
    argv = bwrap_argv(spec, ["x"], privileged=True)
    assert ("/srv/data",) in pairs(argv, "--tmpfs")
    # The mask comes after the bind, so it is on top.
    assert argv.index("--tmpfs", argv.index("/srv/data")) > argv.index("/srv/data")


def test_the_environment_is_never_on_the_command_line() -> None:
    argv = bwrap_argv(SandboxSpec(system=SYSTEM), ["x"], privileged=True)
    assert "--setenv" not in argv and "--clearenv" not in argv


def test_an_empty_command_is_refused() -> None:
    with pytest.raises(ValueError, match="no command"):
        bwrap_argv(SandboxSpec(), [], privileged=True)


def test_an_operator_cwd_wins_over_home() -> None:
    argv = bwrap_argv(SandboxSpec(home="/h", cwd="/workspace"), ["x"], privileged=False)
    assert pairs(argv, "--chdir") == [("/workspace",)]


def test_tmp_and_shm_are_writable_by_all_and_bounded_in_size() -> None:
    argv = bwrap_argv(SandboxSpec(system=SYSTEM, tmpfs_bytes=64 << 20), ["x"], privileged=True)
    for point in ("/dev/shm", "/tmp"):
        at = argv.index(point)
        assert argv[at - 5 : at] == ["--size", str(64 << 20), "--perms", "1777", "--tmpfs"]
    assert "--size" not in bwrap_argv(SandboxSpec(system=SYSTEM), ["x"], privileged=True)


def test_nested_binds_are_mounted_parent_first_whatever_order_they_came_in() -> None:
    spec = SandboxSpec(
        binds=(
            Bind(source="/srv/shared/scratch", writable=True),
            Bind(source="/srv/shared"),
            Bind(source="/srv/shared/scratch/deep", fd=7),
        ),
    )
    argv = bwrap_argv(spec, ["x"], privileged=True)
    mounts = [(arg, argv[i + 1], argv[i + 2]) for i, arg in enumerate(argv) if arg.endswith(("bind", "bind-fd"))]
    assert mounts == [
        ("--ro-bind", "/srv/shared", "/srv/shared"),
        ("--bind", "/srv/shared/scratch", "/srv/shared/scratch"),
        # Handed as the fd mcpvisor opened: what bwrap mounts is what was checked.
        ("--ro-bind-fd", "7", "/srv/shared/scratch/deep"),
    ]


def test_the_filter_the_user_namespace_lock_and_the_network_wait_are_passed() -> None:
    spec = SandboxSpec(seccomp_fd=5, block_fd=6, files=((8, "/etc/resolv.conf"),), own_ipc=False)
    unprivileged = bwrap_argv(spec, ["x"], privileged=False)
    assert "--disable-userns" in unprivileged and "--unshare-ipc" not in unprivileged
    assert pairs(unprivileged, "--seccomp") == [("5",)] and pairs(unprivileged, "--block-fd") == [("6",)]
    assert pairs(unprivileged, "--ro-bind-data", 2) == [("8", "/etc/resolv.conf")]
    # As root there is no user namespace to lock: the filter refuses new ones.
    assert "--disable-userns" not in bwrap_argv(spec, ["x"], privileged=True)
