"""Supervision proven over its state space: a real mcpvisor driven by hypothesis against a small model.

`SupervisionMachine` is a `RuleBasedStateMachine` whose rules are what an operator or a fault does
to a running mcpvisor: `ctl start|stop|restart|enable|disable|reread|update|shutdown`, SIGHUP,
SIGTERM, SIGINT, edits of the config file, and `kill -9` of workers, upstreams, the frontend and
the forkserver. Its servers
are tests/upstreams/raw_server.py, each with a behaviour the config file gives it (and edits
change): it runs well, crashes at start, crashes later, hangs on initialize, ignores SIGTERM, or
exits cleanly. (An upstream that ends once it was ready is started again by its worker, which
stays RUNNING: the supervisor's rules apply to workers, the worker's reconnects to upstreams.)

Beside the real processes runs `Model`, supervisord's rules in a few lines: what each server is
expected to settle in, given whether the operator wants it running and how it behaves. After every
step the machine waits for the processes to settle, compares each one's state with the model and
checks the invariants:

- a stop (`ctl stop`, `ctl shutdown`, SIGTERM, SIGINT, during a reload or not) completes within
  its bound: the largest stopwaitsecs and the moments SIGKILL takes;
- no orphan: every upstream process runs under the worker of its server, every child of the
  supervisor is its frontend, its forkserver or a worker it knows, and nothing is left once it
  has exited;
- no process runs that the model says is stopped;
- every process the supervisor calls RUNNING has a live pid, and a RUNNING server that works
  answers a call;
- after any kill, a call to that server comes back (an answer or an error) within a bound;
- `ctl` exit codes follow LSB: status 0 only when everything runs, else 3; 4 for an unknown name.

Timing on a shared machine is noisy, so the model gives sets of states rather than one, and the
bounds are generous; they are still bounds: a stop that hangs, a phantom RUNNING, a worker left
behind, all fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
import trio
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mcpvisor.supervisor.ctl import NoDaemon
from tests.support.stack import UPSTREAMS, Stack, alive, free_port, serve_config

SERVERS = ("alpha", "beta", "gamma")
BEHAVIOURS = {
    "good": [],
    "crash_start": ["--crash-at-start"],
    "crash_later": ["--crash-after", "4"],
    "hang_init": ["--hang-on-initialize"],
    "ignore_term": ["--ignore-term"],
    "exit_clean": ["--exit-after", "3"],
}
POLICY = {
    "startsecs": 1,
    "startretries": 2,
    "backoff_max": 2,
    "init_timeout": 2,
    "stopwaitsecs": 3,
    "autorestart": "unexpected",  # a clean exit (0) stays EXITED, a crash is restarted
    "call_timeout": 20,
}
SETTINGS = {"leave_timeout": 1}  # the frontend's stopwaitsecs: 10 + leave_delay (0) + 1
KILL_WAIT = 5.0
MARGIN = 5.0  # a loaded two-core machine, another engineer's tests beside ours
STOP_BOUND = 11 + KILL_WAIT + MARGIN  # the largest stopwaitsecs (the frontend's) and SIGKILL's moments
WORKER_STOP_BOUND = POLICY["stopwaitsecs"] + KILL_WAIT + MARGIN
SETTLE = 45.0  # how long a server may take to reach what the model expects
CALL_BOUND = 25.0  # a call after a kill comes back (answer or error) within this

CTL = [sys.executable, "-P", "-m", "mcpvisor.supervisor", "ctl"]


@dataclass
class ServerModel:
    """What supervisord's rules say about one server."""

    enabled: bool = True
    behaviour: str = "good"  # as mcpvisor runs it
    file_behaviour: str = "good"  # as the config file says, applied by update / SIGHUP
    wanted: bool = True  # started (by mcpvisor's start, start, restart, enable, update), not stopped
    fatal_allowed: bool = False  # a kill during its start may have used up its start retries

    def settled(self) -> set[str]:
        """The states it must reach, and then stay in while nothing happens to it."""
        if not self.enabled:
            return {"STOPPED"}  # listed as disabled
        if not self.wanted:
            return {"STOPPED", "EXITED", "FATAL"}  # a stop leaves EXITED and FATAL as they are
        fatal = {"FATAL"} if self.fatal_allowed else set()
        match self.behaviour:
            case "good" | "ignore_term":
                return {"RUNNING"} | fatal
            case "crash_start" | "hang_init":
                return {"FATAL"}
            case _:
                # crash_later, exit_clean: an upstream that ends after it was ready is started again
                # by its worker, which stays RUNNING. On a slow machine the end may come before the
                # first ready: a failed start, and after startretries of them, FATAL.
                return {"RUNNING", "FATAL"}

    def start_codes(self) -> set[int]:
        """What `ctl start` may exit with."""
        if not self.enabled:
            return {4}
        match self.behaviour:
            case "good" | "ignore_term":
                return {0} | ({1} if self.fatal_allowed else set())
            case "crash_start" | "hang_init":
                return {1}
            case _:
                return {0, 1}  # it runs, unless its exit beats startsecs

    @property
    def may_run(self) -> bool:
        return self.enabled and self.wanted

    @property
    def answers(self) -> bool:
        return self.may_run and self.behaviour in ("good", "ignore_term")


@dataclass
class Model:
    servers: dict[str, ServerModel] = field(default_factory=lambda: {name: ServerModel() for name in SERVERS})

    def restarted(self) -> None:
        """mcpvisor started again: the file is what runs, and every enabled server is wanted."""
        for server in self.servers.values():
            server.behaviour = server.file_behaviour
            server.wanted = True
            server.fatal_allowed = False

    def pending(self) -> list[str]:
        """What `reread` must report as changed."""
        return sorted(name for name, s in self.servers.items() if s.behaviour != s.file_behaviour)

    def updated(self) -> None:
        """`update` / SIGHUP: a changed server is restarted with the file's table."""
        for server in self.servers.values():
            if server.behaviour != server.file_behaviour:
                server.behaviour = server.file_behaviour
                server.wanted = True
                server.fatal_allowed = False


def server_table(tag: str, name: str, behaviour: str, enabled: bool) -> dict[str, Any]:
    args = [str(UPSTREAMS / "raw_server.py"), "--tag", f"{tag}-{name}", *BEHAVIOURS[behaviour]]
    table: dict[str, Any] = {"command": sys.executable, "args": args, "policy": dict(POLICY)}
    if not enabled:
        table["enabled"] = False
    return table


class Finding(AssertionError):
    """An invariant that did not hold: a defect of mcpvisor (or of the model, to be judged)."""


class SupervisionMachine(RuleBasedStateMachine):
    """A real mcpvisor (supervisor, frontend, forkserver, workers, upstreams) against `Model`."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="mvmodel"))
        self.tag = self.tmp.name  # in every upstream's command line: ours, and no one else's
        self.model = Model()
        self.stack: Stack | None = None
        self.port = free_port()
        self.port_moves = 0
        self.steps = 0
        self.log: list[str] = []
        self._write_config()
        self._start()

    # -- the stack -------------------------------------------------------------------------------

    def _write_config(self) -> None:
        servers = {
            name: server_table(self.tag, name, m.file_behaviour, m.enabled) for name, m in self.model.servers.items()
        }
        path = self.tmp / "mcpvisor.toml"
        if path.exists():
            # mcpvisor writes `enabled` back itself: keep the file as it is, change what the step changes.
            document = tomllib.loads(path.read_text())
            for name, table in servers.items():
                document["servers"][name]["args"] = table["args"]
            path.write_text(tomli_w.dumps(document))
            return
        settings = {
            "listen": f"127.0.0.1:{self.port}",
            "enable_direct_endpoint": True,
            "data_dir": str(self.tmp / "data"),
            **SETTINGS,
        }
        path.write_text(tomli_w.dumps({"mcpvisor": settings, "servers": servers}))

    def _move_port(self) -> None:
        path = self.tmp / "mcpvisor.toml"
        document = tomllib.loads(path.read_text())
        self.port = free_port()
        document["mcpvisor"]["listen"] = f"127.0.0.1:{self.port}"
        path.write_text(tomli_w.dumps(document))

    def _launch(self) -> Stack:
        """`mcpvisor serve` on the config as it is (launch_stack would write a new one)."""
        return serve_config(self.tmp / "mcpvisor.toml", self.tmp / "data", self.port)

    def _start(self) -> None:
        stack = self._launch()
        self.stack = stack
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if stack.process.poll() is not None:
                output = stack.supervisor_output()
                holders = _listeners(self.port)
                # Ours: one of this run's processes (its frontend's environment names our config).
                ours = [holder for holder in holders if _mentions(int(holder.split()[0]), str(self.tmp))]
                taken = stack.process.returncode == 1 and "address is in use" in output
                if taken and not ours and self.port_moves < 3:
                    # Another program took the port while mcpvisor was stopped (a busy machine reuses
                    # ports, a client's connection may have had it a moment): mcpvisor said so and
                    # exited 1, as it must. Go on elsewhere.
                    self.note(f"port {self.port} taken meanwhile by {holders}: moving")
                    self.port_moves += 1
                    self._move_port()
                    self._start()
                    return
                raise Finding(f"mcpvisor exited at start ({stack.process.returncode}): {output}")
            try:
                if self._status().get("frontend", {}).get("state") == "RUNNING":
                    return
            except NoDaemon:
                pass
            time.sleep(0.1)
        raise Finding(f"mcpvisor's frontend not RUNNING within 60 s: {self._status()}")

    def _status(self) -> dict[str, dict[str, Any]]:
        assert self.stack is not None
        return self.stack.status()

    def ctl(self, *args: str, timeout: float = 120) -> tuple[int, Any]:
        """The real `mcpvisor ctl --json`, as an operator runs it."""
        assert self.stack is not None
        return self.stack.ctl(*args, timeout=timeout)

    def note(self, text: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {text}")

    # -- processes -------------------------------------------------------------------------------

    def upstreams(self) -> dict[str, set[int]]:
        """Live upstream processes of each server, from their command lines (ours alone carry the tag)."""
        found: dict[str, set[int]] = {name: set() for name in SERVERS}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    argv = cmdline.read().split(b"\0")
            except OSError:
                continue
            for name in SERVERS:
                if f"{self.tag}-{name}".encode() in argv and alive(int(entry)):
                    found[name].add(int(entry))
        return found

    def settle(self) -> dict[str, dict[str, Any]]:
        """Wait until every server is in a state the model expects it to settle in; the status."""
        deadline = time.monotonic() + SETTLE
        rows = self._status()
        while time.monotonic() < deadline:
            rows = self._status()
            frontend = rows.get("frontend", {}).get("state") == "RUNNING"  # killed or not, it comes back
            if frontend and all(rows.get(n, {}).get("state") in m.settled() for n, m in self.model.servers.items()):
                return rows
            time.sleep(0.2)
        wrong = {
            name: (rows.get(name, {}).get("state"), sorted(m.settled()))
            for name, m in self.model.servers.items()
            if rows.get(name, {}).get("state") not in m.settled()
        }
        if rows.get("frontend", {}).get("state") != "RUNNING":
            wrong["frontend"] = (rows.get("frontend", {}).get("state"), ["RUNNING"])
        raise Finding(f"not settled within {SETTLE:g}s (state, expected): {wrong}")

    def call(self, server: str) -> tuple[bool, str, float]:
        """One `SERVER:echo` call through the frontend with the SDK client: (answered, text, seconds).

        Given time well past CALL_BOUND, so that a call slower than the bound shows as one.
        """
        assert self.stack is not None
        return trio.run(_call, self.stack.direct_url, f"{server}:echo", CALL_BOUND + 30)

    # -- rules: the operator ---------------------------------------------------------------------

    @rule(name=st.sampled_from(SERVERS))
    def start(self, name: str) -> None:
        server = self.model.servers[name]
        code, out = self.ctl("start", name)
        self.note(f"ctl start {name} -> {code}")
        if server.enabled:
            server.wanted = True
        if code not in server.start_codes():
            raise Finding(
                f"ctl start {name} ({server.behaviour}) exited {code}, expected {server.start_codes()}: {out}"
            )

    @rule(name=st.sampled_from(SERVERS))
    def stop(self, name: str) -> None:
        server = self.model.servers[name]
        started = time.monotonic()
        code, out = self.ctl("stop", name)
        took = time.monotonic() - started
        self.note(f"ctl stop {name} -> {code} in {took:.1f}s")
        if server.enabled:
            server.wanted = False
        expected = 0 if server.enabled else 4
        if code != expected:
            raise Finding(f"ctl stop {name} exited {code}, expected {expected}: {out}")
        if took > WORKER_STOP_BOUND:
            raise Finding(f"ctl stop {name} took {took:.1f}s, over its bound {WORKER_STOP_BOUND:g}s")

    @rule(name=st.sampled_from(SERVERS))
    def restart(self, name: str) -> None:
        server = self.model.servers[name]
        code, _ = self.ctl("restart", name)
        self.note(f"ctl restart {name} -> {code}")
        if server.enabled:
            server.wanted = True
            server.fatal_allowed = False
        if code not in server.start_codes():
            raise Finding(f"ctl restart {name} ({server.behaviour}) exited {code}, expected {server.start_codes()}")

    @rule(name=st.sampled_from(SERVERS), enabled=st.booleans())
    def enable_or_disable(self, name: str, enabled: bool) -> None:
        server = self.model.servers[name]
        code, out = self.ctl("enable" if enabled else "disable", name)
        self.note(f"ctl {'enable' if enabled else 'disable'} {name} -> {code}")
        if code != 0:
            raise Finding(f"ctl {'enable' if enabled else 'disable'} {name} exited {code}: {out}")
        if enabled and not server.enabled:
            server.wanted, server.fatal_allowed = True, False
        server.enabled = enabled

    @rule()
    def reread(self) -> None:
        code, out = self.ctl("reread")
        self.note(f"ctl reread -> {code} {out}")
        if code != 0 or sorted(out["changed"]) != self.model.pending():
            raise Finding(f"ctl reread gave {code} {out}, expected changed {self.model.pending()}")

    @rule()
    def update(self) -> None:
        code, out = self.ctl("update")
        self.note(f"ctl update -> {code} {out}")
        expected = self.model.pending()
        self.model.updated()
        if code != 0 or sorted(out["changed"]) != expected:
            raise Finding(f"ctl update gave {code} {out}, expected changed {expected}")

    @rule(name=st.sampled_from(SERVERS), behaviour=st.sampled_from(sorted(BEHAVIOURS)))
    def edit_config(self, name: str, behaviour: str) -> None:
        self.model.servers[name].file_behaviour = behaviour
        self._write_config()
        self.note(f"edit {name} -> {behaviour}")

    @rule()
    def sighup(self) -> None:
        assert self.stack is not None
        before = self.stack.supervisor_output().count("SIGHUP: added")
        self.stack.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while self.stack.supervisor_output().count("SIGHUP: added") == before:
            if time.monotonic() > deadline:
                raise Finding("SIGHUP was not applied within 60 s")
            time.sleep(0.1)
        self.model.updated()
        self.note("SIGHUP")

    # -- rules: stopping mcpvisor ----------------------------------------------------------------

    @rule(
        how=st.sampled_from(["ctl shutdown", "SIGTERM", "SIGINT"]),
        during=st.sampled_from(["", "reload", "restart all"]),
    )
    def shutdown(self, how: str, during: str) -> None:
        """Stop mcpvisor (now, or in the middle of a reload), check it is all gone, start it again."""
        stack = self.stack
        assert stack is not None
        tree = stack.pids()
        background = None
        if during:
            command = [*CTL, "-c", str(stack.config_path), "--timeout", "30"]
            background = subprocess.Popen(
                [*command, *during.split()], env=stack.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            time.sleep(0.5)
        started = time.monotonic()
        if how == "ctl shutdown":
            code, _ = self.ctl("shutdown")
            if code != 0:
                raise Finding(f"ctl shutdown exited {code}")
        else:
            stack.process.send_signal(getattr(signal, how))
        try:
            status = stack.process.wait(timeout=STOP_BOUND + 30)
        except subprocess.TimeoutExpired:
            raise Finding(f"{how} did not stop mcpvisor within {STOP_BOUND + 30:g}s") from None
        took = time.monotonic() - started
        self.note(f"{how}{' during ' + during if during else ''}: exited {status} in {took:.1f}s")
        if background is not None:
            try:
                background.wait(timeout=60)
            except subprocess.TimeoutExpired:
                background.kill()
                raise Finding(f"`ctl {during}` did not return within 60 s of a stop") from None
        if took > STOP_BOUND:
            raise Finding(f"{how} took {took:.1f}s to stop mcpvisor, over its bound {STOP_BOUND:g}s")
        if status != 0:
            raise Finding(f"mcpvisor exited {status} on {how}")
        deadline = time.monotonic() + 10
        while (left := {pid for pid in tree if alive(pid)}) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            raise Finding(f"processes outlived mcpvisor: {sorted(left)}")
        # An upstream goes with its worker (the kernel's SIGKILL when its parent dies): moments later.
        deadline = time.monotonic() + 5
        while (
            outliving := {name: pids for name, pids in self.upstreams().items() if pids}
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        if outliving:
            raise Finding(f"upstreams outlived mcpvisor by more than 5 s: {outliving}")
        self.model.restarted()
        self._start()

    # -- rules: faults ---------------------------------------------------------------------------

    @rule(name=st.sampled_from(SERVERS), which=st.sampled_from(["worker", "upstream", "frontend", "forkserver"]))
    def kill_9(self, name: str, which: str) -> None:
        """SIGKILL a process: a server's worker or upstream, the frontend, or the forkserver's template."""
        assert self.stack is not None
        rows = self._status()
        if which in ("frontend", "forkserver"):
            if which == "frontend":
                targets = {rows["frontend"]["pid"]} if rows["frontend"].get("pid") else set()
            else:
                targets = {
                    pid
                    for pid in _children(self.stack.process.pid)
                    if "mcpvisor.workers.forkserver" in _command(pid)
                    and pid not in {r.get("pid") for r in rows.values()}
                }
            for pid in targets:
                with _suppress():
                    os.kill(pid, signal.SIGKILL)
            self.note(f"kill -9 {which}: {sorted(targets)}")
            return
        server = self.model.servers[name]
        row = rows.get(name, {})
        worker = {row["pid"]} if row.get("pid") else set()
        targets = worker if which == "worker" else self.upstreams()[name]
        for pid in targets:
            with _suppress():
                os.kill(pid, signal.SIGKILL)
        self.note(f"kill -9 {which} of {name} ({row.get('state')}): {sorted(targets)}")
        if targets and row.get("state") != "RUNNING":
            server.fatal_allowed = True  # a failed start, maybe the one over startretries
        if targets and server.may_run:
            _, text, took = self.call(name)
            if took > CALL_BOUND:
                raise Finding(f"a call to {name} after kill -9 of its {which} took {took:.1f}s: {text}")

    # -- after every step ------------------------------------------------------------------------

    @invariant()
    def matches_the_model_and_keeps_its_promises(self) -> None:
        if self.stack is None:
            return
        self.steps += 1
        rows = self.settle()
        supervisor = self.stack.process.pid
        children = _children(supervisor)
        upstreams = self.upstreams()
        again = self._status()  # a crash_later server may have been restarted meanwhile
        known = {row["pid"] for row in [*rows.values(), *again.values()] if row.get("pid")}
        for name, server in self.model.servers.items():
            row = rows[name]
            pid = row.get("pid", 0)
            if row["state"] == "RUNNING" and (not pid or not alive(pid)) and again[name].get("pid") == pid:
                raise Finding(f"{name} is RUNNING with pid {pid}, which is no live process: {row}")
            if not server.may_run and (pid or upstreams[name]):
                raise Finding(
                    f"{name} is {row['state']} for the model, but runs: worker {pid}, upstream {upstreams[name]}"
                )
            if again[name].get("pid") != pid:
                continue  # in flux: judged at the next step
            if pid and alive(pid) and pid not in children:
                raise Finding(f"{name}'s pid {pid} is not a child of the supervisor")
            for upstream in upstreams[name]:
                parent = _parent(upstream)
                if parent and parent != pid:
                    raise Finding(f"{name}'s upstream {upstream} runs under {parent}, not its worker {pid}")
        # Every child of the supervisor is one it knows: the frontend, the forkserver, a worker.
        forkserver = {pid for pid in children if "mcpvisor.workers.forkserver" in _command(pid)}
        strays = {pid for pid in children - known - forkserver if alive(pid)}
        if strays:
            # A process just killed is not a zombie yet while the kernel tears it down (its command
            # line already reads empty): judge again a moment later.
            time.sleep(1.0)
            strays = {pid for pid in strays & _children(supervisor) if alive(pid) and _command(pid)}
            strays -= {row["pid"] for row in self._status().values() if row.get("pid")}
            strays = {pid for pid in strays if "mcpvisor.workers.forkserver" not in _command(pid)}
        if strays:
            raise Finding(f"children of the supervisor it does not know: {[(p, _command(p)) for p in strays]}")
        if len(forkserver - known) > 1:
            raise Finding(f"forked processes that are neither the forkserver nor a worker: {forkserver - known}")
        # A RUNNING server that works answers (one client session asks them all).
        asked = [
            name for name, server in self.model.servers.items() if server.answers and rows[name]["state"] == "RUNNING"
        ]
        deadline = time.monotonic() + SETTLE
        while asked:
            assert self.stack is not None
            answers = trio.run(_call_all, self.stack.direct_url, asked, CALL_BOUND + 30)
            # Just killed and reconnecting: then it must answer once it is ready again.
            asked = [name for name in asked if not answers[name][0]]
            if asked and time.monotonic() > deadline:
                raise Finding(f"RUNNING but not answering: { ({name: answers[name][1] for name in asked}) }")
            if asked:
                time.sleep(0.5)
        if self.steps % 3 != 1:
            return  # the real ctl costs a second of CPU: its exit codes are checked every third step
        # LSB: 0 only when everything listed runs, else 3; 4 for an unknown name.
        code, listed = self.ctl("status")
        if isinstance(listed, list):
            states = {row["name"]: row["state"] for row in listed}
            expected = 0 if all(state == "RUNNING" for state in states.values()) else 3
            if code != expected:
                raise Finding(f"ctl status exited {code} for {states}, expected {expected}")
        if self.steps % 10 == 1:
            code, _ = self.ctl("status", "no-such-server")
            if code != 4:
                raise Finding(f"ctl status of an unknown name exited {code}, expected 4")

    def teardown(self) -> None:
        stack = self.stack
        if stack is not None and stack.process.poll() is None:
            tree = stack.pids()
            stack.process.send_signal(signal.SIGTERM)
            try:
                stack.process.wait(timeout=STOP_BOUND + 30)
            except subprocess.TimeoutExpired:
                for pid in tree | stack.pids():
                    with _suppress():
                        os.kill(pid, signal.SIGKILL)
                stack.process.wait()
        for pids in self.upstreams().values():
            for pid in pids:
                with _suppress():
                    os.kill(pid, signal.SIGKILL)
        (self.tmp / "steps.log").write_text("\n".join(self.log) + "\n")
        if os.environ.get("MCPVISOR_MODEL_KEEP"):
            print(f"model run kept in {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _suppress() -> Any:
    import contextlib

    return contextlib.suppress(ProcessLookupError)


def _children(pid: int) -> set[int]:
    found = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                found.update(int(child) for child in listing.read().split())
    except OSError:
        pass
    return {child for child in found if alive(child)}


def _listeners(port: int) -> list[str]:
    """Who has a TCP socket on local `port` (from /proc/net/tcp): `pid command` of each."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                for line in list(lines)[1:]:
                    fields = line.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] != "0":
                        inodes.add(f"socket:[{fields[9]}]")
        except OSError:
            continue
    holders = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{entry}/fd")):
                holders.append(f"{entry} {_command(int(entry))[:80]}")
        except OSError:
            continue
    return holders


def _mentions(pid: int, text: str) -> bool:
    """Whether a process's command line or initial environment holds `text`."""
    for name in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as source:
                if text.encode() in source.read():
                    return True
        except OSError:
            continue
    return False


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


async def _call_all(url: str, servers: list[str], bound: float) -> dict[str, tuple[bool, str]]:
    """`SERVER:echo` of each server, in one client session: {server: (answered, text)}."""
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    answers = {name: (False, "no answer") for name in servers}
    with trio.move_on_after(bound):
        try:
            async with Client(url) as client:
                for name in servers:
                    try:
                        result = await client.call_tool(f"{name}:echo", {"text": "model"})
                        text = result.content[0].text if result.content else ""
                        answers[name] = (not result.is_error and text == "model", text)
                    except MCPError as exc:
                        answers[name] = (False, exc.error.message)
        except Exception as exc:  # the session itself failed: every server unanswered, and why
            for name in servers:
                if not answers[name][0]:
                    answers[name] = (False, f"{type(exc).__name__}: {exc}")
    return answers


async def _call(url: str, tool: str, bound: float) -> tuple[bool, str, float]:
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    started = time.monotonic()
    text = ""
    answered = False
    with trio.move_on_after(bound):
        try:
            async with Client(url) as client:
                result = await client.call_tool(tool, {"text": "model"})
                answered = not result.is_error and result.content[0].text == "model"
                text = result.content[0].text if result.content else ""
        except MCPError as exc:
            text = exc.error.message
        except Exception as exc:  # a connection the frontend dropped: the call came back, as a failure
            text = f"{type(exc).__name__}: {exc}"
    return answered, text or "no answer", time.monotonic() - started
