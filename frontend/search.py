"""BM25 search over the aggregated tool catalog, the index behind `retrieve_tools`.

Pure and I/O-free: the frontend feeds it each server's tool definitions (MCP wire dicts) and asks
it for the best matches of a free-text query.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["RELATED_TERMS", "SearchHit", "ToolIndex", "split_identifier", "stem", "tokenize"]

# k1 = 1.2 is the usual BM25 default: repeating a word a second or third time still helps, but
# a description that says "file" ten times does not beat one that says it twice by much.
K1 = 1.2
# Tool descriptions range from five words to whole manuals; a long one matches many words by
# sheer size, so length normalisation stays at the usual, fairly strong 0.75.
B = 0.75

# How much one occurrence in each field counts toward a term's frequency. The name is the most
# deliberate text a tool has, so it counts most. Integers keep the running length total exact
# through any sequence of additions and removals (floats would drift).
NAME_WEIGHT = 3
TITLE_WEIGHT = 2
DESCRIPTION_WEIGHT = 1
SERVER_WEIGHT = 1
PARAMETER_WEIGHT = 1

# A document that only contains a word related to the query word (not the word itself) gets
# this share of the score it would get for the word itself: the query author chose a word,
# the exact match is more likely to be what they meant.
RELATED_WEIGHT = 0.5

_STOP_WORD_TEXT = """
    a about above after again all also am an and any are as at be because been before being
    below between both but by can could did do does doing down during each either else etc ever
    few for from further had has have having he her here hers him his how i if in into is it its
    itself just me more most my myself no nor not of off on once one only or other our ours out over
    own per same she should so some such than that the their theirs them then there these they
    this those through thus to too under until up us very via was we were what when where which
    while who whom why will with within without would yet you your yours
"""
_STOP_WORDS = frozenset(_STOP_WORD_TEXT.split())

# Groups of words that tool authors and tool users use interchangeably for the same operation or
# object: the common vocabulary of tool catalogs (files, CRUD, version control, the web, data).
# A word belongs here only if the pairing holds in almost any catalog; a pairing that only helps
# one domain's queries does not. Each word is stemmed when the module loads.
_RELATED_GROUPS: tuple[tuple[str, ...], ...] = (
    ("get", "fetch", "retrieve", "obtain"),
    ("fetch", "download"),
    ("delete", "remove", "erase", "destroy", "drop", "purge"),
    ("create", "make"),
    ("add", "insert", "append"),
    ("update", "modify", "edit", "change", "alter"),
    ("search", "find", "lookup", "locate", "query"),
    ("list", "enumerate"),
    ("show", "display", "view", "print"),
    ("run", "execute", "invoke"),
    ("start", "begin", "launch"),
    ("stop", "halt", "terminate", "kill"),
    ("write", "save", "store"),
    ("move", "rename"),
    ("copy", "duplicate", "clone"),
    ("compare", "diff", "difference"),
    ("undo", "revert", "reset", "rollback"),
    ("convert", "translate", "transform"),
    ("send", "post", "submit"),
    ("directory", "folder", "dir"),
    ("file", "document"),
    ("repository", "repo"),
    ("database", "db"),
    ("record", "row", "entry"),
    ("image", "picture", "photo"),
    ("information", "info", "metadata", "details"),
    ("web", "internet", "online"),
    ("url", "link", "website", "webpage"),
    ("error", "failure"),
    ("config", "configuration"),
    ("user", "account"),
    ("message", "msg"),
    ("email", "mail"),
    ("issue", "ticket", "bug"),
)

# Splits an alphanumeric run into words: "HTTPServer" -> HTTP Server, "getFileInfo" -> get File
# Info, "utf8" -> utf 8.
_IDENTIFIER_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# Word characters minus the underscore, so snake_case splits like any other separator.
_ALNUM_RUN = re.compile(r"[^\W_]+")


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One search result: a tool of one server and its BM25 score."""

    server: str
    tool: str
    score: float


def split_identifier(text: str) -> list[str]:
    """Split text into lowercase words at separators, case changes and letter/digit borders."""
    words: list[str] = []
    for run in _ALNUM_RUN.findall(text):
        if run.isascii():
            words.extend(part.lower() for part in _IDENTIFIER_PART.findall(run))
        else:
            # Case rules for scripts beyond ASCII are not worth guessing; keep the run whole.
            words.append(run.lower())
    return words


def tokenize(text: str) -> list[str]:
    """Turn text into index terms: split words, drop stop words and single letters, stem."""
    return [stem(word) for word in split_identifier(text) if len(word) > 1 and word not in _STOP_WORDS]


# --- Stemmer: the inflectional steps (1 and 5) of M. F. Porter's 1980 suffix-stripping algorithm --
# Porter's steps 2 to 4 strip derivational suffixes too; on short technical text that merges
# words a tool author keeps apart ("general" and "generate", "relative" and "relation"), so only
# plurals, -ed, -ing, -y and a final -e are handled.


def _is_consonant(word: str, i: int) -> bool:
    char = word[i]
    if char in "aeiou":
        return False
    if char == "y":
        return i == 0 or not _is_consonant(word, i - 1)
    return True


def _measure(stem_: str) -> int:
    """Count the vowel-consonant sequences (Porter's m) in a stem."""
    m = 0
    previous_vowel = False
    for i in range(len(stem_)):
        consonant = _is_consonant(stem_, i)
        if consonant and previous_vowel:
            m += 1
        previous_vowel = not consonant
    return m


def _has_vowel(stem_: str) -> bool:
    return any(not _is_consonant(stem_, i) for i in range(len(stem_)))


def _ends_double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and _is_consonant(word, len(word) - 1)


def _ends_cvc(word: str) -> bool:
    """Tell whether a word ends consonant-vowel-consonant, the last not w, x or y (Porter's *o)."""
    return (
        len(word) >= 3
        and _is_consonant(word, len(word) - 3)
        and not _is_consonant(word, len(word) - 2)
        and _is_consonant(word, len(word) - 1)
        and word[-1] not in "wxy"
    )


def _strip_inflection(word: str) -> str:
    """Porter's step 1: plurals, -eed, -ed, -ing, and a final y after a vowel-bearing stem."""
    if word.endswith(("sses", "ies")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]

    if word.endswith("eed"):
        if _measure(word[:-3]) > 0:
            word = word[:-1]
    else:
        for suffix in ("ed", "ing"):
            if word.endswith(suffix) and _has_vowel(word[: -len(suffix)]):
                word = word[: -len(suffix)]
                # Restore what the suffix took away, so "hoping" meets "hope" and "hopping" "hop".
                if word.endswith(("at", "bl", "iz")):
                    word += "e"
                elif _ends_double_consonant(word) and word[-1] not in "lsz":
                    word = word[:-1]
                elif _measure(word) == 1 and _ends_cvc(word):
                    word += "e"
                break

    if word.endswith("y") and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    return word


def _strip_final_e(word: str) -> str:
    """Porter's step 5: drop a final e and undouble a final ll on longer stems."""
    if word.endswith("e"):
        base = word[:-1]
        m = _measure(base)
        if m > 1 or (m == 1 and not _ends_cvc(base)):
            word = base
    if word.endswith("ll") and _measure(word) > 1:
        word = word[:-1]
    return word


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Reduce a lowercase word to its stem ("directories" -> "directori", "created" -> "creat")."""
    if len(word) <= 2 or not word.isalpha() or not word.isascii():
        return word
    return _strip_final_e(_strip_inflection(word))


def _build_related(groups: Iterable[Iterable[str]]) -> dict[str, tuple[str, ...]]:
    related: dict[str, set[str]] = {}
    for group in groups:
        stems = {stem(word) for word in group}
        for term in stems:
            related.setdefault(term, set()).update(stems - {term})
    return {term: tuple(sorted(others)) for term, others in related.items() if others}


RELATED_TERMS: Mapping[str, tuple[str, ...]] = _build_related(_RELATED_GROUPS)


# --- The index ----------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _weighted_terms(server: str, tool: Mapping[str, Any]) -> Counter[str]:
    """Count the terms of one tool definition, each occurrence weighted by its field."""
    terms: Counter[str] = Counter()

    def add(text: str, weight: int) -> None:
        for term in tokenize(text):
            terms[term] += weight

    add(_text(tool.get("name")), NAME_WEIGHT)
    annotations = tool.get("annotations")
    titles = {_text(tool.get("title"))}
    if isinstance(annotations, Mapping):
        titles.add(_text(annotations.get("title")))
    for title in titles:
        add(title, TITLE_WEIGHT)
    add(_text(tool.get("description")), DESCRIPTION_WEIGHT)
    add(server, SERVER_WEIGHT)
    schema = tool.get("inputSchema")
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if isinstance(properties, Mapping):
        for parameter, parameter_schema in properties.items():
            add(_text(parameter), PARAMETER_WEIGHT)
            if isinstance(parameter_schema, Mapping):
                add(_text(parameter_schema.get("description")), PARAMETER_WEIGHT)
    return terms


class ToolIndex:
    """A BM25 index of tools grouped by server, updated one server at a time."""

    def __init__(self, *, expand_related: bool = True) -> None:
        self._expand_related = expand_related
        self._next_id = 0
        self._names: dict[int, tuple[str, str]] = {}
        self._keys: dict[int, str] = {}
        self._terms: dict[int, Counter[str]] = {}
        self._lengths: dict[int, int] = {}
        self._by_server: dict[str, list[int]] = {}
        self._postings: dict[str, dict[int, int]] = {}
        self._total_length = 0

    def __len__(self) -> int:
        return len(self._names)

    def set_server_tools(self, server: str, tools: Iterable[Mapping[str, Any]]) -> None:
        """Replace every tool of `server` with `tools` (MCP tool definitions in wire form).

        Entries without a string name are skipped; of two tools with the same name, the later
        wins, as a client calling that name could reach only one of them.
        """
        self.remove_server(server)
        by_name: dict[str, Mapping[str, Any]] = {}
        for tool in tools:
            name = tool.get("name") if isinstance(tool, Mapping) else None
            if isinstance(name, str) and name:
                by_name[name] = tool
        ids = []
        for name, tool in by_name.items():
            ids.append(self._add(server, name, _weighted_terms(server, tool)))
        if ids:
            self._by_server[server] = ids

    def remove_server(self, server: str) -> None:
        """Drop every tool of `server`; unknown servers are ignored."""
        for doc_id in self._by_server.pop(server, ()):
            for term in self._terms.pop(doc_id):
                posting = self._postings[term]
                del posting[doc_id]
                if not posting:
                    del self._postings[term]
            self._total_length -= self._lengths.pop(doc_id)
            del self._names[doc_id]
            del self._keys[doc_id]

    def servers(self) -> list[str]:
        """Return the names of the servers that have tools in the index, sorted."""
        return sorted(self._by_server)

    def search(self, query: str, limit: int, *, servers: Collection[str] | None = None) -> list[SearchHit]:
        """Return up to `limit` tools best matching `query`, best first.

        `servers`, when given, keeps only tools of those servers. Term statistics are those of
        the whole index, so a tool's score does not depend on the filter. Ties are broken by
        `server:tool` name, so equal input gives equal output.
        """
        query_terms = Counter(tokenize(query))
        # With no terms in the whole index (every tool named like "x"), nothing can match.
        if not query_terms or limit <= 0 or not self._total_length:
            return []
        allowed: set[int] | None = None
        if servers is not None:
            allowed = {doc_id for server in servers for doc_id in self._by_server.get(server, ())}
            if not allowed:
                return []

        scores: dict[int, float] = {}
        for term, count in query_terms.items():
            for doc_id, score in self._term_scores(term, query_terms, allowed).items():
                scores[doc_id] = scores.get(doc_id, 0.0) + count * score

        keys = self._keys
        best = heapq.nsmallest(limit, scores.items(), key=lambda item: (-item[1], keys[item[0]]))
        return [SearchHit(*self._names[doc_id], score) for doc_id, score in best]

    def _add(self, server: str, name: str, terms: Counter[str]) -> int:
        doc_id = self._next_id
        self._next_id += 1
        self._names[doc_id] = (server, name)
        self._keys[doc_id] = f"{server}:{name}"
        self._terms[doc_id] = terms
        length = sum(terms.values())
        self._lengths[doc_id] = length
        self._total_length += length
        for term, frequency in terms.items():
            self._postings.setdefault(term, {})[doc_id] = frequency
        return doc_id

    def _term_scores(self, term: str, query_terms: Mapping[str, int], allowed: set[int] | None) -> dict[int, float]:
        """Score every document for one query term, counting related words at a discount."""
        variants = [(term, 1.0)]
        if self._expand_related:
            # A related word the query also names is scored in its own right, not twice.
            variants += [(other, RELATED_WEIGHT) for other in RELATED_TERMS.get(term, ()) if other not in query_terms]

        document_count = len(self._names)
        # K1 * (1 - B + B * length / average), split so the loop does one multiply-add.
        norm_base = K1 * (1.0 - B)
        norm_per_length = K1 * B * document_count / self._total_length
        lengths = self._lengths
        per_doc: dict[int, float] = {}
        for variant, weight in variants:
            posting = self._postings.get(variant)
            if not posting:
                continue
            frequency = len(posting)
            # The "+ 1" inside the log (as in Lucene) keeps idf positive for very common terms.
            idf = weight * math.log(1.0 + (document_count - frequency + 0.5) / (frequency + 0.5))
            scale = idf * (K1 + 1.0)
            entries = posting.items() if allowed is None else (e for e in posting.items() if e[0] in allowed)
            for doc_id, tf in entries:
                score = scale * tf / (tf + norm_base + norm_per_length * lengths[doc_id])
                if score > per_doc.get(doc_id, 0.0):
                    per_doc[doc_id] = score
        return per_doc
