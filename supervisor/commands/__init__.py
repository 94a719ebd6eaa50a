"""Control commands: one module each, registered by the `command` decorator.

A command module holds both halves: the handler the supervisor runs, and the renderer `mcpvisor
ctl` uses to print the result. The handler's docstring is the command's help text.

Each command declares its arguments as a msgspec Struct. The control server turns what arrives
(the words typed after `mcpvisor ctl NAME`, or the structured `data` the frontend sends) into that
Struct once, before the handler runs: a handler never sees an argument of the wrong type, and a bad
argument is answered with one line naming it and exit code 2.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from inspect import cleandoc
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor

# LSB exit codes, as supervisorctl uses them.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2  # a bad argument (or a broken config file)
EXIT_NOT_RUNNING = 3
EXIT_UNKNOWN = 4  # unknown name, or no daemon answers


class CommandError(Exception):
    """A command that cannot be carried out; the message is shown to whoever asked."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class ArgumentError(CommandError):
    """An argument that does not fit the command's declaration."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


class Args(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base of every command's arguments; a command without arguments uses it as it is."""


class Name(Args):
    name: str


class Names(Args):
    names: list[str] = []


Handler = Callable[["Supervisor", Any], Awaitable[Any]]


@dataclass(frozen=True)
class CommandSpec:
    name: str
    handler: Handler
    args: type[Args]
    usage: str
    render: Callable[[Any], str]
    exit_code: Callable[[Any], int]
    ctl: bool  # offered by `mcpvisor ctl` (some exist only for the frontend)
    options: Mapping[str, str] = field(default_factory=dict)  # flag -> argument field
    operator_only: bool = False  # refused when the frontend sends it (what a client's tool could reach)

    @property
    def help(self) -> str:
        return cleandoc(self.handler.__doc__ or "")

    @property
    def summary(self) -> str:
        return self.help.splitlines()[0] if self.help else ""

    def parse(self, words: list[str], data: Any) -> Args:
        """The command's arguments: from `data` when given (the frontend's commands), else from words."""
        from_words = data is None
        raw = parse_words(self.args, self.options, words, self.name) if from_words else data
        if not from_words and words:
            raise ArgumentError(f"{self.name}: takes its arguments as data, not as words")
        try:
            # Words are strings: let msgspec turn "5" into 5. Data arrives typed and must fit as it is.
            return msgspec.convert(raw, self.args, strict=not from_words)
        except msgspec.ValidationError as exc:
            raise ArgumentError(self._describe(str(exc), raw if from_words else None)) from None

    def _describe(self, message: str, words: dict[str, Any] | None) -> str:
        """msgspec's message, told in the command's own words (one line)."""
        usage = f" (usage: {self.usage})" if self.usage else ""
        if m := re.match(r"Object missing required field `([^`]+)`", message):
            return f"{self.name}: missing argument {self.display(m.group(1))}{usage}"
        if m := re.match(r"Object contains unknown field `([^`]+)`", message):
            return f"{self.name}: unknown argument {_quote(m.group(1))}{usage}"
        if m := re.match(r"(.*) - at `\$\.?([A-Za-z0-9_]*)(.*)`$", message):
            reason, key = m.group(1), m.group(2)
            reason = reason[:1].lower() + reason[1:]
            if not key:
                return f"{self.name}: bad arguments: {reason}{usage}"
            value = words.get(key) if words is not None else None
            if isinstance(value, str):
                reason = re.sub(r", got `[^`]*`$", "", reason)
            shown = f", got {_quote(value)}" if isinstance(value, str) else ""
            return f"{self.name}: bad argument {self.display(key)}: {reason}{shown}"
        return f"{self.name}: bad arguments: {message}{usage}"

    def display(self, key: str) -> str:
        """How the operator names an argument: its flags, or its place in the usage line."""
        flags = [flag for flag, target in self.options.items() if target == key]
        if flags:
            return "/".join(flags)
        return key.upper().removesuffix("S") if _is_list(_field_types(self.args).get(key)) else key.upper()


REGISTRY: dict[str, CommandSpec] = {}


def _default_render(result: Any) -> str:
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    return json.dumps(result, indent=2)


def command(
    name: str,
    *,
    args: type[Args] = Args,
    options: Mapping[str, str] | None = None,
    usage: str = "",
    render: Callable[[Any], str] = _default_render,
    exit_code: Callable[[Any], int] = lambda _result: EXIT_OK,
    ctl: bool = True,
    operator_only: bool = False,
) -> Callable[[Handler], Handler]:
    """Register a control command taking `args` (ctl words: fields in order, `options` by flag)."""

    def register(handler: Handler) -> Handler:
        if name in REGISTRY:
            raise ValueError(f"command {name!r} registered twice")
        fields = _field_types(args)
        for target in (options or {}).values():
            if target not in fields:
                raise ValueError(f"command {name!r}: option for unknown argument {target!r}")
        REGISTRY[name] = CommandSpec(
            name, handler, args, usage, render, exit_code, ctl, dict(options or {}), operator_only
        )
        return handler

    return register


# -- ctl words -> a dict for msgspec.convert -----------------------------------------------------


def parse_words(args: type[Args], options: Mapping[str, str], words: list[str], command: str) -> dict[str, Any]:
    """Flags take the next word; the other words fill the remaining fields in order (a list takes the rest).

    Values stay strings here: `msgspec.convert(..., strict=False)` turns "5" into 5 and says what is
    wrong with "abc". A `dict` field takes `key=value,key=value`.
    """
    fields = _field_types(args)
    positional = [key for key in fields if key not in options.values()]
    values: dict[str, Any] = {}
    rest: list[str] = []
    queue = list(words)
    while queue:
        word = queue.pop(0)
        if word in options:
            key = options[word]
            if not queue:
                raise ArgumentError(f"{command}: option {word} needs a value")
            values[key] = _option_value(fields[key], queue.pop(0), word, command)
        elif word.startswith("-") and len(word) > 1 and not _NUMBER.match(word):
            known = ", ".join(sorted(options)) or "none"
            raise ArgumentError(f"{command}: unknown option {_quote(word)} (options: {known})")
        else:
            rest.append(word)
    for key in positional:
        if _is_list(fields[key]):
            if rest:
                values[key] = rest
            rest = []
        elif rest:
            values[key] = rest.pop(0)
    if rest:
        raise ArgumentError(f"{command}: unexpected argument {_quote(rest[0])}")
    return values


_NUMBER = re.compile(r"^-\d+(\.\d+)?$")


def _option_value(annotation: Any, word: str, flag: str, command: str) -> Any:
    if _origin(annotation) is not dict:
        return word
    pairs = [item.split("=", 1) for item in word.split(",") if item]
    if any(len(pair) != 2 for pair in pairs):
        raise ArgumentError(f"{command}: option {flag} takes KEY=VALUE[,KEY=VALUE...], got {_quote(word)}")
    return dict(pairs)


def _field_types(args: type[Args]) -> dict[str, Any]:
    return {f.encode_name: f.type for f in msgspec.structs.fields(args)}


def _origin(annotation: Any) -> Any:
    """The container type of an annotation, through Annotated[...] and `X | None`."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return None
            annotation = members[0]
        else:
            return origin


def _is_list(annotation: Any) -> bool:
    return _origin(annotation) in (list, tuple)


def _quote(value: Any) -> str:
    """A value as the operator typed it, shortened and on one line."""
    text = repr(value if isinstance(value, str) else str(value))
    return text if len(text) <= 60 else text[:57] + "...'"


def load_all() -> dict[str, CommandSpec]:
    """Import every command module (each registers itself) and return the registry."""
    from mcpvisor.supervisor.commands import (  # noqa: F401
        activity,
        allow,
        approve,
        block,
        calls,
        deny,
        disable,
        enable,
        inspect,
        login,
        pending,
        pid,
        pool,
        reload,
        reread,
        restart,
        server_admin,
        server_propose,
        server_quarantine,
        shutdown,
        start,
        status,
        stop,
        tail,
        update,
    )

    return REGISTRY
