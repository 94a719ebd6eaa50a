"""The `code_execution` tool's frontend half: argument rules, stored scripts, and the sandbox processes.

`execute_code(arguments, call_tool, ...)` runs one request. Every tool call the script makes goes
through the injected `call_tool(server, tool, args, intent)` callback (the frontend binds it to the
door that owns catalog, routing, visibility, the quarantine/pinning gate and the activity record)
and answers `(True, CallToolResult dict)` or `(False, {"code", "message"})`.

The destructive-hint rule: the outer request's `intent` object is passed unchanged to every inner
call. A tool whose annotations say `destructiveHint: true` may run only if that intent declares
`operation_type: "destructive"`; the callback applies it with `destructive_refusal()` before
routing, so a script can never do more than its caller declared.

Scripts run in sandbox processes (`python -m mcpvisor.workers.sandbox`, V8), one run per process at
a time, a few kept warm in a `SandboxPool`. A run that overstays its timeout, or whose process dies
(a V8 heap blow-up ends the process), costs that process only; the next run gets a fresh one.
Each process runs inside bubblewrap as well (runtime.script_runner): no network, no view of the host,
so a script that escaped V8 would still reach nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from mcpvisor.frontend.door.upstreams import UNAVAILABLE, NotFound, Refused, UpstreamError, Upstreams
from mcpvisor.runtime import lifetime, script_runner

CODE_EXECUTION_TOOL = "code_execution"
SCRIPT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_SCRIPT_BYTES = 256 * 1024
MAX_INLINE_CODE = 1024 * 1024
MAX_BATCH = 100
MAX_LINE = 64 * 1024 * 1024  # the largest message a sandbox may send (its value, or a batch of calls)
DEFAULT_HEAP_MB = 256
DEFAULT_POOL_SIZE = 2
REFUSED = (
    "code_execution cannot run here: its sandbox cannot be built on this host, and without one scripts are"
    " refused (the operator's log and `mcpvisor check` say why)"
)
KILL_GRACE = 2.0  # the sandbox stops a late script itself; past its timeout plus this, the process is killed

log = logging.getLogger(__name__)

CallTool = Callable[[str, str, dict[str, Any], "dict[str, Any] | None"], Awaitable[tuple[bool, Any]]]

DESCRIPTION = (
    "Execute JavaScript (or TypeScript) to orchestrate several tools in one request. Provide exactly one of "
    "`code` (inline source) or `script` (the name of a stored script). Inside the code: "
    "`call_tool(server, tool, args)` returns {ok: true, result} or {ok: false, error: {code, message}}; "
    "`call_tools([{server, tool, args}, ...], {max_parallel})` runs up to 100 independent calls in parallel and "
    "returns one such slot per request, in order; `log(message)` adds a log line; `input` holds the input object. "
    "Both calls are synchronous (no await). The value of the last expression is the result. No file system, "
    "network or environment access. A tool marked destructive runs only if `intent.operation_type` is "
    "'destructive'."
)

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "Inline JavaScript or TypeScript source."},
        "script": {"type": "string", "description": "Name of a stored script (scripts/NAME.js or NAME.ts)."},
        "language": {"type": "string", "enum": ["javascript", "typescript"], "default": "javascript"},
        "input": {"type": "object", "description": "Available to the code as `input`."},
        "intent": {
            "type": "object",
            "description": "What the code will do; operation_type 'destructive' is needed for destructive tools.",
            "properties": {
                "operation_type": {"type": "string", "enum": ["read", "write", "destructive"]},
                "data_sensitivity": {"type": "string"},
                "reason": {"type": "string"},
            },
        },
    },
}


def tool_definition() -> dict[str, Any]:
    """The MCP tool definition listed when `enable_code_execution` is true."""
    return {"name": CODE_EXECUTION_TOOL, "description": DESCRIPTION, "inputSchema": INPUT_SCHEMA}


def destructive_refusal(annotations: Mapping[str, Any] | None, intent: Mapping[str, Any] | None) -> dict | None:
    """The error for an inner call to a destructive tool that the caller's intent did not declare, else None."""
    if not annotations or annotations.get("destructiveHint") is not True:
        return None
    if isinstance(intent, Mapping) and intent.get("operation_type") == "destructive":
        return None
    return {
        "code": "DESTRUCTIVE_NOT_DECLARED",
        "message": "this tool is marked destructive: call code_execution with intent.operation_type 'destructive'"
        " to let the code run it",
    }


@dataclass(frozen=True)
class Limits:
    timeout_ms: int = 120000
    max_tool_calls: int = 0  # 0: unlimited
    max_parallel: int = 8

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        return cls(
            timeout_ms=settings.code_execution_timeout_ms,
            max_tool_calls=settings.code_execution_max_tool_calls,
            max_parallel=settings.code_execution_max_parallel,
        )


@dataclass
class Outcome:
    """One run's answer: `text` is the JSON the tool returns; `is_error` marks a failed run."""

    is_error: bool
    text: str
    tool_calls: int = 0

    @property
    def data(self) -> dict[str, Any]:
        return json.loads(self.text)

    def tool_result(self) -> dict[str, Any]:
        """The `CallToolResult` of the code_execution tool: the JSON text, `isError` for a failed run."""
        return {"content": [{"type": "text", "text": self.text}], "isError": self.is_error, "resultType": "complete"}


class CodeExecutionError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _json_text(value: Any) -> str:
    """Compact JSON that keeps non-ASCII text as is (escaping would multiply its size), unless it holds
    lone surrogates, which only escapes can carry."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":"))
    return text


def _failure(code: str, message: str, logs: list[str] | None = None, tool_calls: int = 0) -> Outcome:
    body = {"ok": False, "error": {"code": code, "message": message}, "logs": logs or []}
    return Outcome(True, json.dumps(body), tool_calls)


# -- stored scripts ---------------------------------------------------------------------------------


def scripts_dir_for(config_path: str | os.PathLike[str] | None) -> Path | None:
    """`scripts/` beside the config file; None when there is no config file."""
    return Path(config_path).parent / "scripts" if config_path else None


def available_scripts(scripts_dir: Path | None) -> list[str]:
    """Names of the runnable scripts (regular .js/.ts files with a valid name), sorted."""
    if scripts_dir is None:
        return []
    try:
        entries = list(os.scandir(scripts_dir))
    except OSError:
        return []
    names: dict[str, int] = {}
    for entry in entries:
        stem, dot, ext = entry.name.rpartition(".")
        if dot and ext in ("js", "ts") and SCRIPT_NAME.match(stem) and entry.is_file(follow_symlinks=False):
            names[stem] = names.get(stem, 0) + 1
    return sorted(name for name, count in names.items() if count == 1)


def load_script(scripts_dir: Path | None, name: Any, language: str | None) -> tuple[str, str]:
    """The source and language of stored script NAME; CodeExecutionError for any problem."""
    if not isinstance(name, str) or not SCRIPT_NAME.match(name):
        raise CodeExecutionError(
            "INVALID_INPUT", "script must be a bare name of 1-64 letters, digits, '_' or '-' (no path, no extension)"
        )
    if scripts_dir is None:
        raise CodeExecutionError("SCRIPT_NOT_FOUND", "stored scripts need a config file: there is no scripts folder")
    found = []
    for ext in ("js", "ts"):
        try:
            info = os.lstat(scripts_dir / f"{name}.{ext}")
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise CodeExecutionError("SCRIPT_INVALID", f"script {name}.{ext} cannot be read: {exc.strerror}") from None
        found.append((ext, info))
    if not found:
        names = available_scripts(scripts_dir)
        shown = ", ".join(names[:20]) if names else "none"
        more = f" (first 20 of {len(names)})" if len(names) > 20 else ""
        raise CodeExecutionError("SCRIPT_NOT_FOUND", f"no stored script named {name!r}; available{more}: {shown}")
    if len(found) > 1:
        raise CodeExecutionError("SCRIPT_AMBIGUOUS", f"both {name}.js and {name}.ts exist: remove one")
    ext, info = found[0]
    script_language = "typescript" if ext == "ts" else "javascript"
    if language is not None and language != script_language:
        raise CodeExecutionError("INVALID_INPUT", f"script {name}.{ext} is {script_language}, not {language}")
    if stat.S_ISLNK(info.st_mode):
        raise CodeExecutionError("SCRIPT_INVALID", f"script {name}.{ext} is a symbolic link; only regular files run")
    if not stat.S_ISREG(info.st_mode):
        raise CodeExecutionError("SCRIPT_INVALID", f"script {name}.{ext} is not a regular file")
    try:
        # O_NOFOLLOW: a symlink swapped in after the check above is refused here, not followed.
        fd = os.open(scripts_dir / f"{name}.{ext}", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise CodeExecutionError("SCRIPT_INVALID", f"script {name}.{ext} cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise CodeExecutionError("SCRIPT_INVALID", f"script {name}.{ext} is not a regular file")
        if size == 0 or size > MAX_SCRIPT_BYTES:
            raise CodeExecutionError(
                "SCRIPT_INVALID", f"script {name}.{ext} must be 1 byte to 256 KB, it is {size} bytes"
            )
        data = f.read(MAX_SCRIPT_BYTES + 1)
    if len(data) > MAX_SCRIPT_BYTES:
        raise CodeExecutionError("SCRIPT_INVALID", f"script {name}.{ext} is larger than 256 KB")
    try:
        return data.decode("utf-8"), script_language
    except UnicodeDecodeError:
        raise CodeExecutionError("SCRIPT_INVALID", f"script {name}.{ext} is not UTF-8 text") from None


def parse_arguments(arguments: Mapping[str, Any], scripts_dir: Path | None) -> tuple[str, str, dict, dict | None]:
    """(source, language, input, intent) from the tool's arguments; CodeExecutionError when they are wrong."""
    allowed = {"code", "script", "language", "input", "intent"}
    if unknown := sorted(set(arguments) - allowed):
        raise CodeExecutionError("INVALID_INPUT", f"unknown argument(s): {', '.join(unknown)}")
    has_code, has_script = arguments.get("code") is not None, arguments.get("script") is not None
    if has_code == has_script:
        raise CodeExecutionError("INVALID_INPUT", "provide exactly one of `code` (inline source) or `script` (a name)")
    language = arguments.get("language")
    if language is not None and language not in ("javascript", "typescript"):
        raise CodeExecutionError("INVALID_INPUT", "language must be 'javascript' or 'typescript'")
    input_value = arguments.get("input")
    if input_value is None:
        input_value = {}
    if not isinstance(input_value, dict):
        raise CodeExecutionError("INVALID_INPUT", "input must be an object")
    intent = arguments.get("intent")
    if intent is not None and not isinstance(intent, dict):
        raise CodeExecutionError("INVALID_INPUT", "intent must be an object")
    if has_code:
        code = arguments["code"]
        if not isinstance(code, str) or not code.strip():
            raise CodeExecutionError("INVALID_INPUT", "code must be a non-empty string")
        if len(code) > MAX_INLINE_CODE:
            raise CodeExecutionError("INVALID_INPUT", "code is larger than 1 MB: use a stored script")
        return code, language or "javascript", input_value, intent
    source, script_language = load_script(scripts_dir, arguments["script"], language)
    return source, script_language, input_value, intent


# -- the sandbox processes --------------------------------------------------------------------------


class SandboxDied(Exception):
    """The sandbox process ended or broke the protocol in the middle of a run."""


class SandboxProcess:
    """One sandbox child: JSON lines over its stdin/stdout."""

    def __init__(self, child: lifetime.Child) -> None:
        self._child = child
        self._buffer = bytearray()
        self.pid = child.pid
        self.broken = False

    @classmethod
    async def start(
        cls,
        heap_mb: int = DEFAULT_HEAP_MB,
        python: str = sys.executable,
        decision: script_runner.Decision | None = None,
    ) -> SandboxProcess:
        """Start one process, inside bwrap when `decision` says so (None: as it is, V8 alone)."""
        command = [python, "-m", script_runner.MODULE, "--heap-mb", str(heap_mb)]
        fds: tuple[int, ...] = ()
        if decision is not None and decision.confined:
            (argv, fds), env = decision.launch(command), script_runner.environment(python)
        else:
            # No inherited environment: the script cannot see it anyway, and the process needs none of it.
            argv, env = command, {"PATH": os.defpath, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            child = lifetime.spawn(argv, env=env, cwd="/", stdin_pipe=True, stdout_pipe=True, pass_fds=fds)
        except OSError as exc:
            raise SandboxDied(f"the code_execution sandbox cannot be started: {exc.strerror or exc}") from None
        finally:
            for fd in fds:
                os.close(fd)
        process = cls(child)
        try:
            with trio.fail_after(30):
                ready = await process.receive()
        except (SandboxDied, trio.TooSlowError):
            await process.kill()
            raise SandboxDied("the code_execution sandbox did not start") from None
        if ready.get("op") != "ready":
            await process.kill()
            raise SandboxDied("the code_execution sandbox did not start")
        return process

    async def send(self, message: dict[str, Any]) -> None:
        assert self._child.stdin is not None
        try:
            await self._child.stdin.send_all(_json_text(message).encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.broken = True
            raise SandboxDied("the code_execution sandbox process has ended") from None

    async def receive(self) -> dict[str, Any]:
        assert self._child.stdout is not None
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                try:
                    message = json.loads(line)
                except ValueError:
                    self.broken = True
                    raise SandboxDied("the code_execution sandbox sent a malformed message") from None
                if isinstance(message, dict):
                    return message
                continue
            if len(self._buffer) > MAX_LINE:
                self.broken = True
                raise SandboxDied("the code_execution sandbox sent a message larger than 64 MB")
            try:
                chunk = await self._child.stdout.receive_some(1 << 20)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            if not chunk:
                self.broken = True
                raise SandboxDied("the code_execution sandbox process has ended")
            self._buffer += chunk

    async def kill(self) -> None:
        self.broken = True
        self._child.send_signal_to_group(9)
        with trio.move_on_after(5):
            await self._child.wait()
        for stream in (self._child.stdin, self._child.stdout):
            if stream is not None:
                await stream.aclose()

    async def aclose(self) -> None:
        """Close stdin (the sandbox exits on EOF), then make sure it is gone."""
        if self._child.stdin is not None:
            await self._child.stdin.aclose()
        with trio.move_on_after(2):
            await self._child.wait()
        await self.kill()


@dataclass(frozen=True)
class Confinement:
    """Whether the pool's processes run inside bwrap (`enabled`), and what the sandbox must respect.

    `required`: refuse to run scripts at all when the sandbox cannot be built (tenants, or
    `[mcpvisor] sandbox` on); otherwise they run in V8 alone, with a warning. `hidden`: host paths
    never shown (runtime.script_runner.hidden_paths).
    """

    enabled: bool = True
    required: bool = False
    hidden: tuple[str, ...] = ()


@dataclass
class SandboxPool:
    """Up to `size` sandbox processes, each running one script at a time; idle ones are kept warm."""

    size: int = DEFAULT_POOL_SIZE
    heap_mb: int = DEFAULT_HEAP_MB
    python: str = sys.executable
    confinement: Confinement = Confinement()
    _idle: list[SandboxProcess] = field(default_factory=list)
    _slots: trio.Semaphore | None = None
    _decision: script_runner.Decision | None = None
    started: int = 0  # processes started so far (a respawn after a crash or timeout counts)

    def _semaphore(self) -> trio.Semaphore:
        if self._slots is None:
            self._slots = trio.Semaphore(self.size)
        return self._slots

    async def decision(self) -> script_runner.Decision | None:
        """How this pool's processes start: found out once (a probe run of bwrap), then kept."""
        if not self.confinement.enabled:
            return None
        if self._decision is None:
            decision = await trio.to_thread.run_sync(
                lambda: script_runner.decide(self.python, self.confinement.hidden, required=self.confinement.required)
            )
            if self._decision is None:
                self._decision = decision
                if decision.warning is not None:
                    log.warning("%s", decision.warning)
        return self._decision

    async def acquire(self) -> SandboxProcess:
        await self._semaphore().acquire()
        try:
            if self._idle:
                return self._idle.pop()
            decision = await self.decision()
            if decision is not None and decision.refused:
                # The reason (logged when found) may name host paths: the client gets none of it.
                raise SandboxDied(REFUSED)
            self.started += 1
            return await SandboxProcess.start(self.heap_mb, self.python, decision)
        except BaseException:
            self._semaphore().release()
            raise

    async def release(self, process: SandboxProcess) -> None:
        try:
            if process.broken:
                await process.kill()
            else:
                self._idle.append(process)
        finally:
            self._semaphore().release()

    async def warm(self) -> None:
        """Start one process ahead of the first run (a start takes about a second)."""
        await self.release(await self.acquire())

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for process in idle:
            await process.aclose()


# -- one run ----------------------------------------------------------------------------------------


def _slot(ok: bool, payload: Any) -> dict[str, Any]:
    """A call's answer as the script sees it; an upstream tool error (`isError`) is a failed slot."""
    if ok:
        if isinstance(payload, dict) and payload.get("isError") is True:
            texts = [c.get("text", "") for c in payload.get("content") or [] if isinstance(c, dict)]
            message = " ".join(t for t in texts if t) or "the tool reported an error"
            return {"ok": False, "error": {"code": "TOOL_ERROR", "message": message, "result": payload}}
        return {"ok": True, "result": payload}
    if isinstance(payload, dict) and "message" in payload:
        code = str(payload.get("code", "CALL_FAILED"))
        return {"ok": False, "error": {"code": code, "message": str(payload["message"])}}
    return {"ok": False, "error": {"code": "CALL_FAILED", "message": str(payload)}}


async def _run_batch(
    requests: list[dict[str, Any]], max_parallel: int, call_tool: CallTool, intent: dict | None
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = [{}] * len(requests)
    limiter = trio.CapacityLimiter(max(1, min(32, max_parallel)))

    async def one(index: int, request: dict[str, Any]) -> None:
        async with limiter:
            ok, payload = await call_tool(request["server"], request["tool"], request.get("args") or {}, intent)
        results[index] = _slot(ok, payload)

    async with trio.open_nursery() as nursery:
        for index, request in enumerate(requests):
            nursery.start_soon(one, index, request)
    return results


def _well_formed(requests: Any) -> bool:
    return (
        isinstance(requests, list)
        and 0 < len(requests) <= MAX_BATCH
        and all(
            isinstance(r, dict)
            and isinstance(r.get("server"), str)
            and isinstance(r.get("tool"), str)
            and isinstance(r.get("args", {}), dict)
            for r in requests
        )
    )


async def execute_code(
    arguments: Mapping[str, Any],
    call_tool: CallTool,
    *,
    pool: SandboxPool,
    limits: Limits = Limits(),
    scripts_dir: Path | None = None,
) -> Outcome:
    """Run one `code_execution` request; every failure is an Outcome with `is_error`, never an exception."""
    try:
        source, language, input_value, intent = parse_arguments(arguments, scripts_dir)
    except CodeExecutionError as exc:
        return _failure(exc.code, exc.message)
    try:
        process = await pool.acquire()
    except SandboxDied as exc:
        return _failure("SANDBOX_UNAVAILABLE", str(exc))
    calls = 0
    try:
        await process.send(
            {
                "op": "run",
                "id": 1,
                "code": source,
                "language": language,
                "input": input_value,
                "timeout_ms": limits.timeout_ms,
                "max_parallel": limits.max_parallel,
            }
        )
        # The sandbox stops a script at timeout_ms itself; this outer limit is for a process that cannot.
        with trio.move_on_after(limits.timeout_ms / 1000 + KILL_GRACE) as deadline:
            while True:
                message = await process.receive()
                if message.get("op") == "done":
                    break
                if message.get("op") != "calls":
                    continue
                requests = message.get("requests")
                reply: dict[str, Any] = {"op": "reply", "id": 1, "call": message.get("call")}
                if not _well_formed(requests):
                    reply["abort"] = {"message": "the sandbox sent a malformed call batch"}
                elif limits.max_tool_calls and calls + len(requests) > limits.max_tool_calls:
                    reply["abort"] = {
                        "message": f"too many tool calls: the limit is {limits.max_tool_calls} per run"
                        " (code_execution_max_tool_calls)"
                    }
                else:
                    calls += len(requests)
                    parallel = message.get("max_parallel")
                    parallel = parallel if isinstance(parallel, int) else limits.max_parallel
                    reply["results"] = await _run_batch(requests, parallel, call_tool, intent)
                await process.send(reply)
        if deadline.cancelled_caught:
            await process.kill()
            return _failure(
                "TIMEOUT", f"the code ran longer than {limits.timeout_ms} ms and its sandbox was stopped", [], calls
            )
    except SandboxDied as exc:
        await process.kill()
        return _failure(
            "SANDBOX_CRASHED",
            f"{exc}: the code most likely exhausted the sandbox's memory; a fresh sandbox serves the next run",
            [],
            calls,
        )
    except BaseException:
        await process.kill()
        raise
    finally:
        await pool.release(process)
    logs = [str(line) for line in message.get("logs") or []]
    if not message.get("ok"):
        error = message.get("error") or {}
        code, text = str(error.get("code", "RUNTIME_ERROR")), str(error.get("message", "the code failed"))
        return _failure(code, text, logs, calls)
    try:
        value = json.loads(message.get("value", "null"))
    except ValueError:
        return _failure("SERIALIZATION_ERROR", "the code's value was not valid JSON", logs, calls)
    if isinstance(value, float) and not math.isfinite(value):
        value = None
    return Outcome(False, _json_text({"ok": True, "value": value, "logs": logs}), calls)


# -- bound to the door ------------------------------------------------------------------------------


def door_callback(upstreams: Upstreams) -> CallTool:
    """Inner calls through the door: the same lookup, gate, pins and activity record as call_tool_*.

    A destructive tool runs only when the outer intent declares `operation_type: destructive`.
    """

    async def call_tool(
        server: str, tool: str, args: dict[str, Any], intent: dict[str, Any] | None
    ) -> tuple[bool, Any]:
        try:
            target = upstreams.find_tool(f"{server}:{tool}", quarantined=True)
        except NotFound as exc:
            return False, {
                "code": "TOOL_UNAVAILABLE" if exc.code == UNAVAILABLE else "TOOL_NOT_FOUND",
                "message": exc.message,
            }
        destructive = isinstance(intent, dict) and intent.get("operation_type") == "destructive"
        params = {"name": target.tool, "arguments": args}
        try:
            result = await upstreams.call_tool(
                target, params, None, via=CODE_EXECUTION_TOOL, intent=intent, destructive=destructive
            )
        except Refused as refused:
            texts = [c.get("text", "") for c in refused.answer.get("content") or [] if isinstance(c, dict)]
            if target.quarantined:
                code = "QUARANTINED"
            elif target.destructive and not destructive:
                code = "DESTRUCTIVE_NOT_DECLARED"
            else:
                code = "REFUSED"  # e.g. the tool changed since it was approved
            return False, {"code": code, "message": " ".join(t for t in texts if t) or "the call was refused"}
        except UpstreamError as exc:
            return False, {"code": "UPSTREAM_ERROR", "message": exc.message}
        if isinstance(result, bytes):
            try:
                return True, json.loads(result)
            except ValueError:
                return False, {"code": "UPSTREAM_ERROR", "message": f"tool '{target.name}' answered with bad JSON"}
        return False, {"code": "UNSUPPORTED", "message": f"tool '{target.name}' asked the client a question"}

    return call_tool


class CodeExecution:
    """The `code_execution` built-in tool: a sandbox pool, the stored scripts folder and the door."""

    def __init__(
        self,
        upstreams: Upstreams,
        scripts_dir: Path | None,
        limits: Limits,
        pool: SandboxPool | None = None,
        confinement: Confinement = Confinement(),
    ) -> None:
        self.scripts_dir = scripts_dir
        self.limits = limits
        self.pool = pool or SandboxPool(confinement=confinement)
        self._call_tool = door_callback(upstreams)

    async def __call__(self, arguments: Mapping[str, Any], ctx: Any = None) -> dict[str, Any]:
        outcome = await execute_code(
            arguments, self._call_tool, pool=self.pool, limits=self.limits, scripts_dir=self.scripts_dir
        )
        return outcome.tool_result()

    async def aclose(self) -> None:
        await self.pool.aclose()
