"""Where the door and the endpoints mark the stages of a request for tracing: a no-op until it is on.

`Spans.span(name, caller, attributes)` is a context manager around one stage: the MCP request
(opened by the endpoint, named `METHOD TARGET` as OpenTelemetry's MCP conventions do), the door's
decisions (gate, policy, approval wait) and the routing to a worker. `caller` carries the client's
trace context (`params._meta.traceparent`, else the HTTP `traceparent` header); a tracer makes the
request's span a child of it, and the worker's span a child of the routing span. Attribute
values are names and ids, never arguments, results or secrets.
"""

from __future__ import annotations

from typing import Any, Protocol

from mcpvisor.frontend.door.calls import Caller


class Span(Protocol):
    def set(self, key: str, value: Any) -> None:
        """One more attribute, known only once the stage has run (an outcome, a server)."""
        ...

    def error(self, kind: str) -> None:
        """The stage failed; `kind` names how (no message that could hold client data)."""
        ...


class Spans(Protocol):
    def span(self, name: str, caller: Caller | None, attributes: dict[str, Any]) -> Any:
        """A context manager yielding a `Span` for one stage."""
        ...


class _Unrecorded:
    """A stage nobody records: its own context manager, so tracing off costs a method call."""

    def __enter__(self) -> _Unrecorded:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, key: str, value: Any) -> None:
        pass

    def error(self, kind: str) -> None:
        pass


_UNRECORDED = _Unrecorded()


class NoSpans:
    """Tracing off."""

    def span(self, name: str, caller: Caller | None, attributes: dict[str, Any]) -> _Unrecorded:
        return _UNRECORDED
