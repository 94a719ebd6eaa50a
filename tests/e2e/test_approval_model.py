"""Calls waiting for an operator, over their state space: a state machine against a real stack.

The rules are what clients, operators and the config can do: a client's call of a destructive
tool (held for approval), an operator's allow or deny, a verdict for an id that waits nowhere, a
client that gives up, and a reload that makes the policies hold, refuse or allow such calls. A
small model says which calls wait and how each must end; after every step the stack's waiting
calls are the model's, and every call that ended, ended as the model says (ran, or refused with
the expected words), with its file written exactly when it ran.

The run here is short and seeded; `python tests/bench/bench_approval_model.py` runs it long.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.e2e.test_approval_attacks import BASELINE, NO_TOUCH, WAITS
from tests.e2e.test_policies import text_of
from tests.support.stack import Stack, echo_server, open_stack

POLICIES = {"waits": WAITS, "refuses": NO_TOUCH, "allows": BASELINE}
SETTLE = 30.0  # seconds a call may take to reach the state the model says


class LiveStack:
    """A stack run by trio in a thread of its own, so that synchronous rules can drive it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.files = tmp_path / "files"
        self.files.mkdir()
        self.stack: Stack | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(120) or self.stack is None:
            raise RuntimeError(f"the stack did not start: {self._failure!r}")

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # told to the test thread, which waits for the stack
            self._failure = exc
            self._ready.set()

    async def _main(self) -> None:
        (self.tmp_path / "policies.cedar").write_text(WAITS)
        tables = {"policy": {"files": ["policies.cedar"], "approval_timeout": 600}}
        async with open_stack(self.tmp_path, {"echo": echo_server()}, tables=tables) as stack:
            self.stack = stack
            self._stop = trio.Event()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def start(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._nursery is not None
        trio.from_thread.run_sync(self._nursery.start_soon, fn, *args, trio_token=self._token)

    def close(self) -> None:
        if self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(60)


class Call:
    """One client's call of echo:touch, run in the stack's thread; `cancel` gives it up."""

    def __init__(self, live: LiveStack, number: int) -> None:
        self.path = live.files / f"call{number}"
        self.result: Any = None
        self.done = threading.Event()
        self.scope: trio.CancelScope | None = None
        self.id = ""

    async def run(self, stack: Stack) -> None:
        async with stack.client("/mcp/direct", mode="legacy") as client:
            with trio.CancelScope() as self.scope:
                self.result = await client.call_tool("echo:touch", {"path": str(self.path)})
        self.done.set()


class Approvals(RuleBasedStateMachine):
    live: LiveStack  # set by the test, shared by every run of the machine
    numbers = itertools.count(1)  # each call's file, never one an earlier run used

    def __init__(self) -> None:
        super().__init__()
        self.waiting: dict[str, Call] = {}  # the model: id -> the call that waits
        self.expected: dict[int, tuple[Call, str]] = {}  # call -> how it must end: "ran", or the words
        self.policy = "waits"

    @property
    def stack(self) -> Stack:
        assert self.live.stack is not None
        return self.live.stack

    def control(self, *args: str) -> Any:
        return self.stack.control(*args)

    def listed(self) -> set[str]:
        reply = self.control("calls")
        assert reply.ok, reply
        return {call["id"] for call in reply.result}

    @initialize()
    def policies_that_hold_calls(self) -> None:
        self.set_policy("waits")

    def teardown(self) -> None:
        """Leave the stack as the next run's model starts: nothing waits."""
        for call_id in self.listed():
            self.control("deny", call_id)
        with_deadline(lambda: not self.listed(), "the calls left waiting to be denied")

    def set_policy(self, name: str) -> None:
        (self.live.tmp_path / "policies.cedar").write_text(POLICIES[name])
        reply = self.control("update")
        assert reply.ok, reply
        self.policy = name

    # -- what clients do --------------------------------------------------------------------------

    @rule()
    def a_client_calls_a_destructive_tool(self) -> None:
        call = Call(self.live, next(self.numbers))
        before = self.listed()
        self.live.start(call.run, self.stack)
        if self.policy == "waits":
            with_deadline(lambda: len(self.listed() - before) == 1, "the call to be listed")
            (call.id,) = self.listed() - before
            self.waiting[call.id] = call
        else:
            self.expected[id(call)] = (call, "ran" if self.policy == "allows" else "refused by policy 'no-touch'")

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def the_client_gives_up(self, data: st.DataObject) -> None:
        call = self.waiting.pop(data.draw(st.sampled_from(sorted(self.waiting))))
        self.live.run(_cancel, call)
        with_deadline(lambda: call.id not in self.listed(), "a call given up to leave the list")
        assert not call.path.exists()

    # -- what operators do ------------------------------------------------------------------------

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), allow=st.booleans())
    def an_operator_decides(self, data: st.DataObject, allow: bool) -> None:
        call = self.waiting.pop(data.draw(st.sampled_from(sorted(self.waiting))))
        reply = self.control("allow" if allow else "deny", call.id)
        assert reply.ok, reply
        self.expected[id(call)] = (call, "ran" if allow else f"an operator denied it (call {call.id})")

    @rule(known=st.booleans())
    def a_verdict_for_a_call_that_does_not_wait(self, known: bool) -> None:
        ended = [call.id for call, _ in self.expected.values() if call.id]
        call_id = ended[0] if known and ended else "0123456789ab"
        reply = self.control("allow", call_id)
        assert (reply.ok, reply.exit_code) == (False, 4) and "is waiting for approval" in reply.error

    @rule(name=st.sampled_from(sorted(POLICIES)))
    def the_policies_are_reloaded(self, name: str) -> None:
        self.set_policy(name)
        if name == "waits":
            return
        for call in self.waiting.values():
            self.expected[id(call)] = (call, "ran" if name == "allows" else "the policies as reloaded: refused by")
        self.waiting.clear()

    # -- what must hold ---------------------------------------------------------------------------

    @invariant()
    def the_waiting_calls_are_the_models(self) -> None:
        with_deadline(lambda: self.listed() == set(self.waiting), f"the list to be {sorted(self.waiting)}")

    @invariant()
    def every_call_that_ended_ended_as_the_model_says(self) -> None:
        for key, (call, outcome) in list(self.expected.items()):
            assert call.done.wait(SETTLE), f"call {call.id or call.path.name} never ended (expected: {outcome})"
            if outcome == "ran":
                assert not call.result.is_error, text_of(call.result)
                assert call.path.exists()
            else:
                assert call.result.is_error and outcome in text_of(call.result), (outcome, text_of(call.result))
                assert not call.path.exists()
            del self.expected[key]


async def _cancel(call: Call) -> None:
    assert call.scope is not None
    call.scope.cancel()


def with_deadline(holds: Callable[[], bool], what: str, timeout: float = SETTLE) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not holds():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.1)


def run_machine(tmp_path: Path, examples: int, steps: int) -> None:
    live = LiveStack(tmp_path)
    try:
        Approvals.live = live
        machine = Approvals.TestCase
        machine.settings = settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        machine().runTest()
    finally:
        live.close()


def test_waiting_calls_follow_the_model(tmp_path: Path) -> None:
    run_machine(tmp_path, examples=4, steps=10)
