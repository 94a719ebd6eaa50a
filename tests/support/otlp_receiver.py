"""A real OTLP receiver on loopback, for tests: HTTP/protobuf and gRPC, decoded with the official
`opentelemetry-proto` messages, kept in memory and printed as trees.

No OpenTelemetry Collector binary installs from the package registries this project uses, so the
tests receive what mcpvisor exports with the same protobuf messages a collector decodes.

    python -m tests.support.otlp_receiver [--http PORT] [--grpc PORT]

runs one in the foreground and prints each trace's tree once it has been quiet for a second.
"""

from __future__ import annotations

import argparse
import gzip
import signal
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import trio
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

KINDS = {value: name.removeprefix("SPAN_KIND_") for name, value in ProtoSpan.SpanKind.items()}
STATUS = {value: name.removeprefix("STATUS_CODE_") for name, value in Status.StatusCode.items()}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if which == "bytes_value":
        return bytes(value.bytes_value)
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass(frozen=True)
class Received:
    """One span as the collector got it, with its process's resource and its instrumentation scope."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: str
    attributes: dict[str, Any]
    status: str
    status_message: str
    resource: dict[str, Any]
    scope: str
    start_ns: int
    end_ns: int
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    via: str = ""  # "http" or "grpc"

    @property
    def service(self) -> str:
        return str(self.resource.get("service.name", ""))

    @property
    def role(self) -> str:
        return str(self.resource.get("mcpvisor.process.role", ""))

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    def text(self) -> str:
        """Everything the span says, as one string: what a test searches for a value that must not be there."""
        return repr((self.name, self.attributes, self.status_message, self.events, self.resource))


@dataclass(frozen=True)
class Point:
    """One data point of a metric: its name, its process's resource, attributes, and count (histograms)."""

    name: str
    resource: dict[str, Any]
    attributes: dict[str, Any]
    count: int
    unit: str


class Receiver:
    """What has been received, in arrival order; safe to read while the servers' threads add to it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[Received] = []
        self._points: list[Point] = []
        self.requests = 0
        # Of every export request, with "via" (http or grpc) among them; names lowercased.
        self.headers: list[dict[str, str]] = []
        self.http_port = 0
        self.grpc_port = 0

    # -- taking in ----------------------------------------------------------------------------------

    def take_headers(self, headers: dict[str, str], via: str) -> None:
        with self._lock:
            self.headers.append({**headers, "via": via})

    def take_traces(self, request: trace_service_pb2.ExportTraceServiceRequest, via: str) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        Received(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            attributes=_attributes(span.attributes),
                            status=STATUS.get(span.status.code, str(span.status.code)),
                            status_message=span.status.message,
                            resource=resource,
                            scope=scope_spans.scope.name,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            events=[(event.name, _attributes(event.attributes)) for event in span.events],
                            via=via,
                        )
                    )
        with self._lock:
            self._spans.extend(spans)
            self.requests += 1

    def take_metrics(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        points = []
        for resource_metrics in request.resource_metrics:
            resource = _attributes(resource_metrics.resource.attributes)
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    data = getattr(metric, metric.WhichOneof("data") or "gauge")
                    for point in data.data_points:
                        count = int(getattr(point, "count", 0))
                        points.append(Point(metric.name, resource, _attributes(point.attributes), count, metric.unit))
        with self._lock:
            self._points.extend(points)
            self.requests += 1

    # -- reading ------------------------------------------------------------------------------------

    def spans(self, predicate: Callable[[Received], bool] | None = None) -> list[Received]:
        with self._lock:
            found = list(self._spans)
        return [span for span in found if predicate is None or predicate(span)]

    def points(self, name: str = "") -> list[Point]:
        with self._lock:
            found = list(self._points)
        return [point for point in found if not name or point.name == name]

    def trace(self, trace_id: str) -> list[Received]:
        return self.spans(lambda span: span.trace_id == trace_id)

    async def wait_for(
        self, predicate: Callable[[Receiver], Any], *, timeout: float = 20.0, what: str = "spans"
    ) -> Any:
        """Poll until `predicate(self)` is truthy and return it; fail with what has arrived, after `timeout`."""
        deadline = trio.current_time() + timeout
        while True:
            found = predicate(self)
            if found:
                return found
            if trio.current_time() > deadline:
                names = sorted({f"{span.role}:{span.name}" for span in self.spans()})
                raise TimeoutError(f"no {what} after {timeout}s; received: {names}")
            await trio.sleep(0.1)

    async def wait_for_span(self, predicate: Callable[[Received], bool], **kwargs: Any) -> Received:
        spans = await self.wait_for(lambda receiver: receiver.spans(predicate), **kwargs)
        return spans[0]

    def tree(self, trace_id: str) -> str:
        """The trace as an indented tree: kind, name, the process that made it, duration, status."""
        spans = sorted(self.trace(trace_id), key=lambda span: span.start_ns)
        known = {span.span_id for span in spans}
        children: dict[str, list[Received]] = {}
        for span in spans:
            parent = span.parent_id if span.parent_id in known else ""
            children.setdefault(parent, []).append(span)
        lines = [f"trace {trace_id}"]

        def walk(parent: str, depth: int) -> None:
            for span in children.get(parent, []):
                who = span.role or span.service
                status = "" if span.status == "UNSET" else f"  {span.status}"
                error = f" ({span.attributes['error.type']})" if "error.type" in span.attributes else ""
                outside = "  [parent not received]" if depth == 1 and span.parent_id else ""
                lines.append(
                    f"{'  ' * depth}{span.name}  {span.kind.lower()}, {who}, {span.duration_ms:.1f} ms"
                    f"{status}{error}{outside}"
                )
                walk(span.span_id, depth + 1)

        walk("", 1)
        return "\n".join(lines)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()
            self._points.clear()


def _body(handler: BaseHTTPRequestHandler) -> bytes:
    length = int(handler.headers.get("Content-Length") or 0)
    data = handler.rfile.read(length)
    encoding = (handler.headers.get("Content-Encoding") or "").lower()
    if encoding == "gzip":
        return gzip.decompress(data)
    if encoding == "deflate":
        return zlib.decompress(data)
    return data


def _http_handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            receiver.take_headers({name.lower(): value for name, value in self.headers.items()}, "http")
            try:
                body = _body(self)
                if self.path == "/v1/traces":
                    request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    receiver.take_traces(request, "http")
                    answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    receiver.take_metrics(metrics_service_pb2.ExportMetricsServiceRequest.FromString(body))
                    answer = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_error(404)
                    return
            except (DecodeError, OSError, zlib.error):
                self.send_error(400)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a test's output is not the place for an access log

    return Handler


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        self.receiver.take_headers({key.lower(): str(value) for key, value in context.invocation_metadata()}, "grpc")
        self.receiver.take_traces(request, "grpc")
        return trace_service_pb2.ExportTraceServiceResponse()


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        self.receiver.take_metrics(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@contextmanager
def otlp_receiver(*, http_port: int = 0, grpc_port: int = 0) -> Iterator[Receiver]:
    """An OTLP receiver on loopback, HTTP/protobuf and gRPC, each on a free port unless one is given."""
    receiver = Receiver()
    http = ThreadingHTTPServer(("127.0.0.1", http_port), _http_handler(receiver))
    http.daemon_threads = True
    receiver.http_port = http.server_address[1]
    http_thread = threading.Thread(target=http.serve_forever, name="otlp-http", daemon=True)
    http_thread.start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Traces(receiver), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Metrics(receiver), server)
    receiver.grpc_port = server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    server.start()
    try:
        yield receiver
    finally:
        server.stop(grace=None)
        http.shutdown()
        http.server_close()
        http_thread.join(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description="Receive OTLP traces on loopback and print each trace's tree.")
    parser.add_argument("--http", type=int, default=4318, help="HTTP/protobuf port (default 4318)")
    parser.add_argument("--grpc", type=int, default=4317, help="gRPC port (default 4317)")
    parser.add_argument("--quiet", action="store_true", help="print no trees, only the count when stopped")
    args = parser.parse_args()
    # SIGTERM stops it as Ctrl-C does, so whoever started it gets the count.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with otlp_receiver(http_port=args.http, grpc_port=args.grpc) as receiver:
        print(
            f"listening: http://127.0.0.1:{receiver.http_port} (HTTP/protobuf), 127.0.0.1:{receiver.grpc_port} (gRPC)",
            flush=True,
        )
        printed: set[str] = set()
        last_seen: dict[str, tuple[int, float]] = {}
        try:
            while True:
                time.sleep(0.5)
                now = time.monotonic()
                for trace_id, size in Counter(span.trace_id for span in receiver.spans()).items():
                    if last_seen.get(trace_id, (0, now))[0] != size:
                        last_seen[trace_id] = (size, now)
                for trace_id, (_, seen) in last_seen.items():
                    if trace_id not in printed and now - seen > 1.0:
                        printed.add(trace_id)
                        if not args.quiet:
                            print(receiver.tree(trace_id), flush=True)
        except KeyboardInterrupt:
            spans = receiver.spans()
            print(f"received {len(spans)} spans in {len({span.trace_id for span in spans})} traces", flush=True)


if __name__ == "__main__":
    main()
