"""The code_execution sandbox: a process that runs one script at a time in V8 (mini-racer).

The frontend starts it (`python -m mcpvisor.workers.sandbox --heap-mb N`) and talks to it with JSON
lines on its stdin and stdout. A pipe pair fits here better than a ZeroMQ socket: the sandbox has
exactly one peer, its parent, and carries one conversation at a time; the pipes close when either
side dies (the sandbox exits on EOF, and the kernel kills it if its parent dies), and no socket
file is left to guard. A runaway script, a heap blow-up or a V8 crash takes down this process and
nothing else; the frontend starts another.

    parent -> sandbox   {"op": "run", "id", "code", "language", "input", "timeout_ms", "max_parallel"}
    sandbox -> parent   {"op": "calls", "id", "call", "requests": [{"server", "tool", "args"}], "max_parallel"}
    parent -> sandbox   {"op": "reply", "id", "call", "results": [{"ok": true, "result"} | {"ok": false, "error"}]}
                        or {"op": "reply", "id", "call", "abort": {"code", "message"}} to end the run
    sandbox -> parent   {"op": "done", "id", "ok": true, "value": "<JSON text>", "logs": [...]}
                        or {"op": "done", "id", "ok": false, "error": {"code", "message"}, "logs": [...]}

The script sees only ECMAScript's built-ins plus `input`, `call_tool`, `call_tools` and `log`:
plain V8 has no file system, network, process or environment, and the few host extras that
mini-racer installs (timers) are removed, as are WebAssembly and SharedArrayBuffer. Each run gets
a fresh isolate, so nothing a script leaves behind reaches the next one.

`call_tool` is synchronous, as in MCPProxy (`var r = call_tool(...)`), but mini-racer only offers
JS-to-Python notifications that return at once. So the script writes its request into a
SharedArrayBuffer whose memory Python reads directly, notifies Python, and blocks in
`Atomics.wait` (in short slices, so a timeout can still stop it) until Python has written the
reply there and set the flag. Replies larger than the buffer come in chunks.

TypeScript is stripped by the real TypeScript compiler (`ts.transpileModule`, no type checking),
loaded once per process into an isolate of its own from the `typescriptServices.js` file that the
dukpy wheel ships.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib.util
import json
import os
import queue
import re
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO

DEFAULT_HEAP_MB = 256
BUFFER_BYTES = 8 * 1024 * 1024  # the shared request/reply buffer; requests must fit, replies are chunked
_HEADER = 16  # int32 slots: [0] flag (0 waiting, 1 reply ready), [1] chunk length in UTF-16 units, [2] more chunks
_CHUNK_UNITS = (BUFFER_BYTES - _HEADER) // 2
MAX_LOG_LINES = 1000
MAX_LOG_LINE = 10_000
MAX_BATCH = 100

# Runs once per isolate, before the script. Everything the script may use is created here; the
# plumbing stays in this closure and the dangerous or useless globals are removed.
_PRELUDE = r"""
(function (host, inputJson, defaultParallel, bufferBytes, maxBatch, maxLogLines, maxLogLine) {
  'use strict';
  const G = globalThis;
  const stringify = JSON.stringify, parse = JSON.parse, A = Atomics;
  const isArray = Array.isArray, fromCharCode = String.fromCharCode;
  const sab = new SharedArrayBuffer(bufferBytes);
  const flags = new Int32Array(sab, 0, 4);
  const units = new Uint16Array(sab, 16);
  const logs = [];
  let dropped = 0;
  let aborted = null;

  function fail(message) {
    // Named so the parent reports it without a line: the line would be this prelude's, not the script's.
    const e = new Error(message);
    e.name = 'CallError';
    return e;
  }

  function exchange(request) {
    if (aborted) throw fail(aborted);
    const text = stringify(request);
    if (text.length > units.length) throw fail('call arguments too large (' + text.length + ' characters)');
    for (let i = 0; i < text.length; i++) units[i] = text.charCodeAt(i);
    flags[1] = text.length;
    let reply = '';
    for (;;) {
      A.store(flags, 0, 0);
      host();
      let slice = 0.05;
      while (A.load(flags, 0) === 0) {
        A.wait(flags, 0, 0, slice);
        if (slice < 1) slice *= 2;  // at most 1 ms late: Python cannot Atomics.notify
      }
      const n = flags[1];
      for (let i = 0; i < n; i += 8192) reply += fromCharCode.apply(null, units.subarray(i, Math.min(n, i + 8192)));
      if (flags[2] === 0) break;
    }
    const answer = parse(reply);
    if (answer.abort) {
      aborted = answer.abort.message;
      throw fail(aborted);
    }
    return answer.results;
  }

  function bad(message) {
    return {ok: false, error: {code: 'INVALID_ARGUMENTS', message: message}};
  }

  function checkRequest(server, tool, args) {
    if (typeof server !== 'string' || server === '') return 'server must be a non-empty string';
    if (typeof tool !== 'string' || tool === '') return 'tool must be a non-empty string';
    if (args !== undefined && args !== null && (typeof args !== 'object' || isArray(args))) {
      return 'args must be an object';
    }
    return null;
  }

  function call_tool(server, tool, args) {
    const problem = checkRequest(server, tool, args);
    if (problem) return bad('call_tool: ' + problem);
    return exchange({requests: [{server: server, tool: tool, args: args || {}}], max_parallel: 1})[0];
  }

  function call_tools(requests, options) {
    if (!isArray(requests)) return bad('call_tools: the first argument must be an array of {server, tool, args}');
    if (requests.length > maxBatch) return bad('call_tools: at most ' + maxBatch + ' requests, got ' + requests.length);
    let parallel = defaultParallel;
    if (options !== undefined && options !== null) {
      if (typeof options !== 'object') return bad('call_tools: options must be an object');
      if (options.max_parallel !== undefined) {
        const p = options.max_parallel;
        if (!Number.isInteger(p) || p < 1 || p > 32) {
          return bad('call_tools: max_parallel must be an integer from 1 to 32');
        }
        parallel = p;
      }
    }
    const batch = [];
    for (let i = 0; i < requests.length; i++) {
      const r = requests[i];
      if (r === null || typeof r !== 'object') {
        return bad('call_tools: element ' + i + ' must be an object {server, tool, args}');
      }
      const problem = checkRequest(r.server, r.tool, r.args);
      if (problem) return bad('call_tools: element ' + i + ': ' + problem);
      batch.push({server: r.server, tool: r.tool, args: r.args || {}});
    }
    if (batch.length === 0) return [];
    return exchange({requests: batch, max_parallel: parallel});
  }

  function log(message) {
    let line;
    if (typeof message === 'string') line = message;
    else {
      try { line = stringify(message); } catch (e) { line = String(message); }
      if (line === undefined) line = String(message);
    }
    if (line.length > maxLogLine) line = line.slice(0, maxLogLine) + '... (cut)';
    if (logs.length < maxLogLines) logs.push(line);
    else dropped++;
  }

  function takeLogs() {
    return dropped ? logs.concat(['... ' + dropped + ' more log lines dropped']) : logs;
  }

  function finish(value) {
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') {
      return stringify({promise: true, logs: takeLogs()});
    }
    let text;
    try {
      text = stringify(value === undefined ? null : value);
    } catch (e) {
      return stringify({unserializable: String(e && e.message || e), logs: takeLogs()});
    }
    return stringify({value: text === undefined ? 'null' : text, logs: takeLogs()});
  }

  function logsJson() { return stringify(takeLogs()); }

  const removed = ['setTimeout', 'clearTimeout', '__TimerManager', '__timer_manager', 'WebAssembly',
                   'SharedArrayBuffer', 'Atomics', 'd8', 'Realm', 'os', 'print', 'read', 'readbuffer', 'load', 'quit'];
  for (const name of removed) {
    // A `var` global (mini-racer's timers) cannot be deleted (strict mode throws); it can be emptied.
    try { delete G[name]; } catch (e) { G[name] = undefined; }
  }
  const fixed = {writable: false, configurable: false, enumerable: false};
  Object.defineProperty(G, 'call_tool', Object.assign({value: call_tool}, fixed));
  Object.defineProperty(G, 'call_tools', Object.assign({value: call_tools}, fixed));
  Object.defineProperty(G, 'log', Object.assign({value: log}, fixed));
  G.console = {log: log, info: log, warn: log, error: log, debug: log};
  G.input = inputJson === undefined ? {} : parse(inputJson);
  return [sab, finish, logsJson];
})
"""

_TS_TRANSPILE = r"""
(function (src) {
  const r = ts.transpileModule(src, {
    reportDiagnostics: true,
    compilerOptions: {target: ts.ScriptTarget.ES2020, module: ts.ModuleKind.None, removeComments: false,
                      newLine: ts.NewLineKind.LineFeed},
  });
  const diags = (r.diagnostics || []).map(function (d) {
    const at = d.file && d.start !== undefined ? d.file.getLineAndCharacterOfPosition(d.start) : null;
    return {line: at ? at.line + 1 : null, column: at ? at.character + 1 : null,
            message: ts.flattenDiagnosticMessageText(d.messageText, ' ')};
  });
  return JSON.stringify({code: r.outputText, diagnostics: diags});
})
"""

_V8_LOCATION = re.compile(r"^<anonymous>:(\d+): (.*)$")


class RunError(Exception):
    """A run that ends without a value: `code` is one of the sandbox's error codes."""

    def __init__(self, code: str, message: str, logs: list[str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.logs = logs or []


def typescript_compiler_path() -> Path:
    """The TypeScript compiler (a single JS file) inside the installed dukpy wheel; dukpy is not imported."""
    spec = importlib.util.find_spec("dukpy")
    if spec is None or not spec.submodule_search_locations:
        raise RunError("TRANSPILE_ERROR", "TypeScript is not available: the dukpy package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "jsmodules" / "typescriptServices.js"
    if not path.is_file():
        raise RunError("TRANSPILE_ERROR", "TypeScript is not available: the compiler file is missing from dukpy")
    return path


def describe_js_error(exc: Exception) -> str:
    """V8's message (`<anonymous>:LINE: Kind: text` then source, caret and stack) as one line with its line number."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if m := _V8_LOCATION.match(first):
        if m.group(2).startswith("CallError: "):
            return m.group(2).removeprefix("CallError: ")
        return f"{m.group(2)} (line {m.group(1)})"
    return first


class Sandbox:
    """The process-side state: V8 initialised once, the TypeScript isolate loaded on first use."""

    def __init__(self, out: BinaryIO, heap_mb: int) -> None:
        from py_mini_racer import DEFAULT_V8_FLAGS, init_mini_racer

        # The hard limit below stops a script politely; this V8 flag is the backstop that ends the
        # process if one allocation leaps past it.
        init_mini_racer(flags=(*DEFAULT_V8_FLAGS, f"--max-old-space-size={heap_mb * 2}"), ignore_duplicate_init=True)
        self._out = out
        self._heap_bytes = heap_mb * 1024 * 1024
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._ts: Any = None
        self._ts_transpile: Any = None

    # -- the parent link ------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        self._out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        self._out.flush()

    def read_stdin(self, stream: BinaryIO) -> None:
        """Thread: every line from the parent becomes an event; EOF ends the process's loop."""
        for raw in stream:
            try:
                message = json.loads(raw)
            except ValueError:
                continue  # the parent only sends JSON; anything else is noise, not a reason to die
            if isinstance(message, dict):
                self._events.put(("line", message))
        self._events.put(("eof", None))

    def serve(self) -> int:
        from py_mini_racer import MiniRacer

        probe = MiniRacer()
        self.send({"op": "ready", "pid": os.getpid(), "v8": probe.v8_version})
        probe.close()
        while True:
            kind, message = self._events.get()
            if kind == "eof":
                return 0
            if kind == "line" and message.get("op") == "run":
                self.send(self.run(message))

    # -- one run --------------------------------------------------------------------------------

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        run_id = request.get("id")
        logs: list[str] = []
        try:
            code = request.get("code")
            if not isinstance(code, str):
                raise RunError("INVALID_INPUT", "code must be a string")
            if request.get("language") == "typescript":
                code = self.transpile(code)
            timeout = max(0.001, float(request.get("timeout_ms", 120000)) / 1000)
            max_parallel = int(request.get("max_parallel", 8))
            input_json = json.dumps(request.get("input") or {})
            value, logs = self._execute(run_id, code, input_json, timeout, max_parallel)
        except RunError as exc:
            error = {"code": exc.code, "message": exc.message}
            return {"op": "done", "id": run_id, "ok": False, "error": error, "logs": exc.logs or logs}
        return {"op": "done", "id": run_id, "ok": True, "value": value, "logs": logs}

    def transpile(self, source: str) -> str:
        from py_mini_racer import JSEvalException, MiniRacer

        if self._ts_transpile is None:
            self._ts = MiniRacer()
            self._ts.eval(typescript_compiler_path().read_text(encoding="utf-8"))
            self._ts_transpile = self._ts.eval(_TS_TRANSPILE)
        try:
            result = json.loads(self._ts_transpile(source, timeout_sec=30))
        except JSEvalException as exc:
            raise RunError("TRANSPILE_ERROR", f"TypeScript could not be stripped: {describe_js_error(exc)}") from None
        if diagnostics := result["diagnostics"]:
            first = diagnostics[0]
            where = f" at line {first['line']}, column {first['column']}" if first["line"] else ""
            raise RunError("TRANSPILE_ERROR", f"TypeScript syntax error{where}: {first['message']}")
        return result["code"]

    def _execute(
        self, run_id: Any, code: str, input_json: str, timeout: float, max_parallel: int
    ) -> tuple[str, list[str]]:
        from py_mini_racer import JSEvalException, JSOOMException, JSParseException, MiniRacer

        mr = MiniRacer()
        try:
            ctx = mr._ctx  # the raw notification (below) has no public wrapper that works while JS blocks
            mr.set_hard_memory_limit(self._heap_bytes)
            with ctx._register_js_notification(lambda _handle: self._events.put(("host", None))) as host:
                setup = mr.eval(_PRELUDE)
                parts = setup(host, input_json, max_parallel, BUFFER_BYTES, MAX_BATCH, MAX_LOG_LINES, MAX_LOG_LINE)
                buffer, finish, logs_json = parts[0], parts[1], parts[2]
                flags = buffer[:_HEADER].cast("i")

                async def script() -> str:
                    value = await mr.eval_cancelable(code)
                    return await finish.cancelable()(value)

                future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(script(), timeout), ctx.event_loop)
                future.add_done_callback(lambda _f: self._events.put(("done", None)))
                abort = self._serve_calls(run_id, future, buffer, flags)
                try:
                    outcome = json.loads(future.result())
                except concurrent.futures.CancelledError:
                    ended = abort or "the run was ended"
                    raise RunError("MAX_TOOL_CALLS_EXCEEDED", ended, self._logs(logs_json)) from None
                except (TimeoutError, concurrent.futures.TimeoutError):
                    message = f"the code ran longer than {timeout * 1000:.0f} ms and was stopped"
                    raise RunError("TIMEOUT", message) from None
                except JSOOMException:
                    raise RunError("HEAP_LIMIT", self._heap_message()) from None
                except JSParseException as exc:
                    raise RunError("SYNTAX_ERROR", describe_js_error(exc)) from None
                except JSEvalException as exc:
                    if mr.was_hard_memory_limit_reached():
                        raise RunError("HEAP_LIMIT", self._heap_message()) from None
                    if abort:
                        raise RunError("MAX_TOOL_CALLS_EXCEEDED", abort, self._logs(logs_json)) from None
                    raise RunError("RUNTIME_ERROR", describe_js_error(exc), self._logs(logs_json)) from None
        finally:
            mr.close()
        logs = outcome.get("logs", [])
        if abort:
            raise RunError("MAX_TOOL_CALLS_EXCEEDED", abort, logs)
        if outcome.get("promise"):
            raise RunError(
                "RUNTIME_ERROR",
                "the code's value is a Promise: call_tool and call_tools are synchronous, so no await is needed",
                logs,
            )
        if "unserializable" in outcome:
            reason = outcome["unserializable"]
            raise RunError("SERIALIZATION_ERROR", f"the code's value cannot be turned into JSON: {reason}", logs)
        return outcome["value"], logs

    def _heap_message(self) -> str:
        limit = self._heap_bytes // (1024 * 1024)
        return f"the code used more than the sandbox's heap limit of {limit} MB and was stopped"

    @staticmethod
    def _logs(logs_json: Any) -> list[str]:
        from py_mini_racer import JSEvalException

        try:
            return json.loads(logs_json(timeout_sec=1))
        except (JSEvalException, ValueError):
            return []

    def _serve_calls(
        self, run_id: Any, future: concurrent.futures.Future[str], buffer: memoryview, flags: memoryview
    ) -> str | None:
        """Relay the script's calls to the parent until the run ends; returns an abort message if any."""
        call = 0
        pending: str | None = None  # the rest of a reply too large for one chunk
        abort: str | None = None
        while True:
            kind, message = self._events.get()
            if kind == "done":
                return abort
            if kind == "eof":
                future.cancel()
                os._exit(0)  # the parent is gone: nobody is waiting for this run
            if kind == "host":
                if pending is not None:
                    pending = self._write_reply(buffer, flags, pending)
                    continue
                length = flags[1]
                request = json.loads(bytes(buffer[_HEADER : _HEADER + 2 * length]).decode("utf-16-le", "surrogatepass"))
                call += 1
                self.send(
                    {
                        "op": "calls",
                        "id": run_id,
                        "call": call,
                        "requests": request["requests"],
                        "max_parallel": request.get("max_parallel", 1),
                    }
                )
            elif kind == "line" and message.get("op") == "reply" and message.get("call") == call:
                if isinstance(message.get("abort"), dict):
                    # The run ends here, whatever the script would do with an exception it could catch.
                    abort = str(message["abort"].get("message", "the run was ended"))
                    future.cancel()
                    continue
                answer = {"results": message.get("results", [])}
                # Not ASCII-escaped: the buffer holds UTF-16, and escapes would multiply the size of text.
                text = json.dumps(answer, separators=(",", ":"), ensure_ascii=False)
                pending = self._write_reply(buffer, flags, text)

    @staticmethod
    def _write_reply(buffer: memoryview, flags: memoryview, text: str) -> str | None:
        chunk, rest = text[:_CHUNK_UNITS], text[_CHUNK_UNITS:]
        data = chunk.encode("utf-16-le", "surrogatepass")
        buffer[_HEADER : _HEADER + len(data)] = data
        flags[1] = len(data) // 2
        flags[2] = 1 if rest else 0
        flags[0] = 1  # last: the script starts reading once it sees this
        return rest or None


def _quiet_late_callbacks(unraisable: Any) -> None:
    # A stopped isolate may still deliver a notification after its run's event loop closed.
    if isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(unraisable.exc_value):
        return
    sys.__unraisablehook__(unraisable)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcpvisor.workers.sandbox")
    parser.add_argument("--heap-mb", type=int, default=DEFAULT_HEAP_MB)
    args = parser.parse_args(argv)
    sys.unraisablehook = _quiet_late_callbacks
    # The protocol owns the real stdout; anything else that prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sandbox = Sandbox(out, max(16, args.heap_mb))
    threading.Thread(target=sandbox.read_stdin, args=(sys.stdin.buffer,), daemon=True).start()
    return sandbox.serve()


if __name__ == "__main__":
    sys.exit(main())
