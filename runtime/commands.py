"""The program a stdio server's `command` names, found as the worker finds it.

The worker runs an upstream with a small inherited environment plus the server's `env`, and looks
the command up in that environment's PATH, to which the folder of mcpvisor's own Python is added
(commands installed next to mcpvisor are found without activating its virtualenv). A command with
a slash is a path, relative to the server's `cwd`. `mcpvisor check` asks the same question before
anything runs.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping

# Inherited by default, as the SDK's stdio client does: enough to find and run programs.
INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR", "TZ")


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """The upstream's environment: a safe inherited base, then its configured `env`."""
    env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
    here = os.path.dirname(sys.executable)
    path = env.get("PATH", os.defpath)
    if here not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join([here, path])
    env.update(extra)
    return env


def find_program(command: str, search_path: str | None) -> str:
    """The executable the worker starts for `command` (the command itself when PATH has none)."""
    return shutil.which(command, path=search_path) or command


def command_problem(command: str, search_path: str | None, cwd: str | None) -> str | None:
    """Why `command` cannot be started (missing, not executable, a bad `cwd`); None when it can."""
    if cwd is not None and not os.path.isdir(os.path.expanduser(cwd)):
        return f"cwd {cwd!r} is not a directory"
    if "/" in command:
        path = os.path.join(os.path.expanduser(cwd) if cwd else os.getcwd(), os.path.expanduser(command))
        if not os.path.exists(path):
            return f"command {command!r} does not exist"
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            return f"command {command!r} is not an executable file"
        return None
    if shutil.which(command, path=search_path) is not None:
        return None
    # Found, but not executable by us?
    for folder in (search_path or os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or ".", command)
        if os.path.isfile(candidate):
            return f"command {command!r} is not executable ({candidate})"
    return f"command {command!r} is not found in PATH (nor in the folder of mcpvisor's Python)"
