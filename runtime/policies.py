"""Cedar policies compiled once, and the decisions they make, each naming the policies that made it.

Cedar decides: a `forbid` that applies overrides every `permit`, and nothing is allowed that no
`permit` allows. mcpvisor adds three things, all read from policy annotations:

- `@id("...")` names a policy in every decision (else it is `FILE:LINE`, FILE the file's name);
- `@reason("...")` is told to the client whose call a `forbid` refused;
- `@approval("operator")` on a `permit`: a call it allows waits for an operator. When several
  permits allow a call and any of them asks for approval, the call waits (the strictest permit
  wins).

A `forbid` that cannot be evaluated for a request (a type error, say) refuses it: Cedar would skip
it, and a policy meant to refuse must not let a call through because it failed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Final, Literal

import cedarpy
import msgspec

from mcpvisor.runtime.policy_vocabulary import ENTITY_TYPES, SCHEMA, Action, Kind, entity_id, principal_of
from mcpvisor.wire.policy_sources import PolicyText

Effect = Literal["allow", "deny", "approval"]

APPROVER: Final = "operator"  # the one value @approval takes
_ERROR_POLICY: Final = re.compile(r"policy `([^`]*)`")
_encode = msgspec.json.encode


class PolicyError(Exception):
    """Policy text that cannot be used; the message names the file and line (`FILE:LINE: what`)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One policy, as decisions and `check` speak of it."""

    id: str  # @id, else FILE:LINE
    effect: Literal["permit", "forbid"]
    path: str
    line: int
    reason: str = ""
    approval: bool = False
    body: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)  # Cedar's JSON form

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True, slots=True)
class Decision:
    """allow, deny or approval (allow once an operator does), and the policies that decided it."""

    effect: Effect
    policies: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()  # the deciding forbids' @reason texts (those that have one)
    errors: tuple[str, ...] = ()  # policies that could not be evaluated, and why

    @property
    def explanation(self) -> str:
        """One line for whoever asked: which policies, and their reasons."""
        if self.effect == "deny" and not self.policies:
            return "no policy permits it"
        named = ", ".join(f"'{policy}'" for policy in self.policies)
        word = "policy" if len(self.policies) == 1 else "policies"
        if self.effect == "approval":
            text = f"{word} {named} requires an operator's approval"
        elif self.effect == "allow":
            text = f"permitted by {word} {named}"
        elif self.errors:
            text = f"{word} {named} could not be evaluated for this call"
        else:
            text = f"refused by {word} {named}"
        return f"{text}: {'; '.join(self.reasons)}" if self.reasons else text


ALLOWED: Final = Decision("allow")  # what every request gets without policy files


class Policies:
    """A compiled policy set: decide a request in a few tens of microseconds."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = {rule.id: rule for rule in rules}
        # Cedar evaluates every policy of a set. A policy for `principal == Tenant::"X"` can only
        # apply to X: each principal decides with the policies for anyone and its own, so a host of
        # many tenants pays for one tenant's policies per decision, not for all of them.
        self._anyone = [rule for rule in rules if _principal(rule) is None]
        self._own: dict[str, list[Rule]] = {}
        for rule in rules:
            if (principal := _principal(rule)) is not None:
                self._own.setdefault(principal, []).append(rule)
        self._sets: dict[str, cedarpy.PolicySet] = {}
        # Arguments cost a conversion per call: only when some policy reads the context at all.
        self.reads_context = any(reads_context(rule.body) for rule in rules)

    def _set_of(self, principal: str) -> cedarpy.PolicySet:
        key = principal if principal in self._own else ""
        found = self._sets.get(key)
        if found is None:
            rules = self._anyone + self._own.get(key, [])
            body = {"staticPolicies": {rule.id: rule.body for rule in rules}, "templates": {}, "templateLinks": []}
            found = self._sets[key] = cedarpy.PolicySet.from_json_str(_encode(body).decode())
        return found

    @classmethod
    def compile(cls, sources: Sequence[PolicyText]) -> Policies:
        """Parse and validate the files against the schema; PolicyError names the first problem."""
        return cls(load_rules(sources))

    def decide(
        self,
        tenant: str,
        action: Action,
        kind: Kind,
        attributes: Mapping[str, Any],
        *,
        args: Mapping[str, Any] | None = None,
        endpoint: str = "",
        via: str = "",
    ) -> Decision:
        """Whether `tenant` may `action` the tool, resource or prompt with these attributes."""
        entity = {"type": ENTITY_TYPES[kind], "id": entity_id(kind, attributes)}
        context = {"args": args or {}, "endpoint": endpoint, "via": via} if self.reads_context else {}
        principal = principal_of(tenant)
        request = {
            "principal": {"type": "Tenant", "id": principal},
            "action": {"type": "Action", "id": action},
            "resource": entity,
            "context": _encode(context).decode(),
        }
        entities = _encode([{"uid": entity, "attrs": attributes, "parents": []}]).decode()
        result = cedarpy.is_authorized(request, self._set_of(principal), entities)
        return self._decision(result)

    def _decision(self, result: cedarpy.AuthzResult) -> Decision:
        diagnostics = result.diagnostics
        failed: dict[str, str] = {}
        for error in diagnostics.errors:
            if (match := _ERROR_POLICY.search(error)) is not None and match.group(1) in self.rules:
                failed.setdefault(match.group(1), error)
        broken = [key for key in failed if self.rules[key].effect == "forbid"]
        if broken:
            return Decision("deny", tuple(broken), errors=tuple(failed[key] for key in broken))
        if result.decision is cedarpy.Decision.Allow:
            permits = [self.rules[key] for key in diagnostics.reasons if key in self.rules]
            waiting = [rule for rule in permits if rule.approval]
            if waiting:
                return Decision("approval", tuple(rule.id for rule in waiting))
            return Decision("allow", tuple(rule.id for rule in permits))
        if result.decision is cedarpy.Decision.Deny:
            forbids = [self.rules[key] for key in diagnostics.reasons if key in self.rules]
            return Decision(
                "deny", tuple(rule.id for rule in forbids), tuple(rule.reason for rule in forbids if rule.reason)
            )
        # No decision: the request itself could not be built. Refuse, and say why.
        return Decision("deny", errors=tuple(diagnostics.errors) or ("the request could not be evaluated",))


# -- loading ---------------------------------------------------------------------------------------


def load_rules(sources: Sequence[PolicyText]) -> list[Rule]:
    """Every policy of the files, in order, checked: syntax, schema, annotations, unique ids."""
    rules: list[Rule] = []
    names: dict[str, str] = {}
    for source in sources:
        name = PurePath(source.path).name
        if name in names and names[name] != source.path:
            raise PolicyError(
                f"{source.path}: another policy file is also named {name} ({names[name]}): policies are named"
                " FILE:LINE, so file names must differ"
            )
        names[name] = source.path
        rules.extend(_file_rules(source, name))
    seen: dict[str, Rule] = {}
    for rule in rules:
        if rule.id in seen:
            raise PolicyError(f"{rule.where}: @id({rule.id!r}) is also the id of the policy at {seen[rule.id].where}")
        seen[rule.id] = rule
    return rules


def _file_rules(source: PolicyText, name: str) -> list[Rule]:
    statements = split_statements(source.text)
    try:
        parsed = msgspec.json.decode(cedarpy.policies_to_json_str(source.text))
    except ValueError as exc:
        raise PolicyError(_locate_syntax_error(source.path, statements, str(exc))) from None
    if parsed.get("templates"):
        raise PolicyError(f"{source.path}: policy templates (?principal, ?resource) are not supported")
    bodies = list(parsed.get("staticPolicies", {}).items())
    lines = [line for line, _ in statements] if len(statements) == len(bodies) else [0] * len(bodies)
    validation = cedarpy.validate_policies(source.text, SCHEMA)
    if not validation.validation_passed:
        error = validation.errors[0]
        index = _policy_index(error.policy_id)
        line = lines[index] if index is not None and index < len(lines) else 0
        where = f"{source.path}:{line}" if line else source.path
        message = re.sub(r"^for policy `[^`]*`, ", "", error.error)
        if "in context" in message and "args." in message:
            message += "; test for an argument before reading it: context.args has NAME && ..."
        raise PolicyError(f"{where}: {message} (the schema: mcpvisor policy schema)")
    rules = []
    for (_key, body), line in zip(bodies, lines, strict=True):
        annotations = body.get("annotations") or {}
        where = f"{source.path}:{line}" if line else source.path
        effect = body.get("effect")
        approval = annotations.get("approval")
        if approval is not None and approval != APPROVER:
            raise PolicyError(f'{where}: @approval takes "{APPROVER}" (an operator allows the call), got {approval!r}')
        if approval is not None and effect != "permit":
            raise PolicyError(f"{where}: @approval belongs on a permit (a forbid refuses; there is nothing to approve)")
        policy_id = annotations.get("id")
        if policy_id is not None and not (isinstance(policy_id, str) and policy_id.strip()):
            raise PolicyError(f'{where}: @id needs a name: @id("...")')
        rules.append(
            Rule(
                id=policy_id if policy_id else f"{name}:{line or len(rules) + 1}",
                effect=effect,
                path=source.path,
                line=line,
                reason=annotations.get("reason") or "",
                approval=approval is not None,
                body=body,
            )
        )
    return rules


def _policy_index(policy_id: str) -> int | None:
    match = re.fullmatch(r"policy(\d+)", policy_id or "")
    return int(match.group(1)) if match else None


def _locate_syntax_error(path: str, statements: list[tuple[int, str]], message: str) -> str:
    """`FILE:LINE: message` for the first statement Cedar cannot parse on its own."""
    for line, statement in statements:
        try:
            cedarpy.policies_to_json_str(statement)
        except ValueError as exc:
            return f"{path}:{line}: {exc}"
    return f"{path}: {message}"


def split_statements(text: str) -> list[tuple[int, str]]:
    """The policies of a file as (line of their first character, text), split at `;` outside
    strings and `//` comments; text after the last `;` is a statement too (Cedar refuses it)."""
    statements: list[tuple[int, str]] = []
    start: int | None = None
    line = 1
    start_line = 1
    i = 0
    in_string = False
    while i < len(text):
        char = text[i]
        if in_string:
            if char == "\\":
                i += 1
            elif char == '"':
                in_string = False
            elif char == "\n":
                line += 1
        elif char == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            i = len(text) if end == -1 else end
            continue
        elif char == "\n":
            line += 1
        elif char == ";":
            if start is not None:
                statements.append((start_line, text[start : i + 1]))
            start = None
        elif not char.isspace():
            if start is None:
                start, start_line = i, line
            in_string = char == '"'
        i += 1
    if start is not None:
        statements.append((start_line, text[start:]))
    return statements


def _principal(rule: Rule) -> str | None:
    """The one tenant a policy's scope names (`principal == Tenant::"X"`), else None (it may apply to anyone)."""
    scope = rule.body.get("principal") or {}
    entity = scope.get("entity") if scope.get("op") == "==" else None
    if isinstance(entity, dict) and entity.get("type") == "Tenant" and isinstance(entity.get("id"), str):
        return entity["id"]
    return None


def reads_context(node: Any) -> bool:
    """Whether Cedar's JSON form of a policy (or a part of one) reads `context`."""
    if isinstance(node, dict):
        return node.get("Var") == "context" or any(reads_context(value) for value in node.values())
    if isinstance(node, list):
        return any(reads_context(item) for item in node)
    return False
