"""Messages between mcpvisor's processes: one tagged union per channel.

MCP payloads (params, results, catalogs) travel as opaque JSON bytes in a frame of their own, so a
process that only forwards them never decodes them; the one kept inline is the upstream's
`initialize` result in `Snapshot`, as bytes too (small, and sent only when the catalog changes).
"""

from __future__ import annotations

from typing import Any

import msgspec

from mcpvisor.wire.config import ServerConfig, TenantConfig
from mcpvisor.wire.errors import ErrorCode
from mcpvisor.wire.operator import Action, OperatorResult
from mcpvisor.wire.policy_sources import PolicyBundle
from mcpvisor.wire.states import ProcessState, UpstreamState


class _Msg(msgspec.Struct, tag_field="t", frozen=True, kw_only=True, omit_defaults=True):
    pass


# ---- calls channel: frontend ROUTER <-> worker DEALERs -------------------------------------------


class Heartbeat(_Msg, tag="hb"):
    """Worker -> frontend, every second: I am alive; this is my catalog version."""

    pid: int
    catalog_seq: int
    state: UpstreamState


class SnapshotRequest(_Msg, tag="snapreq"):
    """Frontend -> worker: send your catalog (the frontend restarted or missed one)."""


class Snapshot(_Msg, tag="snap"):
    """Worker -> frontend: upstream state and catalog; payload: JSON catalog (see workers.catalog)."""

    pid: int
    catalog_seq: int
    state: UpstreamState
    error: str = ""
    server_name: str = ""  # the upstream's own serverInfo.name, informational
    # The upstream's initialize result as JSON (protocolVersion, capabilities, serverInfo,
    # instructions), for /mcp/servers/NAME; empty until it has answered one.
    initialize: bytes = b""
    # Waiting for this worker's tenant to connect its own account: the frontend offers `SERVER:login`.
    login: bool = False


class Request(_Msg, tag="req"):
    """Frontend -> worker: run a request; payload: the JSON params.

    An MCP method goes to the upstream; mcpvisor's own (a login's start, its redirect, a logout:
    store/oauth_store.py LOGIN_METHODS) are the worker's.
    """

    id: int
    method: str
    timeout: float
    activity_id: str = ""  # the activity log's request id, so the worker's lines for the call carry it
    # The frontend's span of this request as the OpenTelemetry propagators write it (`traceparent`,
    # `tracestate`, `baggage`): the parent of the worker's span. Empty while telemetry is off.
    trace_context: dict[str, str] = {}


class Cancel(_Msg, tag="cancel"):
    """Frontend -> worker: the client gave up on request `id`."""

    id: int
    reason: str = ""


class Response(_Msg, tag="res"):
    """Worker -> frontend: request `id` succeeded; payload: the JSON result."""

    id: int


class Failure(_Msg, tag="fail"):
    """Worker -> frontend: request `id` failed."""

    id: int
    code: ErrorCode
    message: str
    mcp_code: int | None = None


class Notify(_Msg, tag="notify"):
    """Worker -> frontend: an upstream notification, or the worker's own account event
    (store/oauth_store.py ACCOUNT_EVENT, which no client sees); payload: its JSON params.

    `id` is the request it belongs to (progress, or a log line during a call), 0 for none.
    """

    method: str
    id: int = 0


class Ask(_Msg, tag="ask"):
    """Worker -> frontend: the upstream asks the client something (sampling, elicitation, roots)
    during request `call_id`; payload: the JSON params. Answered by `Answer` with the same id."""

    id: int
    method: str
    call_id: int = 0


class Answer(_Msg, tag="answer"):
    """Frontend -> worker: the client's answer to `Ask` `id`; payload: the JSON result when ok."""

    id: int
    ok: bool
    code: int = 0
    message: str = ""


CallsMessage = Heartbeat | SnapshotRequest | Snapshot | Request | Cancel | Response | Failure | Notify | Ask | Answer


# ---- control channel: supervisor ROUTER <-> ctl / frontend / worker DEALERs ---------------------


class Command(_Msg, tag="cmd"):
    """A control command, as `mcpvisor ctl` sends it."""

    id: int
    name: str
    args: list[str] = []
    data: Any = None  # structured input (a server table, a patch), for commands that take one


class Reply(_Msg, tag="reply"):
    """The answer to a Command: `result` is command-specific JSON-able data."""

    id: int
    ok: bool
    result: Any = None
    error: str = ""
    exit_code: int = 0


class Report(_Msg, tag="report"):
    """Worker or frontend -> supervisor: I am up (the first one makes it RUNNING), and my state.

    Sent at start, on every upstream state change and every second; a worker that stops sending
    it is considered hung and is restarted.
    """

    name: str  # the process name: `frontend` or `worker:<id>`
    pid: int
    upstream_state: UpstreamState | None = None
    tools: int = 0
    error: str = ""
    fatal: str = ""  # set on the last report of a worker that is exiting because its upstream cannot start
    discoveries: int = 0
    connect_seconds: float = 0.0  # the upstream's own start: transport opened to initialize answered
    waiting: bool = False  # the upstream waits for the operator (a secret it needs is missing): not a crash
    spans_dropped: int = 0  # spans this process could not hand to the collector (telemetry), for /metrics


class ConfigChanged(_Msg, tag="config"):
    """Supervisor -> frontend (events): the servers or tenants tables (or the policies) changed; data inline."""

    servers: dict[str, ServerConfig]
    version: int = 0
    tenants: dict[str, TenantConfig] = {}
    policies: PolicyBundle | None = None


class OperatorRequest(_Msg, tag="opreq"):
    """Supervisor -> frontend: an operator's question or decision about approvals (from `ctl`)."""

    id: int
    action: Action
    name: str = ""
    tools: list[str] = []
    reason: str = ""  # an operator's reason for denying a waiting call


class OperatorReply(_Msg, tag="oprep"):
    """Frontend -> supervisor: the answer to `OperatorRequest` `id`; on failure, `error` says why."""

    id: int
    result: OperatorResult | None = None
    error: str = ""
    exit_code: int = 0


ControlMessage = Command | Reply | Report | OperatorRequest | OperatorReply


# ---- events: supervisor PUB, topic `process.<name>.<event>` --------------------------------------


class ProcessEvent(_Msg, tag="proc"):
    """A process changed state."""

    name: str
    state: ProcessState
    pid: int = 0
    description: str = ""


EventMessage = ProcessEvent | ConfigChanged
