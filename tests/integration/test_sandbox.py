"""code_execution against real sandbox processes (V8 in `python -m mcpvisor.workers.sandbox`).

The inner calls go to a small in-test tool table standing in for the frontend's door (the door
itself is exercised end to end elsewhere); everything else is real: the process, its protocol,
V8, the TypeScript compiler, the limits.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpvisor.frontend.tools.code_execution import (
    Limits,
    Outcome,
    SandboxPool,
    destructive_refusal,
    execute_code,
    tool_definition,
)

TOOLS: dict[tuple[str, str], dict[str, Any]] = {
    ("math", "add"): {},
    ("math", "double"): {},
    ("slow", "echo"): {"readOnlyHint": True},
    ("files", "fail"): {},
    ("files", "delete_all"): {"destructiveHint": True},
    ("big", "blob"): {},
}


class FakeDoor:
    """The callback the door will provide: looks the tool up, applies the destructive rule, runs it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict, dict | None]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, server: str, tool: str, args: dict, intent: dict | None) -> tuple[bool, Any]:
        self.calls.append((server, tool, args, intent))
        if (server, tool) not in TOOLS:
            return False, {"code": "TOOL_NOT_FOUND", "message": f"no tool {server}:{tool}"}
        if refusal := destructive_refusal(TOOLS[server, tool], intent):
            return False, refusal
        if (server, tool) == ("math", "add"):
            total = args["a"] + args["b"]
            return True, {"content": [{"type": "text", "text": str(total)}], "structuredContent": {"sum": total}}
        if (server, tool) == ("math", "double"):
            return True, {"content": [{"type": "text", "text": str(args["x"] * 2)}]}
        if (server, tool) == ("slow", "echo"):
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            # Let the other calls of the batch start before this one finishes.
            await trio.sleep(0.05)
            self.in_flight -= 1
            return True, {"content": [{"type": "text", "text": json.dumps(args)}]}
        if (server, tool) == ("files", "fail"):
            return True, {"content": [{"type": "text", "text": "disk on fire"}], "isError": True}
        if (server, tool) == ("files", "delete_all"):
            return True, {"content": [{"type": "text", "text": "deleted"}]}
        if (server, tool) == ("big", "blob"):
            return True, {"content": [{"type": "text", "text": "é" * args["n"]}]}
        raise AssertionError(f"unhandled tool {server}:{tool}")


@pytest.fixture
async def pool() -> AsyncIterator[SandboxPool]:
    # One process, so every test shows that the run after a failure is served (reused or respawned).
    sandboxes = SandboxPool(size=1, heap_mb=64)
    try:
        yield sandboxes
    finally:
        await sandboxes.aclose()


TEST_LIMITS = Limits(timeout_ms=20000)


async def run(
    pool: SandboxPool,
    door: FakeDoor | None = None,
    limits: Limits = TEST_LIMITS,
    scripts: Path | None = None,
    **arguments: Any,
) -> Outcome:
    return await execute_code(arguments, door or FakeDoor(), pool=pool, limits=limits, scripts_dir=scripts)


def ok_value(outcome: Outcome) -> Any:
    assert not outcome.is_error, outcome.text
    data = outcome.data
    assert data["ok"] is True
    return data["value"]


def error_of(outcome: Outcome) -> dict[str, str]:
    assert outcome.is_error, outcome.text
    return outcome.data["error"]


async def test_chains_two_tools_and_returns_the_last_expression(pool: SandboxPool) -> None:
    door = FakeDoor()
    outcome = await run(
        pool,
        door,
        code=(
            "var a = call_tool('math', 'add', {a: input.x, b: 2});\n"
            "var d = call_tool('math', 'double', {x: a.result.structuredContent.sum});\n"
            "log('sum was ' + a.result.structuredContent.sum);\n"
            "({sum: a.result.structuredContent.sum, doubled: Number(d.result.content[0].text)})"
        ),
        input={"x": 40},
    )
    assert ok_value(outcome) == {"sum": 42, "doubled": 84}
    assert outcome.data["logs"] == ["sum was 42"]
    assert [(s, t) for s, t, _, _ in door.calls] == [("math", "add"), ("math", "double")]
    assert door.calls[1][2] == {"x": 42}
    assert outcome.tool_calls == 2


async def test_call_tools_fans_out_in_order_within_max_parallel(pool: SandboxPool) -> None:
    door = FakeDoor()
    outcome = await run(
        pool,
        door,
        code=(
            "var slots = call_tools([0,1,2,3,4,5,6,7,8,9].map(n => ({server: 'slow', tool: 'echo', args: {n}})),"
            " {max_parallel: 3});\n"
            "slots.map(s => JSON.parse(s.result.content[0].text).n)"
        ),
    )
    assert ok_value(outcome) == list(range(10))
    assert 1 < door.most_in_flight <= 3
    assert outcome.tool_calls == 10


async def test_call_tools_default_parallelism_comes_from_the_settings(pool: SandboxPool) -> None:
    door = FakeDoor()
    outcome = await run(
        pool,
        door,
        limits=Limits(timeout_ms=20000, max_parallel=2),
        code="call_tools([1,2,3,4,5,6].map(n => ({server: 'slow', tool: 'echo', args: {n}}))).length",
    )
    assert ok_value(outcome) == 6
    assert door.most_in_flight == 2


async def test_call_tools_rejects_bad_batches_without_calling(pool: SandboxPool) -> None:
    door = FakeDoor()
    outcome = await run(
        pool,
        door,
        code=(
            "[call_tools(new Array(101).fill({server: 'math', tool: 'add', args: {a: 1, b: 1}})).error.message,\n"
            " call_tools([{server: 'math', tool: 'add'}, {server: 3, tool: 'x'}]).error.message,\n"
            " call_tools([{server: 'math', tool: 'add'}], {max_parallel: 99}).error.message,\n"
            " call_tool('math', 'add', [1, 2]).error.code]"
        ),
    )
    messages = ok_value(outcome)
    assert "at most 100" in messages[0]
    assert "element 1" in messages[1]
    assert "max_parallel" in messages[2]
    assert messages[3] == "INVALID_ARGUMENTS"
    assert door.calls == []


async def test_errors_are_values_the_script_can_handle(pool: SandboxPool) -> None:
    outcome = await run(
        pool,
        code=(
            "var missing = call_tool('nope', 'x', {});\n"
            "var failed = call_tool('files', 'fail', {});\n"
            "var caught;\n"
            "try { null.x } catch (e) { caught = e.constructor.name }\n"
            "({missing: missing.ok || missing.error.code, failed: failed.error.code,"
            " message: failed.error.message, caught})"
        ),
    )
    assert ok_value(outcome) == {
        "missing": "TOOL_NOT_FOUND",
        "failed": "TOOL_ERROR",
        "message": "disk on fire",
        "caught": "TypeError",
    }


async def test_typescript_types_are_stripped(pool: SandboxPool) -> None:
    outcome = await run(
        pool,
        language="typescript",
        code=(
            "interface Sum { sum: number }\n"
            "enum Mode { Fast = 'fast' }\n"
            "function first<T>(xs: T[]): T { return xs[0]; }\n"
            "const r = call_tool('math', 'add', {a: 1, b: 2}) as any;\n"
            "const s: Sum = r.result.structuredContent;\n"
            "({sum: s.sum, mode: Mode.Fast, first: first<number>([7, 8])})"
        ),
    )
    assert ok_value(outcome) == {"sum": 3, "mode": "fast", "first": 7}


async def test_typescript_syntax_error_names_its_line(pool: SandboxPool) -> None:
    error = error_of(await run(pool, language="typescript", code="const a: number = 1;\nconst b: = 2;"))
    assert error["code"] == "TRANSPILE_ERROR"
    assert "line 2" in error["message"]


async def test_javascript_syntax_error_and_exception_name_their_line(pool: SandboxPool) -> None:
    error = error_of(await run(pool, code="var a = 1;\nvar b = ;\n"))
    assert error["code"] == "SYNTAX_ERROR"
    assert "line 2" in error["message"] and "SyntaxError" in error["message"]
    outcome = await run(pool, code="log('before');\n\nthrow new Error('boom');")
    error = error_of(outcome)
    assert error["code"] == "RUNTIME_ERROR"
    assert "Error: boom" in error["message"] and "line 3" in error["message"]
    assert outcome.data["logs"] == ["before"]


async def test_stored_scripts(pool: SandboxPool, tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "sum-two.js").write_text("call_tool('math', 'add', {a: input.a, b: input.b}).result.structuredContent")
    (scripts / "typed.ts").write_text("const n: number = input.n;\n({twice: n * 2})")
    (scripts / "both.js").write_text("1")
    (scripts / "both.ts").write_text("2")
    (scripts / "empty.js").write_text("")
    (scripts / "huge.js").write_text("//" + "x" * (256 * 1024))
    outside = tmp_path / "outside.js"
    outside.write_text("'secret content'")
    os.symlink(outside, scripts / "link.js")
    (scripts / "folder.js").mkdir()

    assert ok_value(await run(pool, scripts=scripts, script="sum-two", input={"a": 2, "b": 5})) == {"sum": 7}
    assert ok_value(await run(pool, scripts=scripts, script="typed", input={"n": 21})) == {"twice": 42}

    cases = {
        "both": "SCRIPT_AMBIGUOUS",
        "empty": "SCRIPT_INVALID",
        "huge": "SCRIPT_INVALID",
        "link": "SCRIPT_INVALID",
        "folder": "SCRIPT_INVALID",
        "../outside": "INVALID_INPUT",
        "sum-two.js": "INVALID_INPUT",
        "/etc/passwd": "INVALID_INPUT",
        "x" * 65: "INVALID_INPUT",
    }
    for name, code in cases.items():
        error = error_of(await run(pool, scripts=scripts, script=name))
        assert error["code"] == code, (name, error)
        assert "secret content" not in error["message"]
    missing = error_of(await run(pool, scripts=scripts, script="nope"))
    assert missing["code"] == "SCRIPT_NOT_FOUND"
    assert "sum-two" in missing["message"] and "typed" in missing["message"]
    assert "link" not in missing["message"]
    wrong = error_of(await run(pool, scripts=scripts, script="typed", language="javascript"))
    assert wrong["code"] == "INVALID_INPUT"


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"code": "1", "script": "x"},
        {"code": "1", "input": [1]},
        {"code": "1", "language": "python"},
        {"code": "1", "extra": True},
        {"code": ""},
    ],
)
async def test_bad_arguments(pool: SandboxPool, arguments: dict[str, Any]) -> None:
    outcome = await execute_code(arguments, FakeDoor(), pool=pool)
    assert error_of(outcome)["code"] == "INVALID_INPUT"
    assert pool.started == 0  # refused before any sandbox was needed


@pytest.mark.parametrize(
    ("code", "expected", "fragment"),
    [
        ("require('fs').readFileSync('/etc/passwd')", "RUNTIME_ERROR", "require is not defined"),
        ("process.env", "RUNTIME_ERROR", "process is not defined"),
        ("fetch('http://127.0.0.1:1/')", "RUNTIME_ERROR", "fetch is not defined"),
        ("Deno.readTextFileSync('/etc/passwd')", "RUNTIME_ERROR", "Deno is not defined"),
        ("new WebAssembly.Memory({initial: 1})", "RUNTIME_ERROR", "WebAssembly is not defined"),
        ("setTimeout(() => 1, 10)", "RUNTIME_ERROR", "setTimeout is not a function"),
        ("import('fs')", "RUNTIME_ERROR", ""),
        ("function down(n) { return down(n + 1) + 1 }\ndown(0)", "RUNTIME_ERROR", "Maximum call stack size exceeded"),
        ("(async () => call_tool('math', 'add', {a: 1, b: 1}))()", "RUNTIME_ERROR", "Promise"),
        ("({n: 1n})", "SERIALIZATION_ERROR", "BigInt"),
    ],
)
async def test_hostile_or_broken_code_gets_a_clear_error(
    pool: SandboxPool, code: str, expected: str, fragment: str
) -> None:
    error = error_of(await run(pool, code=code))
    assert error["code"] == expected, error
    assert fragment in error["message"]
    assert ok_value(await run(pool, code="1 + 1")) == 2
    assert pool.started == 1  # the same process served both runs


async def test_infinite_loop_times_out_and_the_next_run_works(pool: SandboxPool) -> None:
    error = error_of(await run(pool, limits=Limits(timeout_ms=500), code="while (true) {}"))
    assert error["code"] == "TIMEOUT"
    assert "500 ms" in error["message"]
    assert ok_value(await run(pool, code="'still here'")) == "still here"


async def test_loop_of_calls_times_out_too(pool: SandboxPool) -> None:
    door = FakeDoor()
    error = error_of(
        await run(pool, door, limits=Limits(timeout_ms=500), code="for (;;) call_tool('math', 'add', {a: 1, b: 1})")
    )
    assert error["code"] == "TIMEOUT"
    assert len(door.calls) > 0
    assert ok_value(await run(pool, code="3")) == 3


async def test_allocation_bombs_end_with_a_heap_error(pool: SandboxPool) -> None:
    error = error_of(await run(pool, code="var a = []; for (;;) a.push(new Array(100000).fill(1.5))"))
    assert error["code"] == "HEAP_LIMIT"
    assert "64 MB" in error["message"]
    assert ok_value(await run(pool, code="'after the bomb'")) == "after the bomb"
    error = error_of(await run(pool, code="'x'.repeat(2 ** 30)"))
    assert error["code"] == "RUNTIME_ERROR" and "Invalid string length" in error["message"]


async def test_a_bomb_the_isolate_cannot_interrupt_costs_only_its_process(pool: SandboxPool) -> None:
    # One huge allocation inside a builtin: V8 cannot stop it politely, so either V8 ends the process
    # or the wall clock does; either way the pool starts a fresh process for the next run.
    outcome = await run(pool, limits=Limits(timeout_ms=2000), code="var a = new Array(2 ** 28).fill(1.5); a.length")
    error = error_of(outcome)
    assert error["code"] in ("HEAP_LIMIT", "SANDBOX_CRASHED", "TIMEOUT"), error
    assert ok_value(await run(pool, code="'next run'")) == "next run"
    if error["code"] != "HEAP_LIMIT":
        assert pool.started == 2


async def test_too_many_tool_calls_end_the_run(pool: SandboxPool) -> None:
    door = FakeDoor()
    outcome = await run(
        pool,
        door,
        limits=Limits(timeout_ms=20000, max_tool_calls=3),
        code="var n = 0;\nfor (;;) { try { call_tool('math', 'add', {a: 1, b: 1}); n++; } catch (e) { log(e.message) } if (n > 10) break; }\nn",
    )
    error = error_of(outcome)
    assert error["code"] == "MAX_TOOL_CALLS_EXCEEDED"
    assert "3" in error["message"]
    assert len(door.calls) == 3
    outcome = await run(
        pool,
        door,
        limits=Limits(timeout_ms=20000, max_tool_calls=3),
        code="call_tools([1, 2, 3, 4].map(n => ({server: 'math', tool: 'add', args: {a: n, b: n}})))",
    )
    assert error_of(outcome)["code"] == "MAX_TOOL_CALLS_EXCEEDED"
    assert ok_value(await run(pool, code="'fine'")) == "fine"


async def test_destructive_tools_need_a_declared_intent(pool: SandboxPool) -> None:
    door = FakeDoor()
    code = "var r = call_tool('files', 'delete_all', {}); r.ok ? 'ran' : r.error.code"
    assert ok_value(await run(pool, door, code=code)) == "DESTRUCTIVE_NOT_DECLARED"
    assert ok_value(await run(pool, door, code=code, intent={"operation_type": "write"})) == "DESTRUCTIVE_NOT_DECLARED"
    assert ok_value(await run(pool, door, code=code, intent={"operation_type": "destructive"})) == "ran"
    assert door.calls[-1][3] == {"operation_type": "destructive"}


async def test_large_results_cross_in_chunks(pool: SandboxPool) -> None:
    # Larger than the shared buffer (8 MB), so the reply arrives in several pieces.
    n = 5_000_000
    code = "var r = call_tool('big', 'blob', {n: input.n}); var t = r.result.content[0].text; [t.length, t[0], t[t.length - 1]]"
    assert ok_value(await run(pool, code=code, input={"n": n})) == [n, "é", "é"]


async def test_each_run_starts_from_a_clean_global_scope(pool: SandboxPool) -> None:
    assert ok_value(await run(pool, code="globalThis.leftover = 42; Object.prototype.polluted = 1; 0")) == 0
    assert ok_value(await run(pool, code="[typeof leftover, ({}).polluted === undefined]")) == ["undefined", True]


async def test_concurrent_runs_share_the_pool() -> None:
    sandboxes = SandboxPool(size=2, heap_mb=64)
    results: list[Any] = []
    try:
        await sandboxes.warm()
        assert sandboxes.started == 1
        async with trio.open_nursery() as nursery:
            for n in range(4):

                async def one(n: int = n) -> None:
                    results.append(ok_value(await run(sandboxes, code="input.n * 10", input={"n": n})))

                nursery.start_soon(one)
    finally:
        await sandboxes.aclose()
    assert sorted(results) == [0, 10, 20, 30]
    assert sandboxes.started <= 2


def test_tool_definition_follows_mcpproxy() -> None:
    tool = tool_definition()
    assert tool["name"] == "code_execution"
    assert set(tool["inputSchema"]["properties"]) >= {"code", "script", "language", "input"}
    assert "required" not in tool["inputSchema"]  # exactly-one-of is enforced by the tool itself


async def test_odd_strings_cross_both_ways(pool: SandboxPool) -> None:
    door = FakeDoor()
    code = "var r = call_tool('slow', 'echo', {s: input.s + '\\ud800'}); [JSON.parse(r.result.content[0].text).s, '\\udfff']"
    value = ok_value(await run(pool, door, code=code, input={"s": "zé✓"}))
    assert value == ["zé✓\ud800", "\udfff"]
    assert door.calls[0][2] == {"s": "zé✓\ud800"}


async def test_a_sandbox_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    sandboxes = SandboxPool(size=1, python=str(tmp_path / "no-such-python"))
    outcome = await execute_code({"code": "1"}, FakeDoor(), pool=sandboxes)
    assert error_of(outcome)["code"] == "SANDBOX_UNAVAILABLE"
    await sandboxes.aclose()
