"""A stdio server's command looked up as its worker will: what `mcpvisor check` says before anything runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcpvisor.runtime.commands import child_environment, command_problem


def test_a_command_in_path_or_next_to_mcpvisor_is_found() -> None:
    assert command_problem("sh", "/usr/bin:/bin", None) is None
    # mcpvisor's own Python folder is added to the PATH the worker gives its upstream.
    path = child_environment({"PATH": "/nowhere"}).get("PATH")
    assert path == "/nowhere"  # a configured PATH is the server's own choice
    inherited = child_environment({}).get("PATH", "")
    assert os.path.dirname(sys.executable) in inherited.split(os.pathsep)


def test_a_missing_command_is_named() -> None:
    assert command_problem("no-such-command-anywhere", "/usr/bin:/bin", None) == (
        "command 'no-such-command-anywhere' is not found in PATH (nor in the folder of mcpvisor's Python)"
    )


def test_a_file_that_is_not_executable_is_named_with_where_it_is(tmp_path: Path) -> None:
    script = tmp_path / "server"
    script.write_text("#!/bin/sh\n")
    assert command_problem("server", str(tmp_path), None) == f"command 'server' is not executable ({script})"
    assert command_problem(str(script), None, None) == f"command '{script}' is not an executable file"
    script.chmod(0o755)
    assert command_problem("server", str(tmp_path), None) is None


def test_a_relative_path_is_taken_from_the_servers_cwd(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert command_problem("./bin/run.sh", None, str(tmp_path)) is None
    assert command_problem("./bin/missing.sh", None, str(tmp_path)) == "command './bin/missing.sh' does not exist"
    assert command_problem("./bin/run.sh", None, str(tmp_path / "nowhere")) == (
        f"cwd '{tmp_path / 'nowhere'}' is not a directory"
    )
