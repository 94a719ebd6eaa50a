"""The search index behind `retrieve_tools`: tokenizing, BM25 ranking, hybrid ranking, updates, filtering.

The BM25 tests build lexical indexes (`semantic=False`), the behaviour the frontend falls back to
when the embedding model cannot be loaded; the hybrid tests use the model shipped in the
`wordllama` package.
"""

from __future__ import annotations

import logging
import math
import stat
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mcpvisor.frontend.door import search as search_module
from mcpvisor.frontend.door.search import (
    K1,
    NAME_WEIGHT,
    SEMANTIC_WEIGHT,
    B,
    PreparedTools,
    SearchHit,
    ToolIndex,
    embedding_text,
    split_identifier,
    stem,
    tokenize,
)
from mcpvisor.frontend.door.semantic import (
    CACHE_FILE_NAME,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    default_model_dir,
    load_embedder,
)


def tool(name: str, description: str = "", **parameters: str) -> dict[str, Any]:
    """Build an MCP tool definition in wire form; keyword arguments become described parameters."""
    properties = {key: {"type": "string", "description": text} for key, text in parameters.items()}
    return {
        "name": name,
        "description": description,
        "inputSchema": {"type": "object", "properties": properties},
    }


GITHUB = [
    tool(
        "create_issue",
        "Open a new issue in a GitHub repository",
        repo="Repository in owner/name form",
        labels="Labels to attach",
        assignees="Users to assign",
    ),
    tool("list_pull_requests", "List pull requests of a repository", repo="Repository in owner/name form"),
    tool("merge_pull_request", "Merge a pull request", number="Pull request number"),
]
FILESYSTEM = [
    tool("read_text_file", "Read the complete contents of a file as text", path="Path of the file"),
    tool("write_file", "Create a new file or overwrite an existing one", path="Path", content="Text"),
    tool("delete_directory", "Delete a directory and everything below it", path="Directory path"),
    tool("list_directory", "List the entries of a directory", path="Directory path"),
]
SLACK = [
    tool("send_message", "Send a message to a channel", channel="Channel id", text="Message text"),
    tool("list_channels", "List the channels of the workspace"),
]
TIME = [
    tool("get_current_time", "Get the current time in a timezone", timezone="IANA timezone name"),
    tool("convert_time", "Convert a time between timezones", source_timezone="From", target_timezone="To"),
]


def catalog_index(**servers: list[dict[str, Any]]) -> ToolIndex:
    """Index each keyword's tools under that server name, with "_" written as "-"."""
    index = ToolIndex(semantic=False)
    for server, tools in servers.items():
        index.set_server_tools(server.replace("_", "-"), tools)
    return index


def full_catalog() -> ToolIndex:
    return catalog_index(github=GITHUB, filesystem=FILESYSTEM, slack=SLACK, time=TIME)


def ids(hits: list[SearchHit]) -> list[str]:
    return [f"{hit.server}:{hit.tool}" for hit in hits]


# --- Tokenizing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("list_directory_with_sizes", ["list", "directory", "with", "sizes"]),
        ("getFileInfo", ["get", "file", "info"]),
        ("HTTPServerError", ["http", "server", "error"]),
        ("sequential-thinking", ["sequential", "thinking"]),
        ("github.issues.create", ["github", "issues", "create"]),
        ("base64Encode v2", ["base", "64", "encode", "v", "2"]),
        ("Read the file!", ["read", "the", "file"]),
        ("", []),
    ],
)
def test_identifiers_split_at_separators_case_changes_and_digits(text: str, words: list[str]) -> None:
    assert split_identifier(text) == words


def test_words_outside_ascii_stay_whole_and_lowercased() -> None:
    assert split_identifier("Données_Über") == ["données", "über"]


def test_tokenize_drops_stop_words_and_single_letters_and_stems() -> None:
    assert tokenize("Lists the files of a directory, e.g. /tmp") == ["list", "file", "directori", "tmp"]


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        # Examples from Porter's paper for the steps this stemmer implements.
        ("caresses", "caress"),
        ("ponies", "poni"),
        ("cats", "cat"),
        ("feed", "feed"),
        ("agreed", "agre"),
        ("motoring", "motor"),
        ("sing", "sing"),
        ("hopping", "hop"),
        ("falling", "fall"),
        ("hissing", "hiss"),
        ("filing", "file"),
        ("happy", "happi"),
        ("sky", "sky"),
        ("cease", "ceas"),
        ("controll", "control"),
    ],
)
def test_stemmer_follows_porter_on_inflections(word: str, expected: str) -> None:
    assert stem(word) == expected


@pytest.mark.parametrize(
    "forms",
    [
        ("directory", "directories"),
        ("create", "creates", "created", "creating"),
        ("stage", "staged", "staging", "stages"),
        ("modify", "modified", "modifies"),
        ("timezone", "timezones"),
        ("list", "lists", "listing", "listed"),
    ],
)
def test_inflected_forms_share_one_stem(forms: tuple[str, ...]) -> None:
    assert len({stem(form) for form in forms}) == 1


def test_derivations_with_different_meanings_stay_apart() -> None:
    assert stem("general") != stem("generate")
    assert stem("relative") != stem("relation")


# --- Ranking ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("open a ticket with labels and assignees", "github:create_issue"),
        ("remove a folder", "filesystem:delete_directory"),
        ("post a note to a channel", "slack:send_message"),
        ("translate a time from one timezone to another", "time:convert_time"),
        ("show the text inside a document", "filesystem:read_text_file"),
        ("merge PRs", "github:merge_pull_request"),
    ],
)
def test_the_right_tool_ranks_first_among_several_servers(query: str, expected: str) -> None:
    assert ids(full_catalog().search(query, 5))[0] == expected


def test_parameter_names_and_descriptions_are_searchable() -> None:
    index = catalog_index(
        api=[
            tool("call", "Make a call", retryPolicy="How often to try again"),
            tool("ping", "Check reachability"),
        ]
    )

    assert ids(index.search("retry policy", 5)) == ["api:call"]
    assert ids(index.search("try again", 5)) == ["api:call"]


def test_titles_and_annotation_titles_are_searchable() -> None:
    index = catalog_index(
        shop=[
            {"name": "op1", "title": "Refund an order"},
            {"name": "op2", "annotations": {"title": "Cancel a subscription"}},
        ]
    )

    assert ids(index.search("refund", 5)) == ["shop:op1"]
    assert ids(index.search("subscription", 5)) == ["shop:op2"]


def test_server_name_is_searchable() -> None:
    hits = full_catalog().search("slack", 10)

    assert sorted(ids(hits)) == ["slack:list_channels", "slack:send_message"]


def test_a_word_in_the_name_outweighs_the_same_word_in_a_description() -> None:
    index = catalog_index(
        ops=[
            tool("search_logs", "Find entries that match a pattern in the stored output"),
            tool("tail", "Follow logs"),
        ]
    )

    assert ids(index.search("logs", 5)) == ["ops:search_logs", "ops:tail"]


def test_scores_follow_the_bm25_formula() -> None:
    index = catalog_index(
        x=[
            {"name": "kiwi", "description": "apple apple"},
            {"name": "fig", "description": "apple"},
            {"name": "lime"},
        ]
    )
    # The one-letter server name is not a term, so each document holds its name and description.
    lengths = {"kiwi": NAME_WEIGHT + 2, "fig": NAME_WEIGHT + 1, "lime": NAME_WEIGHT}
    average = sum(lengths.values()) / 3
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))

    def bm25(tf: int, length: int) -> float:
        return idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / average))

    hits = index.search("apple", 10)

    assert ids(hits) == ["x:kiwi", "x:fig"]
    assert hits[0].score == pytest.approx(bm25(2, lengths["kiwi"]), rel=1e-12)
    assert hits[1].score == pytest.approx(bm25(1, lengths["fig"]), rel=1e-12)


def test_the_query_word_itself_outranks_a_related_word() -> None:
    index = catalog_index(store=[tool("remove_item", "Drops one item"), tool("delete_item", "Drops one item")])

    assert ids(index.search("remove", 5)) == ["store:remove_item", "store:delete_item"]


def test_related_words_can_be_switched_off() -> None:
    index = ToolIndex(semantic=False, expand_related=False)
    index.set_server_tools("fs", FILESYSTEM)

    assert index.search("remove folder", 5) == []
    assert ids(index.search("delete directory", 5))[0] == "fs:delete_directory"


def test_limit_caps_the_number_of_hits() -> None:
    index = full_catalog()

    assert len(index.search("list", 10)) == 3
    assert len(index.search("list", 2)) == 2
    assert index.search("list", 0) == []


@pytest.mark.parametrize("query", ["", "   ", "\n\t", "the of and", "?!", "a b c"])
def test_a_blank_or_stop_word_query_finds_nothing(query: str) -> None:
    assert full_catalog().search(query, 10) == []


def test_an_empty_index_finds_nothing() -> None:
    index = ToolIndex(semantic=False)

    assert len(index) == 0
    assert index.search("file", 10) == []


def test_tools_without_any_searchable_word_match_nothing() -> None:
    index = catalog_index(x=[{"name": "a"}, {"name": "b", "description": "the of"}])

    assert len(index) == 2
    assert index.search("anything at all", 10) == []


def test_scores_are_positive_and_descending() -> None:
    hits = full_catalog().search("list the directory of a repository", 10)

    assert len(hits) >= 3
    assert all(hit.score > 0 for hit in hits)
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)


def test_ties_are_ordered_by_server_and_tool_name_whatever_the_insertion_order() -> None:
    same = [tool("zeta", "Upload a blob"), tool("alpha", "Upload a blob")]
    forward = catalog_index(b_store=same, a_store=same)
    backward = catalog_index(a_store=same[::-1], b_store=same[::-1])

    hits = forward.search("upload blob", 10)

    assert ids(hits) == ["a-store:alpha", "a-store:zeta", "b-store:alpha", "b-store:zeta"]
    assert len({hit.score for hit in hits}) == 1
    assert backward.search("upload blob", 10) == hits


# --- Updates ------------------------------------------------------------------------------------


def test_len_counts_tools_across_servers() -> None:
    assert len(full_catalog()) == len(GITHUB) + len(FILESYSTEM) + len(SLACK) + len(TIME)


def test_replacing_one_servers_tools_changes_only_its_results() -> None:
    index = full_catalog()
    slack_before = ids(index.search("channel message", 10))

    index.set_server_tools("github", [tool("create_gist", "Share a snippet as a gist")])

    assert ids(index.search("gist", 10)) == ["github:create_gist"]
    assert index.search("pull request", 10) == []
    assert ids(index.search("channel message", 10)) == slack_before
    assert len(index) == 1 + len(FILESYSTEM) + len(SLACK) + len(TIME)


def test_removing_a_server_drops_its_hits() -> None:
    index = full_catalog()

    index.remove_server("time")

    assert [hit for hit in index.search("time timezone", 10) if hit.server == "time"] == []
    assert len(index) == len(GITHUB) + len(FILESYSTEM) + len(SLACK)
    assert index.servers() == ["filesystem", "github", "slack"]


def test_removing_an_unknown_server_changes_nothing() -> None:
    index = full_catalog()
    before = index.search("list directory", 10)

    index.remove_server("nonexistent")

    assert index.search("list directory", 10) == before


def test_an_empty_tool_list_removes_the_server() -> None:
    index = full_catalog()

    index.set_server_tools("slack", [])

    assert "slack" not in index.servers()
    assert index.search("channel", 10) == []


@pytest.mark.parametrize(
    "query",
    [
        "list the directory",
        "create an issue in a repository",
        "convert time between timezones",
        "pull request number",
        "delete file path",
        "gist snippet",
    ],
)
def test_scores_after_add_replace_remove_equal_those_of_a_fresh_index(query: str) -> None:
    updated = ToolIndex(semantic=False)
    updated.set_server_tools("github", GITHUB)
    updated.set_server_tools("filesystem", FILESYSTEM)
    updated.set_server_tools("slack", SLACK)
    updated.set_server_tools("github", [tool("create_gist", "Share a snippet as a gist"), *GITHUB[1:]])
    updated.set_server_tools("time", TIME)
    updated.remove_server("slack")
    updated.set_server_tools("filesystem", FILESYSTEM[:2])
    updated.set_server_tools("filesystem", FILESYSTEM)

    fresh = ToolIndex(semantic=False)
    fresh.set_server_tools("time", TIME)
    fresh.set_server_tools("filesystem", FILESYSTEM)
    fresh.set_server_tools("github", [tool("create_gist", "Share a snippet as a gist"), *GITHUB[1:]])

    expected = fresh.search(query, 20)
    assert expected, "the query should match something in the final catalog"
    assert updated.search(query, 20) == expected
    assert len(updated) == len(fresh)


def test_entries_without_a_name_are_skipped_and_a_repeated_name_keeps_the_last() -> None:
    index = ToolIndex(semantic=False)
    index.set_server_tools(
        "odd",
        [
            {"description": "no name at all"},
            {"name": 42, "description": "a number for a name"},
            {"name": "dup", "description": "first version about apples"},
            {"name": "dup", "description": "second version about pears"},
            {"name": "weird", "inputSchema": {"properties": ["not", "a", "mapping"]}},
        ],
    )

    assert len(index) == 2
    assert index.search("apples", 5) == []
    assert ids(index.search("pears", 5)) == ["odd:dup"]
    assert index.search("name number", 5) == []


# --- Filtering by server ------------------------------------------------------------------------


def test_servers_filter_keeps_only_the_named_servers() -> None:
    index = full_catalog()

    hits = index.search("list", 10, servers={"slack", "github"})

    assert ids(hits) and {hit.server for hit in hits} == {"slack", "github"}


def test_servers_filter_does_not_change_scores() -> None:
    index = full_catalog()
    unfiltered = {f"{hit.server}:{hit.tool}": hit.score for hit in index.search("list", 10)}

    for hit in index.search("list", 10, servers=["filesystem"]):
        assert hit.score == unfiltered[f"{hit.server}:{hit.tool}"]


def test_servers_filter_with_no_known_server_finds_nothing() -> None:
    index = full_catalog()

    assert index.search("list", 10, servers=[]) == []
    assert index.search("list", 10, servers=["quarantined-and-gone"]) == []


# --- Hybrid ranking (the model shipped in the wordllama package) ---------------------------------

WEATHER = [
    tool("get_forecast", "Get the weather forecast for a city: temperature, precipitation and wind", city="City")
]
MONEY = [tool("exchange_rate", "Convert an amount between two currencies at today's rate", base="Code", target="Code")]
CATALOG = {"github": GITHUB, "filesystem": FILESYSTEM, "slack": SLACK, "time": TIME, "weather": WEATHER, "money": MONEY}


def hybrid_index(catalog: dict[str, list[dict[str, Any]]] = CATALOG, **options: Any) -> ToolIndex:
    index = ToolIndex(**options)
    assert index.status == "hybrid", index.status
    for server, tools in catalog.items():
        index.set_server_tools(server, tools)
    return index


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("will I need an umbrella tomorrow", "weather:get_forecast"),
        ("is it going to be sunny this weekend", "weather:get_forecast"),
        ("how many yen is one dollar", "money:exchange_rate"),
    ],
)
def test_hybrid_finds_a_tool_by_meaning_when_no_word_is_shared(query: str, expected: str) -> None:
    lexical = ToolIndex(semantic=False)
    for server, tools in CATALOG.items():
        lexical.set_server_tools(server, tools)

    assert lexical.search(query, 5) == []
    assert ids(hybrid_index().search(query, 5))[0] == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("open a ticket with labels and assignees", "github:create_issue"),
        ("remove a folder", "filesystem:delete_directory"),
        ("post a note to a channel", "slack:send_message"),
        ("translate a time from one timezone to another", "time:convert_time"),
        ("show the text inside a document", "filesystem:read_text_file"),
        ("merge PRs", "github:merge_pull_request"),
        ("merge_pull_request", "github:merge_pull_request"),
    ],
)
def test_hybrid_ranks_the_right_tool_among_the_first_two(query: str, expected: str) -> None:
    assert expected in ids(hybrid_index().search(query, 2))


def test_hybrid_score_is_the_weighted_sum_of_scaled_centred_cosine_and_scaled_bm25() -> None:
    query = "delete the folder with everything in it"
    index = hybrid_index()
    lexical = ToolIndex(semantic=False, expand_related=False)
    for server, tools in CATALOG.items():
        lexical.set_server_tools(server, tools)
    bm25 = {(hit.server, hit.tool): hit.score for hit in lexical.search(query, 100)}
    embedder = load_embedder()
    entries = [(server, t["name"], t) for server, tools in CATALOG.items() for t in tools]
    vectors = embedder.embed([embedding_text(server, name, t) for server, name, t in entries])
    # Each tool vector less the mean of all of them, the query as it is.
    centred = vectors - vectors.mean(axis=0)
    cosine = (centred @ embedder.embed([query])[0]) / np.linalg.norm(centred, axis=1)
    low, high = cosine.min(), cosine.max()
    expected = {
        (server, name): SEMANTIC_WEIGHT * (cos - low) / (high - low)
        + (1 - SEMANTIC_WEIGHT) * bm25.get((server, name), 0.0) / max(bm25.values())
        for (server, name, _), cos in zip(entries, cosine.tolist(), strict=True)
    }

    hits = index.search(query, 100)

    assert len(hits) == len(entries)
    for hit in hits:
        assert hit.score == pytest.approx(expected[(hit.server, hit.tool)], abs=1e-6)
    assert [hit.score for hit in hits] == pytest.approx(sorted(expected.values(), reverse=True), abs=1e-6)
    assert 0.0 <= hits[-1].score <= hits[0].score <= 1.0


def test_hybrid_scores_follow_the_catalog_as_servers_come_and_go() -> None:
    # The centre the tool vectors are measured from is that of the tools indexed now: after a
    # server leaves, or comes back with other tools, scores are those of an index built afresh.
    query = "remove a directory"
    changing = hybrid_index()
    assert changing.search(query, 3)
    servers = sorted(CATALOG)
    changing.remove_server(servers[0])
    changing.set_server_tools(servers[1], CATALOG[servers[1]][:1])
    fresh = ToolIndex()
    for server in servers[1:]:
        fresh.set_server_tools(server, CATALOG[server][:1] if server == servers[1] else CATALOG[server])

    after = changing.search(query, 100)

    assert [(hit.server, hit.tool) for hit in after] == [(hit.server, hit.tool) for hit in fresh.search(query, 100)]
    assert [hit.score for hit in after] == pytest.approx([hit.score for hit in fresh.search(query, 100)], abs=1e-9)


def test_hybrid_fills_the_limit_but_a_query_without_words_finds_nothing() -> None:
    index = hybrid_index()

    assert len(index.search("xyzzy plugh", 4)) == 4
    assert index.search("the of and", 4) == []
    assert index.search("  ", 4) == []
    assert index.search("weather", 0) == []


def test_hybrid_uses_no_related_terms_unless_asked() -> None:
    catalog = {"store": [tool("remove_item", "Drops one item"), tool("delete_item", "Drops one item")]}
    lexical_part = dict(semantic=False)

    plain = ToolIndex(expand_related=False, **lexical_part)
    related = ToolIndex(**lexical_part)
    for index in (plain, related):
        index.set_server_tools("store", catalog["store"])

    # The default follows the mode: related terms for BM25 alone, none beside the embeddings.
    assert ids(related.search("erase", 5)) == ["store:delete_item", "store:remove_item"]
    assert plain.search("erase", 5) == []
    assert hybrid_index(catalog).search("erase", 5) == hybrid_index(catalog, expand_related=False).search("erase", 5)


def test_hybrid_filter_keeps_scores_and_only_the_named_servers() -> None:
    index = hybrid_index()
    everything = {(hit.server, hit.tool): hit.score for hit in index.search("list things", len(index))}

    hits = index.search("list things", 100, servers=["slack", "github", "not-there"])

    assert {hit.server for hit in hits} == {"slack", "github"}
    assert len(hits) == len(SLACK) + len(GITHUB)
    for hit in hits:
        assert hit.score == everything[(hit.server, hit.tool)]
    assert index.search("list things", 5, servers=["not-there"]) == []
    assert index.search("list things", 5, servers=[]) == []


def test_hybrid_embeds_only_new_or_changed_tools() -> None:
    index = hybrid_index()
    assert index.embedded_tools == sum(len(tools) for tools in CATALOG.values())
    before = index.embedded_tools

    index.set_server_tools("time", TIME)
    assert index.embedded_tools == before

    changed = [TIME[0], tool("convert_time", "Convert a moment between time zones", source_timezone="From")]
    index.set_server_tools("time", changed)
    assert index.embedded_tools == before + 1

    # A server that goes away and comes back with the same tools (a restart) is not embedded again.
    index.remove_server("weather")
    assert [hit for hit in index.search("umbrella", 100) if hit.server == "weather"] == []
    index.set_server_tools("weather", WEATHER)
    assert index.embedded_tools == before + 1
    assert ids(index.search("will I need an umbrella tomorrow", 1)) == ["weather:get_forecast"]


def test_prepare_changes_nothing_until_apply() -> None:
    index = hybrid_index()
    before = index.search("weather tomorrow", 20)
    embedded = index.embedded_tools
    extra = [tool("get_alerts", "Severe weather warnings for a region", region="Region")]

    prepared = index.prepare("weather", [*WEATHER, *extra])

    assert index.search("weather tomorrow", 20) == before
    assert index.embedded_tools == embedded and len(index) == len(before)
    index.apply(prepared)
    assert index.embedded_tools == embedded + 1
    assert "weather:get_alerts" in ids(index.search("storm warning", 3))


def test_prepare_in_a_thread_while_the_index_is_searched_and_changed() -> None:
    index = hybrid_index()
    many = [tool(f"op_{number}", f"Operation number {number} on invoices and receipts") for number in range(300)]
    result: list[PreparedTools] = []
    worker = threading.Thread(target=lambda: result.append(index.prepare("billing", many)))

    worker.start()
    while worker.is_alive():
        index.set_server_tools("time", TIME[::-1])
        index.remove_server("slack")
        index.set_server_tools("slack", SLACK)
        assert index.search("send a message", 1)[0].tool == "send_message"
    worker.join()
    index.apply(result[0])

    fresh = hybrid_index({**CATALOG, "billing": many})
    assert [(hit.server, hit.tool) for hit in index.search("receipts", 10)] == [
        (hit.server, hit.tool) for hit in fresh.search("receipts", 10)
    ]


def test_a_vector_lost_between_prepare_and_apply_is_embedded_on_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    index = hybrid_index()
    prepared = index.prepare("weather", WEATHER)
    assert prepared.vectors == {}, "the tool is in the index already"
    monkeypatch.setattr(search_module, "CACHE_SPARE_VECTORS", 0)
    index.remove_server("weather")
    embedded = index.embedded_tools

    index.apply(prepared)

    assert index.embedded_tools == embedded + 1
    assert ids(index.search("will I need an umbrella tomorrow", 1)) == ["weather:get_forecast"]


@pytest.mark.parametrize("query", ["list the directory", "create an issue in a repository", "gist snippet", "rain"])
def test_hybrid_results_after_add_replace_remove_match_a_fresh_index(query: str) -> None:
    gist = [tool("create_gist", "Share a snippet as a gist"), *GITHUB[1:]]
    updated = hybrid_index({"github": GITHUB, "filesystem": FILESYSTEM, "slack": SLACK, "weather": WEATHER})
    updated.set_server_tools("github", gist)
    updated.set_server_tools("time", TIME)
    updated.remove_server("slack")
    updated.set_server_tools("filesystem", FILESYSTEM[:2])
    updated.set_server_tools("filesystem", FILESYSTEM)
    updated.remove_server("weather")

    fresh = hybrid_index({"time": TIME, "filesystem": FILESYSTEM, "github": gist})

    expected = fresh.search(query, 20)
    hits = updated.search(query, 20)
    assert len(updated) == len(fresh) == len(expected)
    assert [(hit.server, hit.tool) for hit in hits] == [(hit.server, hit.tool) for hit in expected]
    assert [hit.score for hit in hits] == pytest.approx([hit.score for hit in expected], abs=1e-6)


# --- Falling back to BM25 alone -----------------------------------------------------------------


def lexical_results(query: str) -> list[SearchHit]:
    index = ToolIndex(semantic=False)
    for server, tools in CATALOG.items():
        index.set_server_tools(server, tools)
    return index.search(query, 10)


def test_a_missing_model_leaves_bm25_alone_and_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mcpvisor.frontend.door.search"):
        index = ToolIndex(model_dir=tmp_path)
    for server, tools in CATALOG.items():
        index.set_server_tools(server, tools)

    assert index.status.startswith("lexical (model file ")
    assert "not found" in index.status
    assert any("falls back to BM25" in record.getMessage() for record in caplog.records)
    for query in ("remove a folder", "will I need an umbrella tomorrow", "merge PRs"):
        assert index.search(query, 10) == lexical_results(query)
    assert index.embedded_tools == 0


def test_unreadable_model_files_leave_bm25_alone(tmp_path: Path) -> None:
    source = default_model_dir()
    assert source is not None
    (tmp_path / "weights").mkdir()
    (tmp_path / "tokenizers").mkdir()
    (tmp_path / WEIGHTS_FILE).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    (tmp_path / TOKENIZER_FILE).write_bytes((source / TOKENIZER_FILE).read_bytes())

    index = ToolIndex(model_dir=tmp_path)
    index.set_server_tools("filesystem", FILESYSTEM)

    assert index.status.startswith("lexical (cannot read model weights ")
    assert ids(index.search("remove a folder", 1)) == ["filesystem:delete_directory"]


def test_semantic_can_be_switched_off() -> None:
    index = ToolIndex(semantic=False)

    assert index.status == "lexical (semantic search switched off)"


# --- The vector cache file ----------------------------------------------------------------------


def test_a_restart_with_the_cache_dir_embeds_nothing_again(tmp_path: Path) -> None:
    first = hybrid_index(cache_dir=tmp_path)
    assert first.save_cache()
    cache = tmp_path / CACHE_FILE_NAME

    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    second = hybrid_index(cache_dir=tmp_path)

    assert second.embedded_tools == 0
    assert not second.save_cache(), "nothing new to write"
    for query in ("will I need an umbrella tomorrow", "remove a folder", "gist"):
        assert second.search(query, 20) == first.search(query, 20)
    second.set_server_tools("money", [*MONEY, tool("list_currencies", "Every currency code with its name")])
    assert second.embedded_tools == 1


def test_the_cache_is_written_at_once_then_at_most_once_per_interval(tmp_path: Path) -> None:
    index = hybrid_index({"time": TIME}, cache_dir=tmp_path, cache_interval=3600)
    cache = tmp_path / CACHE_FILE_NAME
    assert hybrid_index({"time": TIME}, cache_dir=tmp_path).embedded_tools == 0

    index.set_server_tools("weather", WEATHER)
    assert hybrid_index({"weather": WEATHER}, cache_dir=tmp_path).embedded_tools == 1, "not written yet"
    assert index.save_cache()
    assert hybrid_index({"time": TIME, "weather": WEATHER}, cache_dir=tmp_path).embedded_tools == 0

    every_time = hybrid_index({"time": TIME}, cache_dir=tmp_path, cache_interval=0)
    every_time.set_server_tools("money", MONEY)
    assert not every_time.save_cache(), "already written by set_server_tools"
    assert hybrid_index({"money": MONEY}, cache_dir=tmp_path).embedded_tools == 0
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600


def test_the_cache_file_is_rewritten_owner_only_even_if_it_was_readable_by_others(tmp_path: Path) -> None:
    hybrid_index({"time": TIME}, cache_dir=tmp_path)
    cache = tmp_path / CACHE_FILE_NAME
    cache.chmod(0o644)

    index = hybrid_index({"time": TIME}, cache_dir=tmp_path)
    index.set_server_tools("weather", WEATHER)

    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert hybrid_index({"time": TIME, "weather": WEATHER}, cache_dir=tmp_path).embedded_tools == 0


def test_a_corrupt_cache_file_is_ignored_and_replaced(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / CACHE_FILE_NAME
    cache.write_bytes(b"PK\x03\x04 this is not a zip archive")

    with caplog.at_level(logging.WARNING, logger="mcpvisor.frontend.door.semantic"):
        index = hybrid_index({"weather": WEATHER}, cache_dir=tmp_path)

    assert index.embedded_tools == 1
    assert any("ignoring the tool vector cache" in record.getMessage() for record in caplog.records)
    assert hybrid_index({"weather": WEATHER}, cache_dir=tmp_path).embedded_tools == 0


def test_an_unwritable_cache_dir_does_not_break_search(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")

    with caplog.at_level(logging.WARNING, logger="mcpvisor.frontend.door.search"):
        index = hybrid_index({"weather": WEATHER}, cache_dir=blocked)

    assert ids(index.search("umbrella tomorrow", 1)) == ["weather:get_forecast"]
    assert any("cannot write the tool vector cache" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("expand_related", [False, True])
def test_hybrid_results_stay_right_when_the_index_changes_between_searches(expand_related: bool) -> None:
    """What hybrid search keeps between searches (per-term arrays, lengths) follows every change."""
    query = "delete the folder with everything in it"
    updated = ToolIndex(expand_related=expand_related)
    for server, tools in {"github": GITHUB, "filesystem": FILESYSTEM, "slack": SLACK}.items():
        updated.set_server_tools(server, tools)
        updated.search(query, 20)
    updated.remove_server("slack")
    updated.search(query, 20)
    updated.set_server_tools("filesystem", FILESYSTEM[:1])
    updated.search(query, 20)
    updated.set_server_tools("weather", WEATHER)

    fresh = ToolIndex(expand_related=expand_related)
    for server, tools in {"github": GITHUB, "filesystem": FILESYSTEM[:1], "weather": WEATHER}.items():
        fresh.set_server_tools(server, tools)

    hits, expected = updated.search(query, 20), fresh.search(query, 20)
    assert [(hit.server, hit.tool) for hit in hits] == [(hit.server, hit.tool) for hit in expected]
    assert [hit.score for hit in hits] == pytest.approx([hit.score for hit in expected], abs=1e-6)
