"""The operator's side of approvals: what `mcpvisor ctl pending | inspect | approve | block` do.

The supervisor forwards these commands as `OperatorRequest`s over the control channel; the
frontend answers them here because it holds what they are about: the upstreams' tools, the
approved pins (frontend/gate/approvals.py) and the security analysis. The quarantine flag itself is
configuration, so approving or blocking a whole server goes back to the supervisor
(`server.quarantine`), which writes the config file, as the `quarantine_security` tool does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from mcpvisor.frontend.door.catalog import Catalog, ServerView
from mcpvisor.frontend.door.control import ControlClient, ControlError
from mcpvisor.frontend.door.gatekeeper import other_tool_names
from mcpvisor.frontend.gate.approvals import ToolApprovals
from mcpvisor.frontend.gate.security import analyze_server
from mcpvisor.frontend.gate.waiting_calls import UnknownCall, WaitingCalls, operator_answer
from mcpvisor.store.state_db import STORE_ERRORS
from mcpvisor.wire.config import ServerConfig
from mcpvisor.wire.messages import OperatorReply, OperatorRequest
from mcpvisor.wire.operator import (
    Decision,
    Inspection,
    Noted,
    OperatorResult,
    Pending,
    PendingServer,
    ToolReview,
)
from mcpvisor.wire.redaction import redact_url

log = logging.getLogger(__name__)

# The supervisor's exit codes for what can go wrong here (LSB, as `ctl` reports them).
_EXIT_ERROR = 1
_EXIT_UNKNOWN = 4


class OperatorError(Exception):
    """A request that cannot be carried out; the message goes to the operator as it is."""

    def __init__(self, message: str, exit_code: int = _EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class Operator:
    """Answers the operator's requests about which servers and tools clients may use."""

    def __init__(
        self,
        *,
        servers: Callable[[], Mapping[str, ServerConfig]],
        catalog: Catalog,
        approvals: ToolApprovals,
        control: ControlClient,
        changed: Callable[[str], None],
        accounts: Callable[[str, Mapping[str, Any]], None] | None = None,
        waiting: WaitingCalls | None = None,
        changes: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self._changes = changes  # records an operator's change (command, target, by whom) in the activity log
        self.waiting = waiting  # the calls waiting for an operator's approval (`ctl calls | allow | deny`)
        self._servers = servers  # a getter: the table changes with every ConfigChanged
        self._accounts = accounts  # records an upstream login or logout in the activity log
        self.catalog = catalog
        self.approvals = approvals
        self.control = control
        self._changed = changed  # tells clients that what they see of a server changed

    async def answer(self, request: OperatorRequest) -> OperatorReply:
        """Run one request; every failure becomes an error reply, never an exception."""
        try:
            result = await self._run(request)
        except OperatorError as exc:
            return OperatorReply(id=request.id, error=exc.message, exit_code=exc.exit_code)
        except UnknownCall as exc:
            return OperatorReply(id=request.id, error=str(exc), exit_code=_EXIT_UNKNOWN)
        except STORE_ERRORS as exc:
            log.error("operator %s: the state store failed: %s", request.action, exc)
            return OperatorReply(id=request.id, error=f"the state store failed: {exc}", exit_code=_EXIT_ERROR)
        # Anything else is a bug; the frontend must outlive it, the log gets the traceback.
        except Exception as exc:
            log.exception("operator %s failed", request.action)
            error = f"{request.action}: internal error ({type(exc).__name__}); the frontend's log has the details"
            return OperatorReply(id=request.id, error=error, exit_code=_EXIT_ERROR)
        return OperatorReply(id=request.id, result=result)

    async def _run(self, request: OperatorRequest) -> OperatorResult:
        if request.action == "pending":
            return await self.pending()
        if request.action == "inspect":
            return await self.inspect(request.name)
        if request.action == "approve":
            return await self.approve(request.name, request.tools)
        if request.action in ("calls", "allow", "deny"):
            if self.waiting is None:
                raise OperatorError("this frontend holds no calls for approval")
            return await operator_answer(self.waiting, request.action, request.name, request.reason, "ctl")
        if request.action == "operator":
            if self._changes is not None and request.tools:
                self._changes(request.tools[0], request.name, request.reason)
            return Noted()
        if request.action == "account":
            if self._accounts is not None and request.tools:
                self._accounts(request.name, {"event": request.tools[0], "by": "operator"})
            return Noted()
        return await self.block(request.name, request.tools)

    # -- questions -------------------------------------------------------------------------------

    async def pending(self) -> Pending:
        """Quarantined servers, and approved servers whose tools changed since their approval."""
        rows = []
        for name, config in sorted(self._servers().items()):
            view = self.catalog.servers.get(name)
            tools = view.tools if view is not None else []
            state = str(view.state) if view is not None and view.alive else "not running"
            if config.quarantined:
                report = analyze_server(name, tools, other_tools=other_tool_names(self.catalog, name))
                rows.append(
                    PendingServer(name=name, reason="quarantined", state=state, tools=len(tools), risk=report.risk)
                )
            # A server that is (re)connecting lists no tools yet: that is not a change of its tools.
            elif view is not None and view.ready and (drift := self.approvals.drift(name, tools)):
                report = analyze_server(name, tools, other_tools=other_tool_names(self.catalog, name))
                rows.append(
                    PendingServer(
                        name=name,
                        reason="changed",
                        state=state,
                        tools=len(tools),
                        risk=report.risk,
                        changed=drift.changed,
                        added=drift.added,
                        removed=drift.removed,
                    )
                )
        return Pending(servers=rows)

    async def inspect(self, name: str) -> Inspection:
        """What the server runs or connects to, and its tools against the approved pins."""
        config = self._server(name)
        view = self.catalog.servers.get(name)
        tools = view.tools if view is not None else []
        report = analyze_server(name, tools, other_tools=other_tool_names(self.catalog, name))
        approved = self.approvals.approved(name)
        drift = self.approvals.drift(name, tools)
        reviews = []
        for tool in report.tools:
            if approved is None:
                approval = "not approved"
            elif tool.tool in drift.changed:
                approval = "changed since approval"
            elif tool.tool in drift.added:
                approval = "new since approval"
            else:
                approval = "approved"
            reviews.append(
                ToolReview(
                    tool=tool.tool,
                    approval=approval,
                    risk=tool.risk,
                    score=tool.score,
                    summary=tool.summary,
                    findings=tool.findings,
                )
            )
        return Inspection(
            name=name,
            quarantined=config.quarantined,
            enabled=config.enabled,
            connected=view is not None and view.ready,
            transport=config.kind,
            command=[config.command, *config.args] if config.command is not None else [],
            cwd=config.cwd or "",
            url=redact_url(config.url or ""),
            env=sorted(config.env),
            headers=sorted(config.headers),
            risk=report.risk,
            score=report.score,
            counts=report.counts,
            tools=reviews,
            removed_since_approval=drift.removed,
        )

    # -- decisions -------------------------------------------------------------------------------

    async def approve(self, name: str, tools: list[str]) -> Decision:
        """Pin the server's tools (or only `tools`) as they are now, and lift its quarantine."""
        config = self._server(name)
        current = self._current_tools(name, "approved")
        self._check_tools(name, tools, current)
        keep = set(current) if not tools else self._approved_now(name, config, current) | set(tools)
        # Pins first: once the quarantine is lifted, clients must see only what is approved.
        hashes = self.approvals.approve(name, [current[tool] for tool in sorted(keep)])
        if not tools:  # approving the whole server approves its prompts as they are now, too
            self.approvals.approve(name, self.catalog.servers[name].prompts, "prompt")
        # In the shared store before the quarantine is lifted: other replicas follow both.
        await self.approvals.flush()
        if config.quarantined:
            await self._set_quarantined(name, False)
        self._changed(name)
        return Decision(
            name=name, action="approve", quarantined=False, tools=sorted(set(tools)), approved_tools=sorted(hashes)
        )

    async def block(self, name: str, tools: list[str]) -> Decision:
        """Quarantine the server, or withhold only `tools` until they are approved again."""
        config = self._server(name)
        if not tools:
            if not config.quarantined:
                await self._set_quarantined(name, True)
            self._changed(name)
            return Decision(
                name=name, action="block", quarantined=True, approved_tools=sorted(self.approvals.approved(name) or {})
            )
        current = self._current_tools(name, "blocked")
        self._check_tools(name, tools, current)
        keep = self._approved_now(name, config, current) - set(tools)
        hashes = self.approvals.approve(name, [current[tool] for tool in sorted(keep)])
        await self.approvals.flush()
        self._changed(name)
        return Decision(
            name=name,
            action="block",
            quarantined=config.quarantined,
            tools=sorted(set(tools)),
            approved_tools=sorted(hashes),
        )

    # -- helpers ---------------------------------------------------------------------------------

    def _server(self, name: str) -> ServerConfig:
        config = self._servers().get(name)
        if config is None:
            known = ", ".join(sorted(self._servers())) or "none"
            raise OperatorError(f"{_shown(name)}: no such server (servers: {known})", _EXIT_UNKNOWN)
        return config

    def _current_tools(self, name: str, done: str) -> dict[str, dict[str, Any]]:
        """The server's tools by name; an error when they are not known (the upstream is not ready)."""
        view: ServerView | None = self.catalog.servers.get(name)
        if view is None or not view.ready:
            raise OperatorError(
                f"{name}: cannot be {done} yet: {self.catalog.describe_unavailable(name)}; its tools must be "
                "known first, try again once it is connected"
            )
        return {tool["name"]: tool for tool in view.tools if isinstance(tool.get("name"), str)}

    @staticmethod
    def _check_tools(name: str, tools: list[str], current: Mapping[str, Any]) -> None:
        unknown = [tool for tool in tools if tool not in current]
        if unknown:
            known = ", ".join(sorted(current)) or "none"
            raise OperatorError(f"{name}: no tool {_shown(unknown[0])} (tools: {known})", _EXIT_UNKNOWN)

    def _approved_now(self, name: str, config: ServerConfig, current: Mapping[str, Any]) -> set[str]:
        """The tools clients may use now: pinned and unchanged, or all of a never-pinned visible server."""
        if self.approvals.approved(name) is None:
            return set() if config.quarantined else set(current)
        return set(current) - self.approvals.drift(name, current.values()).unapproved

    async def _set_quarantined(self, name: str, quarantined: bool) -> None:
        try:
            await self.control.call("server.quarantine", data={"name": name, "quarantined": quarantined})
        except ControlError as exc:
            raise OperatorError(f"{name}: the supervisor could not record the decision: {exc}") from None


def _shown(name: str) -> str:
    """A name as the operator typed it, on one line and not too long."""
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "...'"
