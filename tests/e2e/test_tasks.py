"""The Tasks extension (`io.modelcontextprotocol/tasks`) through mcpvisor, to an upstream that offers it.

Given a stack with two upstreams that make tasks (tests/upstreams/tasks_server.py, both minting
`task-1`, `task-2`, ...), a 2026-07-28 client that declares the extension gets a task from a
task-supporting tool, polls it with tasks/get, answers it with tasks/update and stops it with
tasks/cancel, on `/mcp/servers/NAME` (the upstream's own ids) and on `/mcp/direct` (`server:id`).
A handle that this stack never handed out, or that another server made, is refused with -32602.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import tomli_w
import trio

from tests.e2e.test_tenants import add_token
from tests.support.stack import UPSTREAMS, free_port, open_stack, python_server, wait_listening

MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
TASKS_SERVER = python_server("tasks_server.py")
SETTINGS = {"enable_server_endpoints": True}
INVALID_PARAMS = -32602
MISSING_CAPABILITY = -32021


def client_meta(*, tasks: bool) -> dict[str, Any]:
    capabilities = {"extensions": {TASKS: {}}} if tasks else {}
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "tasks-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }


async def rpc(
    url: str, method: str, params: dict[str, Any] | None = None, *, tasks: bool = True, token: str = ""
) -> dict[str, Any]:
    """One 2026-07-28 request with its routing headers; the JSON-RPC response (result or error)."""
    params = {**(params or {}), "_meta": client_meta(tasks=tasks)}
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": MODERN, "mcp-method": method}
    if token:
        headers["authorization"] = f"Bearer {token}"
    named = params.get("name") or params.get("taskId")
    if named is not None:
        headers["mcp-name"] = str(named)
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await http.post(
            url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=headers
        )
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return response.json()


def result_of(message: dict[str, Any]) -> dict[str, Any]:
    assert "result" in message, message
    return message["result"]


def error_of(message: dict[str, Any]) -> dict[str, Any]:
    assert "error" in message, message
    return message["error"]


async def settled(
    url: str, task_id: str, until: tuple[str, ...] = ("completed", "failed", "cancelled")
) -> dict[str, Any]:
    """Poll tasks/get until the task reaches one of `until`; its last state."""
    with trio.fail_after(20):
        while True:
            task = result_of(await rpc(url, "tasks/get", {"taskId": task_id}))
            assert task["taskId"] == task_id
            if task["status"] in until:
                return task
            await trio.sleep(0.05)


async def run_task_round_trip(url: str, prefix: str) -> None:
    """A task made, polled, answered and cancelled at `url`, whose handles start with `prefix`."""
    created = result_of(
        await rpc(url, "tools/call", {"name": f"{prefix}slow_compute", "arguments": {"seconds": 0.3, "label": "a"}})
    )
    assert created["resultType"] == "task" and created["status"] == "working", created
    assert created["taskId"].startswith(prefix) and "result" not in created
    done = await settled(url, created["taskId"])
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "computed a after 0.3s"

    # A task that waits for an answer: input_required, then tasks/update resumes it.
    created = result_of(
        await rpc(url, "tools/call", {"name": f"{prefix}confirm_delete", "arguments": {"filename": "x.txt"}})
    )
    waiting = await settled(url, created["taskId"], ("input_required",))
    assert list(waiting["inputRequests"]) == ["confirm"]
    assert waiting["inputRequests"]["confirm"]["method"] == "elicitation/create"
    answer = {"confirm": {"action": "accept", "content": {"confirm": True}}}
    ack = result_of(await rpc(url, "tasks/update", {"taskId": created["taskId"], "inputResponses": answer}))
    assert ack["resultType"] == "complete" and "taskId" not in ack and "status" not in ack
    done = await settled(url, created["taskId"])
    assert done["result"]["content"][0]["text"] == "deleted x.txt"

    # A long task cancelled: an empty ack, then tasks/get sees it cancelled.
    created = result_of(await rpc(url, "tools/call", {"name": f"{prefix}slow_compute", "arguments": {"seconds": 60}}))
    ack = result_of(await rpc(url, "tasks/cancel", {"taskId": created["taskId"]}))
    assert ack["resultType"] == "complete" and "status" not in ack
    assert (await settled(url, created["taskId"]))["status"] == "cancelled"

    # A tool error completes the task with isError; a protocol error fails it with an error.
    created = result_of(await rpc(url, "tools/call", {"name": f"{prefix}failing_job", "arguments": {}}))
    done = await settled(url, created["taskId"])
    assert done["status"] == "completed" and done["result"]["isError"] is True
    created = result_of(await rpc(url, "tools/call", {"name": f"{prefix}protocol_error_job", "arguments": {}}))
    done = await settled(url, created["taskId"])
    assert done["status"] == "failed" and done["error"]["code"] == -32603 and "result" not in done

    # Without the extension declared: the same tool answers at once, a task-only tool is refused,
    # and tasks/* are refused, all with the missing capability named.
    plain = result_of(
        await rpc(url, "tools/call", {"name": f"{prefix}slow_compute", "arguments": {"seconds": 0}}, tasks=False)
    )
    assert plain["resultType"] == "complete" and "taskId" not in plain and plain["content"]
    refused = error_of(await rpc(url, "tools/call", {"name": f"{prefix}failing_job", "arguments": {}}, tasks=False))
    assert refused["code"] == MISSING_CAPABILITY, refused
    refused = error_of(await rpc(url, "tasks/get", {"taskId": done["taskId"]}, tasks=False))
    assert refused["code"] == MISSING_CAPABILITY and TASKS in refused["message"], refused


async def test_a_task_round_trip_through_the_server_endpoint_and_direct(tmp_path: Path) -> None:
    servers = {"jobs": TASKS_SERVER, "other": TASKS_SERVER}
    async with open_stack(tmp_path, servers, settings=SETTINGS) as stack:
        jobs, other = f"{stack.base_url}/mcp/servers/jobs", f"{stack.base_url}/mcp/servers/other"
        direct = stack.direct_url

        # Both endpoints offer the extension (and not the 2025-11-25 `tasks` capability).
        for url in (jobs, direct):
            capabilities = result_of(await rpc(url, "server/discover"))["capabilities"]
            assert TASKS in capabilities.get("extensions", {}) and "tasks" not in capabilities, (url, capabilities)

        # `other` mints task-1 first; on jobs' endpoint that handle is another server's: unknown.
        theirs = result_of(await rpc(other, "tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}}))
        assert theirs["taskId"] == "task-1"
        refused = error_of(await rpc(jobs, "tasks/get", {"taskId": theirs["taskId"]}))
        assert refused["code"] == INVALID_PARAMS and "Unknown task 'task-1'" in refused["message"], refused
        refused = error_of(await rpc(jobs, "tasks/cancel", {"taskId": "no-such-task"}))
        assert refused["code"] == INVALID_PARAMS and "Unknown task" in refused["message"], refused

        await run_task_round_trip(jobs, "")
        await run_task_round_trip(direct, "jobs:")

        # On /mcp/direct a handle names its server; `other`'s task-1 is reached as other:task-1,
        # and a bare id, an unknown server or an id never handed out are refused.
        assert (await settled(direct, "other:task-1", ("working",)))["taskId"] == "other:task-1"
        result_of(await rpc(direct, "tasks/cancel", {"taskId": "other:task-1"}))
        assert (await settled(other, "task-1"))["status"] == "cancelled"
        for handle in ("task-1", "nosuch:task-1", "other:task-99"):
            refused = error_of(await rpc(direct, "tasks/get", {"taskId": handle}))
            assert refused["code"] == INVALID_PARAMS and f"Unknown task '{handle}'" in refused["message"], refused


async def test_a_handshake_era_client_gets_results_not_tasks(tmp_path: Path) -> None:
    async with (
        open_stack(tmp_path, {"jobs": TASKS_SERVER}, settings=SETTINGS) as stack,
        stack.client("/mcp/servers/jobs", mode="legacy") as client,
    ):
        # The extension is defined for 2026-07-28: not offered here, so the tool runs to the end.
        assert TASKS not in (client.server_capabilities.extensions or {})
        result = await client.call_tool("slow_compute", {"seconds": 0.1, "label": "old"})
        assert not result.is_error and result.content[0].text == "computed old after 0.1s"


async def test_a_tenants_task_handle_is_unknown_to_another_tenant(tmp_path: Path) -> None:
    """alice and bob each have their own `jobs` (own worker, own upstream): both mint jobs:task-1."""
    tenants = {"alice": {"servers": ["jobs"]}, "bob": {"servers": ["jobs"]}}
    config = tmp_path / "mcpvisor.toml"
    settings = {"data_dir": str(tmp_path / "data")}
    config.write_text(tomli_w.dumps({"mcpvisor": settings, "servers": {"jobs": TASKS_SERVER}, "tenants": tenants}))
    tokens = {tenant: add_token(config, tenant) for tenant in tenants}
    async with open_stack(
        tmp_path, {"jobs": TASKS_SERVER}, settings=SETTINGS, wait_for=[], tables={"tenants": tenants}
    ) as stack:
        direct = stack.direct_url

        async def make_task(tenant: str) -> str:
            # A tenant's worker starts on its first request; until it is up its tools are not listed.
            with trio.fail_after(60):
                while True:
                    answer = await rpc(
                        direct,
                        "tools/call",
                        {"name": "jobs:slow_compute", "arguments": {"seconds": 60}},
                        token=tokens[tenant],
                    )
                    if "result" in answer:
                        return answer["result"]["taskId"]
                    await trio.sleep(0.5)

        alices = await make_task("alice")
        assert alices == "jobs:task-1"
        refused = error_of(await rpc(direct, "tasks/get", {"taskId": alices}, token=tokens["bob"]))
        assert refused["code"] == INVALID_PARAMS and "Unknown task 'jobs:task-1'" in refused["message"], refused
        refused = error_of(await rpc(direct, "tasks/cancel", {"taskId": alices}, token=tokens["bob"]))
        assert refused["code"] == INVALID_PARAMS, refused
        # alice's task was not touched; bob's own task-1 is his alone, and cancelling it leaves hers running.
        bobs = await make_task("bob")
        assert bobs == "jobs:task-1"
        result_of(await rpc(direct, "tasks/cancel", {"taskId": bobs}, token=tokens["bob"]))
        mine = result_of(await rpc(direct, "tasks/get", {"taskId": alices}, token=tokens["alice"]))
        assert mine["status"] == "working", mine
        theirs = result_of(await rpc(direct, "tasks/get", {"taskId": bobs}, token=tokens["bob"]))
        assert theirs["status"] == "cancelled", theirs


@asynccontextmanager
async def tasks_server_over_http(log_dir: Path) -> AsyncIterator[str]:
    """tests/upstreams/tasks_server.py on streamable HTTP; yields its URL, stops it afterwards."""
    port = free_port()
    with open(log_dir / "tasks-server.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(UPSTREAMS / "tasks_server.py"), "--http", str(port)],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        await wait_listening(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_a_task_round_trip_to_an_upstream_over_streamable_http(tmp_path: Path) -> None:
    """The worker's SDK session (not its raw stdio channel) carries tools/call and tasks/* here."""
    async with (
        tasks_server_over_http(tmp_path) as upstream,
        open_stack(tmp_path, {"jobs": {"url": upstream, "transport": "streamable-http"}}, settings=SETTINGS) as stack,
    ):
        await run_task_round_trip(f"{stack.base_url}/mcp/servers/jobs", "")
        await run_task_round_trip(stack.direct_url, "jobs:")
