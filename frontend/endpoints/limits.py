"""Each tenant's limits: calls in flight and calls per minute, refused at once with HTTP 429.

Counted at the gateway, from the JSON-RPC method the boundary already read: a call over the limit
never reaches a stack, let alone a worker. A call is a tools/call, resources/read or prompts/get
(a code_execution run counts once, however many tools it calls).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from mcpvisor.frontend.endpoints.boundary import BODY_KEY
from mcpvisor.frontend.endpoints.http_server import Send
from mcpvisor.wire.config import TenantConfig

CALL_METHODS: Final = frozenset({"tools/call", "resources/read", "prompts/get"})
OVER_LIMIT: Final = -32000  # JSON-RPC server error; the message names the limit
_COUNTED: Final = "mcpvisor.counted"


class _Envelope(msgspec.Struct):
    method: str = ""
    id: int | str | None = None


_decode = msgspec.json.Decoder(_Envelope)


@dataclass
class Refusal:
    """A call refused for a limit: HTTP 429 with a JSON-RPC error naming it."""

    request_id: int | str | None
    message: str
    retry_after: int

    async def send(self, send: Send) -> None:
        body = msgspec.json.encode(
            {"jsonrpc": "2.0", "id": self.request_id, "error": {"code": OVER_LIMIT, "message": self.message}}
        )
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(self.retry_after).encode()),
        ]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _Bucket:
    """A token bucket of `rate` calls a minute, full at the start."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.tokens = float(rate)
        self.at = time.monotonic()

    def take(self) -> float:
        """0 when a call may go now, else the seconds until one may."""
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate / 60.0)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) * 60.0 / self.rate


class TenantLimits:
    def __init__(self, tenants: Mapping[str, TenantConfig]) -> None:
        self.tenants = tenants
        self._in_flight: dict[str, int] = {}
        self._buckets: dict[str, _Bucket] = {}

    def admit(self, tenant: str, scope: dict[str, Any]) -> Refusal | None:
        """Count the request if it is a call of a tenant with limits; a Refusal when over one."""
        table = self.tenants.get(tenant)
        body = scope.get(BODY_KEY)
        if table is None or body is None:
            return None
        try:
            envelope = _decode.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None  # a batch or an odd envelope: the endpoint answers it
        if envelope.method not in CALL_METHODS:
            return None
        running = self._in_flight.get(tenant, 0)
        if running >= table.max_in_flight:
            return Refusal(
                envelope.id,
                f"Tenant '{tenant}' is over its limit of {table.max_in_flight} calls in flight "
                "(max_in_flight); retry when one has finished",
                1,
            )
        if table.calls_per_minute is not None:
            bucket = self._buckets.get(tenant)
            if bucket is None or bucket.rate != table.calls_per_minute:
                bucket = self._buckets[tenant] = _Bucket(table.calls_per_minute)
            wait = bucket.take()
            if wait:
                return Refusal(
                    envelope.id,
                    f"Tenant '{tenant}' is over its limit of {table.calls_per_minute} calls per minute "
                    f"(calls_per_minute); retry in {wait:.1f}s",
                    max(1, int(wait + 0.999)),
                )
        self._in_flight[tenant] = running + 1
        scope[_COUNTED] = True
        return None

    def done(self, tenant: str, scope: dict[str, Any]) -> None:
        if scope.get(_COUNTED):
            self._in_flight[tenant] -= 1
