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
from tests.e2e.test_protocol_current import post
from tests.support.otlp_receiver import Received, Receiver, otlp_receiver
from tests.support.stack import UPSTREAMS, free_port, open_stack, python_server, wait_listening

ARGUMENT = "argument-value-7f3a"  # in every call's arguments: no span of mcpvisor's may hold it
FAILURE = "failure-value-91c2"  # the message a failing tool is asked to raise
COLLECTOR_TOKEN = "collector-secret-5d1e"  # the collector's credential, in OTEL_EXPORTER_OTLP_HEADERS


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


async def test_one_call_is_one_tree_from_the_client_through_mcpvisor_into_a_stdio_upstream_in_both_eras(
    tmp_path: Path,
) -> None:
    with otlp_receiver() as receiver:
        servers = {"traced": traced_upstream(receiver)}
        # The collector's credential: sent to the collector, and to nothing else.
        env = {**exporting_to(receiver), "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{COLLECTOR_TOKEN}"}
        async with open_stack(tmp_path, servers, env=env) as stack:
            calls = {}
            for mode in ("legacy", "auto"):
                trace_id, client_span, meta = client_context()
                async with stack.client("/mcp/direct", mode=mode) as client:
                    result = await client.call_tool("traced:echo", {"text": ARGUMENT}, meta=meta)
                    failed = await client.call_tool("traced:fail", {"message": FAILURE})
                assert not result.is_error and failed.is_error
                calls[mode] = (trace_id, client_span, result.meta[META_KEY])

            for mode, (trace_id, client_span, request_id) in calls.items():
                spans = await receiver.wait_for(lambda r, t=trace_id: len(r.trace(t)) >= 4 and r.trace(t))
                print(f"{mode}:\n{receiver.tree(trace_id)}")
                served = only(spans, role="frontend", name="tools/call traced:echo")
                call = only(spans, role="worker", name="tools/call echo")
                upstream = only(spans, service="upstream", name="tools/call echo")
                work = only(spans, service="upstream", name="work")
                # One tree: the client's span, the frontend serving it, the worker's call to the
                # upstream, the upstream's handling of it, its own work.
                assert (served.parent_id, served.kind) == (client_span, "SERVER")
                assert (call.parent_id, call.kind) == (served.span_id, "CLIENT")
                assert (upstream.parent_id, upstream.kind) == (call.span_id, "SERVER")
                assert work.parent_id == upstream.span_id
                # Named and attributed by the MCP conventions, and with mcpvisor's own names.
                assert served.attributes["mcp.method.name"] == call.attributes["mcp.method.name"] == "tools/call"
                assert served.attributes["gen_ai.tool.name"] == "traced:echo"
                assert call.attributes["gen_ai.tool.name"] == "echo"
                assert served.attributes["gen_ai.operation.name"] == call.attributes["gen_ai.operation.name"]
                assert (served.attributes["mcpvisor.server"], served.attributes["mcpvisor.via"]) == ("traced", "direct")
                assert served.attributes["mcpvisor.worker_id"] == "traced"
                assert call.attributes["mcp.protocol.version"] == upstream.attributes["mcp.protocol.version"]
                assert call.attributes["network.transport"] == "pipe"
                assert (call.attributes["mcpvisor.server"], call.attributes["mcpvisor.worker_id"]) == (
                    "traced",
                    "traced",
                )
                assert call.attributes["mcpvisor.request.id"] == request_id  # the activity log's row
                assert served.status == call.status == "UNSET"
                assert served.resource["mcpvisor.process.role"] == "frontend"
                assert call.resource["service.name"] == served.resource["service.name"] == "mcpvisor"
                assert call.resource["process.pid"] != served.resource["process.pid"]
                assert call.resource["mcpvisor.worker_id"] == "traced"
            legacy = only(receiver.trace(calls["legacy"][0]), role="frontend")
            assert legacy.attributes["mcp.protocol.version"] in ("2025-06-18", "2025-11-25")

            # A tool that fails is a tool_error, without its message (which may echo what it was sent);
            # and a call without a client trace starts one at the frontend.
            def failures_with_their_calls(r: Receiver) -> list[Received]:
                found = r.spans(lambda s: s.role == "frontend" and s.name == "tools/call traced:fail")
                complete = [f for f in found if any(s.role == "worker" for s in r.trace(f.trace_id))]
                return complete if len(complete) == 2 else []

            failures = await receiver.wait_for(failures_with_their_calls)
            for failure in failures:
                assert (failure.status, failure.attributes["error.type"], failure.parent_id) == (
                    "ERROR",
                    "tool_error",
                    "",
                )
                worker = only(receiver.trace(failure.trace_id), role="worker")
                assert (worker.parent_id, worker.attributes["error.type"]) == (failure.span_id, "tool_error")

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

            # The MCP conventions' duration histograms, through the same SDK: the server's at the
            # frontend, the client's at the worker.
            for metric, role in (
                ("mcp.server.operation.duration", "frontend"),
                ("mcp.client.operation.duration", "worker"),
            ):

                def calls_ok_and_failed(r: Receiver, metric: str = metric) -> list[Any]:
                    points = [p for p in r.points(metric) if p.attributes.get("mcp.method.name") == "tools/call"]
                    return points if {p.attributes.get("error.type") for p in points} >= {None, "tool_error"} else []

                points = await receiver.wait_for(calls_ok_and_failed, what=metric)
                assert points[0].unit == "s" and points[0].resource["mcpvisor.process.role"] == role

            everything = mcpvisors(receiver.spans())
            assert not [span.name for span in everything if ARGUMENT in span.text() or FAILURE in span.text()]
            assert not [span.name for span in everything if COLLECTOR_TOKEN in span.text()]
            # The MCP SDK's own spans (one per message, the worker's pings among them) stay off.
            assert not [span.name for span in everything if span.scope != "mcpvisor"]
            exports = [
                headers for headers in receiver.headers if headers["via"] == "http" and "authorization" in headers
            ]
            assert {headers["authorization"] for headers in exports} == {f"Bearer {COLLECTOR_TOKEN}"}

            # A hostile client's context: a forged log line in tracestate, baggage past every limit.
            hostile = {
                "traceparent": meta["traceparent"],
                "tracestate": "bad\r\nX-Forged: 1",
                "baggage": "k=" + "v" * 20_000,
            }
            async with stack.client("/mcp/direct") as client:
                seen = json.loads((await client.call_tool("traced:seen_context", {}, meta=hostile)).content[0].text)
                told = (await client.call_tool("traced:otel_environment", {})).structured_content
            # The upstream gets mcpvisor's own span as the parent, and nothing the propagators refused.
            assert seen["meta"]["traceparent"].startswith("00-") and seen["meta"]["traceparent"] != meta["traceparent"]
            assert seen["meta"]["tracestate"] is None and seen["meta"]["baggage"] is None
            for log in ("frontend.log", "traced.worker.log"):
                assert not [line for line in stack.log(log).splitlines() if line.startswith("X-Forged")]
            # The upstream sees the variables its own table gave it, never mcpvisor's.
            assert told == {"result": ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME"]}


POLICIES = """
@id("baseline")
permit(principal, action, resource);

@id("nobody-fails")
@reason("traced:fail is for no one")
forbid (principal, action == Action::"call", resource == Tool::"traced:fail");
"""


async def test_code_execution_calls_refused_calls_and_an_http_traceparent(tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        servers = {
            "traced": traced_upstream(receiver),
            "held": traced_upstream(receiver, "--name", "held") | {"quarantined": True},
        }
        settings = {"enable_code_execution": True}
        (tmp_path / "policies.cedar").write_text(POLICIES)
        tables = {"policy": {"files": ["policies.cedar"]}}
        async with open_stack(
            tmp_path, servers, env=exporting_to(receiver), settings=settings, wait_for=["traced"], tables=tables
        ) as stack:
            trace_id, client_span, meta = client_context()
            code = (
                "var a = call_tool('traced', 'echo', {text: input.text});\n"
                "var b = call_tool('held', 'echo', {text: input.text});\n"
                "[a.ok, b.ok, b.error.code]"
            )
            async with stack.client("/mcp") as client:
                ran = await client.call_tool("code_execution", {"code": code, "input": {"text": ARGUMENT}}, meta=meta)
            assert json.loads(ran.content[0].text)["value"] == [True, False, "QUARANTINED"]

            spans = await receiver.wait_for(lambda r: len(r.trace(trace_id)) >= 6 and r.trace(trace_id))
            print(receiver.tree(trace_id))
            served = only(spans, role="frontend", name="tools/call code_execution")
            assert (served.parent_id, served.kind) == (client_span, "SERVER")
            # Each call the script made is a child of code_execution's span.
            made = only(spans, role="frontend", name="tools/call traced:echo")
            assert (made.parent_id, made.kind, made.attributes["mcpvisor.via"]) == (
                served.span_id,
                "INTERNAL",
                "code_execution",
            )
            assert only(spans, role="worker", name="tools/call echo").parent_id == made.span_id
            # The refused one says why, and never reached a worker.
            refused = only(spans, role="frontend", name="tools/call held:echo")
            assert refused.parent_id == served.span_id and refused.status == "ERROR"
            assert refused.attributes["mcpvisor.gate.decision"] == "refused"
            assert (
                "gate",
                {"mcpvisor.gate.decision": "refused", "mcpvisor.gate.reason": "quarantine"},
            ) in refused.events
            assert not [s for s in spans if s.role == "worker" and s.attributes.get("mcpvisor.server") == "held"]

            # A client that sends its context as the HTTP header, not in _meta, is the parent all the same.
            header_trace, header_span, header = client_context()
            answer = await post(
                stack.direct_url, "tools/call", {"name": "traced:echo", "arguments": {"text": "h"}}, headers=header
            )
            assert "error" not in answer.text
            spans = await receiver.wait_for(lambda r: len(r.trace(header_trace)) >= 4 and r.trace(header_trace))
            assert only(spans, role="frontend", name="tools/call traced:echo").parent_id == header_span

            # A policy's refusal names the policy; a call let through names the policies that allowed it.
            _, _, meta = client_context()
            async with stack.client("/mcp/direct") as client:
                forbidden = await client.call_tool("traced:fail", {"message": ARGUMENT}, meta=meta)
            assert forbidden.is_error and "for no one" in forbidden.content[0].text
            refused = await receiver.wait_for_span(
                lambda s: s.role == "frontend" and s.name == "tools/call traced:fail"
            )
            assert (refused.status, refused.attributes["error.type"]) == ("ERROR", "refused")
            gate = {"mcpvisor.gate.decision": "refused", "mcpvisor.gate.reason": "policy"}
            assert [attributes for name, attributes in refused.events if name == "gate"] == [
                {**gate, "mcpvisor.policy.decision": "deny", "mcpvisor.policy.ids": ["nobody-fails"]}
            ]
            assert [name for name, _ in made.events] == ["gate"]
            assert made.events[0][1]["mcpvisor.gate.decision"] == "allowed"
            assert "baseline" in made.events[0][1]["mcpvisor.policy.ids"]

            everything = mcpvisors(receiver.spans())
            assert not [span.name for span in everything if ARGUMENT in span.text()]


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
                "headers": {"authorization": "Bearer ${env:COLLECTOR_TOKEN}"},
                "record_arguments": True,
            }
            env = {"OTEL_BSP_SCHEDULE_DELAY": "100", "COLLECTOR_TOKEN": COLLECTOR_TOKEN}
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
                # The table's header, its secret resolved, went to the collector with every export.
                exports = [headers for headers in receiver.headers if headers["via"] == "grpc"]
                assert exports and all(
                    headers.get("authorization") == f"Bearer {COLLECTOR_TOKEN}" for headers in exports
                )
        finally:
            upstream.send_signal(signal.SIGTERM)
            upstream.wait(10)


async def test_a_worker_killed_mid_call_is_an_exit_and_a_restart_and_a_killed_upstream_a_reconnect(
    tmp_path: Path,
) -> None:
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

            # The call's span at the frontend says the worker went away, in mcpvisor's words.
            served = await receiver.wait_for_span(lambda s: s.role == "frontend" and s.name == "tools/call traced:slow")
            assert (served.status, served.attributes["error.type"]) == ("ERROR", "upstream_gone")
            assert "stopped while the call was running" in served.status_message
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
            assert again.status == "UNSET" and again.attributes["mcpvisor.upstream.reconnect"] is False

            # An upstream that dies under a worker that stays: the worker reconnects, and says why.
            await stack.wait_ready(["traced"])
            async with stack.client("/mcp/direct") as client:
                upstream_pid = (await client.call_tool("traced:pid", {})).structured_content["result"]
            os.kill(upstream_pid, signal.SIGKILL)
            reconnect = await receiver.wait_for_span(
                lambda s: (
                    s.role == "worker" and s.name == "connect traced" and s.attributes["mcpvisor.upstream.reconnect"]
                )
            )
            assert reconnect.status == "UNSET"
            assert "killed by signal 9" in reconnect.attributes["mcpvisor.upstream.lost_reason"]


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
async def test_an_unreachable_collector_costs_no_call_and_is_one_log_line_and_a_count(
    tmp_path: Path, protocol: str
) -> None:
    closed = free_port()  # nothing listens there
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
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
