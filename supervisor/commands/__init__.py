"""Control commands: one module each, registered by the `command` decorator.

A command module holds both halves: the handler the supervisor runs, and the renderer `mcpvisor
ctl` uses to print the result. The handler's docstring is the command's help text.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor

# LSB exit codes, as supervisorctl uses them.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_NOT_RUNNING = 3
EXIT_UNKNOWN = 4  # unknown name, or no daemon answers


class CommandError(Exception):
    """A command that cannot be carried out; the message is shown to whoever asked."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


Handler = Callable[["Supervisor", list[str], Any], Awaitable[Any]]


@dataclass(frozen=True)
class CommandSpec:
    name: str
    handler: Handler
    usage: str
    render: Callable[[Any], str]
    exit_code: Callable[[Any], int]
    ctl: bool  # offered by `mcpvisor ctl` (some exist only for the frontend)

    @property
    def help(self) -> str:
        return inspect.cleandoc(self.handler.__doc__ or "")

    @property
    def summary(self) -> str:
        return self.help.splitlines()[0] if self.help else ""


REGISTRY: dict[str, CommandSpec] = {}


def _default_render(result: Any) -> str:
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    import json

    return json.dumps(result, indent=2)


def command(
    name: str,
    *,
    usage: str = "",
    render: Callable[[Any], str] = _default_render,
    exit_code: Callable[[Any], int] = lambda _result: EXIT_OK,
    ctl: bool = True,
) -> Callable[[Handler], Handler]:
    """Register a control command."""

    def register(handler: Handler) -> Handler:
        if name in REGISTRY:
            raise ValueError(f"command {name!r} registered twice")
        REGISTRY[name] = CommandSpec(name, handler, usage, render, exit_code, ctl)
        return handler

    return register


def load_all() -> dict[str, CommandSpec]:
    """Import every command module (each registers itself) and return the registry."""
    from mcpvisor.supervisor.commands import (  # noqa: F401
        disable,
        enable,
        pid,
        reload,
        reread,
        restart,
        server_add,
        server_patch,
        server_quarantine,
        server_remove,
        shutdown,
        start,
        status,
        stop,
        tail,
        update,
    )

    return REGISTRY
