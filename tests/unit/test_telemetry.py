"""Telemetry's configuration and naming, without processes: what the variables and the table turn on,
how spans are named and attributed, what goes into a request's `_meta`, what is counted as lost."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from urllib.parse import unquote

import msgspec
import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from mcpvisor.runtime import mcp_spans, telemetry, telemetry_export
from mcpvisor.wire import codec
from mcpvisor.wire.config import TelemetryConfig
from mcpvisor.wire.errors import ErrorCode, WireError
from mcpvisor.wire.messages import Request
from mcpvisor.wire.secrets import SecretError

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> Iterator[tuple[trace_api.Tracer, InMemorySpanExporter]]:
    """A tracer of its own that keeps what it ends in memory (the global provider is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test"), exporter
    provider.shutdown()


# -- what turns telemetry on ---------------------------------------------------------------------


def test_nothing_configured_is_off_and_an_endpoint_alone_means_otlp_for_traces_and_metrics() -> None:
    assert not telemetry.wanted({})
    assert not telemetry.wanted({"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert telemetry.wanted(endpoint)
    assert telemetry.exporter_names("traces", endpoint) == ["otlp"]
    assert telemetry.exporter_names("metrics", endpoint) == ["otlp"]
    # A signal's own endpoint turns on that signal alone.
    only_traces = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}
    assert telemetry.exporter_names("traces", only_traces) == ["otlp"]
    assert telemetry.exporter_names("metrics", only_traces) == []


def test_the_exporter_variables_win_and_none_or_the_sdk_switch_turn_it_off() -> None:
    assert telemetry.exporter_names("traces", {"OTEL_TRACES_EXPORTER": "console, otlp"}) == ["console", "otlp"]
    both = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}
    assert telemetry.exporter_names("traces", both) == []
    assert telemetry.wanted(both)  # metrics still go to the endpoint
    assert not telemetry.wanted({**both, "OTEL_METRICS_EXPORTER": "none"})
    assert not telemetry.wanted({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})


def test_the_table_stands_for_the_standard_variables() -> None:
    table = TelemetryConfig(
        endpoint="http://collector:4318",
        protocol="http/protobuf",
        headers={"Authorization": "Bearer ${env:OTLP_TOKEN}", "x-team": "a b,c"},
        sampler="parentbased_traceidratio",
        sampler_arg=0.25,
        service_name="gateway",
        resource_attributes={"deployment.environment": "prod=1"},
        record_arguments=True,
    )
    variables = telemetry.table_environment(table, {"OTLP_TOKEN": "t0ken"})
    assert variables["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"
    assert variables["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert variables["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert variables["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
    assert variables["OTEL_SERVICE_NAME"] == "gateway"
    assert variables[telemetry.RECORD_ARGUMENTS_VAR] == "true"
    # The W3C baggage-like format the SDK reads: values percent-encoded, so a comma stays a value's.
    headers = dict(pair.split("=", 1) for pair in variables["OTEL_EXPORTER_OTLP_HEADERS"].split(","))
    assert {name: unquote(value) for name, value in headers.items()} == {
        "Authorization": "Bearer t0ken",
        "x-team": "a b,c",
    }
    assert unquote(variables["OTEL_RESOURCE_ATTRIBUTES"].split("=", 1)[1]) == "prod=1"
    assert "OTEL_TRACES_EXPORTER" not in variables  # unset keys set nothing
    with pytest.raises(SecretError):
        telemetry.table_environment(table, {})


def test_the_environment_wins_over_the_table_and_a_missing_secret_leaves_the_table_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://from-env:4318"}
    telemetry.apply_table(TelemetryConfig(endpoint="http://from-table:4318", service_name="gw"), environ)
    assert environ == {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://from-env:4318", "OTEL_SERVICE_NAME": "gw"}
    unresolved = {}
    with caplog.at_level(logging.ERROR, "mcpvisor.telemetry"):
        telemetry.apply_table(
            TelemetryConfig(endpoint="http://c:4318", headers={"a": "${env:NOT_SET_HERE}"}), unresolved
        )
    assert unresolved == {}
    assert "NOT_SET_HERE" in caplog.text and "not used" in caplog.text


def test_otlp_means_the_exporter_of_the_configured_protocol_found_by_its_entry_point() -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

    assert telemetry_export.exporter_class("otlp", "traces", {}) is GrpcSpans
    assert (
        telemetry_export.exporter_class("otlp", "traces", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}) is HttpSpans
    )
    per_signal = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"}
    assert telemetry_export.exporter_class("otlp", "metrics", per_signal) is HttpMetrics
    assert telemetry_export.exporter_class("otlp_proto_http", "traces", {}) is HttpSpans
    with pytest.raises(RuntimeError, match="unsupported OTLP protocol 'http/json'"):
        telemetry_export.exporter_class("otlp", "traces", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(RuntimeError, match="no traces exporter named 'zipkin-ish'"):
        telemetry_export.exporter_class("zipkin-ish", "traces", {})


def test_the_resource_names_mcpvisor_the_role_and_the_pid_unless_the_service_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    found = dict(
        telemetry_export.resource("worker", {"mcpvisor.worker_id": "acme/time", "mcpvisor.tenant": ""}).attributes
    )
    assert found["service.name"] == "mcpvisor"
    assert found["mcpvisor.process.role"] == "worker"
    assert isinstance(found["process.pid"], int)
    assert found["mcpvisor.worker_id"] == "acme/time"
    assert "mcpvisor.tenant" not in found  # an empty one says nothing
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=gateway,deployment.environment=prod")
    named = dict(telemetry_export.resource("frontend", {}).attributes)
    assert (named["service.name"], named["deployment.environment"]) == ("gateway", "prod")


# -- names and attributes, by the MCP conventions ---------------------------------------------------


def test_calls_prompts_and_resources_are_named_by_method_and_target() -> None:
    assert mcp_spans.operation("tools/call", {"name": "get_weather", "arguments": {"city": "Paris"}}) == (
        "tools/call get_weather",
        {"mcp.method.name": "tools/call", "gen_ai.tool.name": "get_weather", "gen_ai.operation.name": "execute_tool"},
    )
    assert mcp_spans.operation("prompts/get", {"name": "greet"}) == (
        "prompts/get greet",
        {"mcp.method.name": "prompts/get", "gen_ai.prompt.name": "greet"},
    )
    # The URI is an attribute, never the name (too many of them); a password in it is not kept.
    name, attributes = mcp_spans.operation("resources/read", {"uri": "postgres://app:hunter22secret@db/x"})
    assert name == "resources/read"
    assert "hunter22secret" not in attributes["mcp.resource.uri"]
    assert mcp_spans.operation("ping", None) == ("ping", {"mcp.method.name": "ping"})
    # A client may send any name: the span's stays bounded.
    long_name, _ = mcp_spans.operation("tools/call", {"name": "x" * 10_000})
    assert len(long_name) == len("tools/call ") + mcp_spans.NAME_LIMIT


def test_a_failure_says_the_code_and_only_mcpvisors_own_words(
    spans: tuple[trace_api.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    upstream = tracer.start_span("upstream error")
    mcp_spans.set_failure(
        upstream, WireError(ErrorCode.UPSTREAM_ERROR, "bad path /home/ada/secret.txt", mcp_code=-32602)
    )
    upstream.end()
    timeout = tracer.start_span("timeout")
    mcp_spans.set_failure(timeout, WireError(ErrorCode.TIMEOUT, "no answer from server 'time' within 5s"))
    timeout.end()
    told = tracer.start_span("told")
    mcp_spans.set_failure(told, WireError(ErrorCode.UPSTREAM_ERROR, "token=abcdef0123456789xyz"), describe=True)
    told.end()
    first, second, third = exporter.get_finished_spans()
    assert first.status.status_code is StatusCode.ERROR and first.status.description is None
    assert dict(first.attributes or {}) == {"error.type": "-32602", "rpc.response.status_code": "-32602"}
    assert second.status.description == "no answer from server 'time' within 5s"
    assert dict(second.attributes or {}) == {"error.type": "timeout"}
    assert "abcdef0123456789xyz" not in (third.status.description or "")


def test_a_tool_error_is_found_in_a_result_without_reading_every_result() -> None:
    assert mcp_spans.tool_error("tools/call", b'{"content":[],"isError":true}')
    assert not mcp_spans.tool_error("tools/call", b'{"content":[{"type":"text","text":"\\"isError\\": true"}]}')
    assert not mcp_spans.tool_error("tools/call", b'{"content":[]}')
    assert not mcp_spans.tool_error("prompts/get", b'{"isError":true}')


# -- trace context in _meta -----------------------------------------------------------------------


def test_the_parent_comes_from_a_valid_carrier_only() -> None:
    context = mcp_spans.remote_parent({"traceparent": PARENT, "tracestate": "v=1", "progressToken": 3})
    assert context is not None
    parent = trace_api.get_current_span(context).get_span_context()
    assert (f"{parent.trace_id:032x}", f"{parent.span_id:016x}") == (PARENT[3:35], PARENT[36:52])
    assert mcp_spans.remote_parent({"traceparent": "00-not-a-trace-01"}) is None
    assert mcp_spans.remote_parent({"traceparent": 7}) is None
    assert mcp_spans.remote_parent({}) is None and mcp_spans.remote_parent(None) is None


def test_the_span_replaces_the_clients_context_in_meta_and_keeps_the_rest(
    spans: tuple[trace_api.Tracer, InMemorySpanExporter],
) -> None:
    tracer, _ = spans
    span = tracer.start_span("call", context=mcp_spans.remote_parent({"traceparent": PARENT}))
    params = {"name": "echo", "_meta": {"traceparent": PARENT, "tracestate": "stale=1", "progressToken": 9}}
    sent = mcp_spans.with_context(params, span)
    meta = sent["_meta"]
    assert meta["progressToken"] == 9 and "tracestate" not in meta
    ours = span.get_span_context()
    assert meta["traceparent"] == f"00-{ours.trace_id:032x}-{ours.span_id:016x}-01"
    assert params["_meta"]["traceparent"] == PARENT  # the client's own params are left as they were
    assert mcp_spans.with_context({"name": "x"}, span)["_meta"] == {"traceparent": meta["traceparent"]}


def test_recorded_arguments_are_redacted_as_the_activity_log_keeps_them() -> None:
    found = mcp_spans.arguments_attribute({"arguments": {"query": "weather", "api_key": "sk-live-0123456789abcdefXYZ"}})
    text = found["gen_ai.tool.call.arguments"]
    assert "weather" in text and "0123456789abcdefXYZ" not in text
    assert mcp_spans.arguments_attribute({"name": "x"}) == {}


# -- what never reaches the collector ---------------------------------------------------------------


class _Refusing:
    """An exporter whose collector cannot be reached."""

    def __init__(self) -> None:
        self.calls = 0

    def export(self, batch: object) -> SpanExportResult:
        self.calls += 1
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True


def test_an_unreachable_collector_is_one_line_and_a_count(
    caplog: pytest.LogCaptureFixture, spans: tuple[trace_api.Tracer, InMemorySpanExporter]
) -> None:
    tracer, _ = spans
    deliveries = telemetry_export.Deliveries("http://127.0.0.1:9")
    exporter = telemetry_export._CountingSpanExporter(_Refusing(), deliveries)  # type: ignore[arg-type]
    batch = [tracer.start_span(f"s{i}") for i in range(3)]
    with caplog.at_level(logging.INFO, "mcpvisor.telemetry"):
        for _ in range(5):
            exporter.export(batch)  # type: ignore[arg-type]
        exporter.inner = InMemorySpanExporter()
        exporter.export(batch)  # type: ignore[arg-type]
        exporter.export(batch)  # type: ignore[arg-type]
    assert deliveries.dropped == 15
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert "cannot be exported to http://127.0.0.1:9" in lines[0] and "again" in lines[1]


def test_a_full_queue_drops_spans_without_waiting_and_counts_every_one(
    spans: tuple[trace_api.Tracer, InMemorySpanExporter],
) -> None:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    tracer, _ = spans
    released = threading.Event()
    received: list[object] = []

    taken = threading.Event()

    class Stuck(InMemorySpanExporter):
        """A collector that takes the first batch and then hangs until released."""

        def export(self, batch: Sequence[ReadableSpan]) -> SpanExportResult:
            received.extend(batch)
            taken.set()
            released.wait(60)
            return SpanExportResult.SUCCESS

    deliveries = telemetry_export.Deliveries("the collector")
    processor = BatchSpanProcessor(Stuck(), max_queue_size=4, max_export_batch_size=4, schedule_delay_millis=10)
    telemetry_export._count_queue_drops(processor, deliveries)

    def end(count: int) -> None:
        for index in range(count):
            span = tracer.start_span(f"s{index}")
            span.end()
            processor.on_end(span)  # type: ignore[arg-type]

    end(4)
    assert taken.wait(20)  # the collector has the first four and hangs
    # Ending more spans never waits for it: this finishes while it is still stuck, the queue full.
    ender = threading.Thread(target=end, args=(6,))
    ender.start()
    ender.join(20)
    assert not ender.is_alive()
    assert deliveries.dropped == 2
    released.set()
    processor.shutdown()
    # And no span went missing without being counted.
    assert len(received) + deliveries.dropped == 10


def test_what_a_client_sent_never_makes_a_warning_and_never_breaks_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    handler = telemetry_export._SdkLogs(telemetry_export.Deliveries("memory"))

    def emit(logger: str, message: str) -> None:
        handler.emit(logging.LogRecord(logger, logging.WARNING, __file__, 1, message, None, None))

    with caplog.at_level(logging.DEBUG, "mcpvisor.telemetry"):
        # A propagator quoting a client's malformed tracestate (a forged log line in it).
        emit("opentelemetry.trace.span", "Member doesn't match the w3c identifiers format bad\r\nX-Forged: 1")
        emit("opentelemetry.baggage.propagation", "Baggage header `k=" + "v" * 10_000 + "` exceeded the maximum")
        # A configuration mistake is said, once.
        emit("opentelemetry.sdk.resources", "Invalid key value resource attribute pair oops")
        emit("opentelemetry.sdk.resources", "Invalid key value resource attribute pair oops")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["telemetry: Invalid key value resource attribute pair oops"]
    assert all("\n" not in r.getMessage() and len(r.getMessage()) < 400 for r in caplog.records)
    assert any("X-Forged" in r.getMessage() and "\\x0d\\x0a" in r.getMessage() for r in caplog.records)


# -- on the wire ------------------------------------------------------------------------------------


class _RequestBefore(msgspec.Struct, tag_field="t", tag="req", frozen=True, kw_only=True, omit_defaults=True):
    """A call message as a frontend or worker without telemetry knew it."""

    id: int
    method: str
    timeout: float
    activity_id: str = ""


def test_the_call_messages_trace_context_keeps_older_and_newer_processes_talking() -> None:
    context = {"traceparent": PARENT, "tracestate": "v=1"}
    traced = codec.calls.encode(Request(id=3, method="tools/call", timeout=5.0, trace_context=context))
    decoded, _ = codec.calls.decode(traced)
    assert isinstance(decoded, Request) and decoded.trace_context == context
    # An older worker reads the newer message, the context aside.
    older = msgspec.msgpack.decode(traced[0], type=_RequestBefore)
    assert (older.id, older.method) == (3, "tools/call")
    # A newer worker reads an older frontend's message: no context, a span of its own.
    from_older, _ = codec.calls.decode([msgspec.msgpack.encode(_RequestBefore(id=4, method="ping", timeout=1.0))])
    assert isinstance(from_older, Request) and from_older.trace_context == {}
    # Off, nothing is added to the message at all.
    assert codec.calls.encode(Request(id=5, method="ping", timeout=1.0))[0] == msgspec.msgpack.encode(
        _RequestBefore(id=5, method="ping", timeout=1.0)
    )
