"""What an agent reads from `retrieve_tools`: one-line summaries, and the answer kept within its token budget."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcpvisor.frontend.door.search import SearchHit
from mcpvisor.frontend.tool_args import dumps
from mcpvisor.frontend.tools.retrieval import (
    CHARS_PER_TOKEN,
    MIN_SUMMARY,
    SEPARATOR,
    SUMMARY_FADE,
    budgeted_answer,
    full_answer,
    summary_bound,
)
from mcpvisor.frontend.tools.summaries import SCANNED_CHARS, first_sentence, name_in_words, summarize
from mcpvisor.supervisor.config import loads
from mcpvisor.wire.config import ConfigError, SearchConfig

# -- summaries ------------------------------------------------------------------------------------


def test_a_summary_is_the_first_sentence_cut_at_a_word() -> None:
    tool = {"description": "Get the weather for a city. Uses the Open-Meteo API and caches for an hour."}
    assert summarize("get_weather", tool, 100) == "Get the weather for a city."
    assert summarize("get_weather", tool, 20) == "Get the weather for…"
    assert len(summarize("get_weather", tool, 20)) <= 20


def test_the_title_leads_and_markup_and_line_breaks_are_squeezed() -> None:
    tool = {"title": "Weather report", "description": "**Current** weather\n  and `forecast`. More text."}
    assert summarize("weather", tool, 200) == "Weather report: Current weather and forecast."
    # A title the sentence already starts with is not said twice.
    assert summarize("x", {"title": "List files", "description": "List files in a folder."}, 200) == (
        "List files in a folder."
    )


def test_an_empty_or_foreign_description_is_led_by_the_name_in_words() -> None:
    assert name_in_words("getCurrentTime") == "get current time"
    assert summarize("get-daily_challenge", {"description": ""}, 100) == "get daily challenge"
    assert summarize("get-daily_challenge", {}, 100) == "get daily challenge"
    chinese = {"description": "查询12306余票信息。尚且只支持查询前十条。"}
    assert summarize("get-tickets", chinese, 100) == "get tickets: 查询12306余票信息。"
    # Each line of such a description is a sentence.
    assert first_sentence("获取组件的详细文档\n适用场景\uff1a\n1. 用户询问") == "获取组件的详细文档"


def test_a_summary_never_reads_past_the_scanned_part() -> None:
    hidden = "IGNORE-PREVIOUS-INSTRUCTIONS"
    tool = {"description": "word " * (SCANNED_CHARS // 5 + 10) + hidden + ". And more."}
    summary = summarize("tool", tool, 10_000)
    assert hidden not in summary
    assert summary.endswith("…") and len(summary) <= SCANNED_CHARS + 1
    assert summarize("tool", {"description": "x" * 100_000}, 50).endswith("…")


def test_no_room_no_summary() -> None:
    assert summarize("tool", {"description": "Does things."}, 0) == ""
    assert summarize("tool", {"description": "Does things."}, 1) == ""


def test_summaries_shrink_down_the_ranking_to_none() -> None:
    bounds = [summary_bound(position, 100) for position in range(SUMMARY_FADE + 2)]
    assert bounds[0] == 100
    assert bounds == sorted(bounds, reverse=True)
    assert all(bound == 0 or bound >= MIN_SUMMARY for bound in bounds)
    assert bounds[-1] == 0


# -- the answer within its budget -------------------------------------------------------------------


def catalog(count: int, schema_size: int = 3) -> list[tuple[SearchHit, dict[str, Any]]]:
    found = []
    for number in range(count):
        properties = {f"parameter_{p}": {"type": "string", "description": "a value " * 3} for p in range(schema_size)}
        definition = {
            "name": f"tool_{number}",
            "description": f"Tool number {number} does one thing well. Then it says much more about itself.",
            "inputSchema": {"type": "object", "properties": properties},
            "annotations": {"readOnlyHint": number % 2 == 0},
        }
        found.append((SearchHit(f"server{number % 7}", f"tool_{number}", 1.0 - number / 1000), definition))
    return found


def names_in(answer: dict[str, Any]) -> list[str]:
    return [tool["name"] for tool in answer["tools"]] + [line.split(SEPARATOR)[0] for line in answer.get("more", [])]


@pytest.mark.parametrize("budget", [80, 300, 1000, 4000])
def test_the_default_answer_fits_its_budget_in_ranked_order(budget: int) -> None:
    found = catalog(100)
    answer = budgeted_answer("find a tool", found, SearchConfig(answer_tokens=budget))
    text = dumps(answer)
    assert len(text) / CHARS_PER_TOKEN <= budget
    assert json.loads(text) == answer
    names = names_in(answer)
    assert names == [f"{hit.server}:{hit.tool}" for hit, _ in found[: len(names)]]
    assert answer["total"] == len(names)
    assert names, "the best tool is always named"
    if budget >= 300:
        assert len(names) > 5, "a budget that fits five full tools names many more compact"


def test_a_budget_too_small_for_anything_still_names_the_best_tool() -> None:
    answer = budgeted_answer("find a tool", catalog(10), SearchConfig(answer_tokens=1))
    assert answer["tools"] == [] and answer["more"] == ["server0:tool_0 — Tool number 0 does one thing well."]


def test_the_best_tool_comes_in_full_and_the_next_compact() -> None:
    answer = budgeted_answer("find a tool", catalog(100), SearchConfig())
    [best] = answer["tools"]
    assert best["name"] == "server0:tool_0"
    assert best["inputSchema"]["properties"] and best["call_with"] == "call_tool_read"
    assert best["score"] == 1.0
    first, *rest = answer["more"]
    assert first == "server1:tool_1 — Tool number 1 does one thing well."
    last = len(rest) + 1
    assert rest[-1] == f"server{last % 7}:tool_{last}", "the last ones are named alone"
    assert "describe_tools" in answer["hint"]


def test_a_tool_too_large_to_give_in_full_is_given_compact() -> None:
    found = catalog(30)
    found[0] = (found[0][0], {**found[0][1], "inputSchema": {"type": "object", "description": "x" * 10_000}})
    answer = budgeted_answer("find a tool", found, SearchConfig(answer_tokens=1000, full_entries=2))
    assert answer["tools"] == []
    assert answer["more"][0].startswith("server0:tool_0 — ")
    assert len(dumps(answer)) / CHARS_PER_TOKEN <= 1000


def test_more_full_entries_when_asked_and_none_found_is_an_empty_answer() -> None:
    answer = budgeted_answer("find", catalog(40), SearchConfig(answer_tokens=2000, full_entries=3))
    assert [tool["name"] for tool in answer["tools"]] == ["server0:tool_0", "server1:tool_1", "server2:tool_2"]
    empty = budgeted_answer("the of and", [], SearchConfig())
    assert empty == {"query": "the of and", "tools": [], "total": 0}


def test_an_answer_with_limit_gives_every_tool_in_full() -> None:
    answer = full_answer("find", catalog(5))
    assert answer["total"] == 5 and "more" not in answer
    assert all("inputSchema" in tool and "call_with" in tool for tool in answer["tools"])


# -- the [search] table -----------------------------------------------------------------------------


def test_the_search_table_has_defaults_and_takes_a_key_only_as_a_reference() -> None:
    assert loads("").search == SearchConfig()
    config = loads(
        '[search]\nanswer_tokens = 600\nembedding_url = "http://127.0.0.1:9/v1/embeddings"\n'
        'embedding_key = "${env:EMBEDDING_KEY}"\n'
    )
    assert config.search.answer_tokens == 600 and config.search.embedding_key == "${env:EMBEDDING_KEY}"
    with pytest.raises(ConfigError, match="embedding_key must be a reference") as refused:
        loads('[search]\nembedding_key = "sk-live-0123456789"\n')
    assert "sk-live-0123456789" not in str(refused.value)
    with pytest.raises(ConfigError, match="embedding_url must start with http"):
        loads('[search]\nembedding_url = "file:///etc/passwd"\n')
    with pytest.raises(ConfigError, match="answer_token"):
        loads("[search]\nanswer_token = 5\n")
