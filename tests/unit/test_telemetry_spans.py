"""The frontend's and the supervisor's spans, without processes: which span a request, the door and a
process's life make, and their parents, kept by an in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from mcpvisor.frontend import spans
from mcpvisor.frontend.endpoints import handlers
from mcpvisor.frontend.endpoints.engine import Call, Headers
from mcpvisor.frontend.endpoints.rpc import RpcError
from mcpvisor.frontend.endpoints.sessions import Session
from mcpvisor.runtime import telemetry, telemetry_export
from mcpvisor.wire.states import ProcessState
from tests.unit.test_policy import Scenario, ScriptedSpawner, run_program

TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT = "b7ad6b7169203331"
PARENT = f"00-{TRACE}-{CLIENT}-01"


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Telemetry on, its spans kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = telemetry.Telemetry("test", provider, None, telemetry_export.Deliveries("memory"), {})
    monkeypatch.setattr(telemetry, "active", tel)
    yield exporter
    provider.shutdown()


def ids(span: ReadableSpan) -> tuple[str, str]:
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


def parent_of(span: ReadableSpan) -> str:
    return f"{span.parent.span_id:016x}" if span.parent is not None else ""


def request_ctx(method: str, params: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    """A request as the engine's handlers see it, as much of it as the spans read."""
    headers = headers or {}
    session = headers.get("mcp-session-id")
    call = Call(
        id=7,
        method=method,
        params={key: msgspec.Raw(msgspec.json.encode(value)) for key, value in params.items()},
        meta=params.get("_meta") or {},
        version="2025-11-25",
        capabilities={},
        client_info={},
        headers=Headers([(name.encode(), value.encode()) for name, value in headers.items()]),
        session=Session(session, "", initialized=True) if session else None,
    )
    return SimpleNamespace(call=call, params=params)


async def serve(ctx: Any, handler: Any) -> bytes:
    """Serve the request as the engine does (`handlers.served`), `handler` its endpoint's handler."""

    async def handle(context: handlers.Context) -> Any:
        return await handler(ctx)

    identity = handlers.Identity(lambda: {"name": "test", "version": "0"}, lambda version: {})
    table = handlers.Table("/mcp", {ctx.call.method: handle}, identity)
    return await handlers.served(handlers.Context(ctx.call, table, None, carried={}))  # type: ignore[arg-type]


# -- a request a short path answers: the door makes its span ---------------------------------------


def test_a_short_paths_call_is_the_doors_server_span_below_the_clients(exported: InMemorySpanExporter) -> None:
    params = {"name": "echo", "arguments": {"text": "x"}, "_meta": {"traceparent": PARENT}}
    with spans.door("", "tools/call", "echo", "echo:echo", params, None, via="direct", worker="echo") as door:
        assert door is not None
        sent = spans.wire_context()
    (span,) = exported.get_finished_spans()
    assert (span.name, span.kind) == ("tools/call echo:echo", SpanKind.SERVER)
    assert ids(span)[0] == TRACE and parent_of(span) == CLIENT
    # What the router sends the worker names this span as the parent.
    assert sent["traceparent"] == f"00-{TRACE}-{ids(span)[1]}-01"
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.tool.name"] == "echo:echo"
    assert (attributes["mcpvisor.server"], attributes["mcpvisor.via"]) == ("echo", "direct")
    assert spans.wire_context() == {}  # nothing current once the call is over


async def test_the_http_header_is_the_parent_when_meta_names_none(exported: InMemorySpanExporter) -> None:
    headers = [(b"traceparent", PARENT.encode()), (b"mcp-protocol-version", b"2025-06-18")]
    spans.note_http({"headers": headers})
    with spans.door("", "tools/call", "echo", "echo:echo", {"name": "echo"}, None, via="direct", worker="echo"):
        pass
    (span,) = exported.get_finished_spans()
    assert parent_of(span) == CLIENT
    assert (span.attributes or {})["mcp.protocol.version"] == "2025-06-18"


def test_without_a_client_trace_the_request_starts_one(exported: InMemorySpanExporter) -> None:
    with spans.door("", "tools/call", "echo", "echo:echo", {"name": "echo"}, None, via="direct", worker="echo"):
        pass
    (span,) = exported.get_finished_spans()
    assert span.parent is None


def test_a_refusal_says_why_and_a_door_inside_the_door_adds_no_span(exported: InMemorySpanExporter) -> None:
    with spans.door(
        "acme", "tools/call", "held", "held:echo", {"name": "echo"}, None, via="direct", worker="acme/held"
    ) as door:
        with spans.door("acme", "tools/call", "held", "held:echo", {}, None, via="", worker="acme/held") as inner:
            assert inner is None
        assert door is not None
        door.refused("quarantine")
    (span,) = exported.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert [(event.name, dict(event.attributes or {})) for event in span.events] == [
        ("gate", {"mcpvisor.gate.decision": "refused", "mcpvisor.gate.reason": "quarantine"})
    ]
    assert (span.attributes or {})["mcpvisor.tenant"] == "acme"


# -- a request the engine serves: it makes the request's span ---------------------------------------


async def test_a_direct_call_is_the_requests_own_span_and_a_built_in_tools_call_its_child(
    exported: InMemorySpanExporter,
) -> None:
    async def direct(ctx: Any) -> Any:
        with spans.door("", "tools/call", "echo", "echo:echo", ctx.params, None, via="direct", worker="echo"):
            await trio.lowlevel.checkpoint()
        return {"content": []}

    ctx = request_ctx("tools/call", {"name": "echo:echo", "_meta": {"traceparent": PARENT}}, {"mcp-session-id": "s1"})
    await serve(ctx, direct)
    (served,) = exported.get_finished_spans()
    attributes = dict(served.attributes or {})
    assert (served.name, served.kind, parent_of(served)) == ("tools/call echo:echo", SpanKind.SERVER, CLIENT)
    assert attributes["mcpvisor.via"] == "direct"  # the door's part is told on the request's span
    assert (attributes["mcp.session.id"], attributes["jsonrpc.request.id"]) == ("s1", "7")
    assert attributes["mcp.protocol.version"] == "2025-11-25"
    exported.clear()

    async def built_in(ctx: Any) -> Any:
        for tool in ("a", "b"):
            params = {"name": tool, "arguments": {}}
            with spans.door(
                "", "tools/call", "echo", f"echo:{tool}", params, None, via="code_execution", worker="echo"
            ):
                await trio.lowlevel.checkpoint()
        return {"content": [], "isError": True}

    await serve(request_ctx("tools/call", {"name": "code_execution"}), built_in)
    first, second, served = exported.get_finished_spans()
    assert served.name == "tools/call code_execution" and served.parent is None
    assert [(s.name, s.kind, parent_of(s)) for s in (first, second)] == [
        ("tools/call echo:a", SpanKind.INTERNAL, ids(served)[1]),
        ("tools/call echo:b", SpanKind.INTERNAL, ids(served)[1]),
    ]
    assert (served.attributes or {})["error.type"] == "tool_error"


async def test_an_error_answer_gives_its_code_and_not_its_message(exported: InMemorySpanExporter) -> None:
    async def failing(ctx: Any) -> Any:
        await trio.lowlevel.checkpoint()
        raise RpcError(-32602, "Tool 'echo:echo': invalid value 'secret-argument'")

    with pytest.raises(RpcError):
        await serve(request_ctx("tools/call", {"name": "echo:echo"}), failing)
    (span,) = exported.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and span.status.description is None
    assert (span.attributes or {})["error.type"] == "-32602"


# -- the supervisor: starts, exits, restarts, stops --------------------------------------------------


async def test_a_process_life_is_a_start_an_exit_a_restart_and_a_stop(
    exported: InMemorySpanExporter, autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    spawner = ScriptedSpawner([(30, 1), (1000, 0)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        while len(spawner.starts()) < 2 or s.program.state is not ProcessState.RUNNING:
            await trio.sleep(1)
        s.program.stop()
        await s.program.wait_stopped()

    await run_program(tmp_path, spawner, drive, startsecs=1)
    found = [
        (span.name, span.status.status_code.name, (span.attributes or {}).get("error.type"))
        for span in exported.get_finished_spans()
    ]
    assert found == [
        ("start p", "UNSET", None),
        ("exit p", "ERROR", "exited"),
        ("restart p", "UNSET", None),
        ("stop p", "UNSET", None),
    ]
    assert all(span.parent is None for span in exported.get_finished_spans())  # each a trace of its own


async def test_a_process_that_cannot_start_ends_its_start_in_backoff_then_fatal(
    exported: InMemorySpanExporter, autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    spawner = ScriptedSpawner([(0.5, 1)])

    async def drive(s: Scenario) -> None:
        s.program.start()
        await s.program.wait_settled(timeout=1000)

    await run_program(tmp_path, spawner, drive, startsecs=1, startretries=1)
    found = [(span.name, (span.attributes or {}).get("error.type")) for span in exported.get_finished_spans()]
    assert found == [("start p", "backoff"), ("restart p", "fatal")]


async def test_the_doors_reason_outlasts_the_error_answer_it_becomes(exported: InMemorySpanExporter) -> None:
    gone = "server 'echo' stopped while the call was running (worker EXITED)"

    async def killed(ctx: Any) -> Any:
        with spans.door("", "tools/call", "echo", "echo:echo", ctx.params, None, via="direct", worker="echo") as door:
            assert door is not None
            door.failed(-32000, gone, "upstream_gone", own=True)
        await trio.lowlevel.checkpoint()
        raise RpcError(-32000, f"Tool 'echo:echo': {gone}")

    with pytest.raises(RpcError):
        await serve(request_ctx("tools/call", {"name": "echo:echo"}), killed)
    (span,) = exported.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert (attributes["error.type"], attributes["rpc.response.status_code"]) == ("upstream_gone", "-32000")
    assert span.status.description == gone
