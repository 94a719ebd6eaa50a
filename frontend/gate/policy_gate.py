"""The frontend's policies: what a tenant may see (list) and run (call), decided at the door for every path.

Holds the compiled policy set the supervisor last sent, answers `shown` for every listing (cached
per tool and tenant until the policies or the tool change) and `decide` for every call, counts the
decisions for /metrics, and writes the answer a refused client reads. In dry-run mode every
decision is made and recorded, and nothing is refused or held.

A policy file that no longer compiles when it arrives (it changed on disk after the supervisor
checked it) is refused here too: the policies in force stay, and the log says why.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec
from prometheus_client import CollectorRegistry, Counter

from mcpvisor.runtime.policies import ALLOWED, Decision, Policies, PolicyError
from mcpvisor.runtime.policy_vocabulary import (
    Action,
    Kind,
    cedar_args,
    principal_of,
    prompt_attributes,
    resource_attributes,
    tool_attributes,
)
from mcpvisor.wire.config import PolicyConfig
from mcpvisor.wire.policy_sources import PolicyBundle

log = logging.getLogger(__name__)

LIST_CACHE_LIMIT: Final = 50_000  # cached list decisions; past it the cache starts again
META_DECISION: Final = "io.mcpvisor/decision"
META_POLICIES: Final = "io.mcpvisor/policies"

Mode = Literal["enforce", "dry-run"]


def attributes_of(kind: Kind, server: str, item: Mapping[str, Any]) -> dict[str, Any]:
    """The Cedar attributes of a tool, resource (or template) or prompt definition of `server`."""
    if kind == "tool":
        return tool_attributes(server, item)
    if kind == "resource":
        return resource_attributes(server, item)
    return prompt_attributes(server, item)


class PolicyGate:
    """The policies in force (none: everything allowed, as without `[policy]`)."""

    def __init__(self, bundle: PolicyBundle | None = None, registry: CollectorRegistry | None = None) -> None:
        self.config = PolicyConfig()
        self.policies: Policies | None = None
        self.version = 0  # changes with every reload: listings built before it are stale
        self._shown: dict[tuple[str, Kind, str, tuple[Any, ...]], bool] = {}
        self.decisions = (
            Counter(
                "mcpvisor_policy_decisions",
                "Policy decisions by action, effect (allow, deny, approval) and mode (enforce, dry-run)",
                ["action", "effect", "mode"],
                registry=registry,
            )
            if registry is not None
            else None
        )
        self.reload(bundle)

    @property
    def active(self) -> bool:
        return self.policies is not None

    @property
    def mode(self) -> Mode:
        return self.config.mode

    @property
    def enforcing(self) -> bool:
        return self.config.mode == "enforce"

    def reload(self, bundle: PolicyBundle | None) -> bool:
        """Take in the policies the supervisor sent; False (and the old ones kept) when they do not compile."""
        if bundle is None:
            policies, config = None, PolicyConfig()
        else:
            try:
                policies = Policies.compile(bundle.sources) if bundle.sources else None
            except PolicyError as exc:
                log.error("policies not reloaded, those in force stay: %s", exc)
                return False
            config = bundle.config
        self.policies, self.config = policies, config
        self._shown.clear()
        self.version += 1
        if policies is not None:
            log.info("policies in force: %d (%s)", len(policies.rules), config.mode)
        return True

    # -- list ------------------------------------------------------------------------------------

    def shown(self, tenant: str, kind: Kind, server: str, item: Mapping[str, Any]) -> bool:
        """Whether the tenant's clients see this tool, resource or prompt (dry-run: always)."""
        policies = self.policies
        if policies is None:
            return True
        attributes = attributes_of(kind, server, item)
        key = (tenant, kind, server, tuple(attributes.values()))
        shown = self._shown.get(key)
        if shown is None:
            decision = policies.decide(tenant, "list", kind, attributes)
            self._count("list", decision)
            shown = decision.effect != "deny"
            if not shown and not self.enforcing:
                log.info(
                    "dry-run: would hide %s %s:%s from %s (%s)",
                    kind,
                    server,
                    attributes.get("name"),
                    principal_of(tenant),
                    decision.explanation,
                )
            if len(self._shown) >= LIST_CACHE_LIMIT:
                self._shown.clear()
            self._shown[key] = shown
        return shown or not self.enforcing

    # -- call ------------------------------------------------------------------------------------

    def decide(
        self,
        tenant: str,
        kind: Kind,
        server: str,
        item: Mapping[str, Any],
        arguments: Any = None,
        *,
        endpoint: str = "",
        via: str = "",
        action: Action = "call",
    ) -> Decision:
        """The policies' decision on one call (ALLOWED without policies), counted for /metrics."""
        policies = self.policies
        if policies is None:
            return ALLOWED
        args = cedar_args(_decoded(arguments)) if policies.reads_context else {}
        decision = policies.decide(
            tenant, action, kind, attributes_of(kind, server, item), args=args, endpoint=endpoint, via=via
        )
        self._count(action, decision)
        return decision

    def recorded(self, decision: Decision) -> str:
        """The decision as the activity log keeps it: dry-run says what would have happened."""
        if self.policies is None:
            return ""
        if self.enforcing or decision.effect == "allow":
            return decision.effect
        return "would deny" if decision.effect == "deny" else "would wait for approval"

    def _count(self, action: str, decision: Decision) -> None:
        if self.decisions is not None:
            self.decisions.labels(action, decision.effect, self.config.mode).inc()


def _decoded(arguments: Any) -> Any:
    """Arguments as a short path forwards them (the client's JSON bytes), decoded for the policies."""
    if isinstance(arguments, msgspec.Raw):
        arguments = bytes(arguments)
    if isinstance(arguments, bytes | bytearray | memoryview):
        try:
            return msgspec.json.decode(arguments)
        except msgspec.DecodeError:
            return {}
    return arguments


def refusal_text(kind: Kind, name: str, decision: Decision) -> str:
    """What a client reads when a policy refused its call (the policies' ids and reasons, nothing else)."""
    return f"{kind.title()} '{name}' was not run: {decision.explanation}."


def refusal_meta(decision: Decision) -> dict[str, Any]:
    return {META_DECISION: decision.effect, META_POLICIES: list(decision.policies)}
