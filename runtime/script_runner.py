"""code_execution's script process in bubblewrap: what it may reach, and whether that can be built here.

The process that runs scripts in V8 (`python -m mcpvisor.workers.sandbox`) needs far less than an
upstream: the system's /usr (libraries), the Python it runs on and the few packages it imports,
all read-only, a private /tmp and /dev, a /proc of its own PID namespace, no network (a network
namespace with loopback only), no home, no /etc, and an environment of PATH and PYTHONPATH only.
So a script that escaped V8 would still find nothing of the host: no data dir, config, sockets,
secrets or other processes.

When the sandbox cannot be built (no bwrap, user namespaces refused, a container without the
grants of docs/sandbox-deployment.md), `decide` applies the rule every sandbox follows: where one
is required (tenants are configured, or `[mcpvisor] sandbox` is on) the scripts do not run
unconfined, and the reason names the fix; elsewhere (one user's workstation) they run in V8
alone, with a warning that says the same.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from mcpvisor.runtime import bwrap, namespaces, seccomp
from mcpvisor.wire.config import SandboxConfig, Settings

MODULE = "mcpvisor.workers.sandbox"
# Imported (or read, for dukpy's TypeScript compiler) inside; each is bound where it is installed.
PACKAGES = ("mcpvisor.workers", "py_mini_racer", "dukpy")
# The system part of the view: libraries and programs, never /etc (nothing in it is needed).
SYSTEM = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32")
PROBE_TIMEOUT = 30.0
GUIDE = "docs/sandbox-deployment.md"
# When mcpvisor runs as root, scripts run as this uid: far above the uids distributions hand out
# (so it owns no host file), unless the user namespace mcpvisor runs in maps fewer ids.
UID_FLOOR = 1 << 30


@dataclass(frozen=True)
class Decision:
    """How script processes start: inside bwrap (`confined`, as `spec` says), or not.

    `problem` says why the sandbox cannot be built (None when it can); `refused` is true when that
    means no script may run at all.
    """

    confined: bool
    problem: str | None = None
    refused: bool = False
    spec: bwrap.SandboxSpec | None = None
    privileged: bool = False
    tool: str = "bwrap"

    def argv(self, command: Sequence[str], seccomp_fd: int | None = None) -> list[str]:
        """The argv that starts `command` as this decision says (inside bwrap, or as it is).

        `seccomp_fd` (see `launch`) is the filter bwrap loads before the command runs.
        """
        if not self.confined:
            return list(command)
        assert self.spec is not None
        spec = msgspec.structs.replace(self.spec, seccomp_fd=seccomp_fd) if seccomp_fd is not None else self.spec
        return bwrap.bwrap_argv(spec, command, privileged=self.privileged, bwrap=self.tool)

    def launch(self, command: Sequence[str]) -> tuple[list[str], tuple[int, ...]]:
        """The argv, and the fds to pass to it (close them once it started): inside bwrap, the
        sandbox's seccomp filter (runtime.seccomp), the one every upstream's sandbox has."""
        if not self.confined:
            return list(command), ()
        fd = seccomp.filter_fd()
        return self.argv(command, fd), (fd,)

    @property
    def warning(self) -> str | None:
        """The line the log and `mcpvisor check` show, when there is something to say."""
        if self.problem is None:
            return None
        if self.refused:
            return f"code_execution is refused: its sandbox cannot be built here: {self.problem}"
        return f"code_execution runs in V8 alone, without its bubblewrap sandbox: {self.problem}"


def sandbox_required(settings: Settings, tenants: Mapping[str, object]) -> bool:
    """Whether scripts may only run inside their sandbox: with tenants, or `[mcpvisor] sandbox` on."""
    if tenants:
        return True
    chosen = settings.sandbox
    return chosen.enabled if isinstance(chosen, SandboxConfig) else bool(chosen)


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _system(path: str) -> bool:
    return any(_inside(path, system) for system in SYSTEM)


def python_paths(python: str) -> list[str]:
    """Host dirs the interpreter needs: a virtualenv it belongs to, and the prefix it is installed in."""
    found = []
    bin_dir = os.path.dirname(os.path.abspath(python))
    venv = os.path.dirname(bin_dir)
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        found.append(venv)
    real = os.path.realpath(python)
    found.append(os.path.dirname(os.path.dirname(real)))
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        # The prefixes Python reports know about layouts the path alone does not (framework builds).
        found += [sys.prefix, os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)]
    return [path for path in dict.fromkeys(found) if path not in ("", "/") and not _system(path)]


def package_dirs(names: Iterable[str] = PACKAGES) -> list[str]:
    """Where the packages the script process uses are installed (an editable install's source dir)."""
    found = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            found += [os.path.realpath(location) for location in spec.submodule_search_locations]
    return found


def read_only_paths(python: str) -> list[str]:
    """Every host dir bound read-only: the interpreter's, then the packages' not already inside one."""
    chosen: list[str] = []
    for path in [*python_paths(python), *package_dirs()]:
        if os.path.isdir(path) and not _system(path) and not any(_inside(path, done) for done in chosen):
            chosen = [done for done in chosen if not _inside(done, path)] + [path]
    return chosen


def script_uid(mapped: Sequence[tuple[int, int]]) -> int:
    """The unprivileged uid scripts run as under a root mcpvisor (see UID_FLOOR)."""
    start, count = max(mapped, key=lambda ids: ids[1])
    if start + count > UID_FLOOR + 1:
        return max(start, UID_FLOOR) + 1
    # A narrow map (a rootless container's 65536 ids): near its top, below nobody (65534).
    return start + count - 3


def spec_for(python: str, hidden: Iterable[str] = (), *, uid: int | None = None) -> bwrap.SandboxSpec:
    """The sandbox of a script process run by `python`: see the module's docstring."""
    masks = []
    for path in dict.fromkeys(hidden):
        for each in dict.fromkeys((path, os.path.realpath(path))):
            if os.path.lexists(each):  # a bind shows what exists; a missing path has no place to cover
                masks.append(bwrap.Mask(path=each, directory=not os.path.isfile(each)))
    return bwrap.SandboxSpec(
        system=bwrap.system_binds(SYSTEM),
        binds=tuple(bwrap.Bind(source=path) for path in read_only_paths(python)),
        masks=tuple(masks),
        network=False,
        cwd="/",
        uid=uid,
        gid=uid,
        hostname="code-execution",
    )


def environment(python: str) -> dict[str, str]:
    """The script process's whole environment: where programs and its Python packages are found."""
    bound = read_only_paths(python)
    # sys.path of this process, minus whatever the sandbox does not show (the cwd, a source tree).
    path = [entry for entry in sys.path if entry and any(_inside(os.path.realpath(entry), b) for b in bound)]
    return {"PATH": os.defpath, "PYTHONPATH": os.pathsep.join(path)}


_decided: dict[tuple[str, tuple[str, ...], bool], Decision] = {}


def decide(python: str, hidden: Iterable[str] = (), *, required: bool) -> Decision:
    """Whether script processes can start inside bwrap here, tried once per process with `python`."""
    hidden = tuple(hidden)
    key = (python, hidden, required)
    if key not in _decided:
        _decided[key] = _try(python, hidden, required)
    return _decided[key]


def _try(python: str, hidden: tuple[str, ...], required: bool) -> Decision:
    tool = shutil.which("bwrap")
    if tool is None:
        problem = "bwrap is not installed: install bubblewrap (apt-get install bubblewrap, dnf install bubblewrap)"
        return Decision(confined=False, problem=problem, refused=required)
    privileged = os.geteuid() == 0
    spec = spec_for(python, hidden, uid=script_uid(namespaces.mapped_ids()) if privileged else None)
    decision = Decision(confined=True, spec=spec, privileged=privileged, tool=tool)
    if not os.access(python, os.X_OK):
        return decision  # nothing to learn about bwrap here: starting the process reports the error
    try:
        probe, fds = decision.launch([python, "-c", f"import {MODULE}"])
    except seccomp.SeccompError as exc:
        return Decision(confined=False, problem=str(exc), refused=required)
    try:
        done = subprocess.run(
            probe,
            env=environment(python),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            check=False,
            pass_fds=fds,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        problem = f"bwrap cannot run ({type(exc).__name__}): install bubblewrap"
        return Decision(confined=False, problem=problem, refused=required)
    finally:
        for fd in fds:
            os.close(fd)
    if done.returncode == 0:
        return decision
    return Decision(confined=False, problem=explain(done.stderr), refused=required)


def explain(stderr: str) -> str:
    """One line from bwrap's complaint that names the fix."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    said = lines[-1][:200] if lines else "no message"
    lowered = said.lower()
    if not said.startswith("bwrap:") or "execvp" in lowered:
        return f"the script process fails inside bwrap ({said})"
    if "proc" in lowered:
        return (
            f"{said}: parts of /proc are covered (a container's masked paths, or a systemd unit's"
            " ProtectKernelTunables=/ProtectKernelLogs=); unmask them (Docker: --security-opt"
            f" systempaths=unconfined, Kubernetes: procMount: Unmasked), see {GUIDE}"
        )
    if "namespace" in lowered or "uid map" in lowered or "setting up uid" in lowered:
        return (
            f"{said}: user namespaces are refused; allow them (Ubuntu 24.04: an AppArmor profile for bwrap;"
            f" a container: the seccomp profile deploy/container/seccomp-bwrap.json), see {GUIDE}"
        )
    return f"{said}: give bwrap what it needs to mount (seccomp profile, AppArmor), see {GUIDE}"
