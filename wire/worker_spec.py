"""What the supervisor tells a worker at exec time (JSON in the MCPVISOR_WORKER variable)."""

from __future__ import annotations

import msgspec

from mcpvisor.wire.config import ServerConfig

ENV_VAR = "MCPVISOR_WORKER"


class WorkerSpec(msgspec.Struct, kw_only=True, frozen=True):
    id: str  # routing identity: `server` or `tenant/server`
    server: ServerConfig
    calls_endpoint: str
    control_endpoint: str = ""
    log_dir: str
    call_timeout: float = 120.0
    log_level: str = "info"


def encode(spec: WorkerSpec) -> str:
    return msgspec.json.encode(spec).decode()


def decode(text: str) -> WorkerSpec:
    return msgspec.json.decode(text, type=WorkerSpec)
