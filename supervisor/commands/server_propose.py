"""`server.propose`, `server.proposals` and `server.patch` (for the frontend's upstream_servers tool).

What an MCP client asks to change about the servers never runs a program, opens a connection or
resolves a secret here: it becomes a proposal (store/proposals.py) that the operator reviews with
`ctl pending` / `ctl inspect NAME` and applies with `ctl approve NAME` (or drops with `ctl block
NAME`). The one change a client makes directly is a patch of a server's `policy` (timeouts and
restart limits), which changes neither what runs nor where it connects.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from mcpvisor.store.proposals import (
    Proposal,
    ProposalAction,
    describe_references,
    new_proposal,
    secret_references,
)
from mcpvisor.supervisor import configstore
from mcpvisor.supervisor.commands import EXIT_UNKNOWN, EXIT_USAGE, Args, CommandError, command
from mcpvisor.wire.config import CLIENT_FIELDS, DIRECT_FIELDS, ServerConfig, server_name_problem
from mcpvisor.wire.merge import deep_merge
from mcpvisor.wire.redaction import redact_table, redact_url

if TYPE_CHECKING:
    from mcpvisor.supervisor.supervisor import Supervisor


def redacted(table: dict[str, Any]) -> dict[str, Any]:
    """A server table safe to show: env and header values redacted, URL credentials hidden."""
    shown = dict(table)
    for key in ("env", "headers"):
        if isinstance(shown.get(key), dict):
            shown[key] = redact_table(shown[key])
    if isinstance(shown.get("url"), str):
        shown["url"] = redact_url(shown["url"])
    return shown


def when(proposal: Proposal) -> str:
    return datetime.fromtimestamp(proposal.proposed_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def listing(proposal: Proposal) -> dict[str, Any]:
    """A proposal as `upstream_servers list` and `ctl pending` show it; secrets redacted."""
    row: dict[str, Any] = {"name": proposal.key, "action": proposal.action, "proposed_at": when(proposal)}
    if proposal.tenant:
        row["tenant"] = proposal.tenant
    if proposal.action == "add" and proposal.config is not None:
        server = msgspec.convert(proposal.config, ServerConfig)
        row["transport"] = server.kind
        if server.command is not None:
            row["command"] = server.command
            row["args"] = list(server.args)
        else:
            row["url"] = redact_url(server.url or "")
    elif proposal.action == "patch" and proposal.patch is not None:
        row["fields"] = sorted(proposal.patch)
    return row


def refuse_when_off(sup: Supervisor) -> None:
    if sup.config.mcpvisor.client_server_changes == "off":
        raise CommandError(
            'changes to the servers from MCP clients are turned off (client_server_changes = "off" in '
            "[mcpvisor]); the operator changes servers in the config file or with mcpvisor ctl"
        )


def check_name(name: str) -> None:
    """Refuse (CommandError) a name no server may have, as the config loader would."""
    if (problem := server_name_problem(name)) is not None:
        raise CommandError(f"invalid server name {name[:80]!r}: {problem}", EXIT_USAGE)


def _check_client_table(name: str, table: dict[str, Any]) -> None:
    """Refuse fields a client may not set and secret references, whatever the frontend checked."""
    unknown = sorted(set(table) - CLIENT_FIELDS.keys())
    if unknown:
        raise CommandError(f"server {name!r}: a client may not set {', '.join(map(repr, unknown[:5]))}", EXIT_USAGE)
    if where := secret_references(table):
        raise CommandError(describe_references(name, where), EXIT_USAGE)


class ProposeArgs(Args):
    name: str
    action: ProposalAction
    config: dict[str, Any] | None = None  # add: the server table
    patch: dict[str, Any] | None = None  # patch: the fields to change (null removes one)
    tenant: str = ""  # a tenant's client: it may propose new servers for itself alone


@command("server.propose", args=ProposeArgs, ctl=False)
async def server_propose(sup: Supervisor, args: ProposeArgs) -> dict[str, Any]:
    """Keep a client's change to the servers as a proposal (data: {name, action, config | patch}).

    Nothing runs until an operator approves it with `ctl approve NAME`. A second proposal for the
    same name replaces the first.
    """
    refuse_when_off(sup)
    name, action = args.name, args.action
    check_name(name)
    source = f"proposed server {name!r}"
    current = sup.config.servers.get(name)
    if args.tenant:
        # A tenant sees only its own servers: whatever else exists must not change its answer.
        table = sup.config.tenants.get(args.tenant)
        if table is None:
            raise CommandError(f"{args.tenant}: no such tenant", EXIT_UNKNOWN)
        if action != "add":
            raise CommandError(
                f"server {name!r} may be shared with other tenants: a tenant's client can only propose new "
                "servers; ask the operator for this change"
            )
        current = sup.config.servers.get(name) if name in table.servers else None
    if action == "add":
        if current is not None:
            raise CommandError(f"server {name!r} already exists (propose a patch to change it)")
        if not args.config:
            raise CommandError(f"server {name!r}: an add needs its server table (config)", EXIT_USAGE)
        _check_client_table(name, args.config)
        # Checked as if it stood in the config file, so an approval cannot fail on its form.
        server = configstore.server_from_table(name, args.config, source=source)
        proposal = new_proposal(name, "add", config=configstore.server_table(server), tenant=args.tenant)
    else:
        if current is None:
            raise CommandError(f"{name}: no such server", EXIT_UNKNOWN)
        if action == "patch":
            if not args.patch:
                raise CommandError(f"server {name!r}: a patch needs the fields to change", EXIT_USAGE)
            _check_client_table(name, args.patch)
            merged = deep_merge(configstore.server_table(current), args.patch)
            server = configstore.server_from_table(name, merged, source=source)
            if server == current:
                return {"name": name, "action": action, "pending": False, "changed": False}
            proposal = new_proposal(name, "patch", config=configstore.server_table(server), patch=dict(args.patch))
        else:
            if args.config is not None or args.patch is not None:
                raise CommandError(f"server {name!r}: {action} takes only the name", EXIT_USAGE)
            if action in ("enable", "disable") and current.enabled == (action == "enable"):
                earlier = sup.proposals.get(name)
                if earlier is not None and earlier.action in ("enable", "disable"):
                    # The server is as the client now asks: an opposite proposal is moot.
                    await sup.on_proposals(sup.proposals.pop, name)
                return {"name": name, "action": action, "pending": False, "changed": False}
            proposal = new_proposal(name, action)
    replaced = await sup.on_proposals(sup.proposals.put, proposal)
    return {
        "name": name,
        "action": action,
        "pending": True,
        "replaced": replaced.action if replaced is not None else None,
        "proposal": listing(proposal),
    }


class ProposalsArgs(Args):
    tenant: str | None = None  # a tenant's client sees its own proposals alone


@command("server.proposals", args=ProposalsArgs, ctl=False)
async def server_proposals(sup: Supervisor, args: ProposalsArgs) -> dict[str, Any]:
    """The pending proposals, redacted (for the frontend's `upstream_servers list`)."""
    if args.tenant:
        mine = [proposal for proposal in sup.proposals if proposal.tenant == args.tenant]
        return {"proposals": [{**listing(proposal), "name": proposal.name} for proposal in mine]}
    return {"proposals": [listing(proposal) for proposal in sup.proposals]}


class PatchArgs(Args):
    name: str
    patch: dict[str, Any]


@command("server.patch", args=PatchArgs, ctl=False)
async def server_patch(sup: Supervisor, args: PatchArgs) -> dict[str, Any]:
    """Change a server's `policy` by deep merge (data: {name, patch}); any other field is a proposal."""
    refuse_when_off(sup)
    name = args.name
    current = sup.config.servers.get(name)
    if current is None:
        raise CommandError(f"{name}: no such server", EXIT_UNKNOWN)
    others = sorted(set(args.patch) - DIRECT_FIELDS)
    if others:
        raise CommandError(
            f"server {name!r}: {', '.join(map(repr, others[:5]))} cannot be changed directly; propose the change "
            "(server.propose) for an operator to approve",
            EXIT_USAGE,
        )
    if where := secret_references(args.patch):
        raise CommandError(describe_references(name, where), EXIT_USAGE)
    merged = deep_merge(configstore.server_table(current), args.patch)
    server = configstore.server_from_table(name, merged, source=f"server {name!r}")
    if server != current:
        await sup.change_server(name, server)
    return {"name": name, "config": redacted(configstore.server_table(server))}


# -- the operator's side: ctl pending / inspect / approve / block on a proposal ---------------------


async def apply_proposal(sup: Supervisor, proposal: Proposal) -> dict[str, Any]:
    """Apply an approved proposal through the normal path (config file written back) and drop it."""
    name = proposal.name
    current = sup.config.servers.get(name)
    server: ServerConfig | None
    if proposal.action == "add":
        if current is not None:
            await sup.on_proposals(sup.proposals.pop, proposal.key)
            raise CommandError(f"{name}: a server of that name exists now; the proposal to add it was dropped")
        # The operator approved what runs: not quarantined. Its tools are pinned as first seen.
        table = {**(proposal.config or {}), "quarantined": False}
        server = configstore.server_from_table(name, table, source=f"proposed server {name!r}")
    else:
        if current is None:
            await sup.on_proposals(sup.proposals.pop, proposal.key)
            raise CommandError(f"{name}: no such server any more; the proposal was dropped", EXIT_UNKNOWN)
        server = _result(proposal, current)
    if proposal.tenant and proposal.tenant not in sup.config.tenants:
        await sup.on_proposals(sup.proposals.pop, proposal.key)
        raise CommandError(
            f"{proposal.key}: tenant {proposal.tenant!r} is no longer configured; the proposal was dropped"
        )
    # Dropped first, so applying it does not read as the servers changing under it; kept on failure.
    await sup.on_proposals(sup.proposals.pop, proposal.key)
    try:
        if server != current:
            await sup.change_server(name, server, tenant=proposal.tenant)
    except BaseException:
        with trio.CancelScope(shield=True):  # kept even when the command was cancelled
            await sup.on_proposals(sup.proposals.put, proposal)
        raise
    result: dict[str, Any] = {
        "kind": "proposal",
        "name": proposal.key,
        "action": "approve",
        "proposal": proposal.action,
    }
    if server is not None:
        result["config"] = redacted(configstore.server_table(server))
    return result


async def reject_proposal(sup: Supervisor, proposal: Proposal) -> dict[str, Any]:
    await sup.on_proposals(sup.proposals.pop, proposal.key)
    return {"kind": "proposal", "name": proposal.key, "action": "block", "proposal": proposal.action}


def _result(proposal: Proposal, current: ServerConfig) -> ServerConfig | None:
    """What the server becomes if `proposal` is applied to it now."""
    if proposal.action == "remove":
        return None
    if proposal.action in ("enable", "disable"):
        return msgspec.structs.replace(current, enabled=proposal.action == "enable")
    # The patch as given, on the server as it is now: the operator may have changed it since.
    merged = deep_merge(configstore.server_table(current), proposal.patch or {})
    return configstore.server_from_table(proposal.name, merged, source=f"proposed patch of {proposal.name!r}")


def inspection(sup: Supervisor, proposal: Proposal) -> dict[str, Any]:
    """What the operator needs to decide: the exact command line or URL, env and header names, the diff."""
    current = sup.config.servers.get(proposal.name)
    if proposal.action == "add":
        after: ServerConfig | None = msgspec.convert(proposal.config or {}, ServerConfig)
    elif current is None:
        after = None
    else:
        try:
            after = _result(proposal, current)
        except CommandError:
            after = None
    shown = after if after is not None else current
    result: dict[str, Any] = {
        "kind": "proposal",
        "name": proposal.name,
        "action": proposal.action,
        "proposed_at": when(proposal),
        "transport": "",
        "command": [],
        "cwd": "",
        "url": "",
        "env": [],
        "headers": [],
        "changes": [],
    }
    if shown is not None:
        result.update(
            transport=shown.kind,
            command=[shown.command, *shown.args] if shown.command is not None else [],
            cwd=shown.cwd or "",
            url=redact_url(shown.url or ""),
            env=sorted(shown.env),
            headers=sorted(shown.headers),
        )
    if proposal.action != "add" and current is not None:
        before_table = configstore.server_table(current)
        after_table = configstore.server_table(after) if after is not None else {}
        for field in CLIENT_FIELDS:
            before_value, after_value = before_table.get(field), after_table.get(field)
            if before_value != after_value or (after is None and before_value is not None):
                result["changes"].append(
                    {"field": field, **_shown_change(field, before_value, after_value if after is not None else None)}
                )
    return result


def _shown_change(field: str, before: Any, after: Any) -> dict[str, Any]:
    """One field's before and after, without a secret: env and header values become markers."""
    if field in ("env", "headers"):
        old, new = before or {}, after or {}
        return {
            "before": sorted(old),
            "after": sorted(
                f"{key} (new)" if key not in old else f"{key} (changed)" if old[key] != new[key] else key for key in new
            ),
        }
    if field == "url":
        return {"before": redact_url(before) if before else None, "after": redact_url(after) if after else None}
    return {"before": before, "after": after}
