"""Text as the security rules read it: character classes, normalization, sentences, display.

Matching runs on a normalized copy of each string (NFKC, look-alike letters folded, invisible
characters dropped) that maps back to the original, so a rule sees "ignore" however it is spelled
and its evidence still points at what the server sent.

Evidence quoted in findings never exceeds `EVIDENCE_LIMIT` characters, shows invisible characters
as `<U+XXXX>` and has anything that looks like a secret redacted.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections.abc import Iterator
from functools import cached_property
from itertools import islice
from typing import TYPE_CHECKING, Literal

from mcpvisor.wire.redaction import secret_spans

if TYPE_CHECKING:
    # A text asks its tool for the references it makes; the rules module defines both.
    from mcpvisor.frontend.gate.security_rules import Reference, ToolContext

Mode = Literal["directive", "statement", "mention"]

EVIDENCE_LIMIT = 120
# Each rule keeps only its strongest hit, so it reads at most this many matches per string, and
# looks back at most LOOKBACK characters for the context of a match: both keep the analysis
# linear in the length of the text.
MATCH_LIMIT = 64
LOOKBACK = 300


# --------------------------------------------------------------------------------------------
# Character classes and text normalization

_ZERO_WIDTH = {0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF, 0x180E, 0x2061, 0x2062, 0x2063, 0x2064}
_BIDI_OVERRIDE = {0x202D, 0x202E}
_BIDI_EMBED = {0x202A, 0x202B, 0x202C, 0x2066, 0x2067, 0x2068, 0x2069}
_BIDI_MARK = {0x200E, 0x200F, 0x061C}
_FILLERS = {0x115F, 0x1160, 0x3164, 0xFFA0, 0x034F}

# Cyrillic and Greek letters that render like Latin ones; folding them lets the phrase rules see
# "ignore" spelled with a Cyrillic "i" (U+0456) as "ignore".
_CONFUSABLE_SOURCE = (
    "\u0430\u0435\u043e\u0440\u0441\u0443\u0445\u0456\u0458\u0455"
    "\u0501\u04bb\u04cf\u051b\u051d\u0410\u0412\u0415\u041a\u041c"
    "\u041d\u041e\u0420\u0421\u0422\u0423\u0425\u0406\u0408\u0405"
    "\u03b1\u03bf\u03c1\u03b9\u03c5\u03bd\u0391\u0392\u0395\u0396"
    "\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4\u03a5\u03a7"
)
_CONFUSABLE_TARGET = "aeopcyxijsdhlqwABEKMHOPCTYXIJSaopiuvABEZHIKMNOPTYX"
_CONFUSABLES = str.maketrans(_CONFUSABLE_SOURCE, _CONFUSABLE_TARGET)
CONFUSABLE_CHARS = frozenset(_CONFUSABLE_SOURCE)


def _is_tag(cp: int) -> bool:
    return 0xE0000 <= cp <= 0xE007F


def _is_private_use(cp: int) -> bool:
    return 0xE000 <= cp <= 0xF8FF or 0xF0000 <= cp <= 0xFFFFD or 0x100000 <= cp <= 0x10FFFD


def _is_variation_selector(cp: int) -> bool:
    return 0xFE00 <= cp <= 0xFE0F or 0xE0100 <= cp <= 0xE01EF


def _is_invisible(ch: str) -> bool:
    """Characters that render as nothing (or move text around) and are dropped before matching."""
    cp = ord(ch)
    if ch in "\t\n\r":
        return False
    category = unicodedata.category(ch)
    return (
        category in ("Cf", "Cc") or _is_tag(cp) or _is_variation_selector(cp) or _is_private_use(cp) or cp in _FILLERS
    )


def wordset(words: str) -> frozenset[str]:
    """The set of the space-separated words in `words`."""
    return frozenset(words.split())


def _codepoint(ch: str) -> str:
    return f"<U+{ord(ch):04X}>"


# --------------------------------------------------------------------------------------------
# Invisible and deceptive characters, by the Unicode rule that reports them


def _has_rtl(text: str) -> bool:
    return any(unicodedata.bidirectional(ch) in ("R", "AL") for ch in text)


def _joiner_is_legit(text: str, position: int) -> bool:
    """ZWJ/ZWNJ between emoji or between letters of scripts that need them (Indic, Arabic)."""
    before = text[position - 1] if position > 0 else ""
    after = text[position + 1] if position + 1 < len(text) else ""
    if not before or not after:
        return False
    if unicodedata.category(before) == "So" or unicodedata.category(after) == "So":
        return True
    letter_before = before.isalpha() or unicodedata.category(before) in ("Mn", "Mc")
    return letter_before and after.isalpha() and ord(before) > 0x2FF and ord(after) > 0x2FF


def _unicode_classes(text: str) -> dict[str, list[int]]:
    """Positions of invisible or deceptive characters in `text`, by the name of the rule that reports them."""
    classes: dict[str, list[int]] = {}
    in_flag = False  # inside an emoji tag sequence (subdivision flag), which starts with U+1F3F4
    rtl = _has_rtl(text)
    for position, ch in enumerate(text):
        cp = ord(ch)
        if not _is_tag(cp):
            in_flag = ch == "\U0001f3f4"
        if _is_tag(cp):
            if in_flag:
                continue
            name = "tag_characters"
        elif cp in _BIDI_OVERRIDE:
            name = "bidi_override"
        elif cp in _BIDI_EMBED:
            name = "bidi_embedding"
        elif cp in _BIDI_MARK:
            if rtl:
                continue
            name = "bidi_embedding"
        elif cp in _ZERO_WIDTH:
            if (cp in (0x200C, 0x200D) and _joiner_is_legit(text, position)) or (cp == 0xFEFF and position == 0):
                continue
            name = "zero_width"
        elif 0xE0100 <= cp <= 0xE01EF:
            name = "variation_selector_payload"
        elif 0xFE00 <= cp <= 0xFE0F:
            previous = text[position - 1] if position else ""
            if previous and (ord(previous) > 0x2000 or unicodedata.category(previous) == "So"):
                continue
            name = "zero_width"
        elif _is_private_use(cp):
            name = "private_use"
        elif unicodedata.category(ch) == "Cc" and ch not in "\t\n\r":
            name = "control_characters"
        elif unicodedata.category(ch) == "Cf" or cp in _FILLERS:
            name = "invisible_format"
        else:
            continue
        classes.setdefault(name, []).append(position)
    return classes


class Normalized:
    """A string folded for matching (NFKC, confusables, invisibles dropped) with a map back."""

    def __init__(self, original: str) -> None:
        chars: list[str] = []
        index: list[int] = []
        for position, ch in enumerate(original):
            if _is_invisible(ch):
                continue
            for out in unicodedata.normalize("NFKC", ch.translate(_CONFUSABLES)):
                chars.append(out)
                index.append(position)
        index.append(len(original))
        self.original = original
        self.text = "".join(chars)
        self.index = index

    def to_original(self, start: int, end: int) -> tuple[int, int]:
        if end <= start:
            return self.index[start], self.index[start]
        return self.index[start], self.index[end - 1] + 1


class _Pieces:
    """The original text cut into display pieces: secrets redacted, invisibles made visible."""

    def __init__(self, original: str) -> None:
        # Secrets are found on the normalized text (invisible characters removed), so a zero-width
        # space inside a token cannot hide it from redaction.
        normalized = Normalized(original)
        redactions = {}
        for start, end, label in secret_spans(normalized.text):
            orig_start, orig_end = normalized.to_original(start, end)
            redactions[orig_start] = (orig_end, label)
        pieces: list[tuple[int, int, str]] = []
        position = 0
        while position < len(original):
            ch = original[position]
            if position in redactions:
                end, label = redactions[position]
                pieces.append((position, end, label))
                position = end
            elif ch.isspace():
                end = position
                while end < len(original) and original[end].isspace():
                    end += 1
                pieces.append((position, end, " "))
                position = end
            else:
                shown = _codepoint(ch) if _is_invisible(ch) else ch
                pieces.append((position, position + 1, shown))
                position += 1
        self.pieces = pieces
        self.starts = [piece[0] for piece in pieces]

    def excerpt(self, start: int, end: int, limit: int = EVIDENCE_LIMIT) -> str:
        """Render the pieces covering [start, end) with some context, at most `limit` characters."""
        if not self.pieces:
            return ""
        first = max(bisect_right(self.starts, start) - 1, 0)
        last = max(bisect_right(self.starts, max(end - 1, start)) - 1, first)
        budget = limit - 2  # room for the ellipses
        core = [piece[2] for piece in self.pieces[first : last + 1]]
        length = sum(len(text) for text in core)
        if length >= budget:
            shown, used = [], 0
            for text in core:
                if used + len(text) > budget - 1:
                    break
                shown.append(text)
                used += len(text)
            lead = "…" if first > 0 else ""
            return (lead + "".join(shown)).strip() + "…"
        left, right = first, last
        left_room = min(30, (budget - length) // 2)
        while left > 0 and len(self.pieces[left - 1][2]) <= left_room:
            left -= 1
            left_room -= len(self.pieces[left][2])
            length += len(self.pieces[left][2])
        while right + 1 < len(self.pieces) and length + len(self.pieces[right + 1][2]) <= budget:
            right += 1
            length += len(self.pieces[right][2])
        while left > 0 and length + len(self.pieces[left - 1][2]) <= budget:
            left -= 1
            length += len(self.pieces[left][2])
        body = "".join(piece[2] for piece in self.pieces[left : right + 1]).strip()
        lead = "…" if left > 0 else ""
        tail = "…" if right + 1 < len(self.pieces) else ""
        return f"{lead}{body}{tail}"


def visible(text: str, limit: int = EVIDENCE_LIMIT) -> str:
    """`text` as evidence shows it: secrets redacted, invisibles as `<U+XXXX>`, at most `limit` characters."""
    return _Pieces(text).excerpt(0, len(text), limit)


def redact_secrets(text: str) -> str:
    """Return `text` with anything that looks like a token, key or password replaced.

    Unlike `wire.redaction.redact_secrets`, it matches on the normalized text, so invisible or
    look-alike characters inside a token do not hide it.
    """
    normalized = Normalized(text)
    parts, position = [], 0
    for start, end, label in secret_spans(normalized.text):
        orig_start, orig_end = normalized.to_original(start, end)
        parts += [text[position:orig_start], label]
        position = orig_end
    parts.append(text[position:])
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# Sentences, clauses and whether a phrase is aimed at the model

# A sentence ends at terminal punctuation, a line break, a tag or bracket, or a markdown rule.
_SENTENCE_BOUNDARY = re.compile(r"[.!?](?=\s|$)|\n|<[^<>\n]{1,40}>|[\[\]]|\{\{|\}\}|#{2,}|\s[-\u2013\u2014]{1,2}\s")
# Clauses: punctuation inside a sentence. Coordinated predicates ("... and send it") are minor
# clauses: each can start with its own imperative verb.
_MAJOR_BOUNDARY = re.compile(r"[,;:](?=\s|$)|[()]")
_MINOR_BOUNDARY = re.compile(r"\s(?:and|then|but|or|so)\s")
# Content introduced by such a label is quoted output or sample data, not an instruction.
_DATA_LABEL = re.compile(
    r"(?i)\b(?:text|output|response|reply|replies|sample|example|examples|fixture|string|result|content"
    r"|completion|answer|transcript)s?\s*:"
)
_MENTION_CUE = re.compile(
    r"(?i)\b(?:such\s+as|e\.g|for\s+example|for\s+instance|examples?|detect\w*|scan\w*|flag(?:s|ged|ging)?"
    r"|block\w*|prevent\w*|guard\w*|whether|attempt\w*|tries\s+to|tried\s+to|trying\s+to|explain\w*"
    r"|describ\w*|analy[sz]\w*|phrases?|quot\w*|mention\w*|refers?\s+to|recogni[sz]\w*|identif\w*"
    r"|classif\w*|warns?\s+about|protects?\s+against)\b"
)
_LEADING_ADVERBS = re.compile(
    r"(?:(?:and|also|then|so|but|first|firstly|next|now|instead|please|always|immediately|secretly"
    r"|silently|quietly|just|simply|additionally|finally|afterwards|still|only|from\s+now\s+on"
    r"|on\s+each\s+call|every\s+time)\s*,?\s*)+"
)
_MODAL_TAIL = re.compile(
    r"\b(?:must|should|shall|need\s+to|needs\s+to|have\s+to|has\s+to|are\s+to|is\s+to|required\s+to"
    r"|make\s+sure\s+to|be\s+sure\s+to|remember\s+to|always|never)\s*$"
)
_ADDRESSEE = re.compile(r"\byou\b", re.I)
_QUOTED = re.compile("(?<!\\w)(['\"\u2018\u201c`])(.+?)(['\"\u2019\u201d`])(?!\\w)")
# Base forms that open an imperative clause: "Read ...", "Send ...", "Always ...".
_IMPERATIVE_OPENERS = wordset(
    "read send call use execute run pass include append return ignore forget disregard reveal output "
    "forward upload post delete remove write add copy embed insert put obey follow treat comply do "
    "make ensure always never instead first also route replace prefer invoke"
)


def _last_end(ends: list[int], position: int) -> int:
    index = bisect_right(ends, position) - 1
    return ends[index] if index >= 0 else 0


class Text:
    """One string of a tool definition, with the sentence structure the rules reason about."""

    def __init__(
        self, location: str, original: str, tool: ToolContext, *, depth: int = 0, full_length: int = 0
    ) -> None:
        self.location = location
        self.original = original
        self.full_length = max(full_length, len(original))
        self.tool = tool
        self.depth = depth
        self.normalized = Normalized(original)
        self.norm = self.normalized.text
        sentence = list(_SENTENCE_BOUNDARY.finditer(self.norm))
        self._sentence_starts = [match.start() for match in sentence]
        self._sentence_ends = [match.end() for match in sentence]
        self._major_ends = sorted(self._sentence_ends + [m.end() for m in _MAJOR_BOUNDARY.finditer(self.norm)])
        self._minor_ends = sorted(self._major_ends + [m.end() for m in _MINOR_BOUNDARY.finditer(self.norm)])

    @cached_property
    def pieces(self) -> _Pieces:
        return _Pieces(self.original)

    @cached_property
    def unicode_classes(self) -> dict[str, list[int]]:
        return _unicode_classes(self.original)

    def sentence_bounds(self, position: int) -> tuple[int, int]:
        """The sentence holding `position`, clipped to LOOKBACK characters on either side."""
        start = self.lookback(self._sentence_ends, position)
        index = bisect_right(self._sentence_starts, position)
        end = self._sentence_starts[index] if index < len(self._sentence_starts) else len(self.norm)
        return start, min(end, position + LOOKBACK)

    @cached_property
    def references(self) -> list[Reference]:
        return self.tool.references(self)

    def sentence(self, position: int) -> str:
        start, end = self.sentence_bounds(position)
        return self.norm[start:end]

    def minor_prefix(self, position: int) -> str:
        return self.norm[self.lookback(self._minor_ends, position) : position].strip().lower()

    def quoted(self, position: int) -> bool:
        start, end = self.sentence_bounds(position)
        return any(
            match.start(2) <= position - start < match.end(2) for match in _QUOTED.finditer(self.norm[start:end])
        )

    def matches(self, pattern: re.Pattern[str]) -> Iterator[re.Match[str]]:
        return islice(pattern.finditer(self.norm), MATCH_LIMIT)

    def lookback(self, ends: list[int], position: int) -> int:
        """Start of the sentence or clause holding `position`, at most LOOKBACK characters back."""
        return max(_last_end(ends, position), position - LOOKBACK)

    def mode(self, position: int, *, base_form: bool = True, quotes: bool = True) -> Mode:
        """Classify the phrase at `position`: a directive to the model, a statement, or a mention.

        `base_form` is False when the phrase's verb is inflected ("sends", "posted"), which makes
        it a description of what something does rather than an imperative.
        """
        if quotes and self.quoted(position):
            return "mention"
        if _DATA_LABEL.search(self.norm, self.lookback(self._sentence_ends, position), position):
            return "mention"
        if _MENTION_CUE.search(self.norm, self.lookback(self._major_ends, position), position):
            return "mention"
        prefix = self.minor_prefix(position)
        if _ADDRESSEE.search(prefix):
            return "directive"
        if not base_form:
            return "statement"
        if not self.norm[:position].strip():
            # Descriptions conventionally open in the imperative ("Read a file ..."): the opening
            # clause states what the tool does, it is not an order to the model.
            return "statement"
        if not prefix or _LEADING_ADVERBS.fullmatch(prefix) or _MODAL_TAIL.search(prefix):
            return "directive"
        return "statement"

    def sentence_is_directive(self, position: int) -> bool:
        """True when some clause of the sentence holding `position` opens with an imperative."""
        start, end = self.sentence_bounds(position)
        ends = [start] + [e for e in self._minor_ends if start < e < end]
        for clause_start in ends:
            words = self.norm[clause_start:end].split(maxsplit=1)
            if words and words[0].lower().strip(",:;") in _IMPERATIVE_OPENERS:
                return True
        return _ADDRESSEE.search(self.norm, start, end) is not None

    def span(self, start: int, end: int) -> tuple[int, int]:
        return self.normalized.to_original(start, end)
