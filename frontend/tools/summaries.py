"""One-line summaries of tools, for the compact entries of a `retrieve_tools` answer.

A model choosing among tools needs a few words on what each does, not its manual. Descriptions
are often long, sometimes in another language and sometimes empty, so a summary is built from the
title, the name in words and the first sentence of the description, and never reads past a bound:
whatever a description says after its first few hundred characters cannot reach a summary.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from mcpvisor.frontend.door.search import split_identifier

# How much of a description is looked at for its first sentence: the sentence must start the
# description, and a description is never scanned as a whole.
SCANNED_CHARS: Final = 400
ELLIPSIS: Final = "…"

# The end of a sentence: a full stop, question or exclamation mark followed by a space or the end,
# the ideographic full stop and its full-width kin (which need no space), a line break after an
# ideograph (such descriptions put one sentence per line), or a blank line.
_SENTENCE_END = re.compile(r"(?<=[.!?])(?:\s|$)|(?<=[\u3002\uff01\uff1f])|(?<=[\u3000-\u9fff\uff00-\uffef])\n|\n\s*\n")
_SPACES = re.compile(r"\s+")
# Markdown emphasis and code marks cost tokens and say nothing in one line.
_MARKUP = re.compile(r"[*`#]+")


def name_in_words(name: str) -> str:
    """A tool's name as words: `get_weather_by_city` -> "get weather by city"."""
    return " ".join(split_identifier(name))


def first_sentence(description: str) -> str:
    """The first sentence of a description (whitespace and markup squeezed), from its first `SCANNED_CHARS`."""
    head = description[:SCANNED_CHARS]
    match = _SENTENCE_END.search(head.strip())
    sentence = head.strip()[: match.start()] if match else head
    cut = match is None and len(description) > SCANNED_CHARS
    text = _SPACES.sub(" ", _MARKUP.sub("", sentence)).strip()
    return text + ELLIPSIS if cut and text else text


def shorten(text: str, bound: int) -> str:
    """`text` within `bound` characters, cut at a word where there is one, marked with an ellipsis."""
    if len(text) <= bound:
        return text
    if bound <= len(ELLIPSIS):
        return ""
    cut = text[: bound - len(ELLIPSIS)]
    space = cut.rfind(" ")
    # Scripts without spaces (Chinese, Japanese) are cut anywhere; others at the last word end,
    # unless the cut already falls between two words or that throws most of the room away.
    if not text[len(cut)].isspace() and space > bound // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:-") + ELLIPSIS


def _latin(text: str) -> bool:
    """Mostly in a Latin script: the words of a name in words add little to such a sentence."""
    letters = [char for char in text if char.isalpha()]
    return bool(letters) and sum(char.isascii() for char in letters) >= 0.8 * len(letters)


def summarize(name: str, definition: Mapping[str, Any], bound: int) -> str:
    """What a tool does in at most `bound` characters; "" when `bound` leaves no room.

    The title leads when the tool has one; the name in words leads when there is neither a
    title nor a description in a Latin script to read (an empty or Chinese-only description),
    so a reader always has words it can match to its task. The server name is not part of the
    summary: the entry's `server:tool` name carries it and is never cut.
    """
    if bound <= 0:
        return ""
    description = definition.get("description")
    sentence = first_sentence(description) if isinstance(description, str) else ""
    title = definition.get("title")
    annotations = definition.get("annotations")
    if not (isinstance(title, str) and title.strip()) and isinstance(annotations, Mapping):
        title = annotations.get("title")
    lead = _SPACES.sub(" ", title).strip() if isinstance(title, str) else ""
    if not lead and not _latin(sentence):
        lead = name_in_words(name)
    if lead and sentence and sentence.lower().startswith(lead.lower()):
        lead = ""  # the sentence already says it
    text = f"{lead}: {sentence}" if lead and sentence else lead or sentence
    return shorten(text, bound)
