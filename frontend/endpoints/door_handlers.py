"""Handlers the endpoints over many upstream methods share: forwarding, logging, subscriptions, tasks.

Each takes what differs between `/mcp/direct` and `/mcp/servers/NAME` as an argument (which
server serves a URI or a prompt, whose clients hear what), so both run the same code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Final

import msgspec
import trio
from mcp.shared.inbound import decode_header_value

from mcpvisor.frontend.door.calls import ClientCall
from mcpvisor.frontend.door.tasks import TASKS, UnknownTask
from mcpvisor.frontend.door.upstreams import NotFound, UpstreamError, Upstreams
from mcpvisor.frontend.endpoints import eras, rpc
from mcpvisor.frontend.endpoints.engine import NAME_HEADER
from mcpvisor.frontend.endpoints.handlers import Context, Handler, Result
from mcpvisor.frontend.endpoints.notices import Notices
from mcpvisor.frontend.endpoints.rpc import RpcError
from mcpvisor.frontend.endpoints.tool_calls import TASKS_REQUIRED, door_error, forwarded

ACKNOWLEDGED: Final = "notifications/subscriptions/acknowledged"
# How a door lookup that may fail is given to a handler: the server that serves what is named.
Locate = Callable[[Context], tuple[str, dict[str, Any]]]


def forwarding(upstreams: Upstreams, method: str, locate: Locate) -> Handler:
    """A handler that sends the request to the upstream `locate` finds, as the client sent it."""

    async def handle(context: Context) -> Result:
        try:
            server, params = locate(context)
            return await upstreams.request(server, method, params, ClientCall(context, server))
        except (NotFound, UpstreamError) as exc:
            raise door_error(exc) from None

    return handle


def set_level(context: Context) -> Result:
    """logging/setLevel (handshake era): the session hears upstream log lines at and above it."""
    if context.call.session is not None:
        context.call.session.log_level = rpc.member(context.params, "level")
    return b"{}"


def session_handlers(notices: Notices, find: Callable[[str], str]) -> dict[str, Handler]:
    """logging/setLevel, resources/subscribe and resources/unsubscribe (handshake era), on the session."""

    async def subscribe(context: Context) -> Result:
        uri = rpc.member(context.params, "uri")
        try:
            await notices.subscribe(context.call.session, uri)
        except (NotFound, UpstreamError) as exc:
            raise door_error(exc) from None
        return b"{}"

    async def unsubscribe(context: Context) -> Result:
        uri = rpc.member(context.params, "uri")
        try:
            find(uri)
        except NotFound as exc:
            raise door_error(exc) from None
        await notices.unsubscribe(context.call.session, uri)
        return b"{}"

    async def level(context: Context) -> Result:
        return set_level(context)

    return {"resources/subscribe": subscribe, "resources/unsubscribe": unsubscribe, "logging/setLevel": level}


def listening(notices: Notices) -> Handler:
    """subscriptions/listen (2026-07-28): the answer is a stream of the notices the client asked for.

    It opens with the acknowledgement of what will be delivered, then carries each notice until
    the client closes it; the upstream is subscribed to the resources it names meanwhile.
    """

    async def listen(context: Context) -> Result:
        wanted = rpc.member(context.params, "notifications")
        listener, notices_in = notices.listen(context.call.id, wanted if isinstance(wanted, dict) else {})
        meta = {eras.SUBSCRIPTION_ID_KEY: context.call.id}
        subscribed: list[str] = []
        try:
            for uri in sorted(listener.uris):
                # A URI no server offers just never updates.
                with contextlib.suppress(NotFound, UpstreamError):
                    await notices.subscribe(listener, uri)
                    subscribed.append(uri)
            await context.notify(ACKNOWLEDGED, {"notifications": listener.honored(), "_meta": meta})
            async for message in notices_in:
                await context.outbox.send(message)
        finally:
            notices.stop_listening(listener)
            with trio.CancelScope(shield=True):
                for uri in subscribed:
                    await notices.unsubscribe(listener, uri)
        return {"_meta": meta}

    return listen


def check_task_request(context: Context, task_id: str) -> None:
    """Refuse a tasks/* request whose `Mcp-Name` names another task (-32020, HTTP 400) or whose
    client did not declare the extension on it (-32021).

    A request without the header is let through, as for clients that predate the extension's
    routing headers. Tasks are handed out to 2026-07-28 clients only (the extension is defined for
    that version), so no handshake-era client holds a handle to ask about.
    """
    named = context.call.headers.get(NAME_HEADER)
    if named is not None:
        decoded = decode_header_value(named)
        if decoded is None or decoded.strip() != task_id:
            raise RpcError(rpc.HEADER_MISMATCH, f"{NAME_HEADER} header does not match the request's taskId")
    if context.modern and context.declares("extensions", TASKS):
        return
    raise RpcError(
        rpc.MISSING_CAPABILITY,
        f"{context.call.method} needs the {TASKS} extension: declare it in the request's client capabilities",
        TASKS_REQUIRED,
    )


def task_requests(upstreams: Upstreams, route: Callable[[str], tuple[str, str] | None]) -> dict[str, Handler]:
    """tasks/get, tasks/update, tasks/cancel: `route` turns the client's handle into (server, task id)."""

    def handler(method: str) -> Handler:
        async def handle(context: Context) -> Result:
            handle_id = rpc.member(context.params, "taskId")
            check_task_request(context, handle_id)
            found = route(handle_id)
            if found is None:
                raise RpcError(rpc.INVALID_PARAMS, UnknownTask(handle_id).message)
            server, task_id = found
            params = {**forwarded(context), "taskId": task_id}
            try:
                raw = await upstreams.task_request(
                    server, method, params, ClientCall(context, server), handle=handle_id
                )
            except UnknownTask as exc:
                raise RpcError(rpc.INVALID_PARAMS, exc.message) from None
            except (NotFound, UpstreamError) as exc:
                raise door_error(exc) from None
            if handle_id == task_id or b'"taskId"' not in raw:
                return raw
            answer = msgspec.json.decode(raw, type=dict[str, Any])
            if answer.get("taskId") == task_id:
                answer["taskId"] = handle_id
            return answer

        return handle

    return {method: handler(method) for method in ("tasks/get", "tasks/update", "tasks/cancel")}
