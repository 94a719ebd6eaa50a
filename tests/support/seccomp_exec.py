"""Load a seccomp profile in Docker's JSON format with libseccomp, then exec a command under it.

    python tests/support/seccomp_exec.py PROFILE.json COMMAND [ARGS...]

What a container runtime does with `--security-opt seccomp=PROFILE.json` (for a container without
capabilities, on x86-64), so that a test can run real programs under the shipped profile. The
process must already have no_new_privs set (setpriv --no-new-privs), as a container's has.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import sys

ACT_ALLOW = 0x7FFF0000
ACT_ERRNO = 0x00050000
OPS = {
    "SCMP_CMP_NE": 1,
    "SCMP_CMP_LT": 2,
    "SCMP_CMP_LE": 3,
    "SCMP_CMP_EQ": 4,
    "SCMP_CMP_GE": 5,
    "SCMP_CMP_GT": 6,
    "SCMP_CMP_MASKED_EQ": 7,
}


class ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def applies(rule: dict) -> bool:
    """Docker's includes/excludes for a container with no capability on amd64."""
    includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
    if includes.get("caps") or (includes.get("arches") and "amd64" not in includes["arches"]):
        return False
    return not (excludes.get("arches") and "amd64" in excludes["arches"])


def action(name: str, errno: int | None) -> int:
    if name == "SCMP_ACT_ALLOW":
        return ACT_ALLOW
    if name == "SCMP_ACT_ERRNO":
        return ACT_ERRNO | ((errno if errno is not None else 1) & 0xFFFF)
    raise ValueError(f"action {name} is not used by the profiles tested here")


def load(profile: dict) -> None:
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(action(profile["defaultAction"], profile.get("defaultErrnoRet")))
    if not ctx:
        raise OSError("seccomp_init failed")
    for rule in profile["syscalls"]:
        if not applies(rule):
            continue
        conditions = rule.get("args") or []
        array = (ArgCmp * max(1, len(conditions)))()
        for n, condition in enumerate(conditions):
            if condition["op"] == "SCMP_CMP_MASKED_EQ":
                array[n] = ArgCmp(
                    condition["index"], OPS[condition["op"]], condition["value"], condition.get("valueTwo", 0)
                )
            else:
                array[n] = ArgCmp(condition["index"], OPS[condition["op"]], condition["value"], 0)
        for name in rule["names"]:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                continue  # another architecture's call
            result = lib.seccomp_rule_add_array(
                ctx, action(rule["action"], rule.get("errnoRet")), number, len(conditions), array
            )
            if result < 0:
                raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")
    result = lib.seccomp_load(ctx)
    if result < 0:
        raise OSError(-result, f"seccomp_load: {os.strerror(-result)}")


def main() -> None:
    with open(sys.argv[1]) as f:
        profile = json.load(f)
    load(profile)
    os.execv(sys.argv[2], sys.argv[2:])


if __name__ == "__main__":
    main()
