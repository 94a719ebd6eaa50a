"""`/metrics` against a real stack: the Prometheus text parser reads back the calls a client made."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx2
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.support.stack import Stack, echo_server, open_stack

READ = {"operation_type": "read"}


async def scrape(stack: Stack) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """Every sample of `/metrics` by family name: (sample name, labels, value)."""
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.get(f"{stack.base_url}/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        family.name: [(s.name, dict(s.labels), s.value) for s in family.samples]
        for family in text_string_to_metric_families(response.text)
    }


def value(families: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    """The one sample of `family` named `sample` with exactly these labels (0 when absent)."""
    found = [v for name, ls, v in families.get(family, []) if name == sample and ls == labels]
    assert len(found) <= 1, found
    return found[0] if found else 0.0


async def test_metrics_count_the_calls_a_client_made_per_server_and_path(tmp_path: Path) -> None:
    servers = {"echo": echo_server(), "jail": echo_server("jail", quarantined=True)}
    # Both ready first (open_stack's default): a call to jail before its catalog is known would be
    # refused as unknown, not blocked.
    async with open_stack(tmp_path, servers) as stack:
        before = await scrape(stack)
        async with stack.client("/mcp/direct") as client:
            for text in ("one", "two", "three"):
                assert not (await client.call_tool("echo:echo", {"text": text})).is_error
            assert (await client.call_tool("echo:fail", {"message": "no"})).is_error
        async with stack.client("/mcp") as searcher:
            refused = await searcher.call_tool(
                "call_tool_read", {"name": "jail:echo", "args": {"text": "x"}, "intent": READ}
            )
            assert refused.is_error, refused
            read = await searcher.call_tool(
                "call_tool_read", {"name": "echo:echo", "args": {"text": "r"}, "intent": READ}
            )
            assert not read.is_error, read

        families = await scrape(stack)
        calls = "mcpvisor_calls"
        assert value(families, calls, "mcpvisor_calls_total", server="echo", via="direct", outcome="ok") == 3
        assert value(families, calls, "mcpvisor_calls_total", server="echo", via="direct", outcome="error") == 1
        assert (
            value(families, calls, "mcpvisor_calls_total", server="jail", via="call_tool_read", outcome="blocked") == 1
        )
        assert value(families, calls, "mcpvisor_calls_total", server="echo", via="call_tool_read", outcome="ok") == 1
        histogram = "mcpvisor_call_duration_seconds"
        count = value(families, histogram, "mcpvisor_call_duration_seconds_count", server="echo", via="direct")
        assert count == 4
        assert (
            value(families, histogram, "mcpvisor_call_duration_seconds_bucket", server="echo", via="direct", le="+Inf")
            == 4
        )
        assert value(families, "mcpvisor_calls_in_flight", "mcpvisor_calls_in_flight", server="echo") == 0

        # Scrape-time state, per server.
        assert value(families, "mcpvisor_upstream_state", "mcpvisor_upstream_state", server="echo", state="ready") == 1
        assert value(families, "mcpvisor_server_tools", "mcpvisor_server_tools", server="echo") > 5
        assert value(families, "mcpvisor_catalog_entries", "mcpvisor_catalog_entries", kind="tools") > 5
        assert value(families, "mcpvisor_process_state", "mcpvisor_process_state", process="echo", state="RUNNING") == 1
        frontend_state = value(
            families, "mcpvisor_process_state", "mcpvisor_process_state", process="frontend", state="RUNNING"
        )
        assert frontend_state == 1

        # Memory of every mcpvisor process: supervisor, frontend, each worker.
        memory = {ls["process"]: v for _, ls, v in families["mcpvisor_process_resident_memory_bytes"]}
        assert {"supervisor", "frontend", "worker:echo", "worker:jail"} <= set(memory), memory
        assert all(v > 0 for v in memory.values()), memory

        # The clients' POSTs were all read by the frontend's own HTTP path: of the connections
        # since the first scrape, only the second scrape's GET went to hypercorn.
        connections, handovers = "mcpvisor_http_connections", "mcpvisor_http_handovers"
        opened = value(families, connections, f"{connections}_total") - value(
            before, connections, f"{connections}_total"
        )
        assert opened >= 3, opened  # two clients and this scrape
        handed = value(families, handovers, f"{handovers}_total") - value(before, handovers, f"{handovers}_total")
        assert handed == 1, handed

        # HTTP requests by endpoint and status; the scrape above counted itself after answering.
        requests = "mcpvisor_http_requests"
        assert value(families, requests, "mcpvisor_http_requests_total", endpoint="/mcp/direct", status="200") >= 5
        assert value(families, requests, "mcpvisor_http_requests_total", endpoint="/mcp", status="200") >= 3
        async with httpx2.AsyncClient(timeout=10) as http:
            assert (await http.get(f"{stack.base_url}/nowhere")).status_code == 404
        again = await scrape(stack)
        assert value(again, requests, "mcpvisor_http_requests_total", endpoint="other", status="404") == 1
        assert value(again, requests, "mcpvisor_http_requests_total", endpoint="/metrics", status="200") >= 1

        # A worker killed and started again by the supervisor counts one restart; the others none.
        before = await trio.to_thread.run_sync(stack.status)
        assert value(again, "mcpvisor_process_restarts", "mcpvisor_process_restarts_total", process="echo") == 0
        os.kill(before["echo"]["pid"], signal.SIGKILL)
        await stack.wait_status(
            lambda rows: rows["echo"]["state"] == "RUNNING" and rows["echo"]["pid"] != before["echo"]["pid"]
        )
        await stack.wait_ready(["echo"])
        after = await scrape(stack)
        assert value(after, "mcpvisor_process_restarts", "mcpvisor_process_restarts_total", process="echo") == 1
        assert value(after, "mcpvisor_process_restarts", "mcpvisor_process_restarts_total", process="frontend") == 0
