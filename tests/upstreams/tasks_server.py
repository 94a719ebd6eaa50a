"""An MCP server that offers the Tasks extension (`io.modelcontextprotocol/tasks`), as raw JSON-RPC.

`python tasks_server.py [--http PORT]`: stdio by default; with --http, plain JSON answers to POSTs
on 127.0.0.1:PORT/mcp (no SSE, so no questions to the client: `test_tool_with_task` needs stdio).

The Python SDK's server has no Tasks support, so this one speaks the wire itself: the handshake
era's initialize (as mcpvisor's worker uses it), with the extension declared under
`capabilities.extensions`. A task-supporting tool answers with a task (`resultType: "task"`) only
when the request's `_meta` clientCapabilities name the extension; otherwise it runs to the end
(`slow_compute`) or is refused with -32021 (`failing_job`, which requires a task). The tools are
the ones the conformance suite's tasks scenarios call for:

- `greet(name)`: sync only, `Hello, {name}!`.
- `slow_compute(seconds, label)`: sleeps, then answers; `tasks/cancel` settles it as cancelled.
- `failing_job()`: requires a task; completes with a tool error (`isError: true`).
- `protocol_error_job()`: a task that fails with a JSON-RPC error.
- `confirm_delete(filename)`: a task that waits for one elicitation answer (`tasks/update`).
- `multi_input()`: a task that waits for two answers at once.
- `test_tool_with_task()`: asks the client for `user_name` (elicitation/create, during the call),
  then answers with a task whose result greets that name.

`tasks/get`, `tasks/update` and `tasks/cancel` take the task id; an unknown one is -32602.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

import trio

TASKS = "io.modelcontextprotocol/tasks"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
TTL_MS = 600_000
POLL_MS = 100
INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601
MISSING_CAPABILITY = -32021

_ANY_OBJECT = {"type": "object", "properties": {}}
TOOLS = [
    {
        "name": "greet",
        "description": "Say hello (sync only).",
        "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
        "execution": {"taskSupport": "forbidden"},
    },
    {
        "name": "slow_compute",
        "description": "Sleep `seconds`, then answer with `label` (a task when the client accepts one).",
        "inputSchema": {
            "type": "object",
            "properties": {"seconds": {"type": "number"}, "label": {"type": "string"}},
        },
        "execution": {"taskSupport": "optional"},
    },
    {
        "name": "failing_job",
        "description": "A job that always reports a tool error (tasks only).",
        "inputSchema": _ANY_OBJECT,
        "execution": {"taskSupport": "required"},
    },
    {
        "name": "protocol_error_job",
        "description": "A job whose task fails with a protocol error.",
        "inputSchema": _ANY_OBJECT,
        "execution": {"taskSupport": "required"},
    },
    {
        "name": "confirm_delete",
        "description": "Ask for confirmation, then pretend to delete `filename`.",
        "inputSchema": {"type": "object", "properties": {"filename": {"type": "string"}}},
        "execution": {"taskSupport": "required"},
    },
    {
        "name": "multi_input",
        "description": "Ask two questions at once, then answer with both replies.",
        "inputSchema": _ANY_OBJECT,
        "execution": {"taskSupport": "required"},
    },
    {
        "name": "test_tool_with_task",
        "description": "Ask for a name during the call, then greet it from a task.",
        "inputSchema": _ANY_OBJECT,
        "execution": {"taskSupport": "required"},
    },
]
_TASK_TOOLS = {tool["name"]: tool["execution"]["taskSupport"] for tool in TOOLS}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def text_result(text: str, *, error: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if error:
        result["isError"] = True
    return result


def elicit(message: str, field: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {field: {"type": "boolean"}}, "required": [field]}
    return {"method": "elicitation/create", "params": {"message": message, "requestedSchema": schema}}


class Task:
    """One task: its status, and what it waits for or ended with."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.status = "working"
        self.created = self.updated = now()
        self.result: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.input_requests: dict[str, Any] = {}
        self.input_responses: dict[str, Any] = {}
        self.answered = trio.Event()
        self.cancel_scope = trio.CancelScope()

    def set(self, status: str) -> None:
        self.status = status
        self.updated = now()

    @property
    def terminal(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")

    def envelope(self) -> dict[str, Any]:
        return {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": self.created,
            "lastUpdatedAt": self.updated,
            "ttlMs": TTL_MS,
            "pollIntervalMs": POLL_MS,
        }

    def detailed(self) -> dict[str, Any]:
        found = {"resultType": "complete", **self.envelope()}
        if self.status == "completed" and self.result is not None:
            found["result"] = self.result
        elif self.status == "failed" and self.error is not None:
            found["error"] = self.error
        elif self.status == "input_required":
            found["inputRequests"] = dict(self.input_requests)
        return found

    async def ask(self, requests: dict[str, Any]) -> dict[str, Any]:
        """Park as input_required until every request has an answer; the answers."""
        self.input_requests.update(requests)
        self.set("input_required")
        while any(key not in self.input_responses for key in requests):
            self.answered = trio.Event()
            await self.answered.wait()
        self.set("working")
        return {key: self.input_responses.pop(key) for key in requests}


class TasksServer:
    def __init__(self, nursery: trio.Nursery, out: trio.abc.SendStream | None) -> None:
        self.nursery = nursery
        self.out = out
        self.lock = trio.Lock()
        self.tasks: dict[str, Task] = {}
        self.ids = itertools.count(1)
        self.asked = itertools.count(1)
        self.answers: dict[str, tuple[trio.Event, list[dict[str, Any]]]] = {}

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A request to the client (during a call); its answer (a result or an error object)."""
        request_id = f"ask-{next(self.asked)}"
        done, slot = self.answers[request_id] = (trio.Event(), [])
        try:
            await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            await done.wait()
        finally:
            del self.answers[request_id]
        return slot[0]

    async def send(self, message: dict[str, Any]) -> None:
        if self.out is None:
            raise RpcError(-32603, "this transport cannot send a request to the client")
        async with self.lock:
            await self.out.send_all(json.dumps(message).encode() + b"\n")

    async def handle(self, message: dict[str, Any]) -> None:
        response = await self.answer(message)
        if response is not None:
            await self.send(response)

    async def answer(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The response to a request; None for a notification or a client's answer."""
        if "method" not in message and (pending := self.answers.get(message.get("id"))) is not None:
            pending[1].append(message)
            pending[0].set()
            return None
        if "id" not in message or "method" not in message:
            return None  # notifications: nothing to do
        request_id, method, params = message["id"], message["method"], message.get("params") or {}
        try:
            result = await self.dispatch(method, params)
        except RpcError as exc:
            error: dict[str, Any] = {"code": exc.code, "message": exc.message}
            if exc.data is not None:
                error["data"] = exc.data
            return {"jsonrpc": "2.0", "id": request_id, "error": error}
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    async def dispatch(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        match method:
            case "initialize":
                return {
                    "protocolVersion": params.get("protocolVersion", "2025-11-25"),
                    "capabilities": {"tools": {}, "extensions": {TASKS: {}}},
                    "serverInfo": {"name": "tasks-server", "version": "1.0.0"},
                }
            case "ping":
                return {}
            case "tools/list":
                return {"tools": TOOLS}
            case "tools/call":
                return await self.call(params)
            case "tasks/get":
                return self.task(params).detailed()
            case "tasks/update":
                task = self.task(params)
                responses = params.get("inputResponses")
                if not isinstance(responses, dict):
                    raise RpcError(INVALID_PARAMS, "tasks/update needs inputResponses (an object)")
                for key, value in responses.items():
                    if key in task.input_requests:
                        del task.input_requests[key]
                        task.input_responses[key] = value
                task.answered.set()
                return {"resultType": "complete"}
            case "tasks/cancel":
                task = self.task(params)
                if not task.terminal:
                    task.set("cancelled")
                    task.cancel_scope.cancel()
                return {"resultType": "complete"}
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")

    def task(self, params: dict[str, Any]) -> Task:
        task = self.tasks.get(params.get("taskId"))  # type: ignore[arg-type]
        if task is None:
            raise RpcError(INVALID_PARAMS, f"Unknown task: {params.get('taskId')!r}")
        return task

    async def call(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        arguments = params.get("arguments") or {}
        if name == "greet":
            return text_result(f"Hello, {arguments.get('name', 'World')}!")
        if name not in _TASK_TOOLS:
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        meta = params.get("_meta") or {}
        extensions = (meta.get(CAPABILITIES_KEY) or {}).get("extensions") or {}
        if TASKS not in extensions:
            if _TASK_TOOLS[name] == "required":
                raise RpcError(
                    MISSING_CAPABILITY,
                    f"Tool '{name}' runs only as a task: declare the {TASKS} extension",
                    {"requiredCapabilities": {"extensions": {TASKS: {}}}},
                )
            return await self.slow_compute(arguments)
        if name == "test_tool_with_task":
            schema = {"type": "object", "properties": {"user_name": {"type": "string"}}, "required": ["user_name"]}
            answer = await self.ask("elicitation/create", {"message": "Your name?", "requestedSchema": schema})
            content = (answer.get("result") or {}).get("content") or {}
            arguments = {"user_name": content.get("user_name") or content.get("name") or "nobody"}
        task = Task(f"task-{next(self.ids)}")
        self.tasks[task.task_id] = task
        self.nursery.start_soon(self.run, task, name, arguments)
        return {"resultType": "task", **task.envelope()}

    async def slow_compute(self, arguments: dict[str, Any]) -> dict[str, Any]:
        seconds = arguments.get("seconds", 0)
        await trio.sleep(float(seconds) if isinstance(seconds, int | float) else 0)
        return text_result(f"computed {arguments.get('label', '')} after {seconds}s")

    async def run(self, task: Task, name: str, arguments: dict[str, Any]) -> None:
        with task.cancel_scope:
            if name == "slow_compute":
                task.result = await self.slow_compute(arguments)
            elif name == "failing_job":
                await trio.sleep(0.2)
                task.result = text_result("the job failed: nothing to do", error=True)
            elif name == "protocol_error_job":
                await trio.sleep(0.1)
                task.error = {"code": -32603, "message": "the job's backend is unavailable"}
                task.set("failed")
                return
            elif name == "confirm_delete":
                answers = await task.ask({"confirm": elicit(f"Delete {arguments.get('filename')}?", "confirm")})
                confirmed = (answers["confirm"].get("content") or {}).get("confirm") is True
                task.result = text_result(f"deleted {arguments.get('filename')}" if confirmed else "kept it")
            elif name == "multi_input":
                answers = await task.ask({"first": elicit("First?", "confirm"), "second": elicit("Second?", "confirm")})
                task.result = text_result(json.dumps(answers, sort_keys=True))
            elif name == "test_tool_with_task":
                task.result = text_result(f"Hello, {arguments['user_name']}!")
            task.set("completed")


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


async def serve_http(port: int) -> None:
    """Answer each POSTed JSON-RPC message with plain JSON; other methods and paths get 405 / 404."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    async with trio.open_nursery() as nursery:
        server = TasksServer(nursery, None)

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                while (event := await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
                return
            body = b""
            while True:
                event = await receive()
                body += event.get("body", b"")
                if not event.get("more_body"):
                    break
            status, answer = 404, b""
            if scope["path"] == "/mcp":
                status = 405
                if scope["method"] == "POST":
                    try:
                        response = await server.answer(json.loads(body))
                    except (json.JSONDecodeError, AttributeError):
                        response = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
                    status, answer = (202, b"") if response is None else (200, json.dumps(response).encode())
            headers = [(b"content-type", b"application/json")] if answer else []
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": answer})

        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        await serve(app, config)  # type: ignore[arg-type]


async def main() -> None:
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    stdout = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
    async with trio.open_nursery() as nursery:
        server = TasksServer(nursery, stdout)
        buffer = b""
        async for chunk in stdin:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except json.JSONDecodeError:
                    await server.send(
                        {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
                    )
                    continue
                if isinstance(message, dict):
                    nursery.start_soon(server.handle, message)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    options = parser.parse_args()
    if options.http:
        trio.run(serve_http, options.http)
    else:
        trio.run(main)
