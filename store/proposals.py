"""Changes an MCP client proposes to the servers, kept until an operator approves or blocks them.

A client (which a prompt injection may steer) cannot change what runs: `upstream_servers add`,
a patch of what a server runs or where it connects, `remove`, `enable` and `disable` become a
`Proposal` the supervisor keeps in `proposals.json` in the data dir. Nothing in a proposal is
spawned, connected to or resolved; `mcpvisor ctl approve NAME` applies it, `ctl block NAME`
drops it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import msgspec

from mcpvisor.wire.secrets import SECRET_REF

log = logging.getLogger(__name__)
_T = TypeVar("_T")

ProposalAction = Literal["add", "patch", "remove", "enable", "disable"]
PROPOSAL_ACTIONS: Final = ("add", "patch", "remove", "enable", "disable")
FILE_NAME: Final = "proposals.json"


class Proposal(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One pending change to server `name`."""

    name: str
    action: ProposalAction
    config: dict[str, Any] | None = None  # add: the server table; patch: the table it gave when proposed
    patch: dict[str, Any] | None = None  # patch: the fields as the client gave them (null removes)
    proposed_at: float  # seconds since the epoch
    tenant: str = ""  # the tenant whose client proposed it (an add joins that tenant's servers)

    @property
    def key(self) -> str:
        """How the operator names it: `name`, or `tenant/name` for a tenant's proposal."""
        return f"{self.tenant}/{self.name}" if self.tenant else self.name


class _File(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    version: int = 1
    proposals: list[Proposal] = []


def secret_references(table: Any, path: str = "") -> list[str]:
    """Where in `table` (keys and values, at any depth) a `${env:...}` or `${file:...}` reference stands.

    Only an operator may write one: a client that could would read any file or environment
    variable of the user running mcpvisor and have it sent wherever it points the server.
    Returns the field paths (`env.TOKEN`, `args[2]`), never the values.
    """
    found: list[str] = []
    if isinstance(table, str):
        if SECRET_REF.search(table) or _loose_reference(table):
            found.append(path or "value")
    elif isinstance(table, Mapping):
        for key, value in table.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and (SECRET_REF.search(key) or _loose_reference(key)):
                found.append(f"{path}.<key>" if path else "<key>")
            found += secret_references(value, where)
    elif isinstance(table, list | tuple):
        for index, value in enumerate(table):
            found += secret_references(value, f"{path}[{index}]")
    return found


def _loose_reference(text: str) -> bool:
    # `${env:NAME}` with odd spacing or case is not resolved today, but refusing it costs nothing
    # and keeps a later, more lenient resolver from opening the door.
    lowered = text.lower().replace(" ", "")
    return "${env:" in lowered or "${file:" in lowered


def describe_references(name: str, where: list[str]) -> str:
    """The refusal a client gets for secret references in what it sent (field paths, no values)."""
    fields = ", ".join(_clip(path) for path in where[:5]) + (f" and {len(where) - 5} more" if len(where) > 5 else "")
    return (
        f"Server '{name}': secret references (${{env:...}}, ${{file:...}}) are not accepted from an MCP client "
        f"(found in {fields}). Only the operator may write them, in the config file; ask the operator to add "
        "the secret there."
    )


def _clip(text: str, limit: int = 60) -> str:
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return "".join(c if c.isprintable() else "?" for c in text)


def ordered(proposals: Iterable[Proposal]) -> list[Proposal]:
    """Oldest first (then by name): the order listings show and files keep."""
    return sorted(proposals, key=lambda proposal: (proposal.proposed_at, proposal.name))


class ProposalStore:
    """The pending proposals by server name, persisted to `proposals.json` (0600, replaced atomically)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._items: dict[str, Proposal] = {}

    @classmethod
    def load(cls, data_dir: Path) -> ProposalStore:
        """The proposals saved in `data_dir`; a missing file is none, an unreadable one is set aside."""
        store = cls(data_dir / FILE_NAME)
        with contextlib.suppress(FileNotFoundError):
            _temp(store.path).unlink()  # a write killed half-way
        try:
            raw = store.path.read_bytes()
        except FileNotFoundError:
            return store
        try:
            saved = msgspec.json.decode(raw, type=_File)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            aside = store.path.with_name(f"{FILE_NAME}.unreadable")
            os.replace(store.path, aside)
            log.error("%s cannot be read (%s); set aside as %s, starting with no proposals", store.path, exc, aside)
            return store
        store._items = {proposal.key: proposal for proposal in saved.proposals}
        return store

    def __iter__(self) -> Iterator[Proposal]:
        return iter(ordered(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)

    def get(self, name: str) -> Proposal | None:
        return self._items.get(name)

    def put(self, proposal: Proposal) -> Proposal | None:
        """Keep `proposal` (it replaces one for the same key) and save; the one replaced, if any."""

        def change(items: dict[str, Proposal]) -> tuple[Proposal | None, bool]:
            replaced = items.get(proposal.key)
            items[proposal.key] = proposal
            return replaced, True

        return self._update(change)

    def pop(self, name: str) -> Proposal | None:
        def change(items: dict[str, Proposal]) -> tuple[Proposal | None, bool]:
            popped = items.pop(name, None)
            return popped, popped is not None

        return self._update(change)

    def prune(self, servers: Iterable[str]) -> list[Proposal]:
        """Drop the proposals the servers now configured make stale; the ones dropped.

        An add for a name the operator has since configured, and a change to a server that is no
        longer configured, could only be applied to something the client never saw.
        """
        existing = set(servers)

        def change(items: dict[str, Proposal]) -> tuple[list[Proposal], bool]:
            # A tenant's add may name a server it cannot see (another's): it waits for the operator,
            # who is told at approval; dropping it here would tell the tenant that the name exists.
            stale = [
                proposal
                for proposal in items.values()
                if (proposal.action == "add") == (proposal.name in existing)
                and not (proposal.tenant and proposal.action == "add")
            ]
            for proposal in stale:
                del items[proposal.key]
            return stale, bool(stale)

        stale = self._update(change)
        for proposal in stale:
            log.info("proposal to %s server %r dropped: the servers changed", proposal.action, proposal.name)
        return stale

    def _update(self, change: Callable[[dict[str, Proposal]], tuple[_T, bool]]) -> _T:
        """`change` (its result, and whether it changed anything) applied to the proposals, saved.

        It works on a copy, kept only once saved: on OSError what is in memory is what is on disk.
        """
        items = dict(self._items)
        result, changed = change(items)
        if changed:
            self._save(items)
            self._items = items
        return result

    def _save(self, items: dict[str, Proposal]) -> None:
        data = msgspec.json.encode(_File(proposals=ordered(items.values())))
        tmp = _temp(self.path)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with open(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def new_proposal(
    name: str,
    action: ProposalAction,
    *,
    config: dict[str, Any] | None = None,
    patch: dict[str, Any] | None = None,
    tenant: str = "",
) -> Proposal:
    return Proposal(name=name, action=action, config=config, patch=patch, proposed_at=time.time(), tenant=tenant)


def _temp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")
