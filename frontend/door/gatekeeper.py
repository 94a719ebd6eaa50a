"""The gate: which upstream tools may be shown and run, and the answer given when one may not.

A quarantined server's tools are hidden and never run: a call gets the security analysis of the
server instead. An approved server's tools are pinned (a hash of each definition); a tool whose
definition later differs (a rug pull) is withheld from every listing and refused until an operator
approves it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from mcpvisor.frontend.door.catalog import Catalog, ServerView
from mcpvisor.frontend.gate.approvals import Kind, ToolApprovals
from mcpvisor.frontend.gate.call_policy import CallGate
from mcpvisor.frontend.gate.security import analyze_server, render_report
from mcpvisor.frontend.tool_args import text_result

if TYPE_CHECKING:
    from mcpvisor.frontend.door.upstreams import ToolTarget


def approve_command(server: str) -> str:
    """The operator's command that approves a server (and its changed tools)."""
    return f"mcpvisor ctl approve {server}"


class Audit(Protocol):
    failing: str | None


class Gate:
    """Quarantine and pins, checked on every listing and every call; the policies (`calls`); and, with
    `audit`, a call that could not be recorded in the activity log (`audit_required`) is not run."""

    def __init__(self, approvals: ToolApprovals, calls: CallGate | None = None, audit: Audit | None = None) -> None:
        self.approvals = approvals
        self.calls = calls or CallGate()  # policies, per-tool limits, calls waiting for an operator
        self.audit = audit

    def withheld(self, server: str, tools: Iterable[Mapping[str, Any]], kind: Kind = "tool") -> set[str]:
        """Names of the server's tools (or prompts) whose current definition nobody approved."""
        return self.approvals.drift(server, tools, kind).unapproved

    def sighted(self, view: ServerView) -> None:
        """A server an operator let run shows its lists: pin them if nothing is pinned yet.

        Servers from the config file, and proposals an operator approved, are trusted as they
        are first seen; from then on a changed definition is withheld until approved again.
        """
        for kind, items in (("tool", view.tools), ("prompt", view.prompts)):
            if self.approvals.approved(view.id, kind) is None:
                self.approvals.approve(view.id, items, kind)

    def refusal(self, target: ToolTarget, catalog: Catalog) -> dict[str, Any] | None:
        """The answer to a call that must not run (quarantined server, changed tool, no audit); None if it may run."""
        if self.audit is not None and self.audit.failing is not None:
            return text_result(
                "The activity log cannot record calls right now, and this mcpvisor runs no call it cannot"
                " record (audit_required): the call was NOT executed. An operator must make room for the"
                " state store (the volume of the data dir); calls run again once a row can be written.",
                is_error=True,
            )
        view = catalog.servers[target.server]
        # The other servers' names (what a tool could shadow) cost a walk of the whole catalog:
        # gathered only for a call that is refused.
        if target.quarantined:
            report = analyze_server(target.server, view.tools, other_tools=other_tool_names(catalog, target.server))
            return text_result(render_report(report, tool=target.tool), is_error=True)
        if target.tool in self.withheld(target.server, view.tools):
            others = other_tool_names(catalog, target.server)
            report = analyze_server(target.server, [target.definition], other_tools=others)
            preface = (
                f"TOOL CHANGED SINCE APPROVAL: the definition of '{target.name}' is not the one approved for "
                f"server '{target.server}', so the call was NOT executed. An operator can review the change "
                f"and approve it with `{approve_command(target.server)}` if it is expected."
            )
            return text_result(f"{preface}\n\n{render_report(report, tool=target.tool)}", is_error=True)
        return None


def other_tool_names(catalog: Catalog, server: str) -> set[str]:
    """Other servers' tool names, plain and as `server:tool`: what a tool could try to shadow."""
    names: set[str] = set()
    for view in catalog.ready_servers():
        if view.id != server:
            for tool in view.tools:
                names.update((tool["name"], f"{view.id}:{tool['name']}"))
    return names
