"""Spans of a worker's life with its upstream: each connection attempt (a reconnect says so), its
initialize, and every discovery.

A connection attempt is the root of its own trace: `connect {server}`, with the `initialize` request
and the first `discover {server}` below it; a rediscovery (on `list_changed`, or polling) is a
`discover {server}` trace of its own. While one of these is current, the MCP SDK puts it in the
`_meta` of what it sends, so an upstream that traces files its own spans beneath it. With
telemetry off, `connecting` hands back an object that does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode

from mcpvisor.runtime import telemetry
from mcpvisor.wire.redaction import redact_secrets

if TYPE_CHECKING:
    from mcpvisor.workers.upstream import Upstream

REASON_LIMIT = 200


def attributes(upstream: Upstream) -> dict[str, Any]:
    """What every span about this upstream says of it: mcpvisor's names and the conventions' transport."""
    found: dict[str, Any] = {"mcpvisor.server": upstream.server_label, "mcpvisor.worker_id": upstream.name}
    if upstream.tenant:
        found["mcpvisor.tenant"] = upstream.tenant
    if upstream.protocol_version:
        found["mcp.protocol.version"] = upstream.protocol_version
    server = upstream.server
    if server.kind == "stdio":
        found["network.transport"] = "pipe"
        return found
    found["network.transport"] = "tcp"
    found["network.protocol.name"] = "http"
    url = urlsplit(server.url or "")
    if url.hostname:
        found["server.address"] = url.hostname  # never the userinfo, path or query
        try:
            port = url.port
        except ValueError:
            port = None
        found["server.port"] = port or (443 if url.scheme == "https" else 80)
    return found


def _reason(text: str) -> str:
    return redact_secrets(text)[:REASON_LIMIT]


class Attempt:
    """One connection attempt's span; `current` puts it (or a child of it) in force for the SDK's requests."""

    def __init__(self, tel: telemetry.Telemetry, upstream: Upstream, attempt: int, lost: str) -> None:
        self.tracer = tel.tracer
        self.upstream = upstream
        found = attributes(upstream)
        found["mcpvisor.upstream.attempt"] = attempt
        found["mcpvisor.upstream.reconnect"] = upstream.ever_ready
        if lost:
            found["mcpvisor.upstream.lost_reason"] = _reason(lost)
        self.span: Span = self.tracer.start_span(f"connect {upstream.server_label}", attributes=found)

    @contextmanager
    def initializing(self) -> Iterator[None]:
        """The initialize request, as a CLIENT span below the attempt."""
        context = trace_api.set_span_in_context(self.span)
        span = self.tracer.start_span(
            "initialize", context=context, kind=SpanKind.CLIENT, attributes={"mcp.method.name": "initialize"}
        )
        with trace_api.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            try:
                yield
            except BaseException as exc:  # a timeout cancels it; a closed transport raises
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(StatusCode.ERROR)
                raise
            finally:
                span.end()

    def discovering(self) -> Any:
        """The first discovery, below the attempt."""
        return discovery(self.upstream, parent=self.span)

    def ready(self) -> None:
        self.span.set_attributes(attributes(self.upstream))
        self.span.end()

    def failed(self, reason: str) -> None:
        if self.span.is_recording():
            self.span.set_attribute("error.type", "connect_failed")
            self.span.set_status(StatusCode.ERROR, _reason(reason))
        self.span.end()


class _NoAttempt:
    """What `connecting` hands back with telemetry off."""

    def initializing(self) -> Any:
        return nullcontext()

    def discovering(self) -> Any:
        return nullcontext()

    def ready(self) -> None:
        pass

    def failed(self, reason: str) -> None:
        pass


NO_ATTEMPT = _NoAttempt()


def connecting(upstream: Upstream, attempt: int, lost: str) -> Attempt | _NoAttempt:
    """Start the span of a connection attempt; `lost` says why the previous connection ended."""
    tel = telemetry.active
    return NO_ATTEMPT if tel is None else Attempt(tel, upstream, attempt, lost)


@contextmanager
def discovery(upstream: Upstream, parent: Span | None = None) -> Iterator[None]:
    """A discovery's span, current while it runs: below `parent`, else a trace of its own."""
    tel = telemetry.active
    if tel is None:
        yield
        return
    context = trace_api.set_span_in_context(parent) if parent is not None else Context()
    found = attributes(upstream)
    found["mcpvisor.discovery.first"] = parent is not None
    span = tel.tracer.start_span(f"discover {upstream.server_label}", context=context, attributes=found)
    with trace_api.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
        try:
            yield
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(StatusCode.ERROR)
            raise
        finally:
            span.set_attribute("mcpvisor.discovery.tools", upstream.tool_count)
            span.end()
