"""The deploy files let bubblewrap work, and grant no more than it needs.

The seccomp profile shipped for containers is checked against what really runs: bwrap with the
argv mcpvisor builds, an upstream (mcp-server-time) in its sandbox, and code_execution's script
process running JavaScript and TypeScript, all as a container's unprivileged user (UID 10001,
no_new_privs, no capability) under strace. Every system call they make, with the arguments the
profile looks at, must be allowed by the profile read with Docker's rules, and by the system
unit's SystemCallFilter=, RestrictNamespaces= and RestrictAddressFamilies=. The compose file and
the Kubernetes manifest are read for the settings each grant needs. And the kernel rule behind
the /proc grants is shown with real mounts: a partly covered /proc makes bwrap fail, and mcpvisor
names the fix.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

from tests.support.unprivileged import CONTAINER_UID, as_container_user, missing_tools

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROFILE = DEPLOY / "container" / "seccomp-bwrap.json"
UNIT = DEPLOY / "systemd" / "mcpvisor.service"

BWRAP = shutil.which("bwrap")
STRACE = shutil.which("strace")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_bwrap = pytest.mark.skipif(BWRAP is None, reason="system package missing: bubblewrap")
needs_strace = pytest.mark.skipif(STRACE is None, reason="system package missing: strace")
needs_systemd = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="system package missing: systemd")
needs_emulation = pytest.mark.skipif(missing_tools() is not None, reason=missing_tools() or "")

# What bwrap needs beyond the runtime's default profile, which allows these only with CAP_SYS_ADMIN.
BWRAP_GRANTS = {"clone", "clone3", "unshare", "mount", "umount2", "pivot_root", "sethostname", "setns"}
NAMESPACE_FLAGS = {
    0x00020000: "mnt",
    0x02000000: "cgroup",
    0x04000000: "uts",
    0x08000000: "ipc",
    0x10000000: "user",
    0x20000000: "pid",
    0x40000000: "net",
}
# Calls the run is made to survive being refused (strace answers them EPERM, as the system unit's
# filter or the container's profile would): V8 asks for a memory protection key and does without one;
# a sandbox's child asks for a session keyring of its own, and where every key call is refused (the
# container's profile, as Docker's default does) the sandbox can reach no keyring anyway.
REFUSED_IN_THE_RUN = ("pkey_alloc", "keyctl")
FAMILIES = {1: "AF_UNIX", 2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK"}


# -- the profile, read with Docker's rules -----------------------------------------------------------


def load_profile() -> dict:
    return json.loads(PROFILE.read_text())


def _compare(op: str, arg: int, value: int, value_two: int) -> bool:
    return {
        "SCMP_CMP_NE": lambda: arg != value,
        "SCMP_CMP_LT": lambda: arg < value,
        "SCMP_CMP_LE": lambda: arg <= value,
        "SCMP_CMP_EQ": lambda: arg == value,
        "SCMP_CMP_GE": lambda: arg >= value,
        "SCMP_CMP_GT": lambda: arg > value,
        "SCMP_CMP_MASKED_EQ": lambda: arg & value == value_two,
    }[op]()


def verdict(profile: dict, name: str, args: list[int | None], *, caps: frozenset[str] = frozenset()) -> str:
    """The action the profile takes for one call, as Docker's loader builds the filter (x86-64)."""
    for rule in profile["syscalls"]:
        if name not in rule["names"]:
            continue
        includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
        if includes.get("arches") and "amd64" not in includes["arches"]:
            continue
        if includes.get("caps") and not set(includes["caps"]) <= caps:
            continue
        if excludes.get("arches") and "amd64" in excludes["arches"]:
            continue
        if excludes.get("caps") and set(excludes["caps"]) & caps:
            continue
        conditions = rule.get("args") or []
        if all(
            args[c["index"]] is not None and _compare(c["op"], args[c["index"]] or 0, c["value"], c.get("valueTwo", 0))
            for c in conditions
        ):
            return rule["action"]
    return profile["defaultAction"]


# -- strace ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    pid: int
    name: str
    args: list[int | None]  # the raw value of each argument strace printed as a number


LINE = re.compile(r"^([a-z0-9_]+)\((.*)")
RAW = ("socket", "personality", "clone", "unshare")


def _numbers(text: str) -> list[int | None]:
    values: list[int | None] = []
    for part in text.split(", ")[:6]:
        try:
            values.append(int(part.strip(), 0))
        except ValueError:
            values.append(None)
    return values


def _calls(pid: int, lines: list[str]) -> Iterator[Call]:
    for line in lines:
        match = LINE.match(line)
        if match is not None:
            name, rest = match.groups()
            yield Call(pid, name, _numbers(rest.rsplit(") =", 1)[0]) if name in RAW else [])


def _child(call: Call, line: str) -> int | None:
    if call.name not in ("clone", "clone3", "fork", "vfork"):
        return None
    return _numbers(line.rsplit("= ", 1)[-1].split()[0])[0]  # raw calls print it in hex


def read_trace(prefix: Path, first_exec: str) -> list[Call]:
    """Every call made from the moment the root process ran `first_exec`, by it and every other.

    The root process first sets up the emulated container (as root: mounts, setpriv); those calls,
    and the helpers it ran for them, are left out. A process's children inside a PID namespace
    cannot be told by the pids strace shows (the clone returns their inner pid), hence "every other".
    """
    files = {int(path.suffix[1:]): path for path in prefix.parent.glob(prefix.name + ".*")}
    root = next(pid for pid, path in files.items() if re.match(r'execve\("[^"]*/unshare"', path.read_text()))
    lines = files[root].read_text().splitlines()
    start = next(
        n for n, line in enumerate(lines) if line.startswith(f'execve("{first_exec}"') and line.endswith(" = 0")
    )
    scaffold = {_child(call, line) for line in lines[:start] for call in _calls(root, [line])} - {None}
    calls = list(_calls(root, lines[start + 1 :]))
    for pid, path in files.items():
        if pid != root and pid not in scaffold:
            calls += _calls(pid, path.read_text().splitlines())
    return calls


def as_container(command: list[str], base: Path, *, wrap: list[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run `command` as the container's user (with its own work dir as the last argument), inside `wrap`."""
    # The container user's own dir, which it can reach (pytest's tmp dirs are root's alone).
    work = Path(tempfile.mkdtemp(prefix="mcpvisor-deploy-"))
    try:
        os.chown(work, CONTAINER_UID, CONTAINER_UID)
        work.chmod(0o755)
        stash = base / "stash"
        stash.mkdir()
        inner = as_container_user([*command, str(work)], stash, readable=[work])
        return subprocess.run(
            [*wrap, *inner],
            env={"PATH": os.defpath, "LANG": "C.UTF-8"},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_report(done: subprocess.CompletedProcess[str]) -> None:
    """The driver's run worked: the upstream answered in its sandbox, scripts ran in theirs."""
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["time"].startswith('{\n  "timezone": "UTC"'), report
    assert report["script"] == {"js": 42, "ts": "typed"}, report
    assert report["confined"] is True
    assert report["watched"] > 0  # the watchdog read the sandbox's memory, its IPC namespace's too


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> list[Call]:
    """One run of everything that is to be confined, as a container runs it, under strace."""
    if BWRAP is None or STRACE is None or missing_tools() is not None:
        pytest.skip(missing_tools() or "system package missing: strace")
    base = tmp_path_factory.mktemp("traced")
    trace = base / "trace"
    strace = [
        *(STRACE, "-f", "-ff", "-qq", "-s", "64", "-e", f"raw={','.join(RAW)}", "-o", str(trace)),
        *(arg for name in REFUSED_IN_THE_RUN for arg in ("-e", f"inject={name}:error=EPERM")),
    ]
    # The trace is read only if the run worked: then it holds a whole, successful run.
    check_report(as_container([sys.executable, "-c", DRIVER], base, wrap=strace))
    return read_trace(trace, sys.executable)


DRIVER = r"""
import json, os, subprocess, sys, trio
from mcpvisor.frontend.tools.code_execution import Confinement, SandboxPool, execute_code
from mcpvisor.wire.sandboxing import SandboxPlan
from mcpvisor.workers.confine import confine
from mcpvisor.workers.limits import Watchdog

work = sys.argv[1]

def upstream():
    # An upstream's sandbox exactly as a tenant's worker builds it (workers/confine.py, workers/stdio.py):
    # its own outbound network through pasta, and the watchdog's look at its memory.
    plan = SandboxPlan(home=os.path.join(work, "home"), network="outbound", limits="watchdog")
    confined = confine(plan, "alice/time", os.path.join(sys.prefix, "bin", "mcp-server-time"), [], {}, None)
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
         "capabilities": {}, "clientInfo": {"name": "trace", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "get_current_time", "arguments": {"timezone": "UTC"}}},
    ]
    process = subprocess.Popen(confined.argv, env=confined.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, pass_fds=confined.pass_fds, preexec_fn=confined.prepare)
    confined.started()
    confined.outbound.start_blocking(process.pid, confined.namespaces)
    watchdog = Watchdog.for_plan(plan, memory=True)
    watchdog.ipc_fd, watchdog.userns_fd = confined.namespaces.ipc, confined.namespaces.ipc_owner
    answers = {}
    for message in messages:
        process.stdin.write(json.dumps(message) + "\n")
        process.stdin.flush()
        while "id" in message and message["id"] not in answers:
            reply = json.loads(process.stdout.readline())
            answers[reply.get("id")] = reply
    watched = watchdog.memory_used([process.pid])
    process.stdin.close()
    process.wait(timeout=30)
    confined.close()
    return answers[3]["result"]["content"][0]["text"], watched

async def scripts():
    pool = SandboxPool(size=1, heap_mb=64, confinement=Confinement(required=True))
    async def answer(server, tool, args, intent):
        return True, {"content": [{"type": "text", "text": str(args["n"] * 2)}]}
    try:
        js = await execute_code({"code": "Number(call_tool('m', 'double', {n: 21}).result.content[0].text)"},
                                answer, pool=pool)
        ts = await execute_code({"code": "const s: string = 'typed'; s", "language": "typescript"}, answer, pool=pool)
        decision = await pool.decision()
        return {"js": js.data.get("value"), "ts": ts.data.get("value")}, decision.confined
    finally:
        await pool.aclose()

time, watched = upstream()
script, confined = trio.run(scripts)
print(json.dumps({"time": time, "script": script, "confined": confined, "watched": watched}))
"""


DECIDE = r"""
import json, sys
from mcpvisor.runtime import script_runner
decision = script_runner.decide(sys.executable, (), required=True)
print(json.dumps({"confined": decision.confined, "warning": decision.warning}))
"""


# -- the seccomp profile ---------------------------------------------------------------------------


def test_the_profile_is_dockers_format_with_a_deny_default() -> None:
    profile = load_profile()
    assert set(profile) == {"defaultAction", "defaultErrnoRet", "archMap", "syscalls"}
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and profile["defaultErrnoRet"] == 1
    assert {arch["architecture"] for arch in profile["archMap"]} == {"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"}
    for rule in profile["syscalls"]:
        assert set(rule) <= {"names", "action", "args", "comment", "includes", "excludes", "errnoRet"}, rule
        assert rule["action"] == "SCMP_ACT_ALLOW" and rule["names"] and rule["comment"]
        for condition in rule.get("args") or []:
            assert set(condition) <= {"index", "value", "valueTwo", "op"} and 0 <= condition["index"] < 6


@needs_systemd
def test_every_name_in_the_profile_is_a_system_call() -> None:
    assert not {name for rule in load_profile()["syscalls"] for name in rule["names"]} - systemd_group("@known")


def test_what_stays_refused_in_a_container() -> None:
    profile = load_profile()
    dangerous = [
        "kexec_load", "init_module", "finit_module", "delete_module", "open_by_handle_at", "bpf",
        "perf_event_open", "keyctl", "add_key", "request_key", "reboot", "swapon", "syslog",
        "chroot", "fsopen", "fsmount", "move_mount", "open_tree", "mount_setattr", "userfaultfd", "iopl",
        "ioperm", "clock_settime", "settimeofday", "acct", "quotactl", "kcmp", "pidfd_getfd",
        "process_madvise", "lookup_dcookie", "vhangup",
    ]  # fmt: skip
    assert [name for name in dangerous if verdict(profile, name, [0] * 6) != "SCMP_ACT_ERRNO"] == []
    assert verdict(profile, "socket", [40, 1, 0]) == "SCMP_ACT_ERRNO"  # AF_VSOCK reaches the VM's host
    assert verdict(profile, "personality", [0x0040000]) == "SCMP_ACT_ERRNO"  # ADDR_NO_RANDOMIZE


@needs_bwrap
@needs_strace
@needs_emulation
def test_every_call_of_the_sandboxed_run_is_allowed_by_the_profile(traced: list[Call]) -> None:
    profile = load_profile()
    refused = sorted({(call.name, tuple(call.args)) for call in traced if verdict(profile, call.name, call.args)
                      != "SCMP_ACT_ALLOW" and call.name not in REFUSED_IN_THE_RUN})  # fmt: skip
    assert refused == []
    assert verdict(profile, "keyctl", [0] * 6) == "SCMP_ACT_ERRNO"  # refused, as the run survives
    # The run did build sandboxes: a user namespace and every other kind, mounts, a new root.
    names = {call.name for call in traced}
    assert {"unshare", "mount", "umount2", "pivot_root"} <= names
    made = {NAMESPACE_FLAGS[flag] for call in traced if call.name == "clone" and call.args[0]
            for flag in NAMESPACE_FLAGS if call.args[0] & flag}  # fmt: skip
    assert made == {"user", "mnt", "pid", "ipc", "uts", "net", "cgroup"}


@needs_bwrap
@needs_strace
@needs_emulation
def test_the_profile_grants_what_bwrap_needs_beyond_the_default(traced: list[Call]) -> None:
    # Without the grants (the runtime default for a container without CAP_SYS_ADMIN), exactly those
    # calls of the run are refused: the rest of the profile is the default's allow list.
    profile = load_profile()
    default = dict(profile, syscalls=[rule for rule in profile["syscalls"] if set(rule["names"]) != BWRAP_GRANTS])
    default["syscalls"].append(
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "comment": "the default's rule: no namespace flags",
         "args": [{"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]}
    )  # fmt: skip
    refused = {call.name for call in traced if verdict(default, call.name, call.args) != "SCMP_ACT_ALLOW"}
    refused -= set(REFUSED_IN_THE_RUN)
    # The default answers clone3 with ENOSYS, and glibc falls back to clone: refused, but not a failure.
    assert refused - {"clone3"} == {"clone", "unshare", "mount", "umount2", "pivot_root", "sethostname", "setns"}


LIBSECCOMP = ctypes.util.find_library("seccomp")
needs_libseccomp = pytest.mark.skipif(LIBSECCOMP is None, reason="system package missing: libseccomp2")
SECCOMP_EXEC = REPO / "tests" / "support" / "seccomp_exec.py"


@needs_bwrap
@needs_libseccomp
@needs_emulation
def test_under_the_profile_enforced_the_sandboxed_run_works(tmp_path: Path) -> None:
    # The profile loaded with libseccomp, as a runtime does: the same run works under it.
    check_report(
        as_container([sys.executable, str(SECCOMP_EXEC), str(PROFILE), sys.executable, "-c", DRIVER], tmp_path)
    )


@needs_bwrap
@needs_libseccomp
@needs_emulation
def test_under_the_default_profile_scripts_are_refused_and_the_fix_named(tmp_path: Path) -> None:
    # The runtime default (for a container without CAP_SYS_ADMIN): bwrap cannot make its namespaces.
    profile = load_profile()
    profile["syscalls"] = [rule for rule in profile["syscalls"] if set(rule["names"]) != BWRAP_GRANTS] + [
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
         "args": [{"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
    ]  # fmt: skip
    # Where the container's user can read it (pytest's tmp dirs are root's alone).
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="mcpvisor-default-") as default:
        default.write(json.dumps(profile))
        default.flush()
        os.chmod(default.name, 0o644)
        command = [sys.executable, str(SECCOMP_EXEC), default.name, sys.executable, "-c", DECIDE]
        done = as_container(command, tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["confined"] is False
    assert seen["warning"].startswith("code_execution is refused: its sandbox cannot be built here: bwrap: No perm")
    assert "user namespaces are refused" in seen["warning"] and "seccomp-bwrap.json" in seen["warning"]


# -- the systemd unit ------------------------------------------------------------------------------


@cache
def systemd_groups() -> dict[str, list[str]]:
    out = subprocess.run([SYSTEMD_ANALYZE or "systemd-analyze", "syscall-filter"], capture_output=True, text=True)
    groups: dict[str, list[str]] = {}
    current = None
    for line in out.stdout.splitlines():
        if line.startswith("@"):
            current = line.split()[0]
            groups[current] = []
        elif current and line.strip() and not line.strip().startswith("#"):
            groups[current].append(line.strip())
    return groups


def systemd_group(name: str) -> set[str]:
    found: set[str] = set()
    for member in systemd_groups().get(name, []):
        found |= systemd_group(member) if member.startswith("@") else {member}
    return found


def unit_settings(name: str) -> list[str]:
    return [line.split("=", 1)[1] for line in UNIT.read_text().splitlines() if line.startswith(f"{name}=")]


def unit_allowed_calls() -> set[str]:
    """The calls SystemCallFilter= lets through: the allow list, minus every `~` deny list."""
    allowed: set[str] = set()
    for value in unit_settings("SystemCallFilter"):
        words = value.removeprefix("~").split()
        named = set().union(*(systemd_group(w) if w.startswith("@") else {w} for w in words))
        allowed = allowed - named if value.startswith("~") else allowed | named
    return allowed


@needs_bwrap
@needs_strace
@needs_systemd
@needs_emulation
def test_the_system_unit_lets_the_same_run_through(traced: list[Call]) -> None:
    allowed = unit_allowed_calls()
    assert {"mount", "umount2", "pivot_root", "capset", "sethostname"} <= allowed
    assert not {"chroot", "fsopen", "move_mount", "syslog", "kexec_load", "bpf", "setdomainname"} & allowed
    # restart_syscall is the kernel's own, never filtered; the run went on with REFUSED_IN_THE_RUN refused.
    assert sorted({call.name for call in traced} - allowed - {"restart_syscall", *REFUSED_IN_THE_RUN}) == []
    (namespaces,) = unit_settings("RestrictNamespaces")
    used = {NAMESPACE_FLAGS[flag] for call in traced if call.name in ("clone", "unshare") and call.args[0]
            for flag in NAMESPACE_FLAGS if call.args[0] & flag}  # fmt: skip
    assert used <= set(namespaces.split()) and "time" not in namespaces
    (families,) = unit_settings("RestrictAddressFamilies")
    opened = {FAMILIES.get(call.args[0] or 0, str(call.args[0])) for call in traced if call.name == "socket"}
    assert "AF_NETLINK" in opened and opened <= set(families.split())


def test_the_unit_drops_only_what_blocks_the_sandbox() -> None:
    text = UNIT.read_text()
    settings = {line.split("=", 1)[0] for line in text.splitlines() if "=" in line and not line.startswith("#")}
    assert "ProtectHostname" not in settings  # it forbids sethostname even in a sandbox's own namespace
    for kept in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
                 "ProtectProc", "CapabilityBoundingSet", "SystemCallArchitectures", "RestrictSUIDSGID"):  # fmt: skip
        assert kept in settings, kept
    # These lay mounts over /proc (see test_a_partly_covered_proc_stops_bwrap) or freeze cgroups.
    for dropped in ("ProtectKernelTunables", "ProtectKernelLogs", "ProtectControlGroups", "ProcSubset"):
        assert dropped not in settings, dropped
    assert unit_settings("Delegate") == ["yes"]
    assert unit_settings("BindPaths") == ["/dev/net/tun"] and unit_settings("DeviceAllow") == ["/dev/net/tun rw"]
    user_unit = (DEPLOY / "systemd" / "mcpvisor-user.service").read_text()
    assert "\nDelegate=yes\n" in user_unit and "RestrictNamespaces=" not in user_unit


# -- compose and Kubernetes ------------------------------------------------------------------------


def mcpvisor_services(compose: dict) -> list[dict]:
    return [service for service in compose["services"].values() if str(service.get("image", "")).startswith("mcpvisor")]


@pytest.mark.parametrize("name", ["compose.yaml", "compose.replicas.yaml"])
def test_compose_grants_what_bwrap_needs_and_nothing_more(name: str) -> None:
    services = mcpvisor_services(yaml.safe_load((DEPLOY / "container" / name).read_text()))
    assert services
    for service in services:
        options = service["security_opt"]
        assert "seccomp=./seccomp-bwrap.json" in options
        assert "apparmor=unconfined" in options and "systempaths=unconfined" in options
        assert "no-new-privileges:true" in options and "seccomp=unconfined" not in options
        assert service["cap_drop"] == ["ALL"] and "cap_add" not in service
        assert "privileged" not in service and service["read_only"] is True
        # pasta's tap device, and the homes on a volume apart from the state and logs.
        assert service["devices"] == ["/dev/net/tun:/dev/net/tun"]
        mounts = [v["target"] if isinstance(v, dict) else v.split(":")[1] for v in service.get("volumes", [])]
        mounts += [t.split(":")[0] for t in service.get("tmpfs", [])]
        assert "/var/lib/mcpvisor/sandboxes" in mounts, mounts
    assert (DEPLOY / "container" / "seccomp-bwrap.json").is_file()
    assert "bubblewrap" in (DEPLOY / "container" / "Containerfile").read_text()


@pytest.mark.parametrize("name", ["mcpvisor.yaml", "mcpvisor-replicas.yaml"])
def test_kubernetes_grants_what_bwrap_needs_and_nothing_more(name: str) -> None:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))
    (deployment,) = [doc for doc in documents if doc and doc["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["hostUsers"] is False  # required by procMount: Unmasked
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = [c for c in pod["containers"] if c["name"] == "mcpvisor"]
    context = container["securityContext"]
    assert context["seccompProfile"] == {"type": "Localhost", "localhostProfile": "profiles/mcpvisor-bwrap.json"}
    assert context["appArmorProfile"] == {"type": "Unconfined"}
    assert context["procMount"] == "Unmasked"
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]} and "privileged" not in context
    # pasta's tap device through a device plugin; the homes on a volume of their own.
    assert container["resources"]["limits"]["squat.ai/tun"] == 1
    homes = [m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/mcpvisor/sandboxes"]
    assert len(homes) == 1 and homes[0]["name"] != "data"


# -- /proc -----------------------------------------------------------------------------------------


@needs_bwrap
@needs_emulation
@pytest.mark.parametrize("cover", [None, "/proc/sys", "/proc/kmsg"])
def test_a_partly_covered_proc_stops_bwrap(tmp_path: Path, cover: str | None) -> None:
    # A container runtime's masked and read-only /proc paths, or the unit's ProtectKernelTunables=
    # (/proc/sys) and ProtectKernelLogs= (/proc/kmsg), emulated with the same mounts.
    inner = as_container_user([sys.executable, "-c", DECIDE], tmp_path / "stash")
    covering = "true" if cover is None else f"mount --bind {cover} {cover} && mount -o remount,bind,ro {cover}"
    if cover == "/proc/kmsg":
        covering = "mount --bind /dev/null /proc/kmsg"
    (tmp_path / "stash").mkdir()
    script = f'mount -t proc proc /proc && {covering} && exec "$@"'
    command = ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "--",
               "sh", "-c", script, "sh", *inner]  # fmt: skip
    done = subprocess.run(command, env={"PATH": os.defpath}, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    if cover is None:
        assert seen == {"confined": True, "warning": None}
    else:
        assert seen["confined"] is False
        assert seen["warning"].startswith("code_execution is refused: its sandbox cannot be built here: bwrap: Can't")
        assert "systempaths=unconfined" in seen["warning"] and "procMount: Unmasked" in seen["warning"]
