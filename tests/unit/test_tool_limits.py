"""Per-tool limits: calls per minute and in flight, per (tenant, tool pattern), told with when to retry."""

from __future__ import annotations

from mcpvisor.frontend.gate.tool_limits import ToolLimits
from mcpvisor.wire.config import ToolLimit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_calls_per_minute_per_tenant_with_retry_after() -> None:
    clock = Clock()
    limits = ToolLimits([ToolLimit(tools="search:*", calls_per_minute=2)], clock)
    for _ in range(2):
        refusal, done = limits.admit("alice", "search:web")
        assert refusal is None
        done()
    refusal, _ = limits.admit("alice", "search:images")
    assert refusal is not None
    assert refusal.retry_after == 30
    assert refusal.message == (
        "Tool 'search:images' was not run: tenant 'alice' is over its limit of 2 calls per minute of 'search:*'"
        " (policy.limits calls_per_minute); retry in 30.0s"
    )
    assert limits.admit("bob", "search:web")[0] is None  # bob counts apart
    assert limits.admit("", "time:now")[0] is None  # another tool: no rule
    clock.now += 30
    assert limits.admit("alice", "search:web")[0] is None


def test_calls_in_flight_are_released_when_they_end() -> None:
    limits = ToolLimits([ToolLimit(tools="*:slow", tenant="alice", max_in_flight=1)], Clock())
    first, done = limits.admit("alice", "a:slow")
    assert first is None
    second, _ = limits.admit("alice", "b:slow")
    assert second is not None and second.retry_after == 1
    assert "calls of '*:slow' running, its limit (policy.limits max_in_flight = 1)" in second.message
    assert limits.admit("bob", "a:slow")[0] is None  # the rule names alice alone
    done()
    done()  # twice is once
    assert limits.admit("alice", "b:slow")[0] is None


def test_a_refused_call_takes_nothing_from_the_other_rules() -> None:
    clock = Clock()
    limits = ToolLimits(
        [ToolLimit(tools="github:*", calls_per_minute=10), ToolLimit(tools="github:create_*", calls_per_minute=1)],
        clock,
    )
    assert limits.admit("alice", "github:create_issue")[0] is None
    for _ in range(3):
        assert limits.admit("alice", "github:create_issue")[0] is not None
    for _ in range(9):  # the wider rule lost one token only, for the call that ran
        assert limits.admit("alice", "github:list_issues")[0] is None
    assert limits.admit("alice", "github:list_issues")[0] is not None


def test_a_reload_keeps_the_counts_of_unchanged_rules() -> None:
    rule = ToolLimit(tools="s:*", calls_per_minute=1)
    limits = ToolLimits([rule], Clock())
    assert limits.admit("alice", "s:t")[0] is None
    limits.configure([ToolLimit(tools="s:*", calls_per_minute=1), ToolLimit(tools="x:*", max_in_flight=3)])
    assert limits.admit("alice", "s:t")[0] is not None
    limits.configure([ToolLimit(tools="s:*", calls_per_minute=5)])  # changed: counts afresh
    assert limits.admit("alice", "s:t")[0] is None
