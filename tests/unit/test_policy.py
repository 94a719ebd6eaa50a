"""Restart policy: backoff, autorestart decisions, flapping and the uptime shown by `status`."""

from __future__ import annotations

import datetime

import pytest
import trio
import trio.testing

from mcpvisor.supervisor.policy import FlapDetector, backoff_delay, format_uptime, should_restart


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


# -- a restart loop on trio's mock clock --------------------------------------------------------


async def crash_loop(*, runs_for: float, startsecs: float, startretries: int, cap: float) -> list[tuple[str, float]]:
    """A process that exits `runs_for` seconds after each start, restarted the way supervisord does."""
    events: list[tuple[str, float]] = []
    retries = 0
    while True:
        events.append(("start", trio.current_time()))
        await trio.sleep(runs_for)
        if runs_for >= startsecs:
            retries = 0  # it got past startsecs: the next failure starts the count again
        else:
            retries += 1
            if retries > startretries:
                events.append(("fatal", trio.current_time()))
                return events
        await trio.sleep(backoff_delay(retries, cap))


async def test_a_process_that_never_starts_backs_off_then_goes_fatal(autojump_clock: trio.testing.MockClock) -> None:
    events = await crash_loop(runs_for=0.5, startsecs=1, startretries=8, cap=60)

    starts = [at for kind, at in events if kind == "start"]
    # Exits 0.5 s after each start, then waits 1, 2, 4, 8, 16, 32, 60, 60 seconds.
    assert starts == [0, 1.5, 4, 8.5, 17, 33.5, 66, 126.5, 187]
    assert events[-1] == ("fatal", 187.5)


async def test_crashing_every_ten_seconds_is_flapping_within_a_minute(
    autojump_clock: trio.testing.MockClock,
) -> None:
    flap = FlapDetector(window=60, count=5)
    exits: list[float] = []
    while True:
        await trio.sleep(10)  # runs for 10 s, well past startsecs, then crashes
        exits.append(trio.current_time())
        if flap.record_exit(trio.current_time()):
            break
        await trio.sleep(backoff_delay(1, cap=300))

    assert exits == [10, 21, 32, 43, 54]


async def test_crashing_every_twenty_seconds_never_fills_the_window(autojump_clock: trio.testing.MockClock) -> None:
    flap = FlapDetector(window=60, count=5)
    restarts = 0
    with trio.move_on_after(30 * 60):  # half an hour of simulated time
        while True:
            await trio.sleep(20)
            assert not flap.record_exit(trio.current_time()), f"flapping at {trio.current_time()}"
            restarts += 1
            await trio.sleep(backoff_delay(1, cap=300))

    assert trio.current_time() == 30 * 60
    assert restarts == 85  # exits at 20, 41, 62, ..., 1784
