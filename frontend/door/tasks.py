"""Task handles of the Tasks extension (`io.modelcontextprotocol/tasks`): which upstream made each.

An upstream that offers the extension may answer a `tools/call` with a task (`resultType: "task"`
and a `taskId`) that the client then polls with `tasks/get`, answers with `tasks/update` and stops
with `tasks/cancel`. Those requests must reach the upstream that made the task, and only a client
of the same tenant may use the handle: each stack's door keeps its own `TaskRoutes`, so a handle
one tenant got is unknown to every other by construction.

Toward the upstream the worker speaks the handshake era, on one session shared by all clients, so
a client's opt-in travels per request (`_meta` clientCapabilities, as 2026-07-28 defines it) and
the upstream decides for each call whether to make a task.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

TASKS = "io.modelcontextprotocol/tasks"
# The extension's methods (2026-07-28). Its predecessor's tasks/result and tasks/list are gone:
# the result is inlined on tasks/get, and a list would mix clients' handles.
TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
# A client that opted in names the extension here; the upstream reads it on the forwarded call.
OPT_IN = {"extensions": {TASKS: {}}}
# JSON-RPC code for a capability the client did not declare (2026-07-28, -32021).
MISSING_CAPABILITY = -32021
DEFAULT_LIMIT = 10_000


def offers_tasks(initialize: Mapping[str, Any]) -> bool:
    """The upstream's initialize result declares the Tasks extension."""
    capabilities = initialize.get("capabilities")
    extensions = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
    return isinstance(extensions, Mapping) and TASKS in extensions


def declares_tasks(capabilities: Any) -> bool:
    """A client's capabilities (a dict, as on the wire) name the Tasks extension."""
    extensions = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
    return isinstance(extensions, Mapping) and TASKS in extensions


def request_opts_in(params: Mapping[str, Any] | None) -> bool:
    """A 2026-07-28 request's own `_meta` clientCapabilities name the Tasks extension."""
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    return isinstance(meta, Mapping) and declares_tasks(meta.get(CAPABILITIES_KEY))


def with_opt_in(params: dict[str, Any]) -> dict[str, Any]:
    """`params` for the upstream, telling it this caller accepts a task in place of a result."""
    meta = params.get("_meta")
    return {**params, "_meta": {**(meta if isinstance(meta, dict) else {}), CAPABILITIES_KEY: OPT_IN}}


def created_task(result: Mapping[str, Any]) -> str | None:
    """The task id when `result` is a CreateTaskResult, else None."""
    task_id = result.get("taskId")
    return task_id if result.get("resultType") == "task" and isinstance(task_id, str) else None


def exposed_task_id(server: str, task_id: str) -> str:
    """The handle a client of an aggregating endpoint holds: the server's name, then its own id."""
    return f"{server}:{task_id}"


def split_task_id(handle: str) -> tuple[str, str] | None:
    """(server, upstream task id) of an aggregating endpoint's handle; None when it has no server."""
    server, sep, task_id = handle.partition(":")
    return (server, task_id) if sep and server and task_id else None


class UnknownTask(Exception):
    """A task handle this door never handed out (or has forgotten); the message is safe to show."""

    def __init__(self, handle: str) -> None:
        self.handle = handle
        self.message = f"Unknown task '{handle}': no task with this id was created through this endpoint"
        super().__init__(self.message)


class TaskRoutes:
    """The (server, task id) pairs one stack's clients were handed, newest last, at most `limit`.

    A task outlives the call that made it, so the table is bounded rather than tied to a
    connection: the oldest handles are forgotten first (their tasks are long expired by then).
    """

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self._made: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._made)

    def made(self, server: str, task_id: str) -> None:
        """`server` created task `task_id` for a client of this stack."""
        key = (server, task_id)
        self._made[key] = None
        self._made.move_to_end(key)
        while len(self._made) > self.limit:
            self._made.popitem(last=False)

    def knows(self, server: str, task_id: str) -> bool:
        return (server, task_id) in self._made

    def forget_server(self, server: str) -> None:
        """A removed server's tasks are gone with it."""
        for key in [key for key in self._made if key[0] == server]:
            del self._made[key]
