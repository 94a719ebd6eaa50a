"""Traces of real stacks, received by a real OTLP receiver: one tree per call from the client's span
through mcpvisor's processes to an upstream that traces itself, with nothing of the arguments in it.

The stacks are configured the standard way (`OTEL_*` variables), or by the `[telemetry]` table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from mcp.shared.exceptions import MCPError

from mcpvisor.frontend.gate.activity import META_KEY
from tests.support.otlp_receiver import Received, Receiver, otlp_receiver
from tests.support.stack import UPSTREAMS, free_port, open_stack, python_server, wait_listening

ARGUMENT = "argument-value-7f3a"  # in every call's arguments: no span of mcpvisor's may hold it
FAILURE = "failure-value-91c2"  # the message a failing tool is asked to raise


def client_context() -> tuple[str, str, dict[str, str]]:
    """A client's own span: its trace id, span id, and the `_meta` that names it."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-01"}


def exporting_to(receiver: Receiver, protocol: str = "http/protobuf") -> dict[str, str]:
    """The standard variables that send a process's traces and metrics to the receiver, quickly."""
    port = receiver.http_port if protocol == "http/protobuf" else receiver.grpc_port
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }


def traced_upstream(receiver: Receiver, *args: str) -> dict[str, Any]:
    """A stdio upstream that exports its own spans to the receiver (its env is only what it is given)."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.http_port}", "OTEL_SERVICE_NAME": "upstream"}
    return python_server("traced_server.py", *args, env=env)


def mcpvisors(spans: list[Received]) -> list[Received]:
    return [span for span in spans if span.service == "mcpvisor"]


def only(spans: list[Received], **expected: str) -> Received:
    found = [span for span in spans if all(getattr(span, key) == value for key, value in expected.items())]
    assert len(found) == 1, (expected, [(span.role, span.name, span.kind) for span in spans])
    return found[0]


async def test_a_client_trace_runs_through_the_worker_into_a_stdio_upstream_that_traces_itself(tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        servers = {"traced": traced_upstream(receiver)}
        async with open_stack(tmp_path, servers, env=exporting_to(receiver)) as stack:
            trace_id, client_span, meta = client_context()
            async with stack.client("/mcp/direct") as client:
                result = await client.call_tool("traced:echo", {"text": ARGUMENT}, meta=meta)
                failed = await client.call_tool("traced:fail", {"message": FAILURE})
            assert not result.is_error and failed.is_error

            spans = await receiver.wait_for(lambda r: len(r.trace(trace_id)) >= 3 and r.trace(trace_id))
            print(receiver.tree(trace_id))
            call = only(spans, role="worker", name="tools/call echo")
            upstream = only(spans, service="upstream", name="tools/call echo")
            work = only(spans, service="upstream", name="work")
            # One tree: the client's span, the worker's call, the upstream's handling of it, its work.
            assert call.parent_id == client_span and call.kind == "CLIENT"
            assert (upstream.parent_id, upstream.kind) == (call.span_id, "SERVER")
            assert work.parent_id == upstream.span_id
            # Named and attributed by the MCP conventions, and mcpvisor's own names.
            assert call.attributes["mcp.method.name"] == "tools/call"
            assert call.attributes["gen_ai.tool.name"] == "echo"
            assert call.attributes["gen_ai.operation.name"] == "execute_tool"
            assert call.attributes["mcp.protocol.version"] == upstream.attributes["mcp.protocol.version"]
            assert call.attributes["network.transport"] == "pipe"
            assert (call.attributes["mcpvisor.server"], call.attributes["mcpvisor.worker_id"]) == ("traced", "traced")
            assert call.attributes["mcpvisor.request.id"] == result.meta[META_KEY]  # the activity log's row
            assert call.status == "UNSET"
            assert call.resource["service.name"] == "mcpvisor"
            assert call.resource["process.pid"] != os.getpid() and call.resource["mcpvisor.worker_id"] == "traced"

            # A tool that fails is a tool_error, without its message (which may echo what it was sent).
            failure = await receiver.wait_for_span(lambda s: s.role == "worker" and s.name == "tools/call fail")
            assert (failure.status, failure.attributes["error.type"]) == ("ERROR", "tool_error")
            # Without a client trace, the call starts one.
            assert failure.parent_id == ""

            # The worker's connection: connect, initialize (the upstream's below it) and discovery.
            connect = await receiver.wait_for_span(lambda s: s.role == "worker" and s.name == "connect traced")
            initialize = only(receiver.trace(connect.trace_id), role="worker", name="initialize")
            discover = only(receiver.trace(connect.trace_id), role="worker", name="discover traced")
            assert initialize.parent_id == discover.parent_id == connect.span_id
            assert connect.attributes["mcpvisor.upstream.reconnect"] is False
            assert discover.attributes["mcpvisor.discovery.tools"] >= 4
            upstream_init = only(receiver.trace(connect.trace_id), service="upstream", name="initialize")
            assert upstream_init.parent_id == initialize.span_id

            # The supervisor's starts, each a trace of its own.
            for name in ("start frontend", "start worker:traced"):
                start = await receiver.wait_for_span(lambda s, name=name: s.role == "supervisor" and s.name == name)
                assert start.status == "UNSET" and start.parent_id == ""
                assert start.attributes["mcpvisor.process.state"] == "RUNNING"

            # The duration histogram of the MCP conventions, through the same SDK.
            points = await receiver.wait_for(
                lambda r: [
                    p
                    for p in r.points("mcp.client.operation.duration")
                    if p.attributes.get("gen_ai.tool.name") == "echo"
                ],
                what="mcp.client.operation.duration",
            )
            assert points[0].unit == "s" and points[0].attributes["mcp.method.name"] == "tools/call"

            everything = mcpvisors(receiver.spans())
            assert not [span.name for span in everything if ARGUMENT in span.text() or FAILURE in span.text()]


async def test_a_remote_upstream_gets_the_context_in_meta_and_headers_over_grpc_with_arguments_recorded(
    tmp_path: Path,
) -> None:
    port = free_port()
    with otlp_receiver() as receiver:
        upstream_env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.http_port}",
            "OTEL_SERVICE_NAME": "upstream",
        }
        command = [sys.executable, str(UPSTREAMS / "traced_server.py"), "--http", str(port)]
        upstream = subprocess.Popen(command, env=upstream_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            await wait_listening(port, upstream)
            # Configured by the table alone this time, exporting over gRPC.
            table = {
                "endpoint": f"http://127.0.0.1:{receiver.grpc_port}",
                "protocol": "grpc",
                "record_arguments": True,
            }
            env = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
            servers = {"remote": {"url": f"http://127.0.0.1:{port}/mcp", "transport": "streamable-http"}}
            async with open_stack(tmp_path, servers, env=env, tables={"telemetry": table}) as stack:
                trace_id, _, meta = client_context()
                secret = "sk-live-4eC39HqLyjWDarjtT1zdp7dc"
                async with stack.client("/mcp/direct") as client:
                    seen = await client.call_tool("remote:seen_context", {}, meta=meta)
                    await client.call_tool("remote:echo", {"text": f"{ARGUMENT} {secret}"}, meta=meta)
                told = json.loads(seen.content[0].text)

                calls = await receiver.wait_for(
                    lambda r: (
                        [s for s in r.trace(trace_id) if s.role == "worker" and s.kind == "CLIENT"]
                        if len([s for s in r.trace(trace_id) if s.role == "worker"]) >= 2
                        else None
                    )
                )
                seen_call = only(calls, name="tools/call seen_context")
                ours = f"00-{trace_id}-{seen_call.span_id}-01"
                assert told["meta"]["traceparent"] == ours, told
                assert told["headers"]["traceparent"] == ours, told
                assert seen_call.via == "grpc"
                assert seen_call.attributes["network.transport"] == "tcp"
                assert (seen_call.attributes["server.address"], seen_call.attributes["server.port"]) == (
                    "127.0.0.1",
                    port,
                )

                echo = only(calls, name="tools/call echo")
                upstream_span = await receiver.wait_for_span(
                    lambda s: s.service == "upstream" and s.name == "tools/call echo" and s.trace_id == trace_id
                )
                assert upstream_span.parent_id == echo.span_id
                # Asked for: the arguments and the result, with what looks like a key redacted.
                recorded = echo.attributes["gen_ai.tool.call.arguments"]
                assert ARGUMENT in recorded and secret not in recorded
                assert ARGUMENT in echo.attributes["gen_ai.tool.call.result"]
                assert secret not in echo.attributes["gen_ai.tool.call.result"]
        finally:
            upstream.send_signal(signal.SIGTERM)
            upstream.wait(10)


async def test_a_worker_killed_mid_call_shows_as_an_exit_and_a_restart(tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        servers = {"traced": traced_upstream(receiver)}
        settings = {"log_level": "debug"}  # the worker's log says when a call has started
        async with open_stack(tmp_path, servers, env=exporting_to(receiver), settings=settings) as stack:
            worker_pid = stack.status()["traced"]["pid"]
            async with stack.client("/mcp/direct") as client, trio.open_nursery() as nursery:

                async def slow_call() -> None:
                    with pytest.raises(MCPError, match="stopped while the call was running"):
                        await client.call_tool("traced:slow", {"seconds": 30})

                nursery.start_soon(slow_call)
                with trio.fail_after(20):
                    while "(tools/call) started" not in stack.log("traced.worker.log"):
                        await trio.sleep(0.1)
                os.kill(worker_pid, signal.SIGKILL)

            exited = await receiver.wait_for_span(lambda s: s.role == "supervisor" and s.name == "exit worker:traced")
            assert exited.status == "ERROR" and exited.attributes["error.type"] == "killed"
            assert exited.attributes["process.exit.code"] == -signal.SIGKILL
            restarted = await receiver.wait_for_span(
                lambda s: s.role == "supervisor" and s.name == "restart worker:traced"
            )
            assert restarted.status == "UNSET" and restarted.attributes["mcpvisor.process.restarts"] >= 1
            # The new worker connects again: a trace of its own, from another process.
            again = await receiver.wait_for_span(
                lambda s: s.role == "worker" and s.name == "connect traced" and s.resource["process.pid"] != worker_pid
            )
            assert again.status == "UNSET"


async def test_an_unreachable_collector_costs_no_call_and_is_one_log_line_and_a_count(tmp_path: Path) -> None:
    closed = free_port()  # nothing listens there
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRICS_EXPORTER": "none",
    }
    servers = {"echo": python_server("echo_server.py")}
    async with open_stack(tmp_path, servers, env=env) as stack:
        async with stack.client("/mcp/direct") as client:
            for index in range(20):
                result = await client.call_tool("echo:echo", {"text": f"{index}"})
                assert not result.is_error

        async def dropped() -> dict[str, float]:
            async with httpx2.AsyncClient(timeout=10) as http:
                text = (await http.get(f"{stack.base_url}/metrics")).text
            counts = {}
            for line in text.splitlines():
                if line.startswith("mcpvisor_telemetry_spans_dropped_total{"):
                    labels, value = line.rsplit(" ", 1)
                    counts[labels.split('"')[1]] = float(value)
            return counts

        with trio.fail_after(60):
            while (await dropped()).get("worker:echo", 0) < 20:
                await trio.sleep(0.5)
        assert "frontend" in await dropped()
        log = stack.log("echo.worker.log")
        assert log.count("traces cannot be exported") == 1, log
        assert "Transient error" not in log and "Traceback" not in log
    # The supervisor stopped by itself: its processes gave up on their last spans in time.
    assert stack.process.returncode == 0
