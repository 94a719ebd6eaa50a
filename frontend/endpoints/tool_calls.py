"""The one `tools/call` handler of every endpoint.

An endpoint only says what a name means there (`resolve`): one of mcpvisor's own tools, or an
upstream tool found through the door. Everything else is the same on every path: the arguments
as the client wrote them, its `_meta` less its envelope, a round's answers, the gate, the audit
record, the upstream's result as its bytes, a refusal as the result that explains it, and an
upstream's failure as the JSON-RPC error it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from mcpvisor.frontend.door.calls import ClientCall
from mcpvisor.frontend.door.tasks import MISSING_CAPABILITY, TASKS, created_task, exposed_task_id
from mcpvisor.frontend.door.upstreams import NotFound, Refused, ToolTarget, UpstreamError, Upstreams
from mcpvisor.frontend.endpoints import eras, rpc
from mcpvisor.frontend.endpoints.handlers import Context, Result
from mcpvisor.frontend.endpoints.rpc import RpcError
from mcpvisor.frontend.tools.builtins import Builtins

log = logging.getLogger(__name__)

# What a client that did not declare the Tasks extension is told a task-only tool needs.
TASKS_REQUIRED: Final = {"requiredCapabilities": {"extensions": {TASKS: {}}}}
_decode_object = msgspec.json.Decoder(dict[str, Any])
_CONSUMED: Final = frozenset({"_meta", "requestState", "inputResponses"})
_META: Final = frozenset({"_meta"})
_NAMES: Final = ("name", "uri")


@dataclass(frozen=True, slots=True)
class Builtin:
    """One of mcpvisor's own tools, by name."""

    name: str


Target = Builtin | ToolTarget
Resolver = Callable[[str], Target]


def door_error(exc: NotFound | UpstreamError) -> RpcError:
    return RpcError(exc.code, exc.message)


def call_refused(exc: UpstreamError, definition: Mapping[str, Any]) -> RpcError:
    """A failed tools/call as the client gets it: a task-only tool's -32021 names the extension.

    The worker carries an upstream's error code and message, not its `data`; for a tool whose
    definition requires a task, the capability it misses is known here.
    """
    execution = definition.get("execution")
    required = isinstance(execution, Mapping) and execution.get("taskSupport") == "required"
    if exc.code == MISSING_CAPABILITY and required:
        return RpcError(exc.code, exc.message, TASKS_REQUIRED)
    return RpcError(exc.code, exc.message)


class ToolCalls:
    """`tools/call`: resolve the name the endpoint's way, then run mcpvisor's tool or the upstream's."""

    def __init__(
        self,
        upstreams: Upstreams,
        builtins: Builtins,
        resolve: Resolver,
        *,
        via: str,
        tasks: bool = False,
        task_handles: bool = False,
    ) -> None:
        self.upstreams = upstreams
        self.builtins = builtins
        self.resolve = resolve
        self.via = via  # the activity log's name for calls that came this way
        self.tasks = tasks  # the endpoint routes Tasks extension handles back (tasks/get ...)
        self.task_handles = task_handles  # handles are `server:id` (an endpoint of many servers)

    async def __call__(self, context: Context) -> Result:
        name = rpc.member(context.params, "name")
        try:
            target = self.resolve(name)
        except NotFound as exc:
            raise door_error(exc) from None
        if isinstance(target, Builtin):
            raw = context.params.get("arguments")
            arguments = _decode_object.decode(raw) if raw is not None and bytes(raw).strip() != b"null" else {}
            return _checked(await self.builtins.call(target.name, arguments, context))
        try:
            result = await self.upstreams.call_tool(
                target,
                forwarded(context, target.tool),
                ClientCall(context, target.server),
                via=self.via,
                tasks=self.tasks,
            )
        except Refused as refused:
            return _checked(refused.answer)
        except UpstreamError as exc:
            raise call_refused(exc, target.definition) from None
        if self.task_handles and isinstance(result, bytes) and b'"task"' in result:
            answer = _decode_object.decode(result)
            if (task_id := created_task(answer)) is not None:
                # Upstreams mint their own ids, which may collide: the client holds `server:id`.
                answer["taskId"] = exposed_task_id(target.server, task_id)
                return answer
        return result


def _checked(result: dict[str, Any]) -> dict[str, Any]:
    """One of mcpvisor's own results, after a look that it is one (an `input_required` passes)."""
    if result.get("resultType") != "input_required" and not eras.is_tool_result(result):
        log.error("a tool result of mcpvisor's own is malformed: %s", sorted(result))
        raise RpcError(rpc.INTERNAL_ERROR, "Handler returned an invalid result")
    return result


def forwarded(context: Context, name: str | None = None) -> dict[str, Any]:
    """A request's params for the upstream: as the client sent them, less its envelope, plus what
    it brought back from a round (which the door takes out again)."""
    # A round's answers and state are the door's to carry (they come back opened, in `carried`);
    # other requests (tasks/update) forward theirs as they are.
    consumed = _CONSUMED if context.call.method in eras.INPUT_REQUIRED_METHODS else _META
    params: dict[str, Any] = {key: value for key, value in context.params.items() if key not in consumed}
    for key in _NAMES:  # decoded: the door reads them (the activity log, the routing)
        if key in params:
            params[key] = rpc.member(context.params, key)
    if name is not None:
        params["name"] = name
    meta = eras.forwarded_meta(context.meta)
    if meta:
        params["_meta"] = meta
    params.update(context.carried)
    return params
