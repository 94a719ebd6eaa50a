"""The OpenTelemetry SDK assembled for one process: exporters as the `OTEL_*` variables choose them,
a bounded batch queue, and count of every span that never reached the collector.

Imported only by `telemetry.setup`, and only when telemetry is configured: it is what loads the SDK.
The exporters are found as every OpenTelemetry SDK finds them (`OTEL_TRACES_EXPORTER`, the OTLP
protocol, the exporters' entry points) and the sampler is the SDK's own reading of
`OTEL_TRACES_SAMPLER`, so mcpvisor accepts what any OpenTelemetry SDK does.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from mcpvisor.runtime.telemetry import ROLE, SERVICE_NAME, exporter_names
from mcpvisor.wire.redaction import redact_secrets, redact_url

log = logging.getLogger("mcpvisor.telemetry")

# The official MCP SDK makes a span of its own for every message it sends (pings and discovery
# included) and would stand between mcpvisor's span and the upstream's. With its tracer disabled
# it passes the current span, mcpvisor's, on to the upstream instead.
MCP_SDK_SCOPE = "mcp-python-sdk"
# The loggers whose lines say an export failed; `Deliveries` says it once instead of every retry.
_EXPORT_LOGGERS = (
    "opentelemetry.exporter",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.metrics._internal.export",
)


class Deliveries:
    """Spans that never reached the collector, and whether exports fail now.

    An unreachable collector is one warning when exports start failing and one line when they
    succeed again, never a line per retry; the spans lost meanwhile are counted in `dropped`.
    """

    def __init__(self, target: str) -> None:
        self.target = target
        self.dropped = 0
        self.problem = ""  # the exporter's own account of its last failure, redacted
        self._failing: set[str] = set()
        self._lock = threading.Lock()  # exporters run on the SDK's threads

    def lost(self, count: int) -> None:
        with self._lock:
            self.dropped += count

    def failed(self, what: str, count: int) -> None:
        with self._lock:
            self.dropped += count
            first = what not in self._failing
            self._failing.add(what)
        if first:
            log.warning(
                "telemetry: %s cannot be exported to %s (%s); what is lost meanwhile is counted"
                " (mcpvisor_telemetry_spans_dropped_total)",
                what,
                self.target,
                self.problem or "no answer",
            )

    def succeeded(self, what: str) -> None:
        with self._lock:
            recovered = what in self._failing
            self._failing.discard(what)
        if recovered:
            log.info("telemetry: %s are exported to %s again", what, self.target)


# The SDK's loggers whose warnings say something about mcpvisor's configuration (a bad resource
# attribute, sampler or header variable). Others, the propagators' above all, describe what a client
# sent (a malformed `tracestate`, oversized `baggage`, quoted whole): those stay at debug level.
_CONFIGURATION_LOGGERS = ("opentelemetry.sdk", "opentelemetry.util", "opentelemetry.context")


def _printable(text: str) -> str:
    """One line, whatever it quotes: control characters escaped."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


class _SdkLogs(logging.Handler):
    """Where the SDK's own log lines go: export failures become `Deliveries.problem`, a configuration
    warning is said once, and everything is kept at debug level, redacted and on one line."""

    def __init__(self, deliveries: Deliveries) -> None:
        super().__init__(logging.DEBUG)
        self.deliveries = deliveries
        self._said: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        message = _printable(redact_secrets(record.getMessage()[:1000])[:300])
        log.debug("%s: %s", record.name, message)
        if record.name.startswith(_EXPORT_LOGGERS):
            if record.levelno >= logging.WARNING:
                self.deliveries.problem = message
            return
        configuration = record.name.startswith(_CONFIGURATION_LOGGERS)
        if configuration and record.levelno >= logging.WARNING and message not in self._said and len(self._said) < 20:
            self._said.add(message)
            log.warning("telemetry: %s", message)


class _CountingSpanExporter(SpanExporter):
    """An exporter that counts the spans of every batch it could not deliver."""

    def __init__(self, inner: SpanExporter, deliveries: Deliveries) -> None:
        self.inner = inner
        self.deliveries = deliveries

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # an exporter's bug must cost its batch, not the SDK's export thread
            self.deliveries.problem = redact_secrets(f"{type(exc).__name__}: {exc}")[:300]
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self.deliveries.succeeded("traces")
        else:
            self.deliveries.failed("traces", len(spans))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class _CountingMetricExporter(MetricExporter):
    """A metric exporter that says once when exports start and stop failing."""

    def __init__(self, inner: MetricExporter, deliveries: Deliveries) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self.inner = inner
        self.deliveries = deliveries

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:  # as for spans: one lost export, not a dead reader thread
            self.deliveries.problem = redact_secrets(f"{type(exc).__name__}: {exc}")[:300]
            result = MetricExportResult.FAILURE
        if result is MetricExportResult.SUCCESS:
            self.deliveries.succeeded("metrics")
        else:
            self.deliveries.failed("metrics", 0)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class _QueueDrops:
    """The batch processor's own count of what it processed, passing on the spans it drops
    because its queue is full (it never waits for room: a call is never held up by export)."""

    def __init__(self, inner: Any, deliveries: Deliveries) -> None:
        self.inner = inner
        self.deliveries = deliveries

    def register_queue_size(self, get_queue_size: Callable[[], int]) -> None:
        self.inner.register_queue_size(get_queue_size)

    def drop_items(self, count: int, error_type: str = "queue_full") -> None:
        self.deliveries.lost(count)
        self.inner.drop_items(count, error_type)

    def finish_items(self, count: int) -> None:
        self.inner.finish_items(count)


def _count_queue_drops(processor: BatchSpanProcessor, deliveries: Deliveries) -> None:
    batch = getattr(processor, "_batch_processor", None)
    if batch is None or not hasattr(batch, "_metrics"):
        # Another SDK release: exports failures are still counted, queue overflows only logged.
        log.debug("telemetry: this SDK's batch processor does not tell its queue overflows")
        return
    batch._metrics = _QueueDrops(batch._metrics, deliveries)


def _sdk_tracer_off(scope: Any) -> Any:
    from opentelemetry.sdk.trace import _TracerConfig

    return _TracerConfig(is_enabled=scope.name != MCP_SDK_SCOPE)


def _tracer_provider_options() -> dict[str, Any]:
    """The SDK's (still experimental) per-scope switch, where this SDK release has it."""
    try:
        from opentelemetry.sdk.trace import _TracerConfig  # noqa: F401
    except ImportError:
        log.debug("telemetry: this SDK cannot turn the MCP SDK's own spans off; they stay in the trees")
        return {}
    return {"_tracer_configurator": _sdk_tracer_off}


# What `otlp` means for each OTLP protocol, as the specification names the protocols.
_OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}


def exporter_class(name: str, signal: str, environ: Mapping[str, str]) -> type[Any]:
    """The exporter class `name` stands for, found as every OpenTelemetry SDK finds it: through the
    `opentelemetry_<signal>_exporter` entry points, `otlp` meaning the one of the configured protocol
    (`OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`, else gRPC)."""
    if name == "otlp":
        protocol = (
            environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
            or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "grpc"
        ).strip()
        if protocol not in _OTLP_BY_PROTOCOL:
            raise RuntimeError(f"unsupported OTLP protocol {protocol!r} (grpc or http/protobuf)")
        name = _OTLP_BY_PROTOCOL[protocol]
    found = entry_points(group=f"opentelemetry_{signal}_exporter", name=name)
    if not found:
        raise RuntimeError(f"no {signal} exporter named {name!r} is installed")
    return next(iter(found)).load()


def resource(role: str, attributes: Mapping[str, str]) -> Resource:
    """The process's resource: `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` (`mcpvisor` if neither
    names the service), its role and pid, and `attributes` (`mcpvisor.worker_id`, ...)."""
    detected = Resource.create({})
    ours: dict[str, Any] = {ROLE: role, "process.pid": os.getpid()}
    ours.update({key: value for key, value in attributes.items() if value})
    name = detected.attributes.get("service.name")
    if not isinstance(name, str) or name.startswith("unknown_service"):
        ours["service.name"] = SERVICE_NAME
    return detected.merge(Resource(ours))


def _target(environ: Mapping[str, str], signal: str) -> str:
    endpoint = environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", ""
    )
    return redact_url(endpoint) if endpoint else "the collector"


def build(role: str, attributes: Mapping[str, str], environ: Mapping[str, str]) -> tuple[Any, Any, Deliveries]:
    """The tracer provider (installed as the global one), the meter provider or None, and the count of losses."""
    deliveries = Deliveries(_target(environ, "traces"))
    sdk_logs = logging.getLogger("opentelemetry")
    sdk_logs.addHandler(_SdkLogs(deliveries))
    sdk_logs.propagate = False
    sdk_logs.setLevel(logging.DEBUG if logging.getLogger().isEnabledFor(logging.DEBUG) else logging.INFO)
    # The batch processor warns of a full queue once per span it drops: those are counted instead,
    # and a log record made per span would cost more than the span.
    logging.getLogger("opentelemetry.sdk._shared_internal").setLevel(logging.ERROR)

    span_exporters = [exporter_class(name, "traces", environ) for name in exporter_names("traces", environ)]
    metric_exporters = [exporter_class(name, "metrics", environ) for name in exporter_names("metrics", environ)]
    process_resource = resource(role, attributes)
    tracer_provider = TracerProvider(
        resource=process_resource,
        # No sampler given: the SDK reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG itself.
        shutdown_on_exit=False,  # flushed by the process itself, within FLUSH_TIMEOUT
        **_tracer_provider_options(),
    )
    for span_exporter in span_exporters:
        processor = BatchSpanProcessor(_CountingSpanExporter(span_exporter(), deliveries))
        _count_queue_drops(processor, deliveries)
        tracer_provider.add_span_processor(processor)
    trace_api.set_tracer_provider(tracer_provider)

    meter_provider = None
    if metric_exporters:
        readers: list[MetricReader] = []
        for metric_exporter in metric_exporters:
            if issubclass(metric_exporter, MetricReader):
                readers.append(metric_exporter())
            else:
                readers.append(PeriodicExportingMetricReader(_CountingMetricExporter(metric_exporter(), deliveries)))
        meter_provider = MeterProvider(resource=process_resource, metric_readers=readers, shutdown_on_exit=False)
        metrics_api.set_meter_provider(meter_provider)
    return tracer_provider, meter_provider, deliveries
