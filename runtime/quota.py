"""A sandbox's home limited by the file system itself: a project quota, where the volume has them.

ext4 (with the `project` feature, mounted `prjquota`) and XFS (mounted `prjquota`) count the
blocks of every file tagged with a project id. As root, the home is tagged with the sandbox's
uid as its project id (inherited by everything made inside, FS_XFLAG_PROJINHERIT), and the
project gets a hard limit of `home_mb`: a write past it fails with EDQUOT, in the sandbox alone.
The sandbox cannot retag its files: its seccomp filter refuses FS_IOC_FSSETXATTR, and in a user
namespace the kernel refuses to change a project id anyway.

Elsewhere (no project quota on the volume, or mcpvisor not root) `apply` says so and the
watchdog (workers.limits) holds the home's size instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import struct

FS_IOC_FSGETXATTR = 0x801C581F  # _IOR('X', 31, struct fsxattr)
FS_IOC_FSSETXATTR = 0x401C5820  # _IOW('X', 32, struct fsxattr)
_FS_XFLAG_PROJINHERIT = 0x200
_FSXATTR = "=IIIII8s"  # xflags, extsize, nextents, projid, cowextsize, pad
_SYS_QUOTACTL_FD = 443  # the same number on every architecture (new calls share one table)
_Q_SETQUOTA, _Q_GETINFO, _PRJQUOTA, _QIF_BLIMITS = 0x800008, 0x800005, 2, 1
_DQBLK = "=QQQQQQQQI4x"  # bhardlimit, bsoftlimit, curspace, ihardlimit, isoftlimit, curinodes, btime, itime, valid

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _quotactl(fd: int, command: int, ident: int, data: ctypes.Array[ctypes.c_char] | None) -> None:
    if _libc.syscall(_SYS_QUOTACTL_FD, fd, (command & ~0xFF) | _PRJQUOTA, ident, data) < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _tag(path: str, project: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        raw = bytearray(fcntl.ioctl(fd, FS_IOC_FSGETXATTR, bytes(struct.calcsize(_FSXATTR))))
        xflags, extsize, nextents, old, cow, pad = struct.unpack(_FSXATTR, raw)
        inherit = _FS_XFLAG_PROJINHERIT if os.path.isdir(path) else 0
        if old != project or not xflags & inherit:
            fcntl.ioctl(
                fd, FS_IOC_FSSETXATTR, struct.pack(_FSXATTR, xflags | inherit, extsize, nextents, project, cow, pad)
            )
    finally:
        os.close(fd)


def supported(path: str) -> bool:
    """Whether the volume holding `path` enforces project quotas (and this process may set them)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _quotactl(fd, _Q_GETINFO, 0, ctypes.create_string_buffer(64))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def apply(home: str, project: int, limit_bytes: int) -> bool:
    """Tag `home` (and what it holds) with `project` and limit that project to `limit_bytes`.

    False when the volume has no project quota (or this process may not set one): nothing changed.
    """
    if os.geteuid() != 0 or not supported(home):
        return False
    _tag(home, project)
    # What an earlier start (or a run without the quota) left in the home counts too.
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                with contextlib.suppress(FileNotFoundError):
                    _tag(path, project)
    blocks = max(1, limit_bytes // 1024)
    data = ctypes.create_string_buffer(struct.pack(_DQBLK, blocks, blocks, 0, 0, 0, 0, 0, 0, _QIF_BLIMITS))
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _quotactl(fd, _Q_SETQUOTA, project, data)
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ESRCH, errno.ENOTTY):
            return False
        raise
    finally:
        os.close(fd)
    return True
