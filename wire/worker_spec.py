"""What the supervisor tells a worker at exec time (JSON in the MCPVISOR_WORKER variable)."""

from __future__ import annotations

import msgspec

from mcpvisor.wire.config import ServerConfig
from mcpvisor.wire.sandboxing import SandboxPlan

ENV_VAR = "MCPVISOR_WORKER"


class WorkerSpec(msgspec.Struct, kw_only=True, frozen=True):
    id: str  # routing identity: `server` or `tenant/server`
    server: ServerConfig
    calls_endpoint: str
    control_endpoint: str = ""
    log_dir: str
    call_timeout: float = 120.0
    log_level: str = "info"
    max_result_bytes: int = 64 * 1024 * 1024  # the largest answer of the upstream to one request
    sandbox: SandboxPlan | None = None  # a stdio upstream's sandbox; None: it runs as mcpvisor does
    # The shared store (`state_url`, as written: references resolve in the worker) where a remote
    # upstream's OAuth login is kept; "": in the data dir. Never given to a stdio server's worker.
    state_url: str = ""


def encode(spec: WorkerSpec) -> str:
    return msgspec.json.encode(spec).decode()


def decode(text: str) -> WorkerSpec:
    return msgspec.json.decode(text, type=WorkerSpec)
