"""`retrieve_tools`: search by words and meaning over the tools a client may call, and which call tool to use.

Without `limit`, the answer is shaped to a token budget (`[search] answer_tokens`): the best tools
in full, as they were always given, under `tools`; the next ones compact under `more`, each a
`server:tool` name with a one-line summary that shortens down the ranking to the name alone. An
agent reads the few likely tools whole and sees many more it can ask for by name with
`describe_tools`, for the cost of a handful of full ones. A client that sets `limit` gets that
many tools in full, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from mcpvisor.frontend.door.search import SearchHit
from mcpvisor.frontend.door.upstreams import Upstreams
from mcpvisor.frontend.tool_args import check_parameters, dumps, get_integer, get_string, json_result
from mcpvisor.frontend.tools.summaries import summarize
from mcpvisor.wire.config import SearchConfig

RETRIEVE_TOOL_NAME: Final = "retrieve_tools"
DESCRIBE_TOOL_NAME: Final = "describe_tools"
MAX_LIMIT: Final = 100
# Tokens are counted as the README and the benchmarks count them: characters / 4.
CHARS_PER_TOKEN: Final = 4
# The compact entries' summaries shrink from `summary_chars` to nothing over this many entries:
# the higher a tool ranks, the likelier it is the one, and the more words on it are worth. Past
# it, a tool is named alone (its name usually says what it does). Chosen with
# tests/bench/retrieval_eval.py, which prints the figures for other values.
SUMMARY_FADE: Final = 8
# A summary shorter than this is a word or two cut off: the name alone says as much.
MIN_SUMMARY: Final = 24
SEPARATOR: Final = " — "
MORE_HINT: Final = (
    f"more: 'server:tool{SEPARATOR}summary', best first. {DESCRIBE_TOOL_NAME} gives their schemas and call_with."
)


def call_with(annotations: Mapping[str, Any] | None) -> str:
    """The call tool a client should use for a tool with these annotations.

    A tool marked destructive needs `call_tool_destructive` even if it also claims to be read-only:
    the other two refuse it, and the cautious reading of contradictory hints is the safe one.
    """
    annotations = annotations or {}
    if annotations.get("destructiveHint") is True:
        return "call_tool_destructive"
    if annotations.get("readOnlyHint") is True:
        return "call_tool_read"
    return "call_tool_write"


def retrieve_tool(default_limit: int, search: SearchConfig | None = None) -> dict[str, Any]:
    """The tool definition, with the configured default number of results or token budget."""
    budget = (search or SearchConfig()).answer_tokens
    if budget:
        shape = (
            f"Without limit, the answer fits about {budget} tokens: the best matches in full under `tools` "
            "(name in server:tool form, description, input schema, annotations, score, and `call_with`: the "
            "tool to call it with, call_tool_read, call_tool_write or call_tool_destructive), then more "
            f"matches under `more` as 'server:tool{SEPARATOR}summary', best first; get their schemas with "
            f"{DESCRIBE_TOOL_NAME}, or call them directly."
        )
        limit_text = f"Give this many results, all in full, instead of the answer within about {budget} tokens."
    else:
        shape = (
            "Each result gives the tool's name in server:tool form, its description, input schema, annotations, "
            "a relevance score, and `call_with`: the tool to call it with (call_tool_read, call_tool_write or "
            "call_tool_destructive)."
        )
        limit_text = f"Maximum number of results (default {default_limit}, at most {MAX_LIMIT})."
    return {
        "name": RETRIEVE_TOOL_NAME,
        "description": (
            "Search the tools of all connected upstream servers by what you want done, in plain words or "
            f"keywords. Use it first: upstream tools are not listed directly. {shape}"
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "Search keywords, e.g. 'create github issue'.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_LIMIT,
                    **({} if budget else {"default": default_limit}),
                    "description": limit_text,
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        "annotations": {"title": "Search tools", "readOnlyHint": True, "openWorldHint": False},
    }


def full_entry(server: str, tool: str, definition: Mapping[str, Any], score: float | None = None) -> dict[str, Any]:
    """A tool as `retrieve_tools` has always given it: everything a client needs to call it."""
    entry: dict[str, Any] = {
        "name": f"{server}:{tool}",
        "server": server,
        "description": definition.get("description", ""),
        "inputSchema": definition.get("inputSchema", {"type": "object"}),
    }
    if "title" in definition:
        entry["title"] = definition["title"]
    if definition.get("annotations"):
        entry["annotations"] = definition["annotations"]
    if score is not None:
        entry["score"] = round(score, 4)
    entry["call_with"] = call_with(definition.get("annotations"))
    return entry


def compact_entry(server: str, tool: str, definition: Mapping[str, Any], bound: int) -> str:
    """`server:tool — summary` with a summary of at most `bound` characters, or the name alone."""
    summary = summarize(tool, definition, bound)
    return f"{server}:{tool}{SEPARATOR}{summary}" if summary else f"{server}:{tool}"


def summary_bound(position: int, summary_chars: int) -> int:
    """The longest summary of the `position`-th compact entry (0: the first)."""
    bound = summary_chars * max(0, SUMMARY_FADE - position) // SUMMARY_FADE
    return bound if bound >= MIN_SUMMARY else 0


def full_answer(query: str, found: Sequence[tuple[SearchHit, Mapping[str, Any]]]) -> dict[str, Any]:
    """The answer to a call with `limit`: every hit in full."""
    tools = [full_entry(hit.server, hit.tool, definition, hit.score) for hit, definition in found]
    return {"query": query, "tools": tools, "total": len(tools)}


def budgeted_answer(
    query: str, found: Sequence[tuple[SearchHit, Mapping[str, Any]]], search: SearchConfig
) -> dict[str, Any]:
    """The answer within `search.answer_tokens`: the first hits in full, the next compact, in ranked order.

    A full entry is given while the answer stays within half the budget (a tool with a schema of
    thousands of tokens goes compact instead, and `describe_tools` gives it); compact entries
    are added while the whole answer stays within the budget (a budget too small for one still
    names the best tool).
    """
    budget = search.answer_tokens * CHARS_PER_TOKEN
    # `total` is counted at its widest (three digits), so that the size below is an upper bound.
    answer: dict[str, Any] = {"query": query, "tools": [], "more": [], "total": MAX_LIMIT, "hint": MORE_HINT}
    # The size of the encoded answer, kept up to date entry by entry: each adds its own text, and
    # a comma after the first of its list.
    size = len(dumps(answer))
    tools: list[dict[str, Any]] = answer["tools"]
    more: list[str] = answer["more"]
    for hit, definition in found[:MAX_LIMIT]:
        if not more and len(tools) < search.full_entries:
            entry = full_entry(hit.server, hit.tool, definition, hit.score)
            cost = len(dumps(entry)) + (1 if tools else 0)
            if size + cost <= budget // 2:
                tools.append(entry)
                size += cost
                continue
        line = compact_entry(hit.server, hit.tool, definition, summary_bound(len(more), search.summary_chars))
        cost = len(dumps(line)) + (1 if more else 0)
        if size + cost > budget and (tools or more):  # however small the budget, the best tool is named
            break
        more.append(line)
        size += cost
    answer["total"] = len(tools) + len(more)
    if not more:
        del answer["more"], answer["hint"]
    return answer


async def retrieve_tools(upstreams: Upstreams, arguments: Mapping[str, Any], search: SearchConfig) -> dict[str, Any]:
    """Run the search over the tools a client may call (hidden servers and changed tools left out)."""
    check_parameters(arguments, ("query", "limit"), what=RETRIEVE_TOOL_NAME)
    query = get_string(arguments, "query", required=True)
    assert query is not None
    if arguments.get("limit") is None and search.answer_tokens:
        return json_result(budgeted_answer(query, await upstreams.search(query, MAX_LIMIT), search))
    limit = get_integer(arguments, "limit", default=upstreams.settings.tools_limit, minimum=1, maximum=MAX_LIMIT)
    return json_result(full_answer(query, await upstreams.search(query, limit)))
