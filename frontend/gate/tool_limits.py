"""Per-tool limits (`[[policy.limits]]`): calls per minute and in flight per (tenant, tool pattern).

Counted at the door, so every way of calling counts (direct, call_tool_*, proxy, code_execution's
call_tool, /mcp/servers/NAME). A call over a limit is refused at once with a tool error that says
which limit and when to retry (`Retry-After` in its `_meta`), as the tenant limits answer HTTP 429.
A call must pass every rule that matches it; each tenant has its own count of a `tenant = "*"` rule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Final

from mcpvisor.runtime.policy_vocabulary import principal_of
from mcpvisor.wire.config import ToolLimit

META_RETRY_AFTER: Final = "io.mcpvisor/retryAfter"


@dataclass(frozen=True, slots=True)
class OverLimit:
    message: str
    retry_after: int  # whole seconds, at least 1


class _Bucket:
    """A token bucket of `rate` calls a minute, full at the start."""

    def __init__(self, rate: int, now: float) -> None:
        self.rate = rate
        self.tokens = float(rate)
        self.at = now

    def wait(self, now: float) -> float:
        """0 when a call may go now, else the seconds until one may (nothing is taken)."""
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate / 60.0)
        self.at = now
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) * 60.0 / self.rate


class ToolLimits:
    def __init__(self, limits: Sequence[ToolLimit] = (), clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rules: list[ToolLimit] = []
        self._buckets: dict[tuple[_Key, str], _Bucket] = {}
        self._in_flight: dict[tuple[_Key, str], int] = {}
        self.configure(limits)

    def configure(self, limits: Sequence[ToolLimit]) -> None:
        """New rules (a reload): counts of rules that did not change are kept."""
        self._rules = list(limits)
        kept = {_key(rule) for rule in self._rules}
        self._buckets = {key: bucket for key, bucket in self._buckets.items() if key[0] in kept}

    def admit(self, tenant: str, tool: str) -> tuple[OverLimit | None, Callable[[], None]]:
        """Count a call of `tool` (`server:tool`) by `tenant`: (refusal or None, what to call when it ends)."""
        principal = principal_of(tenant)
        rules = [rule for rule in self._rules if rule.tenant in ("*", principal) and fnmatchcase(tool, rule.tools)]
        if not rules:
            return None, _nothing
        keys = [(_key(rule), principal) for rule in rules]
        now = self._clock()
        who = principal
        for rule, key in zip(rules, keys, strict=True):
            running = self._in_flight.get(key, 0)
            if rule.max_in_flight is not None and running >= rule.max_in_flight:
                return OverLimit(
                    f"Tool '{tool}' was not run: tenant '{who}' has {running} calls of {rule.tools!r} running, its"
                    f" limit (policy.limits max_in_flight = {rule.max_in_flight}); retry when one has finished",
                    1,
                ), _nothing
        buckets = []
        for rule, key in zip(rules, keys, strict=True):
            if rule.calls_per_minute is None:
                continue
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(rule.calls_per_minute, now)
            if wait := bucket.wait(now):
                return OverLimit(
                    f"Tool '{tool}' was not run: tenant '{who}' is over its limit of {rule.calls_per_minute} calls"
                    f" per minute of {rule.tools!r} (policy.limits calls_per_minute); retry in {wait:.1f}s",
                    max(1, math.ceil(wait)),
                ), _nothing
            buckets.append(bucket)
        for bucket in buckets:
            bucket.tokens -= 1.0
        for key in keys:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            for key in keys:
                self._in_flight[key] -= 1

        return None, release


_Key = tuple[str, str, int | None, int | None]


def _key(rule: ToolLimit) -> _Key:
    """A rule's identity: the same rule after a reload keeps its counts."""
    return (rule.tools, rule.tenant, rule.calls_per_minute, rule.max_in_flight)


def _nothing() -> None:
    return None
