"""Prometheus metrics at `/metrics`: calls through the door, HTTP requests, and the state of each process.

Counters and histograms are updated as calls happen; everything that is a state (upstreams, tool
counts, memory, supervised processes) is read at scrape time, so nothing is kept twice.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, Final

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mcpvisor.frontend.door.catalog import Catalog, ServerView
from mcpvisor.frontend.door.control import ControlError
from mcpvisor.runtime import telemetry
from mcpvisor.wire.states import UpstreamState

log = logging.getLogger(__name__)

STATUS_TIMEOUT: Final = 1.0  # a scrape must not hang on a busy supervisor; process states are then left out
# Calls range from a cached answer (sub-millisecond) to a slow upstream tool (minutes).
LATENCY_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
PROCESS_STATES: Final = ("STOPPED", "STARTING", "RUNNING", "BACKOFF", "STOPPING", "EXITED", "FATAL", "UNKNOWN")

StatusSource = Callable[[], Awaitable[Any]]


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process from /proc, or None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def endpoint_label(path: str) -> str:
    """A bounded label for a request path: one label for all of /mcp/servers/NAME, `other` for unknown paths."""
    path = path.rstrip("/") or "/"
    if path in ("/mcp", "/mcp/direct", "/healthz", "/metrics"):
        return path
    if path.startswith("/mcp/servers/"):
        return "/mcp/servers"
    return "other"


class Metrics:
    """The frontend's metrics, in a registry of its own."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        status: StatusSource | None = None,
        workers: Callable[[], Iterable[tuple[str, ServerView]]] | None = None,
    ) -> None:
        self.catalog = catalog
        # Every worker by id (`server`, `tenant/server`); by default the one catalog's.
        self.workers = workers or (lambda: ((view.id, view) for view in list(self.catalog.servers.values())))
        self.status = status  # the supervisor's `status` rows (process states, worker pids)
        self.registry = CollectorRegistry(auto_describe=True)
        self.calls = Counter(
            "mcpvisor_calls", "Tool calls through the gateway", ["server", "via", "outcome"], registry=self.registry
        )
        self.call_seconds = Histogram(
            "mcpvisor_call_duration_seconds",
            "Time from the gate to the upstream's answer",
            ["server", "via"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._in_flight: dict[str, Any] = {}
        self.in_flight = Gauge(
            "mcpvisor_calls_in_flight", "Calls waiting for an upstream", ["server"], registry=self.registry
        )
        self.list_changed = Counter(
            "mcpvisor_list_changed_notices", "list_changed notices sent to clients", registry=self.registry
        )
        self.requests = Counter(
            "mcpvisor_http_requests",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.connections = Counter(
            "mcpvisor_http_connections", "Client connections accepted by the HTTP listener", registry=self.registry
        )
        self.handovers = Counter(
            "mcpvisor_http_handovers",
            "Connections handed to hypercorn by a request the frontend's own HTTP path does not read "
            "(frontend/endpoints/http_server.py)",
            registry=self.registry,
        )
        self._rows: list[dict[str, Any]] = []
        self.registry.register(_StateCollector(self))

    def call_done(self, server: str, via: str, outcome: str, seconds: float) -> None:
        # The labelled children are kept: finding one costs more than the count itself.
        key = (server, via, outcome)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.calls.labels(server, via, outcome),
                self.call_seconds.labels(server, via),
            )
        children[0].inc()
        children[1].observe(seconds)

    def in_flight_of(self, server: str) -> Any:
        """The in-flight gauge of one server (kept, as `call_done` keeps its counters)."""
        gauge = self._in_flight.get(server)
        if gauge is None:
            gauge = self._in_flight[server] = self.in_flight.labels(server)
        return gauge

    async def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type; asks the supervisor for process states first."""
        self._rows = []
        if self.status is not None:
            with trio.move_on_after(STATUS_TIMEOUT):
                try:
                    rows = await self.status()
                except ControlError as exc:
                    log.warning("metrics: the supervisor's status is unavailable: %s", exc)
                    rows = []
                self._rows = [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _spans_dropped(rows: list[dict[str, Any]]) -> CounterMetricFamily:
    """Spans each process could not hand to its collector (telemetry on): this one's, and the others' reports."""
    dropped = CounterMetricFamily(
        "mcpvisor_telemetry_spans_dropped",
        "Spans not delivered to the OpenTelemetry collector: the export queue was full or the export failed",
        labels=["process"],
    )
    if telemetry.active is not None:
        dropped.add_metric(["frontend"], float(telemetry.active.spans_dropped))
    for row in rows:
        name = str(row.get("name", ""))
        if isinstance(count := row.get("spans_dropped"), int) and name and name != "frontend":
            dropped.add_metric([name if ":" in name else f"worker:{name}"], float(count))
    return dropped


class _StateCollector:
    """The scrape-time part: upstream states, catalog sizes, process states and memory."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # the families depend on the servers present at scrape time

    def collect(self) -> Iterator[Metric]:
        upstream = GaugeMetricFamily(
            "mcpvisor_upstream_state", "1 for the upstream's current state", labels=["server", "state"]
        )
        alive = GaugeMetricFamily("mcpvisor_worker_alive", "1 when the worker answers", labels=["server"])
        tools = GaugeMetricFamily("mcpvisor_server_tools", "Tools the upstream offers", labels=["server"])
        catalog_size = GaugeMetricFamily(
            "mcpvisor_catalog_entries", "Entries in the aggregated catalog", labels=["kind"]
        )
        sizes = {"tools": 0, "resources": 0, "templates": 0, "prompts": 0}
        pids: dict[str, int] = {"frontend": os.getpid(), "supervisor": os.getppid()}
        for worker, view in self.metrics.workers():
            for state in UpstreamState:
                upstream.add_metric([worker, str(state)], 1.0 if view.state is state else 0.0)
            alive.add_metric([worker], 1.0 if view.alive else 0.0)
            tools.add_metric([worker], float(len(view.tools)))
            sizes["tools"] += len(view.tools)
            sizes["resources"] += len(view.resources)
            sizes["templates"] += len(view.templates)
            sizes["prompts"] += len(view.prompts)
            if view.pid:
                pids[f"worker:{worker}"] = view.pid
        for kind, count in sizes.items():
            catalog_size.add_metric([kind], float(count))
        yield from (upstream, alive, tools, catalog_size)

        states = GaugeMetricFamily(
            "mcpvisor_process_state", "1 for the supervised process's current state", labels=["process", "state"]
        )
        restarts = CounterMetricFamily(
            "mcpvisor_process_restarts", "Starts of a supervised process after its first", labels=["process"]
        )
        for row in self.metrics._rows:
            name, state = str(row.get("name", "")), str(row.get("state", ""))
            if not name:
                continue
            for known in PROCESS_STATES:
                states.add_metric([name, known], 1.0 if state == known else 0.0)
            if isinstance(count := row.get("restarts"), int):
                restarts.add_metric([name], float(count))
            pid = row.get("pid")
            if isinstance(pid, int) and pid > 0:
                pids[name if name == "frontend" or ":" in name else f"worker:{name}"] = pid
        yield states
        yield restarts
        yield _spans_dropped(self.metrics._rows)

        memory = GaugeMetricFamily(
            "mcpvisor_process_resident_memory_bytes", "Resident memory of each mcpvisor process", labels=["process"]
        )
        for name, pid in sorted(pids.items()):
            if (rss := rss_bytes(pid)) is not None:
                memory.add_metric([name], float(rss))
        yield memory
