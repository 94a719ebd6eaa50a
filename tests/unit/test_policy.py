"""Restart policy: backoff, autorestart decisions, flapping and the uptime shown by `status`."""

from __future__ import annotations

import datetime
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trio.testing

from mcpvisor.runtime.backoff import backoff_delay
from mcpvisor.supervisor.policy import FlapDetector, format_uptime, should_restart
from mcpvisor.supervisor.process import Launch, Program
from mcpvisor.wire.config import Policy
from mcpvisor.wire.states import ProcessState


def test_backoff_doubles_from_one_second() -> None:
    assert [backoff_delay(n, cap=1000) for n in range(1, 8)] == [1, 2, 4, 8, 16, 32, 64]


def test_backoff_is_capped() -> None:
    assert [backoff_delay(n, cap=10) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert backoff_delay(500, cap=300) == 300


def test_backoff_scales_with_its_base() -> None:
    assert [backoff_delay(n, cap=100, base=0.5) for n in (1, 2, 3)] == [0.5, 1, 2]


@pytest.mark.parametrize("retries", [0, -1, -100])
def test_no_delay_before_the_first_attempt(retries: int) -> None:
    assert backoff_delay(retries, cap=300) == 0


def test_jitter_spreads_a_delay_either_way_but_never_past_the_cap() -> None:
    """A worker's reconnects: 0.5 s, 1 s, 2 s, ... spread by up to 10 %."""
    assert backoff_delay(1, cap=60, base=0.5, jitter=0.1, draw=lambda: 0.0) == 0.45
    assert backoff_delay(1, cap=60, base=0.5, jitter=0.1, draw=lambda: 0.999999) == 0.5 * (1 + 0.1 * 0.999998)
    assert backoff_delay(20, cap=60, base=0.5, jitter=0.1, draw=lambda: 0.999999) == 60


def test_a_huge_attempt_count_is_the_cap_not_an_overflow() -> None:
    assert backoff_delay(10**6, cap=300) == 300


@pytest.mark.parametrize("autorestart", [True, "true"])
@pytest.mark.parametrize("exit_code", [0, 1, 2, None])
def test_autorestart_true_restarts_whatever_the_exit(autorestart: bool | str, exit_code: int | None) -> None:
    assert should_restart(autorestart, exit_code, [0]) is True


@pytest.mark.parametrize("autorestart", [False, "false"])
@pytest.mark.parametrize("exit_code", [0, 1, None])
def test_autorestart_false_never_restarts(autorestart: bool | str, exit_code: int | None) -> None:
    assert should_restart(autorestart, exit_code, [0]) is False


def test_autorestart_unexpected_restarts_only_for_codes_outside_exitcodes() -> None:
    assert should_restart("unexpected", 0, [0, 2]) is False
    assert should_restart("unexpected", 2, [0, 2]) is False
    assert should_restart("unexpected", 1, [0, 2]) is True
    # Killed by a signal: there is no exit code, so it cannot be an expected one.
    assert should_restart("unexpected", None, [0]) is True


def test_unexpected_with_no_expected_codes_restarts_even_a_clean_exit() -> None:
    assert should_restart("unexpected", 0, []) is True


def test_count_exits_within_the_window_is_flapping() -> None:
    flap = FlapDetector(window=60, count=3)
    assert flap.record_exit(0.0) is False
    assert flap.record_exit(10.0) is False
    assert flap.record_exit(20.0) is True


def test_old_exits_slide_out_of_the_window() -> None:
    flap = FlapDetector(window=60, count=3)
    flap.record_exit(0.0)
    flap.record_exit(50.0)
    # The exit at 0 is more than 60 s before this one, so only two exits are in the window.
    assert flap.record_exit(61.0) is False
    assert flap.record_exit(70.0) is True


def test_an_exit_exactly_one_window_old_still_counts() -> None:
    flap = FlapDetector(window=60, count=2)
    flap.record_exit(0.0)
    assert flap.record_exit(60.0) is True


def test_reset_forgets_earlier_exits() -> None:
    flap = FlapDetector(window=60, count=2)
    flap.record_exit(0.0)
    flap.reset()
    assert flap.record_exit(1.0) is False
    assert flap.record_exit(2.0) is True


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0:00:00"),
        (5, "0:00:05"),
        (59.9, "0:00:59"),
        (3600 + 12 * 60 + 3, "1:12:03"),
        (86399, "23:59:59"),
        (86400, "1 day, 0:00:00"),
        (86400 + 3723, "1 day, 1:02:03"),
        (3 * 86400 + 5, "3 days, 0:00:05"),
        (-5, "0:00:00"),  # a clock stepped back never shows a negative uptime
    ],
)
def test_uptime_uses_supervisord_layout(seconds: float, shown: str) -> None:
    assert format_uptime(seconds) == shown


@pytest.mark.parametrize("seconds", [0, 61, 86400, 90061, 200000, 10 * 86400 + 1])
def test_uptime_matches_pythons_timedelta_as_supervisord_prints_it(seconds: int) -> None:
    assert format_uptime(seconds) == str(datetime.timedelta(seconds=seconds))


# -- the real restart loop on trio's mock clock ---------------------------------------------------
#
# `Program` does its I/O through a spawner; these children live on the mock clock, so the real loop
# runs minutes of backoff in milliseconds. A child exits `runs_for` seconds after it starts with
# `exit_code`, and on a signal exits at once unless the signal is in `ignores`.


class ScriptedChild:
    def __init__(self, pid: int, runs_for: float, exit_code: int, ignores: frozenset[int], log: list) -> None:
        self.pid = pid
        self.output = None
        self._exit_code = exit_code
        self._ignores = ignores
        self._log = log
        self._returncode: int | None = None
        self._exited = trio.Event()
        self._deadline = trio.current_time() + runs_for

    @property
    def returncode(self) -> int | None:
        if self._returncode is None and trio.current_time() >= self._deadline:
            self._exit(self._exit_code)
        return self._returncode

    def _exit(self, code: int) -> None:
        if self._returncode is None:
            self._returncode = code
            self._exited.set()

    async def wait(self) -> int:
        with trio.move_on_at(self._deadline):
            await self._exited.wait()
        self._exit(self._exit_code)
        assert self._returncode is not None
        return self._returncode

    def send_signal_to_group(self, signum: int) -> bool:
        if self.returncode is not None:
            return False
        self._log.append(("signal", signal.Signals(signum).name, trio.current_time()))
        if signum not in self._ignores:
            self._exit(-signum)
        return True


@dataclass
class ScriptedSpawner:
    """Each spawn takes the next (runs_for, exit_code) from `script`; the last one repeats."""

    script: list[tuple[float, int]]
    ignores: frozenset[int] = frozenset()
    fail_with: OSError | None = None
    spawn_takes: float = 0.0  # a forkserver still importing, a loaded machine
    log: list[tuple[str, object, float]] = field(default_factory=list)
    children: list[ScriptedChild] = field(default_factory=list)

    async def spawn(self, launch: Launch) -> ScriptedChild:
        await trio.lowlevel.checkpoint()
        await trio.sleep(self.spawn_takes)
        self.log.append(("start", len(self.children), trio.current_time()))
        if self.fail_with is not None:
            raise self.fail_with
        runs_for, code = self.script[min(len(self.children), len(self.script) - 1)]
        child = ScriptedChild(1000 + len(self.children), runs_for, code, self.ignores, self.log)
        self.children.append(child)
        return child

    def starts(self) -> list[float]:
        return [at for kind, _, at in self.log if kind == "start"]


@dataclass
class Scenario:
    program: Program
    spawner: ScriptedSpawner
    states: list[tuple[ProcessState, float, str]]

    def entered(self, state: ProcessState) -> list[float]:
        return [at for s, at, _ in self.states if s is state]

    def described(self, state: ProcessState) -> list[str]:
        return [description for s, _, description in self.states if s is state]


async def run_program(
    tmp_path: Path,
    spawner: ScriptedSpawner,
    drive: Callable[[Scenario], object],
    *,
    needs_report: bool = False,
    **policy: object,
) -> Scenario:
    """Start a real Program with `spawner`, let `drive(scenario)` act on it, then retire it."""
    states: list[tuple[ProcessState, float, str]] = []
    launch = Launch(["unused"], {}, tmp_path / "program.log")
    program = Program(
        "p",
        launch,
        Policy(**policy),  # type: ignore[arg-type]
        lambda p: states.append((p.state, trio.current_time(), p.description())),
        needs_report=needs_report,
        spawner=spawner,
    )
    scenario = Scenario(program, spawner, states)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(program.serve)
        await drive(scenario)  # type: ignore[misc]
        program.retire()
    return scenario


def deduplicated(states: list[tuple[ProcessState, float, str]]) -> list[ProcessState]:
    shown: list[ProcessState] = []
    for state, _, _ in states:
        if not shown or shown[-1] is not state:
            shown.append(state)
    return shown


async def test_a_process_that_never_starts_backs_off_then_goes_fatal(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    spawner = ScriptedSpawner([(0.5, 1)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        await s.program.wait_settled(timeout=1000)

    s = await run_program(tmp_path, spawner, drive, startsecs=1, startretries=8, backoff_max=60)

    # Exits 0.5 s after each start, then waits 1, 2, 4, 8, 16, 32, 60, 60 seconds.
    assert spawner.starts() == [0, 1.5, 4, 8.5, 17, 33.5, 66, 126.5, 187]
    assert s.program.state is ProcessState.FATAL
    assert s.entered(ProcessState.FATAL) == [187.5]
    assert s.program.description() == "Exited too quickly (process log may have details)"
    assert ProcessState.RUNNING not in deduplicated(s.states)


async def test_running_past_startsecs_resets_the_retry_count(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # Two quick failures, one good run of 30 s, then quick failures until FATAL.
    spawner = ScriptedSpawner([(0.5, 1), (0.5, 1), (30, 1), (0.5, 1)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        while s.program.state is not ProcessState.FATAL:
            await trio.sleep(0.5)

    s = await run_program(tmp_path, spawner, drive, startsecs=1, startretries=2, backoff_max=60)

    # 0 fails, 1.5 fails, 4 runs until 34 (RUNNING at 5, EXITED at 34, restarted at once);
    # from then on the count starts again: 34, 35.5, 38, then FATAL at 38.5.
    assert spawner.starts() == [0, 1.5, 4, 34, 35.5, 38]
    assert s.entered(ProcessState.RUNNING) == [5]
    assert s.entered(ProcessState.EXITED) == [34]
    assert s.entered(ProcessState.FATAL) == [38.5]


async def test_an_explicit_start_leaves_fatal_with_a_fresh_count(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    spawner = ScriptedSpawner([(0.5, 1)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        await s.program.wait_settled(timeout=1000)
        assert s.program.state is ProcessState.FATAL
        await trio.sleep(100)
        assert len(spawner.starts()) == 2  # FATAL stays put
        s.program.start()
        await s.program.wait_settled(timeout=1000)

    s = await run_program(tmp_path, spawner, drive, startsecs=1, startretries=1, backoff_max=60)

    assert spawner.starts() == [0, 1.5, 102, 103.5]
    assert s.entered(ProcessState.FATAL) == [2, 104]


async def test_crashing_every_ten_seconds_is_flapping_within_a_minute(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    spawner = ScriptedSpawner([(10, 1)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        while not s.entered(ProcessState.BACKOFF):
            await trio.sleep(1)
        await trio.sleep(5)

    s = await run_program(tmp_path, spawner, drive, startsecs=1, flap_window=60, flap_count=5, backoff_max=300)

    # Past startsecs each time, so restarted at once, until the fifth exit within 60 s.
    assert s.entered(ProcessState.EXITED) == [10, 20, 30, 40, 50]
    assert s.entered(ProcessState.BACKOFF) == [50]
    assert s.described(ProcessState.BACKOFF) == ["flapping: 5 exits within 60s"]
    assert spawner.starts() == [0, 10, 20, 30, 40, 51]


async def test_crashing_every_twenty_seconds_never_fills_the_window(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    spawner = ScriptedSpawner([(20, 1)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        await trio.sleep(30 * 60)  # half an hour of simulated time

    s = await run_program(tmp_path, spawner, drive, startsecs=1, flap_window=60, flap_count=5)

    assert not s.entered(ProcessState.BACKOFF)
    assert len(s.entered(ProcessState.EXITED)) == 89  # exits at 20, 40, ..., 1780


@pytest.mark.parametrize(
    ("autorestart", "exit_code", "restarted"),
    [(True, 0, True), ("false", 1, False), ("unexpected", 0, False), ("unexpected", 3, True)],
)
async def test_autorestart_decides_after_an_exit_from_running(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, autorestart: bool | str, exit_code: int, restarted: bool
) -> None:
    spawner = ScriptedSpawner([(5, exit_code)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        await trio.sleep(7)

    s = await run_program(tmp_path, spawner, drive, startsecs=1, autorestart=autorestart, exitcodes=(0,))

    assert s.entered(ProcessState.EXITED)[0] == 5
    assert spawner.starts() == ([0, 5] if restarted else [0])
    if not restarted:
        assert s.program.state is ProcessState.EXITED
        assert s.program.description() == f"exit status {exit_code}"


async def test_stop_sends_the_stopsignal_then_kill_after_stopwaitsecs(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    spawner = ScriptedSpawner([(10_000, 0)], ignores=frozenset({signal.SIGINT}))

    async def drive(s: Scenario) -> None:
        s.program.start()
        await s.program.wait_settled()
        await trio.sleep(10)
        s.program.stop()
        await s.program.wait_stopped()

    s = await run_program(tmp_path, spawner, drive, startsecs=1, stopsignal="INT", stopwaitsecs=7)

    signals = [(name, at) for kind, name, at in spawner.log if kind == "signal"]
    assert signals == [("SIGINT", 11), ("SIGKILL", 18)]
    assert deduplicated(s.states) == [
        ProcessState.STARTING,
        ProcessState.RUNNING,
        ProcessState.STOPPING,
        ProcessState.STOPPED,
    ]
    assert s.program.exit_code == -signal.SIGKILL
    assert spawner.starts() == [0]  # a requested stop is not restarted


async def test_a_process_that_honours_the_stopsignal_is_not_killed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    spawner = ScriptedSpawner([(10_000, 0)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        await s.program.wait_settled()
        s.program.stop()
        await s.program.wait_stopped()

    s = await run_program(tmp_path, spawner, drive, startsecs=1)

    assert [name for kind, name, _ in spawner.log if kind == "signal"] == ["SIGTERM"]
    assert s.program.exit_code == -signal.SIGTERM
    assert s.program.state is ProcessState.STOPPED


async def test_running_is_earned_by_a_report_not_by_startsecs(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    spawner = ScriptedSpawner([(10_000, 0)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        await trio.sleep(30)
        assert s.program.state is ProcessState.STARTING
        s.program.ready.set()
        await s.program.wait_settled()

    s = await run_program(tmp_path, spawner, drive, needs_report=True, startsecs=1)

    assert s.entered(ProcessState.RUNNING) == [30]
    assert s.described(ProcessState.RUNNING)[0].startswith("pid 1000, uptime ")


async def test_a_hung_process_is_killed_and_restarted(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    spawner = ScriptedSpawner([(10_000, 0)], ignores=frozenset({signal.SIGTERM}))

    async def drive(s: Scenario) -> None:
        s.program.start()
        await trio.sleep(20)
        s.program.kill_hung()
        await trio.sleep(5)
        assert s.program.state is ProcessState.RUNNING
        assert [name for kind, name, _ in spawner.log if kind == "signal"] == ["SIGKILL"]

    s = await run_program(tmp_path, spawner, drive, startsecs=1)

    assert s.entered(ProcessState.EXITED) == [20]
    assert s.described(ProcessState.EXITED) == ["exit status -9"]
    assert spawner.starts() == [0, 20]


async def test_a_spawn_error_backs_off_and_names_the_cause(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    spawner = ScriptedSpawner([(1, 0)], fail_with=FileNotFoundError(2, "No such file or directory"))

    async def drive(s: Scenario) -> None:
        s.program.start()
        await s.program.wait_settled(timeout=1000)

    s = await run_program(tmp_path, spawner, drive, startsecs=1, startretries=2, backoff_max=60)

    assert spawner.starts() == [0, 1, 3]
    assert s.program.state is ProcessState.FATAL
    assert s.program.description() == "spawn error: No such file or directory"


async def test_retiring_stops_the_process_it_runs(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    spawner = ScriptedSpawner([(10_000, 0)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        await s.program.wait_settled()

    await run_program(tmp_path, spawner, drive, startsecs=1)

    assert spawner.children[0].returncode == -signal.SIGTERM


# -- stopping completes from every state ------------------------------------------------------------


async def test_a_stop_in_backoff_is_stopped_at_once(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    """The first row of the table: a server that cannot start, then Ctrl-C; it used to hang in BACKOFF."""
    spawner = ScriptedSpawner([(0.1, 1)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        while s.program.state is not ProcessState.BACKOFF:
            await trio.sleep(0.01)
        stopped_from = trio.current_time()
        s.program.stop()
        with trio.fail_after(0.001):  # no process to wait for: no time passes
            await s.program.wait_stopped()
        assert trio.current_time() == stopped_from
        await trio.sleep(1000)  # and it stays stopped: its backoff timer is gone

    s = await run_program(tmp_path, spawner, drive, startsecs=1, startretries=5, backoff_max=60)

    assert deduplicated(s.states)[-2:] == [ProcessState.BACKOFF, ProcessState.STOPPED]
    assert spawner.starts() == [0]
    assert s.program.description() == "stopped"


async def test_a_stop_during_a_slow_spawn_abandons_it(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    spawner = ScriptedSpawner([(10_000, 0)], spawn_takes=60)

    async def drive(s: Scenario) -> None:
        s.program.start()
        await trio.sleep(1)
        assert s.program.state is ProcessState.STARTING
        s.program.stop()
        with trio.fail_after(0.001):
            await s.program.wait_stopped()

    s = await run_program(tmp_path, spawner, drive, startsecs=1)

    assert deduplicated(s.states) == [ProcessState.STARTING, ProcessState.STOPPED]
    assert spawner.children == []


@pytest.mark.parametrize("when", ["starting", "running", "backoff", "exited", "fatal"])
async def test_a_halted_program_stops_and_never_starts_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, when: str
) -> None:
    """Once mcpvisor is stopping nothing starts: not by policy, not by an operator's start."""
    script = {
        "starting": [(10_000, 0)],
        "running": [(10_000, 0)],
        "backoff": [(0.1, 1)],
        "exited": [(5, 0)],
        "fatal": [(0.1, 1)],
    }[when]
    spawner = ScriptedSpawner(script)
    reached = {
        "starting": ProcessState.STARTING,
        "running": ProcessState.RUNNING,
        "backoff": ProcessState.BACKOFF,
        "exited": ProcessState.EXITED,
        "fatal": ProcessState.FATAL,
    }[when]

    async def drive(s: Scenario) -> None:
        s.program.start()
        while s.program.state is not reached:
            await trio.sleep(0.01)
        s.program.halt()
        assert s.program.start() is False
        s.program.stop()
        with trio.fail_after(15):  # stopwaitsecs (10) and no more
            await s.program.wait_stopped()
        starts = len(spawner.starts())
        await trio.sleep(1000)
        assert len(spawner.starts()) == starts
        assert s.program.state in (ProcessState.STOPPED, ProcessState.EXITED, ProcessState.FATAL)

    await run_program(
        tmp_path, spawner, drive, startsecs=1, startretries=0 if when == "fatal" else 5, autorestart=when != "exited"
    )


async def test_a_halted_program_that_exits_on_its_own_is_not_restarted(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The frontend stops first while the workers still serve it: a worker that dies meanwhile stays down."""
    spawner = ScriptedSpawner([(20, 1)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        await s.program.wait_settled()
        s.program.halt()
        await s.program.wait_stopped()

    s = await run_program(tmp_path, spawner, drive, startsecs=1)

    assert s.program.state is ProcessState.EXITED
    assert spawner.starts() == [0]


async def test_kill_now_ends_a_stop_that_waits_out_stopwaitsecs(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    spawner = ScriptedSpawner([(10_000, 0)], ignores=frozenset({signal.SIGTERM}))

    async def drive(s: Scenario) -> None:
        s.program.start()
        await s.program.wait_settled()
        s.program.stop()
        await trio.sleep(2)
        assert s.program.state is ProcessState.STOPPING
        assert s.program.kill_now()
        with trio.fail_after(0.001):
            await s.program.wait_stopped()

    s = await run_program(tmp_path, spawner, drive, startsecs=1, stopwaitsecs=300)

    assert s.program.exit_code == -signal.SIGKILL
