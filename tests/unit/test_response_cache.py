"""Large results: the bounded, expiring cache, cutting a result, and paging it back with read_cache."""

from __future__ import annotations

import re

import pytest

from mcpvisor.frontend.tool_args import ToolInputError
from mcpvisor.frontend.tools.response_cache import (
    TRUNCATION_META,
    CacheMiss,
    ResponseCache,
    cut_result,
    read_cache,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def alphabet(length: int) -> str:
    return "".join(chr(ord("a") + i % 26) for i in range(length))


def result_of(*texts: str, **extra: object) -> dict[str, object]:
    return {"content": [{"type": "text", "text": text} for text in texts], "isError": False, **extra}


# -- ResponseCache -------------------------------------------------------------------------------


def test_stored_text_reads_back_in_pages_that_add_up_to_it() -> None:
    cache = ResponseCache()
    text = alphabet(1000)
    key = cache.put(text)
    assert key is not None
    pages, offset = [], 0
    while offset is not None:
        page = cache.read(key, offset, 300)
        pages.append(page.text)
        offset = page.next_offset
    assert [len(p) for p in pages] == [300, 300, 300, 100]
    assert "".join(pages) == text


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    cache = ResponseCache(ttl=600, clock=clock)
    key = cache.put("x" * 10)
    assert key is not None
    clock.now += 599
    assert cache.read(key).text == "x" * 10
    clock.now += 2
    with pytest.raises(CacheMiss):
        cache.read(key)
    assert len(cache) == 0
    assert cache.total_chars == 0


def test_total_size_is_bounded_by_dropping_the_oldest_entries() -> None:
    cache = ResponseCache(max_chars=100)
    first, second, third = cache.put("a" * 40), cache.put("b" * 40), cache.put("c" * 40)
    assert cache.total_chars == 80
    with pytest.raises(CacheMiss):
        cache.read(first or "")
    assert cache.read(second or "").text == "b" * 40
    assert cache.read(third or "").text == "c" * 40


def test_a_text_larger_than_the_whole_cache_is_not_kept() -> None:
    cache = ResponseCache(max_chars=10)
    kept = cache.put("small")
    assert cache.put("x" * 11) is None
    assert cache.read(kept or "").text == "small"


def test_keys_are_unguessable_and_distinct() -> None:
    cache = ResponseCache()
    keys = {cache.put("same") for _ in range(50)}
    assert len(keys) == 50
    assert all(key is not None and re.fullmatch(r"[0-9a-f]{16}", key) for key in keys)


def test_unknown_key_and_offset_past_the_end_are_refused() -> None:
    cache = ResponseCache()
    key = cache.put("abc") or ""
    with pytest.raises(CacheMiss):
        cache.read("nope")
    with pytest.raises(ValueError, match="past the end"):
        cache.read(key, 4)
    assert cache.read(key, 3).text == ""
    assert cache.read(key, 3).next_offset is None


# -- cut_result ----------------------------------------------------------------------------------


def test_short_result_passes_unchanged() -> None:
    result = result_of("hello", structuredContent={"a": 1})
    assert cut_result(result, 5, ResponseCache()) == result
    assert cut_result(result_of("x" * 100), 0, ResponseCache()) == result_of("x" * 100)


def test_long_result_is_cut_with_a_note_naming_the_key_and_the_offset() -> None:
    cache = ResponseCache()
    text = alphabet(250)
    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    result = {**result_of(text), "structuredContent": {"result": text}, "_meta": {"origin": "tests"}}
    result["content"].append(image)  # type: ignore[attr-defined]
    cut = cut_result(result, 100, cache)
    head, note, *rest = cut["content"]
    assert head == {"type": "text", "text": text[:100]}
    assert rest == [image]
    assert "structuredContent" not in cut
    assert cut["isError"] is False
    meta = cut["_meta"][TRUNCATION_META]
    assert meta["returned"] == 100
    assert meta["total"] == 250
    assert f'{{"key": "{meta["key"]}", "offset": 100}}' in note["text"]
    assert "first 100 of 250 characters" in note["text"]
    assert cut["_meta"]["origin"] == "tests"
    assert cache.read(meta["key"], 100, 1000).text == text[100:]


def test_several_text_blocks_are_cut_as_one_text() -> None:
    cache = ResponseCache()
    cut = cut_result(result_of("a" * 60, "b" * 60), 100, cache)
    key = cut["_meta"][TRUNCATION_META]["key"]
    assert cut["content"][0]["text"] + cache.read(key, 100).text == "a" * 60 + "\n" + "b" * 60


def test_too_large_for_the_cache_is_still_cut_and_says_so() -> None:
    cut = cut_result(result_of("x" * 50), 10, ResponseCache(max_chars=20))
    assert cut["content"][0]["text"] == "x" * 10
    assert "too large to keep" in cut["content"][1]["text"]
    assert cut["_meta"][TRUNCATION_META]["key"] is None


# -- the read_cache tool -------------------------------------------------------------------------


def test_read_cache_tool_pages_to_the_end() -> None:
    cache = ResponseCache()
    text = alphabet(45)
    key = cache.put(text) or ""
    pages, offset = [], 0
    while offset is not None:
        answer = read_cache(cache, {"key": key, "offset": offset, "limit": 20}, page_size=100)
        assert answer["isError"] is False
        pages.append(answer["content"][0]["text"])
        offset = answer["structuredContent"]["next_offset"]
    assert "".join(pages) == text
    assert answer["structuredContent"] == {"key": key, "offset": 40, "returned": 5, "total": 45, "next_offset": None}
    assert "this is the end" in answer["content"][1]["text"]


def test_read_cache_tool_default_page_is_the_response_limit() -> None:
    cache = ResponseCache()
    key = cache.put(alphabet(100)) or ""
    assert len(read_cache(cache, {"key": key}, page_size=30)["content"][0]["text"]) == 30
    assert len(read_cache(cache, {"key": key}, page_size=0)["content"][0]["text"]) == 100


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "Parameter 'key' is required"),
        ({"key": 5}, "Parameter 'key' must be a string, got a number"),
        ({"key": "nope"}, "Unknown or expired cache key 'nope'"),
        ({"key": "KEY", "offset": -1}, "Parameter 'offset' must be an integer of 0 or more"),
        ({"key": "KEY", "offset": "3"}, "Parameter 'offset' must be an integer, got a string"),
        ({"key": "KEY", "limit": 0}, "Parameter 'limit' must be an integer from 1 to"),
        ({"key": "KEY", "offset": 99}, "past the end of the text"),
        ({"key": "KEY", "page": 2}, "Unknown parameter 'page' for read_cache"),
    ],
)
def test_read_cache_tool_refuses_bad_input_with_a_clear_message(arguments: dict[str, object], message: str) -> None:
    cache = ResponseCache()
    key = cache.put("abc") or ""
    arguments = {name: (key if value == "KEY" else value) for name, value in arguments.items()}
    with pytest.raises(ToolInputError, match=re.escape(message)):
        read_cache(cache, arguments, page_size=10)
