"""What the supervisor asks the frontend on an operator's behalf, and the answers.

Approvals (tool pins) and the security analysis live in the frontend; `mcpvisor ctl pending`,
`inspect`, `approve` and `block` reach them through the supervisor as an `OperatorRequest`
(wire/messages.py) answered by an `OperatorReply` carrying one of the results below.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# "account": an upstream login forgotten with no worker running (name: the worker, tools: [event]),
# for the activity log the frontend writes. "calls", "allow", "deny": the calls waiting for an
# operator's approval (name: the call's id; the request's `reason` for deny). "operator": a command
# that changed something, for the activity log (name: its target, tools: [command], reason: by whom).
Action = Literal["pending", "inspect", "approve", "block", "account", "calls", "allow", "deny", "operator"]
# How much harm the security analysis sees in a finding, a tool or a server.
Risk = Literal["low", "medium", "high"]


class PendingServer(msgspec.Struct, kw_only=True, frozen=True):
    """A server waiting for an operator: quarantined, or approved once and changed since."""

    name: str
    reason: Literal["quarantined", "changed"]
    state: str  # the upstream's state, or "not running"
    tools: int
    risk: str
    changed: list[str] = []
    added: list[str] = []
    removed: list[str] = []


class Finding(msgspec.Struct, kw_only=True, frozen=True):
    """One suspicious pattern the security analysis found in a tool definition (frontend/gate/security.py)."""

    kind: str
    rule: str
    severity: Risk
    evidence: str
    location: str = "description"
    detail: str = ""


class ToolReview(msgspec.Struct, kw_only=True, frozen=True):
    """One tool as the security analysis sees it, and where it stands against the approved pins."""

    tool: str
    approval: Literal["approved", "not approved", "changed since approval", "new since approval"]
    risk: str
    score: float
    summary: str
    findings: list[Finding] = []


class _Result(msgspec.Struct, tag_field="kind", kw_only=True, frozen=True):
    pass


class Pending(_Result, tag="pending", kw_only=True):
    servers: list[PendingServer]


class Inspection(_Result, tag="inspection", kw_only=True):
    """What an operator needs to decide: what runs, where it connects, what its tools say."""

    name: str
    quarantined: bool
    enabled: bool
    connected: bool
    transport: str
    command: list[str] = []  # the program and its arguments, for a stdio server
    cwd: str = ""
    url: str = ""  # credentials in it are redacted
    env: list[str] = []  # names only: values may be secrets
    headers: list[str] = []
    risk: str
    score: float
    counts: dict[str, int] = {}
    tools: list[ToolReview] = []
    removed_since_approval: list[str] = []


class Decision(_Result, tag="decision", kw_only=True):
    """What `approve` or `block` changed."""

    name: str
    action: Literal["approve", "block"]
    quarantined: bool
    tools: list[str] = []  # the tools approved or blocked by name; empty: the whole server
    approved_tools: list[str] = []  # every tool of the server approved after this decision


class Noted(_Result, tag="noted", kw_only=True):
    """The frontend recorded what it was told."""


class WaitingCall(msgspec.Struct, kw_only=True, frozen=True):
    """A call waiting for an operator: never its raw arguments (`arguments` is redacted JSON text)."""

    id: str
    tenant: str  # "local": the plain endpoints
    tool: str  # server:tool
    arguments: str
    since: float  # seconds since the epoch
    expires: float  # when approval_timeout refuses it
    policies: list[str]  # the permits that ask for approval
    endpoint: str = ""
    client: str = ""


class WaitingCalls(_Result, tag="waiting", kw_only=True):
    calls: list[WaitingCall]


class CallVerdict(_Result, tag="verdict", kw_only=True):
    """What `allow` or `deny` decided."""

    id: str
    verdict: Literal["allow", "deny"]
    tool: str
    tenant: str
    reason: str = ""


OperatorResult = Pending | Inspection | Decision | Noted | WaitingCalls | CallVerdict
