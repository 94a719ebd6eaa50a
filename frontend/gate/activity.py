"""The activity log: one row per tools/call, resources/read and prompts/get that reached the door.

A row says which request (the id also given to the client in the result's `_meta` and to the
worker), when, who asked (client name; tenant once tenants exist), on which endpoint, what was
called, the declared intent, how long it took, how it ended and how many bytes came back.
Arguments and results may hold secrets: they are kept only when the operator asks, and redacted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec
import trio

from mcpvisor.frontend.gate.store_writer import StoreWriter
from mcpvisor.store import audit_chain
from mcpvisor.store.state_db import STORE_ERRORS
from mcpvisor.wire.redaction import redacted_json

log = logging.getLogger(__name__)

Outcome = Literal["ok", "error", "blocked"]
# "approval": an operator's verdict on a waiting call (tool: the call's tool, variant: allow, deny or
# timeout, request_id: the waiting call's id). "operator": a command that changed something (tool:
# the command, server: its target, client: "ctl" or "frontend").
Kind = Literal["tool", "resource", "prompt", "account", "approval", "operator"]

META_KEY: Final = "io.mcpvisor/requestId"
PRUNE_EVERY: Final = 60.0  # seconds between retention passes
STORED_TEXT_LIMIT: Final = 16_384  # characters of arguments or result kept per row when recording is on
TRACESTATE_LIMIT: Final = 512  # the W3C limit of what a vendor must propagate
_TRACEPARENT: Final = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")

COLUMNS: Final = (
    "id, request_id, time, client, tenant, endpoint, kind, server, tool, variant, intent, outcome, "
    "duration_ms, result_bytes, arguments, result"
)


@dataclass(frozen=True, slots=True)
class CallRecord:
    time: float
    server: str
    tool: str
    variant: str
    intent: dict[str, Any] | None
    outcome: Outcome
    duration_ms: float
    request_id: str = ""
    client: str = ""
    endpoint: str = ""
    kind: Kind = "tool"
    result_bytes: int = 0


def new_request_id() -> str:
    """A random 128-bit id as 32 hex digits (a uuid4's randomness, without building a UUID)."""
    return os.urandom(16).hex()


_decode_object = msgspec.json.Decoder(dict[str, Any])


def with_request_id(result: bytes, request_id: str) -> bytes:
    """The result object with `_meta[META_KEY]` set; anything that is not an object is left as it is."""
    stripped = result.lstrip()
    if not stripped.startswith(b"{"):
        return result
    if b'"_meta"' not in result:
        # The common case, spliced without decoding: a large result costs a copy, not a parse.
        rest = stripped[1:].lstrip()
        entry = b'{"_meta":{"' + META_KEY.encode() + b'":' + msgspec.json.encode(request_id) + b"}"
        return entry + (b"}" if rest.startswith(b"}") else b"," + rest)
    try:
        document = _decode_object.decode(result)
    except msgspec.DecodeError:
        return result
    meta = document.get("_meta")
    document["_meta"] = {**meta, META_KEY: request_id} if isinstance(meta, dict) else {META_KEY: request_id}
    return msgspec.json.encode(document)


def endpoint_of(via: str, server: str) -> str:
    """The HTTP path a call came by, from its path when its request did not say (a built-in's calls)."""
    if via == "direct":
        return "/mcp/direct"
    if via == "server-endpoint":
        return f"/mcp/servers/{server}"
    return "/mcp" if via.startswith("call_tool") or via in ("code_execution", "proxy") else ""


def trace_context(meta: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[str, str]:
    """A request's W3C `traceparent` and `tracestate`: from its `_meta`, else its HTTP headers."""
    found = {key: value for key in ("traceparent", "tracestate") if isinstance(value := meta.get(key), str)}
    if "traceparent" not in found:
        found = {key: value for key in ("traceparent", "tracestate") if isinstance(value := headers.get(key), str)}
    parent = found.get("traceparent", "")
    if not _TRACEPARENT.fullmatch(parent):
        return "", ""
    return parent, found.get("tracestate", "")[:TRACESTATE_LIMIT]


def stored_text(value: Any) -> str | None:
    """Arguments or a result as redacted JSON text (arguments may still be raw JSON bytes here)."""
    return redacted_json(value, STORED_TEXT_LIMIT)


class ActivityLog:
    """Appends calls to the `calls` table of the state store, and keeps it within its retention."""

    def __init__(
        self,
        db: Any,
        *,
        record_arguments: bool = False,
        retention_days: float = 30.0,
        max_rows: int = 100_000,
        writer: StoreWriter | None = None,
    ) -> None:
        self._db = db
        self._writer = writer or StoreWriter(db)
        # Why the last row could not be written (None: it was): with `audit_required`, the gate
        # refuses calls while it is set, and the row of each refused call tries again.
        self.failing: str | None = None
        self.record_arguments = record_arguments
        self.retention_days = retention_days
        self.max_rows = max_rows
        # Rows waiting for the shared store's writer thread, appended to the chain together.
        self._queued: list[tuple[Any, ...]] = []
        self._queued_lock = threading.Lock()
        self._flush_pending = False

    def record_account(self, worker: str, event: Mapping[str, Any]) -> None:
        """A worker's upstream account was connected (`login`) or disconnected (`logout`): never a token."""
        what, by = event.get("event"), event.get("by")
        if what not in ("login", "logout") or by not in ("tenant", "operator"):
            return
        tenant, _, server = worker.rpartition("/")
        self.record(
            server=server,
            tool=what,
            variant=by,
            intent=None,
            outcome="ok",
            duration=0.0,
            request_id=new_request_id(),
            kind="account",
            tenant=tenant,
        )

    def record_operator(self, command: str, target: str, by: str) -> None:
        """An operator's command changed what runs or what clients may use (never its arguments' values)."""
        self.record(
            server=target,
            tool=command,
            variant=by,
            intent=None,
            outcome="ok",
            duration=0.0,
            request_id=new_request_id(),
            client=by,
            kind="operator",
        )

    def record(
        self,
        *,
        server: str,
        tool: str,
        variant: str,
        intent: Mapping[str, Any] | None,
        outcome: Outcome,
        duration: float,
        request_id: str = "",
        client: str = "",
        endpoint: str = "",
        kind: Kind = "tool",
        result_bytes: int = 0,
        arguments: Any = None,
        result: bytes | None = None,
        trace: tuple[str, str] = ("", ""),
        tenant: str = "",
        decision: str = "",
        policies: Sequence[str] = (),
    ) -> None:
        """Log one call (`duration` in seconds); a failing disk is logged, never fails the call.

        `decision` is what the policies decided ("allow", "deny", "approval"; "would deny" and "would
        wait for approval" in dry-run), `policies` the ids of those that decided it (kept as a JSON list).
        """
        keep = self.record_arguments
        row = (
            request_id,
            time.time(),
            client,
            tenant,
            endpoint,
            kind,
            server,
            tool,
            variant,
            None if intent is None else json.dumps(dict(intent), ensure_ascii=False),
            outcome,
            round(duration * 1000, 3),
            result_bytes,
            stored_text(arguments) if keep and arguments is not None else None,
            stored_text(result) if keep and result is not None else None,
            *trace,
            decision,
            json.dumps(list(policies), ensure_ascii=False) if policies else "",
        )
        with self._queued_lock:
            self._queued.append(row)
            if self._flush_pending:
                return  # the flush already queued takes this row too
            self._flush_pending = True
        try:
            self._writer.submit(self._flush, f"a call to {server}:{tool}", self._written)
        except STORE_ERRORS as exc:
            log.error("activity log: cannot record a call to %s:%s: %s", server, tool, exc)
            self._written(exc)
        else:
            if not self._writer.deferred:
                self._written(None)

    def _written(self, failure: BaseException | None) -> None:
        self.failing = None if failure is None else (str(failure) or type(failure).__name__)

    def _flush(self) -> None:
        """Append the queued rows to the chain (now on SQLite; in the writer's thread on the shared store)."""
        with self._queued_lock:
            rows, self._queued = self._queued, []
            self._flush_pending = False
        audit_chain.append(self._db, rows)

    def recent(self, limit: int = 100) -> list[CallRecord]:
        """The last `limit` calls, newest first."""
        rows = self._db.execute(
            "SELECT time, server, tool, variant, intent, outcome, duration_ms, request_id, client, endpoint, kind,"
            " result_bytes FROM calls ORDER BY id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [
            CallRecord(
                row[0],
                row[1],
                row[2],
                row[3],
                None if row[4] is None else json.loads(row[4]),
                *row[5:],
            )
            for row in rows
        ]

    def prune(self, now: float | None = None) -> int:
        """Drop rows older than the retention and the oldest beyond `max_rows`; how many went."""
        cutoff = (time.time() if now is None else now) - self.retention_days * 86400
        try:
            # The oldest rows only, the last one's hash kept: the chain still verifies.
            return audit_chain.prune(self._db, cutoff, self.max_rows)
        except STORE_ERRORS as exc:
            log.error("activity log: cannot prune: %s", exc)
            return 0

    async def serve_pruning(self, interval: float = PRUNE_EVERY) -> None:
        """Keep the log within its retention, now and every `interval` seconds."""
        while True:
            # The shared store is across the network: its prune runs in a thread (every replica
            # prunes; the rows are one set, so the others find little left to do).
            dropped = await trio.to_thread.run_sync(self.prune) if self._writer.deferred else self.prune()
            if dropped:
                log.info("activity log: pruned %d rows past retention", dropped)
            await trio.sleep(interval)
