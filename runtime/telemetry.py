"""OpenTelemetry in every mcpvisor process, configured by the standard `OTEL_*` variables.

Nothing of the SDK is imported unless `setup` finds telemetry configured: until then `active` is
None, and each instrumented place looks at it first and does nothing more. The `[telemetry]` table
is folded into the supervisor's environment at start (`apply_table`), so the frontend and the
workers, which inherit it, read the same variables as any OpenTelemetry SDK would.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, Final
from urllib.parse import quote

import trio

from mcpvisor.wire.config import TelemetryConfig
from mcpvisor.wire.secrets import SecretError, resolve

log = logging.getLogger("mcpvisor.telemetry")

SERVICE_NAME: Final = "mcpvisor"
ROLE: Final = "mcpvisor.process.role"  # frontend, worker or supervisor, on every process's resource
RECORD_ARGUMENTS_VAR: Final = "MCPVISOR_TELEMETRY_RECORD_ARGUMENTS"
# What a stopping process waits for its last spans to leave; a collector that does not answer by
# then is abandoned, so an unreachable one never holds up a stop.
FLUSH_TIMEOUT: Final = 2.0
# The MCP conventions' bucket advice for the operation-duration histograms, in seconds.
DURATION_BUCKETS: Final = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

# `[telemetry]` key -> the variable it stands for.
_VARIABLES: Final = {
    "exporter": "OTEL_TRACES_EXPORTER",
    "metrics_exporter": "OTEL_METRICS_EXPORTER",
    "endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
    "protocol": "OTEL_EXPORTER_OTLP_PROTOCOL",
    "sampler": "OTEL_TRACES_SAMPLER",
    "sampler_arg": "OTEL_TRACES_SAMPLER_ARG",
    "service_name": "OTEL_SERVICE_NAME",
}


def _pairs(table: Mapping[str, str]) -> str:
    """`key=value,...` with percent-encoded values, the format of the headers and resource variables."""
    return ",".join(f"{key.strip()}={quote(value, safe='')}" for key, value in table.items())


def table_environment(table: TelemetryConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The `OTEL_*` variables the `[telemetry]` table stands for; header references are resolved (SecretError)."""
    variables: dict[str, str] = {}
    for key, variable in _VARIABLES.items():
        value = getattr(table, key)
        if value is not None:
            variables[variable] = str(value)
    if table.headers:
        variables["OTEL_EXPORTER_OTLP_HEADERS"] = _pairs(
            {name: resolve(value, environ) for name, value in table.headers.items()}
        )
    if table.resource_attributes:
        variables["OTEL_RESOURCE_ATTRIBUTES"] = _pairs(table.resource_attributes)
    if table.record_arguments:
        variables[RECORD_ARGUMENTS_VAR] = "true"
    return variables


def apply_table(table: TelemetryConfig, environ: MutableMapping[str, str] | None = None) -> None:
    """Set the variables the table stands for where the environment does not: this process's and its children's.

    A header whose secret cannot be resolved leaves the whole table out (said in the log): the
    environment's own variables still apply.
    """
    target = os.environ if environ is None else environ
    try:
        variables = table_environment(table, target)
    except SecretError as exc:
        log.error("telemetry: the [telemetry] table is not used: a header's secret cannot be resolved: %s", exc)
        return
    for variable, value in variables.items():
        target.setdefault(variable, value)


def exporter_names(signal: str, environ: Mapping[str, str]) -> list[str]:
    """The exporters `signal` (traces, metrics) is sent to: `OTEL_<SIGNAL>_EXPORTER`, else `otlp` when an
    OTLP endpoint is set (the specification's default exporter), else none."""
    names = environ.get(f"OTEL_{signal.upper()}_EXPORTER", "").strip()
    if not names:
        endpoint = environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    if names.lower() == "none":
        return []
    return [name.strip() for name in names.split(",") if name.strip()]


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment configures telemetry: an exporter or an endpoint, and the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(exporter_names("traces", environ) or exporter_names("metrics", environ))


class Telemetry:
    """One process's tracer and meters, and what it takes to flush them when the process stops."""

    def __init__(
        self, role: str, tracer_provider: Any, meter_provider: Any, deliveries: Any, environ: Mapping[str, str]
    ):
        self.role = role
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._deliveries = deliveries
        self.tracer = tracer_provider.get_tracer("mcpvisor")
        self.record_arguments = environ.get(RECORD_ARGUMENTS_VAR, "").strip().lower() == "true"
        self.server_duration: Any = None  # mcp.server.operation.duration, when metrics are exported
        self.client_duration: Any = None  # mcp.client.operation.duration, likewise
        if meter_provider is not None:
            meter = meter_provider.get_meter("mcpvisor")
            self.server_duration = meter.create_histogram(
                "mcp.server.operation.duration",
                unit="s",
                description="MCP request duration as observed on the receiver, from receipt to the result sent.",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            )
            self.client_duration = meter.create_histogram(
                "mcp.client.operation.duration",
                unit="s",
                description="MCP request duration as observed on the sender, from sending to the result received.",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            )

    @property
    def spans_dropped(self) -> int:
        """Spans that never reached the collector: the export queue was full, or the export failed."""
        return int(self._deliveries.dropped)

    async def aclose(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Send what is queued and stop exporting; gives up after `timeout` rather than hold up a stop."""
        global active
        if active is self:
            active = None

        def flush() -> None:
            self._tracer_provider.shutdown()
            if self._meter_provider is not None:
                self._meter_provider.shutdown(timeout_millis=timeout * 1000)

        with trio.move_on_after(timeout) as waited:
            await trio.to_thread.run_sync(flush, abandon_on_cancel=True)
        if waited.cancelled_caught:
            log.warning("telemetry: the collector did not take the last spans within %gs; they are dropped", timeout)


# This process's telemetry, or None when it is off: the one thing the hot path reads.
active: Telemetry | None = None


def setup(role: str, environ: Mapping[str, str] | None = None, **attributes: str) -> Telemetry | None:
    """Start exporting as the environment says, if it says anything; None when telemetry is off.

    `attributes` go on the process's resource (`mcpvisor.worker_id`, ...). A configuration the SDK
    cannot use (an unknown exporter or protocol) is a log line and leaves telemetry off.
    """
    global active
    environ = os.environ if environ is None else environ
    if not wanted(environ):
        return None
    from mcpvisor.runtime import telemetry_export

    try:
        tracer_provider, meter_provider, deliveries = telemetry_export.build(role, attributes, environ)
    except (RuntimeError, ValueError, TypeError, ImportError) as exc:
        log.error("telemetry is off: it cannot be set up as configured: %s", exc)
        return None
    active = Telemetry(role, tracer_provider, meter_provider, deliveries, environ)
    log.info(
        "telemetry: exporting traces to %s, metrics to %s",
        ", ".join(exporter_names("traces", environ)) or "nothing",
        ", ".join(exporter_names("metrics", environ)) or "nothing",
    )
    return active


@asynccontextmanager
async def running(role: str, **attributes: str) -> AsyncIterator[Telemetry | None]:
    """`setup` for the life of a process's main task; its last spans are flushed on the way out."""
    telemetry = setup(role, **attributes)
    try:
        yield telemetry
    finally:
        if telemetry is not None:
            with trio.CancelScope(shield=True):
                await telemetry.aclose()
