"""Policies as Cedar decides them, with mcpvisor's annotations: who may list and call what, and why.

Given policy text, a tenant and a tool (its annotations read with the MCP defaults) and a call's
arguments, the decision is allow, deny or approval and names the policies that made it; bad
policy text is refused with its file and line; nothing a client or an upstream sends can change
what a policy means.
"""

from __future__ import annotations

import pytest

from mcpvisor.runtime.policies import Decision, Policies, PolicyError, split_statements
from mcpvisor.runtime.policy_checks import warnings
from mcpvisor.runtime.policy_vocabulary import cedar_args, tool_attributes
from mcpvisor.wire.policy_sources import PolicyText

POLICIES = """\
// Everyone may see and call everything, unless a rule below says otherwise.
@id("baseline")
permit(principal, action, resource);

@id("alice-read-only")
@reason("alice's team may only use read-only tools")
forbid(principal == Tenant::"alice", action == Action::"call", resource is Tool)
unless { resource.read_only };

@id("destructive-needs-approval")
permit(principal, action == Action::"call", resource is Tool) when { resource.destructive };

@id("destructive-waits")
@approval("operator")
permit(principal, action == Action::"call", resource is Tool) when { resource.destructive };

@id("acme-only")
@reason("issues may be created in acme/* repositories only")
forbid(principal, action == Action::"call", resource == Tool::"github:create_issue")
unless { context.args has repo && context.args.repo like "acme/*" };
"""


def compiled(text: str = POLICIES, path: str = "policies.cedar") -> Policies:
    return Policies.compile([PolicyText(path=path, text=text)])


READ = tool_attributes("github", {"name": "list_issues", "annotations": {"readOnlyHint": True}})
CREATE = tool_attributes("github", {"name": "create_issue", "annotations": {"destructiveHint": False}})
DELETE = tool_attributes("github", {"name": "delete_repository", "annotations": {"destructiveHint": True}})
SILENT = tool_attributes("github", {"name": "says_nothing"})


def test_a_tool_that_says_nothing_is_taken_as_the_mcp_specification_says() -> None:
    assert SILENT == {
        "server": "github",
        "name": "says_nothing",
        "read_only": False,
        "destructive": True,
        "idempotent": False,
        "open_world": True,
    }
    assert READ["read_only"] and not READ["destructive"]  # destructiveHint means nothing on a read-only tool


def test_a_forbid_refuses_with_its_id_and_reason() -> None:
    decision = compiled().decide("alice", "call", "tool", CREATE, args={"repo": "acme/x"})
    assert decision == Decision("deny", ("alice-read-only",), ("alice's team may only use read-only tools",))
    assert decision.explanation == "refused by policy 'alice-read-only': alice's team may only use read-only tools"


def test_list_and_call_are_decided_apart() -> None:
    policies = compiled()
    assert policies.decide("alice", "list", "tool", CREATE).effect == "allow"
    assert policies.decide("alice", "call", "tool", READ).effect == "allow"


def test_the_strictest_permit_wins_a_destructive_call_waits_for_the_operator() -> None:
    decision = compiled().decide("bob", "call", "tool", DELETE)
    assert decision == Decision("approval", ("destructive-waits",))
    assert decision.explanation == "policy 'destructive-waits' requires an operator's approval"
    # A forbid still overrides a permit that asks for approval.
    assert compiled().decide("alice", "call", "tool", DELETE).effect == "deny"


@pytest.mark.parametrize(
    ("args", "effect"),
    [
        ({"repo": "acme/widgets", "title": "t"}, "allow"),
        ({"repo": "evil/widgets"}, "deny"),
        ({"title": "no repo"}, "deny"),
        ({"repo": 42}, "deny"),  # not a string: `like` cannot hold, the forbid's `unless` fails it
        ({"repo": {"__entity": {"type": "Tenant", "id": "acme/x"}}}, "deny"),  # no escapes from arguments
    ],
)
def test_argument_conditions(args: dict[str, object], effect: str) -> None:
    decision = compiled().decide("bob", "call", "tool", CREATE, args=args)
    assert decision.effect == effect
    if effect == "deny":
        assert decision.policies == ("acme-only",)


def test_a_forbid_that_cannot_be_evaluated_refuses_rather_than_lets_through() -> None:
    policies = compiled(
        '@id("all") permit(principal, action, resource);\n'
        '@id("small") forbid(principal, action, resource) when { context.args has n && context.args.n > 10 };\n'
    )
    assert policies.decide("bob", "call", "tool", SILENT, args={"n": 3}).effect == "allow"
    assert policies.decide("bob", "call", "tool", SILENT, args={"n": 30}).effect == "deny"
    refused = policies.decide("bob", "call", "tool", SILENT, args={"n": "30"})  # a string: a type error
    assert (refused.effect, refused.policies) == ("deny", ("small",))
    assert refused.errors and "could not be evaluated" in refused.explanation


def test_without_a_permit_nothing_is_allowed_and_the_answer_says_so() -> None:
    decision = compiled('@id("x") permit(principal == Tenant::"alice", action, resource);').decide(
        "bob", "call", "tool", READ
    )
    assert decision == Decision("deny")
    assert decision.explanation == "no policy permits it"


def test_the_plain_endpoints_are_tenant_local() -> None:
    policies = compiled('@id("me") permit(principal == Tenant::"local", action, resource);')
    assert policies.decide("", "call", "tool", READ).effect == "allow"
    assert policies.decide("alice", "call", "tool", READ).effect == "deny"


def test_names_from_upstreams_and_clients_are_ids_never_policy_text() -> None:
    policies = compiled('@id("one") permit(principal, action, resource == Tool::"s:x\\" ) || true");')
    sneaky = tool_attributes("s", {"name": 'x" ) || true'})
    assert policies.decide("bob", "call", "tool", sneaky).effect == "allow"
    other = tool_attributes("s", {"name": "y"})
    assert policies.decide("bob", "call", "tool", other).effect == "deny"


def test_arguments_become_plain_cedar_values() -> None:
    assert cedar_args(
        {
            "n": 5,
            "f": 5.0,
            "x": 1.5,
            "big": 2**70,
            "none": None,
            "list": [1, None, "a"],
            "nested": {"__extn": {"fn": "ip", "arg": "1.2.3.4"}, "ok": True},
            "__entity": {"type": "Tenant", "id": "ops"},
        }
    ) == {
        "n": 5,
        "f": 5,
        "x": "1.5",
        "big": str(2**70),
        "list": [1, "a"],
        "nested": {"ok": True},
    }
    assert cedar_args("not an object") == {}
    deep: dict[str, object] = {}
    node = deep
    for _ in range(100):
        node["d"] = {}
        node = node["d"]  # type: ignore[assignment]
    assert cedar_args(deep)  # deep nesting is cut, not an error


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            'permit(principal, action, resource);\n\n@id("b")\npermit(principal, action, resource) when { x };',
            "policies.cedar:3: invalid variable: x",
        ),
        (
            "permit(principal, action, resource) when { resource.read_onyl };",
            "policies.cedar:1: attribute `read_onyl` on entity type",
        ),
        (
            'permit(principal, action, resource) when { context.args.repo == "a" };',
            "test for an argument before reading it",
        ),
        ('permit(principal, action == Action::"run", resource);', 'unrecognized action `Action::"run"`'),
        ('permit(principal == User::"a", action, resource);', "unrecognized entity type `User`"),
        ('@approval("anyone") permit(principal, action, resource);', '@approval takes "operator"'),
        ('@approval("operator") forbid(principal, action, resource);', "@approval belongs on a permit"),
        ('@id("a") permit(principal, action, resource);\n@id("a") permit(principal, action, resource);', "@id('a')"),
        ("permit(principal == ?principal, action, resource);", "templates"),
        ("permit(principal, action, resource)", "policies.cedar:1:"),
    ],
)
def test_bad_policy_text_is_refused_with_file_and_line(text: str, error: str) -> None:
    with pytest.raises(PolicyError) as refused:
        compiled(text)
    assert error in str(refused.value)


def test_two_files_of_one_name_are_refused() -> None:
    with pytest.raises(PolicyError, match="also named"):
        Policies.compile(
            [
                PolicyText(path="/a/p.cedar", text="permit(principal, action, resource);"),
                PolicyText(path="/b/p.cedar", text="permit(principal, action, resource);"),
            ]
        )


def test_policies_without_an_id_are_named_by_file_and_line() -> None:
    policies = compiled('\n\nforbid(principal, action, resource) when { resource.server == "x" };\n')
    assert list(policies.rules) == ["policies.cedar:3"]


def test_statements_split_at_semicolons_outside_strings_and_comments() -> None:
    text = (
        'permit(principal, action, resource) when { "a;b" == "a;b" }; // ; here\n\nforbid(principal, action, resource);'
    )
    assert [line for line, _ in split_statements(text)] == [1, 3]


def test_check_warns_of_names_the_config_does_not_know() -> None:
    policies = compiled(
        '@id("a") permit(principal == Tenant::"alcie", action, resource == Tool::"gihub:list_issues");\n'
        '@id("b") forbid(principal, action, resource) when { resource.server == "tiem" };\n'
        '@id("c") forbid(principal, action == Action::"call", resource == Tool::"github:nope");\n'
        '@id("d") forbid(principal, action == Action::"list", resource) when { context.endpoint == "/mcp" };\n'
    )
    found = warnings(policies.rules.values(), {"github": {"list_issues"}, "time": None}, ["alice"])
    assert any('Tenant::"alcie" is no tenant' in line for line in found)
    assert any("names no configured server 'gihub'" in line for line in found)
    assert any("resource.server == 'tiem'" in line for line in found)
    assert any("has no tool 'nope'" in line for line in found)
    assert any("(d): decides list from context" in line for line in found)
    assert len(found) == 5
