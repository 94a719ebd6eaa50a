"""What the supervisor tells the frontend at exec time (JSON in the MCPVISOR_FRONTEND variable)."""

from __future__ import annotations

import msgspec

from mcpvisor.wire.config import OAuthResourceConfig, RegistryConfig, SearchConfig, ServerConfig, Settings, TenantConfig
from mcpvisor.wire.policy_sources import PolicyBundle

ENV_VAR = "MCPVISOR_FRONTEND"


class FrontendSpec(msgspec.Struct, kw_only=True, frozen=True):
    settings: Settings
    servers: dict[str, ServerConfig]
    calls_endpoint: str
    control_endpoint: str
    events_endpoint: str
    config_path: str = ""
    data_dir: str = ""
    registries: dict[str, RegistryConfig] = {}
    tenants: dict[str, TenantConfig] = {}
    oauth: OAuthResourceConfig | None = None
    # Host paths no sandbox may see (data, runtime and config dirs, secret and token files):
    # code_execution's script sandbox covers them wherever a bind would show them.
    hidden: list[str] = []
    search: SearchConfig = msgspec.field(default_factory=SearchConfig)
    policies: PolicyBundle | None = None  # [policy] and the text of its files (None: no policies)


def encode(spec: FrontendSpec) -> str:
    return msgspec.json.encode(spec).decode()


def decode(text: str) -> FrontendSpec:
    return msgspec.json.decode(text, type=FrontendSpec)
