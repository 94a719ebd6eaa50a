"""The aggregated catalog: exposed names, change detection and lookups by name and URI."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import msgspec
import pytest
from mcp.shared.uri_template import UriTemplate

from mcpvisor.frontend.door.catalog import MAX_TOOL_NAME, Catalog, exposed_name, split_name
from mcpvisor.wire.states import UpstreamState

LLM_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def catalog_bytes(
    tools: Sequence[str] = (),
    *,
    resources: Sequence[str] = (),
    templates: Sequence[str] = (),
    prompts: Sequence[str] = (),
) -> bytes:
    """What a worker sends: the upstream's lists as MCP JSON."""
    return msgspec.json.encode(
        {
            "tools": [
                {"name": name, "inputSchema": {"type": "object"}, "description": f"{name} tool"} for name in tools
            ],
            "resources": [{"uri": uri, "name": uri} for uri in resources],
            "resourceTemplates": [{"uriTemplate": t, "name": t} for t in templates],
            "prompts": [{"name": name} for name in prompts],
        }
    )


def snapshot(
    catalog: Catalog,
    server: str,
    data: bytes | None,
    *,
    state: UpstreamState = UpstreamState.READY,
    error: str = "",
    seq: int = 1,
) -> bool:
    return catalog.apply_snapshot(server, pid=4121, catalog_seq=seq, state=state, error=error, catalog=data)


# -- exposed names ----------------------------------------------------------------------------------


def test_colon_style_is_server_colon_tool() -> None:
    assert exposed_name("github", "search_repositories", "colon") == "github:search_repositories"


def test_underscore_style_joins_with_two_underscores() -> None:
    assert exposed_name("github", "search_repositories", "underscore") == "github__search_repositories"


@pytest.mark.parametrize(
    ("server", "tool", "expected"),
    [
        ("my.server", "get/item", "my_server__get_item"),
        ("fs", "read file", "fs__read_file"),
        ("fs", "ns:tool", "fs__ns_tool"),
        ("fs", "café", "fs__caf_"),
        ("fs", "x²", "fs__x_"),
        ("fs", "工具", "fs____"),
    ],
)
def test_underscore_style_uses_only_what_llm_apis_accept(server: str, tool: str, expected: str) -> None:
    name = exposed_name(server, tool, "underscore")
    assert name == expected
    assert LLM_TOOL_NAME.fullmatch(name)


@pytest.mark.parametrize("style", ["colon", "underscore"])
def test_a_long_name_is_shortened_deterministically_within_64(style: str) -> None:
    tool = "summarize_the_quarterly_financial_report_for_the_board_of_directors"
    name = exposed_name("finance", tool, style)  # type: ignore[arg-type]

    assert len(name) == MAX_TOOL_NAME
    assert name == exposed_name("finance", tool, style)  # type: ignore[arg-type]
    assert name.startswith(f"finance{':' if style == 'colon' else '__'}summarize_the_quarterly")


def test_a_name_of_exactly_64_characters_is_kept() -> None:
    tool = "t" * (MAX_TOOL_NAME - len("srv:"))
    assert exposed_name("srv", tool, "colon") == f"srv:{tool}"


@pytest.mark.parametrize("style", ["colon", "underscore"])
def test_long_names_sharing_their_first_64_characters_do_not_collide(style: str) -> None:
    head = "a_very_long_tool_name_that_keeps_going_and_going_past_the_limit_of_llm_apis"
    first = exposed_name("srv", head + "_create", style)  # type: ignore[arg-type]
    second = exposed_name("srv", head + "_delete", style)  # type: ignore[arg-type]

    assert first != second
    assert len(first) == len(second) == MAX_TOOL_NAME
    if style == "underscore":
        assert LLM_TOOL_NAME.fullmatch(first) and LLM_TOOL_NAME.fullmatch(second)


def test_the_same_long_tool_on_two_servers_gets_two_names() -> None:
    tool = "x" * 80
    assert exposed_name("one", tool, "underscore") != exposed_name("two", tool, "underscore")


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("time:now", ("time", "now")),
        ("time:ns:tool", ("time", "ns:tool")),
        ("now", None),
        (":now", None),
        ("time:", None),
        ("", None),
    ],
)
def test_split_name(name: str, parts: tuple[str, str] | None) -> None:
    assert split_name(name) == parts


# -- change detection -------------------------------------------------------------------------------


def test_a_server_becoming_ready_is_a_change_and_its_tools_resolve() -> None:
    catalog = Catalog()

    assert snapshot(catalog, "time", catalog_bytes(["now", "convert"])) is True
    assert catalog.version == 1
    assert catalog.resolve_tool("time:now") == ("time", "now")
    assert catalog.tool_definition("time:convert")["description"] == "convert tool"  # type: ignore[index]


def test_a_heartbeat_with_the_same_catalog_is_not_a_change() -> None:
    catalog = Catalog()
    data = catalog_bytes(["now"])
    snapshot(catalog, "time", data)

    assert snapshot(catalog, "time", bytes(data), seq=2) is False
    assert snapshot(catalog, "time", None, seq=3) is False
    assert catalog.version == 1
    assert catalog.servers["time"].catalog_seq == 3


def test_a_new_tool_list_is_a_change() -> None:
    catalog = Catalog()
    snapshot(catalog, "time", catalog_bytes(["now"]))

    assert snapshot(catalog, "time", catalog_bytes(["now", "convert"]), seq=2) is True
    assert catalog.resolve_tool("time:convert") == ("time", "convert")
    assert catalog.version == 2


def test_a_catalog_from_a_server_that_is_not_ready_changes_nothing_clients_see() -> None:
    catalog = Catalog()

    assert snapshot(catalog, "time", catalog_bytes(["now"]), state=UpstreamState.CONNECTING) is False
    assert catalog.resolve_tool("time:now") is None
    # When it becomes ready, the catalog it already sent is what clients get.
    assert snapshot(catalog, "time", None, seq=2) is True
    assert catalog.resolve_tool("time:now") == ("time", "now")


def test_leaving_ready_is_a_change_and_hides_the_tools() -> None:
    catalog = Catalog()
    snapshot(catalog, "time", catalog_bytes(["now"]))

    assert snapshot(catalog, "time", None, state=UpstreamState.ERROR, error="401 Unauthorized") is True
    assert catalog.resolve_tool("time:now") is None
    assert [view.id for view in catalog.ready_servers()] == []


def test_a_worker_gone_is_a_change_once() -> None:
    catalog = Catalog()
    snapshot(catalog, "time", catalog_bytes(["now"]))

    assert catalog.mark_gone("time", "exited with code 1") is True
    assert catalog.resolve_tool("time:now") is None
    assert catalog.servers["time"].catalog_seq == -1
    assert catalog.mark_gone("time", "still gone") is False
    assert catalog.mark_gone("never-seen", "gone") is False


def test_a_worker_back_after_being_gone_is_a_change() -> None:
    catalog = Catalog()
    data = catalog_bytes(["now"])
    snapshot(catalog, "time", data)
    catalog.mark_gone("time", "killed")

    # Even with the same catalog bytes, coming back makes its tools visible again.
    assert snapshot(catalog, "time", data, seq=1) is True
    assert catalog.resolve_tool("time:now") == ("time", "now")


def test_removing_a_server_is_a_change_and_removing_it_again_is_not() -> None:
    catalog = Catalog()
    snapshot(catalog, "time", catalog_bytes(["now"]))

    assert catalog.remove("time") is True
    assert catalog.resolve_tool("time:now") is None
    assert "time" not in catalog.servers
    assert catalog.remove("time") is False


def test_ready_servers_lists_ready_ones_in_order_and_filters_by_allowed() -> None:
    catalog = Catalog()
    for server in ("zeta", "alpha", "mid"):
        snapshot(catalog, server, catalog_bytes(["t"]))
    snapshot(catalog, "down", catalog_bytes(["t"]), state=UpstreamState.CONNECTING)

    assert [view.id for view in catalog.ready_servers()] == ["alpha", "mid", "zeta"]
    assert [view.id for view in catalog.ready_servers(["zeta", "down", "unknown"])] == ["zeta"]


# -- lookups ----------------------------------------------------------------------------------------


def test_underscore_style_resolves_to_the_upstream_name() -> None:
    catalog = Catalog(name_style="underscore")
    snapshot(catalog, "my.server", catalog_bytes(["get/item"]))

    assert catalog.resolve_tool("my_server__get_item") == ("my.server", "get/item")
    assert catalog.resolve_tool("my.server:get/item") is None
    assert catalog.tool_definition("my_server__get_item")["name"] == "get/item"  # type: ignore[index]


def test_a_long_tool_name_resolves_by_its_shortened_name() -> None:
    catalog = Catalog()
    tool = "t" * 100
    snapshot(catalog, "srv", catalog_bytes([tool]))
    assert catalog.resolve_tool(exposed_name("srv", tool, "colon")) == ("srv", tool)


def test_when_two_servers_expose_the_same_name_the_first_in_order_keeps_it(caplog: pytest.LogCaptureFixture) -> None:
    catalog = Catalog(name_style="underscore")
    snapshot(catalog, "a__b", catalog_bytes(["c"]))
    with caplog.at_level(logging.WARNING, logger="mcpvisor.frontend.door.catalog"):
        snapshot(catalog, "a", catalog_bytes(["b__c"]))

    assert catalog.resolve_tool("a__b__c") == ("a", "b__c")
    assert "tool name a__b__c is exposed twice; a keeps it" in caplog.text


def test_prompts_resolve_by_server_colon_prompt() -> None:
    catalog = Catalog(name_style="underscore")
    snapshot(catalog, "docs", catalog_bytes(prompts=["summarize"]))

    assert catalog.resolve_prompt("docs:summarize") == ("docs", "summarize")
    assert catalog.resolve_prompt("docs:absent") is None


def test_a_listed_resource_resolves_to_its_server() -> None:
    catalog = Catalog()
    snapshot(catalog, "fs", catalog_bytes(resources=["file:///etc/motd"]))
    assert catalog.resolve_resource("file:///etc/motd") == "fs"
    assert catalog.resolve_resource("file:///etc/passwd") is None


def test_a_uri_matching_a_resource_template_resolves_to_its_server() -> None:
    catalog = Catalog()
    snapshot(catalog, "db", catalog_bytes(templates=["db://{table}/rows/{id}"]))
    snapshot(catalog, "fs", catalog_bytes(templates=["file:///logs/{name}"]))

    assert catalog.resolve_resource("db://users/rows/7") == "db"
    assert catalog.resolve_resource("file:///logs/worker.log") == "fs"
    assert catalog.resolve_resource("db://users") is None


def test_a_template_of_a_server_that_is_not_ready_does_not_resolve() -> None:
    catalog = Catalog()
    snapshot(catalog, "db", catalog_bytes(templates=["db://{table}"]))
    catalog.mark_gone("db", "exited")
    assert catalog.resolve_resource("db://users") is None


def test_a_malformed_template_is_skipped_not_fatal() -> None:
    with pytest.raises(ValueError):
        UriTemplate.parse("db://{unclosed")
    catalog = Catalog()
    broken = msgspec.json.encode({"resourceTemplates": [{"uriTemplate": "db://{unclosed"}, {"name": "no template"}]})
    snapshot(catalog, "bad", broken)
    snapshot(catalog, "good", catalog_bytes(templates=["db://{table}"]))

    assert catalog.resolve_resource("db://users") == "good"


def test_the_first_server_offering_a_resource_serves_it() -> None:
    catalog = Catalog()
    snapshot(catalog, "b", catalog_bytes(resources=["mem://shared"]))
    snapshot(catalog, "a", catalog_bytes(resources=["mem://shared"]))
    assert catalog.resolve_resource("mem://shared") == "a"


# -- unavailable servers ----------------------------------------------------------------------------


def test_describe_an_unconfigured_server() -> None:
    assert Catalog().describe_unavailable("ghost") == "server 'ghost' is not configured"


def test_describe_a_server_whose_worker_is_gone() -> None:
    catalog = Catalog()
    snapshot(catalog, "time", catalog_bytes(["now"]))
    catalog.mark_gone("time", "exited with code 1")
    assert (
        catalog.describe_unavailable("time")
        == "server 'time' is not running (exited with code 1); it is being restarted"
    )

    catalog.mark_gone("time", "")
    assert catalog.describe_unavailable("time") == "server 'time' is not running; it is being restarted"


@pytest.mark.parametrize(
    ("state", "error", "message"),
    [
        (UpstreamState.CONNECTING, "", "server 'remote' is connecting"),
        (UpstreamState.AUTHENTICATING, "", "server 'remote' is authenticating"),
        (UpstreamState.ERROR, "401 Unauthorized", "server 'remote' is error: 401 Unauthorized"),
    ],
)
def test_describe_a_server_that_is_up_but_not_ready(state: UpstreamState, error: str, message: str) -> None:
    catalog = Catalog()
    snapshot(catalog, "remote", None, state=state, error=error)
    assert catalog.describe_unavailable("remote") == message


# -- bad snapshots ----------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"not json", b'{"tools": 5}', b"[1, 2]", b'{"tools": [1]}'])
def test_an_undecodable_catalog_is_logged_and_treated_as_empty(data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    catalog = Catalog()
    snapshot(catalog, "time", catalog_bytes(["now"]))

    with caplog.at_level(logging.ERROR, logger="mcpvisor.frontend.door.catalog"):
        changed = snapshot(catalog, "time", data, seq=2)

    assert changed is True
    assert catalog.resolve_tool("time:now") is None
    view = catalog.servers["time"]
    assert (view.tools, view.resources, view.templates, view.prompts) == ([], [], [], [])
    assert "worker time sent an undecodable catalog" in caplog.text
