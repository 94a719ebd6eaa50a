"""Help needs no daemon: `mcpvisor CMD --help` and `mcpvisor ctl CMD --help` print the usage and exit 0.

Given no mcpvisor running (no config, no control socket), every command of `mcpvisor` and of
`mcpvisor ctl` answers `--help` with its usage. Given a running stack, `--help` on a command that
changes something (`stop all`, `shutdown`, `disable`) only prints the usage: nothing is stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcpvisor.supervisor.cli import build_parser, version
from mcpvisor.supervisor.commands import load_all
from tests.support.stack import echo_server, open_stack

CTL_COMMANDS = sorted(name for name, spec in load_all().items() if spec.ctl)


def cli_commands() -> list[list[str]]:
    """Every command of `mcpvisor`, and every action of those that have actions (`token add`, ...)."""
    found: list[list[str]] = []

    def subcommands(parser) -> dict:
        for action in parser._actions:  # argparse keeps its subparsers here and nowhere public
            if action.__class__.__name__ == "_SubParsersAction":
                return dict(action.choices)
        return {}

    for name, parser in subcommands(build_parser()).items():
        found.append([name])
        found += [[name, action] for action in subcommands(parser)]
    return found


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "mcpvisor.supervisor", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.fixture
def nothing_running(tmp_path: Path) -> dict[str, str]:
    """An environment where no config exists and the control socket leads nowhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCPVISOR_")}
    env.update(
        HOME=str(tmp_path),
        XDG_DATA_HOME=str(tmp_path / "data"),
        XDG_RUNTIME_DIR=str(tmp_path / "run"),
        MCPVISOR_CONTROL=f"ipc://{tmp_path / 'nobody.sock'}",
    )
    return env


def test_the_commands_are_found() -> None:
    names = {" ".join(words) for words in cli_commands()}
    assert {"serve", "ctl", "check", "import", "stdio", "token add", "config schema"} <= names
    assert {"status", "login", "stop", "tail", "approve"} <= set(CTL_COMMANDS)


def test_every_mcpvisor_command_has_help_without_a_daemon(tmp_path: Path, nothing_running: dict[str, str]) -> None:
    for words in cli_commands():
        done = run([*words, "--help"], tmp_path, nothing_running)
        assert done.returncode == 0, (words, done.stderr)
        assert done.stdout.startswith("usage: "), (words, done.stdout[:200])
        assert " ".join(words) in done.stdout.splitlines()[0] or words[0] in done.stdout, words
        assert "no mcpvisor is running" not in done.stdout + done.stderr, words


def test_every_ctl_command_has_help_without_a_daemon(tmp_path: Path, nothing_running: dict[str, str]) -> None:
    for name in CTL_COMMANDS:
        for flag in ("--help", "-h"):
            done = run(["ctl", name, flag], tmp_path, nothing_running)
            assert done.returncode == 0, (name, flag, done.stderr)
            assert done.stdout.startswith(f"usage: mcpvisor ctl {name}"), (name, done.stdout[:200])
            assert done.stderr == "", (name, done.stderr)
    # The same text as `ctl help NAME`; and ctl's own help lists every command.
    login = run(["ctl", "help", "login"], tmp_path, nothing_running)
    assert login.returncode == 0 and login.stdout == run(["ctl", "login", "--help"], tmp_path, nothing_running).stdout
    overview = run(["ctl", "--help"], tmp_path, nothing_running)
    assert overview.returncode == 0
    assert all(name in overview.stdout for name in CTL_COMMANDS)


def test_version(tmp_path: Path) -> None:
    done = run(["--version"], tmp_path)
    assert done.returncode == 0
    assert done.stdout.strip() == f"mcpvisor {version()}"
    assert version()[0].isdigit()


def test_a_command_still_needs_the_daemon(tmp_path: Path, nothing_running: dict[str, str]) -> None:
    done = run(["ctl", "status"], tmp_path, nothing_running)
    assert done.returncode == 4
    assert "no mcpvisor is running" in done.stderr


async def test_help_on_a_running_stack_changes_nothing(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        for args in (["stop", "all", "--help"], ["disable", "echo", "-h"], ["shutdown", "--help"]):
            code, text = await stack.actl(*args, json_output=False)
            assert code == 0, (args, text)
            assert text.startswith(f"usage: mcpvisor ctl {args[0]}"), text
        states = stack.status()
        assert states["echo"]["state"] == "RUNNING"
        assert states["frontend"]["state"] == "RUNNING"
        assert "enabled = false" not in stack.config_path.read_text()
