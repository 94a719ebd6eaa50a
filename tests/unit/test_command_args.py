"""Control command arguments: decoded once from ctl's words (or the frontend's data), refused in one line."""

from __future__ import annotations

import pytest

from mcpvisor.supervisor.commands import EXIT_USAGE, ArgumentError, CommandSpec, load_all
from mcpvisor.supervisor.commands.tail import TailArgs

COMMANDS = load_all()


def spec(name: str) -> CommandSpec:
    return COMMANDS[name]


def refusal(name: str, words: list[str], data: object = None) -> str:
    with pytest.raises(ArgumentError) as caught:
        spec(name).parse(words, data)
    assert caught.value.exit_code == EXIT_USAGE
    assert "\n" not in caught.value.message
    return caught.value.message


def test_words_fill_fields_in_order_and_flags_take_the_next_word() -> None:
    args = spec("tail").parse(["time", "-n", "5", "stderr"], None)
    assert args == TailArgs(name="time", stream="stderr", lines=5)
    follow = spec("tail").parse(["time", "--from", "worker=10,stderr=0"], None)
    assert isinstance(follow, TailArgs) and follow.offsets == {"worker": 10, "stderr": 0}
    assert spec("status").parse([], None).names == []  # type: ignore[attr-defined]
    assert spec("start").parse(["a", "b"], None).names == ["a", "b"]  # type: ignore[attr-defined]
    assert spec("approve").parse(["gamma", "echo", "touch"], None).tools == ["echo", "touch"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "words", "expected"),
    [
        ("tail", ["time", "-n", "abc"], "tail: bad argument -n/--lines: expected `int`, got 'abc'"),
        ("tail", ["time", "-n", "-1"], "tail: bad argument -n/--lines: expected `int` >= 0, got '-1'"),
        ("tail", ["time", "--lines", "10000000"], "tail: bad argument -n/--lines: expected `int` <= 100000"),
        ("tail", ["time", "-n"], "tail: option -n needs a value"),
        ("tail", ["time", "--from", "worker"], "tail: option --from takes KEY=VALUE"),
        ("tail", ["time", "--from", "worker=x"], "tail: bad argument --from: expected `int`"),
        ("tail", [], "tail: missing argument NAME (usage: tail [-f] NAME [worker|stderr] [-n LINES])"),
        ("tail", ["time", "worker", "more"], "tail: unexpected argument 'more'"),
        ("status", ["--verbose"], "status: unknown option '--verbose' (options: --tenant)"),
        ("enable", [], "enable: missing argument NAME"),
        ("shutdown", ["now"], "shutdown: unexpected argument 'now'"),
        ("inspect", ["a", "b"], "inspect: unexpected argument 'b'"),
    ],
)
def test_a_bad_word_is_named_in_one_line(name: str, words: list[str], expected: str) -> None:
    assert refusal(name, words).startswith(expected)


def test_a_long_or_unprintable_word_is_shown_short_and_on_one_line() -> None:
    message = refusal("shutdown", ["x" * 10_000 + "\n"])
    assert len(message) < 200


def test_the_frontends_commands_take_typed_data_as_it_is() -> None:
    args = spec("server.quarantine").parse([], {"name": "gamma", "quarantined": True})
    assert (args.name, args.quarantined) == ("gamma", True)  # type: ignore[attr-defined]
    assert refusal("server.quarantine", [], {"name": "gamma", "quarantined": "yes"}).startswith(
        "server.quarantine: bad argument QUARANTINED: expected `bool`"
    )
    assert refusal("server.propose", [], {"action": "add", "config": {}}).startswith(
        "server.propose: missing argument NAME"
    )
    assert refusal("server.propose", [], {"name": "a", "action": "run"}).startswith(
        "server.propose: bad argument ACTION: invalid enum value 'run'"
    )
    assert refusal("server.patch", [], {"name": "a", "patch": {}, "extra": 1}).startswith(
        "server.patch: unknown argument 'extra'"
    )
    assert refusal("server.propose", [], [1, 2]).startswith("server.propose: bad arguments: Expected `object`")
    assert refusal("server.propose", ["a"], {"name": "a"}).startswith("server.propose: takes its arguments as data")


def test_every_ctl_command_has_help_and_a_usage_line() -> None:
    for name, command in COMMANDS.items():
        if command.ctl:
            assert command.summary, name
            assert command.usage.split()[0] == name
