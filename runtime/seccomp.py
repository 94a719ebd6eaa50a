"""The seccomp filter every sandbox runs under: Flatpak's, plus what Flatpak's list lacks.

bwrap loads it (`--seccomp FD`) just before it executes the sandbox's command, so bwrap itself
may still build namespaces and mounts, and nothing the sandbox runs afterwards can. The filter is
built by libseccomp (the system's libseccomp2, through pyseccomp's ctypes bindings; libseccomp's
own `seccomp` module is used where the interpreter has it), exported as BPF once per process into
a sealed memfd, and each bwrap gets a fresh read-only fd of it: bwrap reads to the end of its fd,
so two sandboxes starting at once must not share one file offset.

The rules follow Flatpak's `setup_seccomp` (common/flatpak-run.c), non-devel, single-arch: only
the native architecture is allowed (a 32-bit `int 0x80` call is killed by libseccomp's
bad-architecture action), with these additions, which Flatpak leaves to its user namespace: io_uring,
`userfaultfd` (the call, and `/dev/userfaultfd`'s ioctl), `kexec_*`, `bpf`, and loading kernel
modules.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass

CLONE_NEWUSER = 0x10000000
PER_LINUX = 0
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
USERFAULTFD_IOC_NEW = 0xAA00  # _IO(0xAA, 0x00) on /dev/userfaultfd
FS_IOC_FSSETXATTR = 0x401C5820  # sets a file's project id, which a home's quota counts by
# Socket families the sandbox may open (Flatpak's list); every other gets EAFNOSUPPORT.
ALLOWED_FAMILIES = (0, 1, 2, 10, 16)  # AF_UNSPEC, AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
FIX_LIBSECCOMP = "install libseccomp (apt-get install libseccomp2, dnf install libseccomp)"


@dataclass(frozen=True)
class Rule:
    """One refusal: the call, the errno it gets, and the argument it looks at (index, mask, value)."""

    call: str
    errno: int = errno.EPERM
    arg: tuple[int, int, int] | None = None  # (index, mask, value): refused when arg & mask == value
    why: str = ""
    flatpak: bool = True
    differs: bool = False  # refused when the argument differs from `arg`'s value instead


def _each(calls: str, why: str, *, code: int = errno.EPERM, flatpak: bool = True) -> list[Rule]:
    return [Rule(call, code, why=why, flatpak=flatpak) for call in calls.split()]


RULES: tuple[Rule, ...] = (
    *_each("syslog", "the kernel log"),
    *_each("uselib", "an obsolete call"),
    *_each("acct", "process accounting"),
    *_each("quotactl", "quota use of others"),
    *_each("add_key keyctl request_key", "the kernel keyrings (another sandbox's keys, mcpvisor's)"),
    *_each("move_pages mbind get_mempolicy set_mempolicy migrate_pages", "NUMA memory placement"),
    *_each("unshare setns mount umount umount2 pivot_root chroot", "namespaces and mounts of its own"),
    Rule("clone", arg=(0, CLONE_NEWUSER, CLONE_NEWUSER), why="a user namespace of its own"),
    Rule("ioctl", arg=(1, 0xFFFFFFFF, TIOCSTI), why="typing into a terminal (CVE-2017-5226)"),
    Rule("ioctl", arg=(1, 0xFFFFFFFF, TIOCLINUX), why="a virtual console's copy and paste (CVE-2023-28100)"),
    # Its flags are behind a pointer seccomp cannot follow: ENOSYS makes libc fall back to clone().
    Rule("clone3", errno.ENOSYS, why="clone() whose flags cannot be checked (CVE-2021-41133)"),
    *_each(
        "open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr",
        "the new mount API (CVE-2021-41133)",
        code=errno.ENOSYS,
    ),
    *_each("modify_ldt", "a historic source of leaks"),
    *_each("perf_event_open", "profiling, the source of many kernel bugs"),
    Rule("personality", arg=(0, 0xFFFFFFFF, PER_LINUX), differs=True, why="another execution domain"),
    *_each("ptrace", "tracing other processes"),
    # Beyond Flatpak's list.
    *_each("io_uring_setup io_uring_enter io_uring_register", "io_uring, a large attack surface", flatpak=False),
    *_each("userfaultfd", "userfaultfd, in every mode (UFFD_USER_MODE_ONLY too)", flatpak=False),
    Rule("ioctl", arg=(1, 0xFFFFFFFF, USERFAULTFD_IOC_NEW), why="userfaultfd through /dev/userfaultfd", flatpak=False),
    *_each("kexec_load kexec_file_load", "loading another kernel", flatpak=False),
    *_each("bpf", "eBPF programs and maps", flatpak=False),
    *_each("init_module finit_module delete_module", "kernel modules", flatpak=False),
    Rule("ioctl", arg=(1, 0xFFFFFFFF, FS_IOC_FSSETXATTR), why="retagging files out of the home's quota", flatpak=False),
)


class SeccompError(Exception):
    """The filter cannot be built here; the message names the fix."""


def _library():  # either module: the same API
    try:
        import seccomp  # libseccomp's own bindings, where the interpreter has them

        return seccomp
    except ImportError:
        pass
    try:
        import pyseccomp
    except ImportError as exc:
        raise SeccompError(f"the sandbox's seccomp filter needs pyseccomp ({exc})") from None
    return pyseccomp


def build() -> bytes:
    """The filter as BPF, for the native architecture."""
    try:
        lib = _library()
        arch = lib.system_arch()
        ctx = lib.SyscallFilter(lib.ALLOW)
    except (OSError, AttributeError) as exc:
        raise SeccompError(f"libseccomp cannot be loaded ({exc}): {FIX_LIBSECCOMP}") from None
    for rule in RULES:
        if lib.resolve_syscall(arch, rule.call) < 0:
            continue  # not a call of this architecture (umount on x86-64)
        args = []
        if rule.arg is not None:
            index, mask, value = rule.arg
            args = [lib.Arg(index, lib.NE, value) if rule.differs else lib.Arg(index, lib.MASKED_EQ, mask, value)]
        ctx.add_rule(lib.ERRNO(rule.errno), rule.call, *args)
    highest = max(ALLOWED_FAMILIES)
    for family in range(highest):
        if family not in ALLOWED_FAMILIES:
            ctx.add_rule(lib.ERRNO(errno.EAFNOSUPPORT), "socket", lib.Arg(0, lib.EQ, family))
    ctx.add_rule(lib.ERRNO(errno.EAFNOSUPPORT), "socket", lib.Arg(0, lib.GE, highest + 1))
    memfd = os.memfd_create("mcpvisor-seccomp", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(memfd), "wb") as out:
            ctx.export_bpf(out)
        return os.pread(memfd, os.fstat(memfd).st_size, 0)
    finally:
        os.close(memfd)


_sealed: int | None = None


def filter_fd() -> int:
    """A new fd (not inherited across exec unless passed) reading the filter from its start.

    The filter lives in one sealed memfd per process, built on first use; each call opens it
    anew, so each bwrap reads it from its own offset.
    """
    global _sealed
    if _sealed is None:
        program = build()
        memfd = os.memfd_create("mcpvisor-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.write(memfd, program)
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, seals)
        _sealed = memfd
    return os.open(f"/proc/self/fd/{_sealed}", os.O_RDONLY | os.O_CLOEXEC)


def describe() -> list[str]:
    """The refused calls, one line each, for `ctl inspect` and the docs."""
    lines = []
    for rule in RULES:
        condition = ""
        if rule.arg is not None:
            condition = f" (argument {rule.arg[0]} {'not ' if rule.differs else ''}{rule.arg[2]:#x})"
        lines.append(f"{rule.call}{condition}: {errno.errorcode[rule.errno]}, {rule.why}")
    lines.append("socket of a family other than unix, inet, inet6, netlink: EAFNOSUPPORT")
    return lines
