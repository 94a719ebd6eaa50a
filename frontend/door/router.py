"""The frontend's side of the calls socket: route requests to workers, take in their snapshots."""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec
import trio
import zmq

from mcpvisor.frontend import spans
from mcpvisor.frontend.door.calls import AskFailed, ClientCall
from mcpvisor.frontend.door.catalog import Catalog, ServerView
from mcpvisor.store.oauth_store import ACCOUNT_EVENT, LOGIN_METHODS
from mcpvisor.wire import codec
from mcpvisor.wire.errors import ErrorCode, WireError
from mcpvisor.wire.messages import (
    Answer,
    Ask,
    Cancel,
    Failure,
    Heartbeat,
    Notify,
    Request,
    Response,
    Snapshot,
    SnapshotRequest,
)
from mcpvisor.wire.zsocket import ZSocket

log = logging.getLogger(__name__)

# A worker that has not been heard from for this long is treated as gone (it beats every second).
HEARTBEAT_TIMEOUT = 3.5
# Time a worker gets past the call timeout to report its own timeout before the frontend gives up.
_GRACE = 2.0


_encode = msgspec.json.encode


async def _ignore(worker: str, method: str, params: bytes) -> None:
    await trio.lowlevel.checkpoint()


class _Pending:
    __slots__ = ("call", "deadline", "done", "outcome", "timeout", "worker")

    def __init__(self, worker: str, call: ClientCall | None, timeout: float) -> None:
        self.worker = worker
        self.call = call
        self.timeout = timeout
        self.deadline: trio.CancelScope | None = None
        self.done = trio.Event()
        self.outcome: bytes | WireError | None = None

    def settle(self, outcome: bytes | WireError) -> None:
        if not self.done.is_set():
            self.outcome = outcome
            self.done.set()


class Catalogs:
    """One catalog per tenant: worker `tenant/server` reports into tenant's catalog as `server`.

    Workers without a tenant (`server`) report into the catalog of prefix "". A tenant's catalog
    knows nothing of another's, so no lookup in it can find another tenant's server.
    """

    def __init__(self, plain: Catalog) -> None:
        self.name_style = plain.name_style
        self._by_tenant: dict[str, Catalog] = {"": plain}

    def of_tenant(self, tenant: str) -> Catalog:
        catalog = self._by_tenant.get(tenant)
        if catalog is None:
            catalog = self._by_tenant[tenant] = Catalog(self.name_style)
        return catalog

    def locate(self, worker: str) -> tuple[Catalog, str]:
        """The catalog that holds `worker` and the worker's name there."""
        tenant, _, local = worker.rpartition("/")
        return self.of_tenant(tenant), local

    def workers(self) -> Iterator[tuple[str, ServerView]]:
        """Every worker known, by its full id."""
        for tenant, catalog in list(self._by_tenant.items()):
            for view in list(catalog.servers.values()):
                yield (f"{tenant}/{view.id}" if tenant else view.id), view


class MergedCatalog:
    """Every catalog seen as one, by server name: what the operator inspects and approves.

    Pins are per server name, for every tenant; a server's definitions are taken from the plain
    worker when it is up, else from any tenant's worker of it that is.
    """

    def __init__(self, catalogs: Catalogs) -> None:
        self.catalogs = catalogs

    @property
    def servers(self) -> dict[str, ServerView]:
        merged: dict[str, ServerView] = {}
        for _worker, view in self.catalogs.workers():
            held = merged.get(view.id)
            if held is None or (view.ready and not held.ready):
                merged[view.id] = view
        return merged

    def ready_servers(self) -> list[ServerView]:
        return [view for view in self.servers.values() if view.ready]

    def describe_unavailable(self, server: str) -> str:
        return Catalog.describe_unavailable(self, server)  # type: ignore[arg-type]  # it reads `servers` alone


class TenantRouter:
    """A tenant's side of the router: the tenant's server names, its own workers."""

    def __init__(self, router: Router, tenant: str) -> None:
        self.router = router
        self.prefix = f"{tenant}/"

    async def request(
        self,
        worker: str,
        method: str,
        params: dict[str, Any],
        timeout: float,
        call: ClientCall | None = None,
        *,
        activity_id: str = "",
    ) -> bytes:
        return await self.router.request(self.prefix + worker, method, params, timeout, call, activity_id=activity_id)

    def fail_worker(self, worker: str, reason: str) -> None:
        self.router.fail_worker(self.prefix + worker, reason)


_decode_event = msgspec.json.Decoder(dict[str, Any])


class Router:
    """Sends requests to workers by identity and matches replies to them."""

    def __init__(
        self,
        sock: ZSocket,
        catalog: Catalog,
        on_catalog_change: Callable[[str], None],
        *,
        max_inflight: int = 64,
        on_notification: Callable[[str, str, bytes], Awaitable[None]] | None = None,
    ) -> None:
        self._on_notification = on_notification or _ignore
        # A worker's account was connected or disconnected: (worker, event) for the activity log.
        self.on_account: Callable[[str, dict[str, Any]], None] | None = None
        self._nursery: trio.Nursery | None = None
        self.sock = sock
        self.catalog = catalog  # the catalog of workers without a tenant
        self.catalogs = Catalogs(catalog)
        self._on_catalog_change = on_catalog_change
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._inflight: defaultdict[str, int] = defaultdict(int)
        self.max_inflight = max_inflight

    # -- requests --------------------------------------------------------------------------------

    async def request(
        self,
        worker: str,
        method: str,
        params: dict[str, Any],
        timeout: float,
        call: ClientCall | None = None,
        *,
        activity_id: str = "",
    ) -> bytes:
        """Send one request to a worker and wait for its JSON result; raises WireError.

        With `call`, the upstream's progress, logs and questions during the request go back to
        that client; its progress token is replaced by this request's id, unique across clients.
        """
        catalog, name = self.catalogs.locate(worker)
        view = catalog.servers.get(name)
        # A login (its start, its redirect, a logout) goes to a worker that may be waiting for it.
        if view is None or not (view.ready or (view.alive and method in LOGIN_METHODS)):
            raise WireError(ErrorCode.SERVER_UNAVAILABLE, catalog.describe_unavailable(name))
        if self._inflight[worker] >= self.max_inflight:
            raise WireError(
                ErrorCode.BUSY,
                f"server '{name}' already has {self.max_inflight} calls in flight; retry shortly",
            )
        request_id = next(self._ids)
        pending = self._pending[request_id] = _Pending(worker, call, timeout)
        meta = params.get("_meta")
        if isinstance(meta, dict) and "progressToken" in meta:
            params = {**params, "_meta": {**meta, "progressToken": request_id}}
        self._inflight[worker] += 1
        try:
            frames = [
                worker.encode(),
                *codec.calls.encode(
                    Request(
                        id=request_id,
                        method=method,
                        timeout=timeout,
                        activity_id=activity_id,
                        trace_context=spans.wire_context(),
                    ),
                    _encode(params),
                ),
            ]
            try:
                await self.sock.send_multipart(frames)
            except zmq.ZMQError as exc:
                if exc.errno == errno.EHOSTUNREACH:
                    raise WireError(ErrorCode.SERVER_UNAVAILABLE, catalog.describe_unavailable(name)) from None
                raise
            with trio.move_on_after(timeout + _GRACE) as deadline:
                pending.deadline = deadline
                await pending.done.wait()
            if deadline.cancelled_caught:
                self._send_cancel(worker, request_id, "timeout")
                raise WireError(ErrorCode.TIMEOUT, f"no answer from server '{name}' within {timeout:g}s")
        except trio.Cancelled:
            # The client went away or cancelled: tell the worker so the upstream stops too.
            if not pending.done.is_set():
                self._send_cancel(worker, request_id, "cancelled by the client")
            raise
        finally:
            del self._pending[request_id]
            self._inflight[worker] -= 1
        outcome = pending.outcome
        if isinstance(outcome, WireError):
            raise outcome
        assert outcome is not None
        return outcome

    def _send_cancel(self, worker: str, request_id: int, reason: str) -> None:
        frames = [worker.encode(), *codec.calls.encode(Cancel(id=request_id, reason=reason))]
        # If the worker is gone there is nothing left to cancel.
        with contextlib.suppress(zmq.ZMQError, trio.ClosedResourceError):
            self.sock.send_multipart_nowait(frames)

    def fail_worker(self, worker: str, reason: str) -> None:
        """Fail every call in flight to `worker` at once, and hide its catalog."""
        catalog, name = self.catalogs.locate(worker)
        error = WireError(ErrorCode.UPSTREAM_GONE, f"server '{name}' stopped while the call was running ({reason})")
        for pending in self._pending.values():
            if pending.worker == worker:
                pending.settle(error)
        if catalog.mark_gone(name, reason):
            self._on_catalog_change(worker)

    # -- receiving -------------------------------------------------------------------------------

    async def serve(self) -> None:
        """Take in replies, snapshots and heartbeats until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._watch_heartbeats)
            while True:
                for frames in await self.sock.receive_batch():
                    await self._dispatch(frames)

    async def _notified(self, worker: str, msg: Notify, payload: bytes) -> None:
        if msg.method == ACCOUNT_EVENT:
            # mcpvisor's own event, never an upstream's: no client sees it.
            if self.on_account is not None:
                try:
                    self.on_account(worker, _decode_event.decode(payload))
                except (msgspec.DecodeError, msgspec.ValidationError):
                    log.error("worker %s sent an undecodable account event", worker)
            return
        pending = self._pending.get(msg.id) if msg.id else None
        if pending is not None:
            if msg.method == "notifications/progress" and pending.deadline is not None:
                pending.deadline.deadline = trio.current_time() + pending.timeout + _GRACE
            if pending.call is not None and await pending.call.notify(msg.method, payload):
                return
        await self._on_notification(worker, msg.method, payload)

    async def _answer(self, worker: str, msg: Ask, payload: bytes | None) -> None:
        pending = self._pending.get(msg.call_id)
        answer: Answer
        result: bytes | None = None
        if pending is None or pending.call is None:
            answer = Answer(
                id=msg.id, ok=False, code=-32600, message=f"{msg.method}: the client of this call cannot be asked it"
            )
        else:
            try:
                result = await pending.call.ask(msg.method, payload or b"{}")
                answer = Answer(id=msg.id, ok=True)
            except AskFailed as exc:
                answer = Answer(id=msg.id, ok=False, code=exc.code, message=exc.message)
        with contextlib.suppress(zmq.ZMQError, trio.ClosedResourceError):
            await self.sock.send_multipart([worker.encode(), *codec.calls.encode(answer, result)])

    async def _dispatch(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            return
        identity = frames[0]
        try:
            msg, payload = codec.calls.decode(frames[1:])
            worker = identity.decode()
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            log.error("dropping an undecodable message from a worker: %s", exc)
            return
        match msg:
            case Response():
                if (pending := self._pending.get(msg.id)) is not None:
                    pending.settle(payload or b"{}")
            case Failure():
                if (pending := self._pending.get(msg.id)) is not None:
                    pending.settle(WireError(msg.code, msg.message, mcp_code=msg.mcp_code))
            case Snapshot():
                catalog, name = self.catalogs.locate(worker)
                changed = catalog.apply_snapshot(
                    name,
                    pid=msg.pid,
                    catalog_seq=msg.catalog_seq,
                    state=msg.state,
                    error=msg.error,
                    catalog=payload,
                    initialize=msg.initialize,
                    login=msg.login,
                )
                if changed:
                    self._on_catalog_change(worker)
            case Notify():
                await self._notified(worker, msg, payload or b"{}")
            case Ask():
                assert self._nursery is not None
                self._nursery.start_soon(self._answer, worker, msg, payload)
            case Heartbeat():
                catalog, name = self.catalogs.locate(worker)
                view = catalog.view(name)
                view.last_seen = time.monotonic()
                if msg.catalog_seq != view.catalog_seq or msg.pid != view.pid or not view.alive:
                    self._request_snapshot(worker)
            case _:
                log.error("unexpected message from worker %s: %s", worker, type(msg).__name__)

    def _request_snapshot(self, worker: str) -> None:
        try:
            self.sock.send_multipart_nowait([worker.encode(), *codec.calls.encode(SnapshotRequest())])
        except zmq.ZMQError as exc:
            log.debug("cannot ask %s for a snapshot: %s", worker, exc)

    async def _watch_heartbeats(self) -> None:
        while True:
            await trio.sleep(1.0)
            now = time.monotonic()
            for worker, view in list(self.catalogs.workers()):
                if view.alive and now - view.last_seen > HEARTBEAT_TIMEOUT:
                    log.warning("worker %s missed its heartbeats", worker)
                    self.fail_worker(worker, "it stopped answering")
