"""Search over the aggregated tool catalog, the index behind `retrieve_tools`.

Two rankings are fused: BM25 over the words of each tool definition (exact on names and rare
words) and the cosine similarity of text embeddings from a small static model shipped in a package
(`semantic.py`), which connects "umbrella" to a weather tool. When the model cannot be loaded the
index is BM25 alone, and says so in `status`.

Pure apart from the optional vector cache file: the frontend feeds it each server's tool
definitions (MCP wire dicts) and asks it for the best matches of a free-text query.
"""

from __future__ import annotations

import heapq
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mcpvisor.frontend.door.semantic import (
    CACHE_FILE_NAME,
    Embedder,
    ModelUnavailable,
    VectorCache,
    load_embedder,
    text_key,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "RELATED_TERMS",
    "PreparedTools",
    "SearchHit",
    "ToolIndex",
    "embedding_text",
    "split_identifier",
    "stem",
    "tokenize",
]

log = logging.getLogger(__name__)

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

# Hybrid ranking: a convex combination of the two scores, each scaled to [0, 1] over the whole
# index for the query at hand (cosine by min-max, BM25 by its maximum, its natural minimum being
# 0), as analysed by Bruch et al., "An Analysis of Fusion Functions for Hybrid Retrieval" (2023).
# Unlike reciprocal rank fusion it keeps how far ahead a tool is, so a tool that BM25 alone finds
# (a rare word in its name) still comes first, while a weak BM25 ranking of a paraphrased query
# does not drag the semantic one down. The weight was chosen on the mcpproxy-eval golden set and
# half of the LiveMCPTool evaluation queries (see tests/bench/retrieval_eval.py).
SEMANTIC_WEIGHT = 0.8
# How many characters of a description are embedded: long manuals say what the tool does first.
EMBEDDED_DESCRIPTION_CHARS = 2000
# Vectors of tools not in the index (a server restarting, a catalog loaded from the cache file
# whose servers are not up yet) kept for reuse, at 1 KiB each: enough for a large catalog, bounded
# so that servers removed for good stop costing memory and space.
CACHE_SPARE_VECTORS = 16_384
# Seconds between two automatic writes of the cache file (a write of 10,000 vectors is 10 MiB).
CACHE_SAVE_INTERVAL = 30.0

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


class TextEmbedder(Protocol):
    """What the index needs of a model: unit vectors for texts, and a name for the vectors it makes."""

    @property
    def fingerprint(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


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


def embedding_text(server: str, name: str, tool: Mapping[str, Any]) -> str:
    """The text whose embedding stands for a tool: server and name as words, title, description."""
    parts = [" ".join(split_identifier(server)), " ".join(split_identifier(name))]
    annotations = tool.get("annotations")
    titles = [_text(tool.get("title"))]
    if isinstance(annotations, Mapping):
        titles.append(_text(annotations.get("title")))
    parts.extend(title for title in dict.fromkeys(titles) if title)
    parts.append(_text(tool.get("description"))[:EMBEDDED_DESCRIPTION_CHARS])
    return ". ".join(part for part in parts if part)


@dataclass(frozen=True, slots=True)
class PreparedTools:
    """One server's tools made ready for `ToolIndex.apply`: word counts, text keys, new vectors."""

    server: str
    terms: dict[str, Counter[str]]  # by tool name, in the order of the tool list
    keys: dict[str, bytes]  # by tool name; empty when search is BM25 alone
    vectors: dict[bytes, np.ndarray]  # by text key, for the texts the index had no vector for
    texts: dict[bytes, str]  # by text key


_embedders: dict[Path | None, Embedder | ModelUnavailable] = {}


def _shared_embedder(model_dir: Path | None) -> Embedder:
    """Load the model once per process and folder; a failure is remembered too."""
    if model_dir not in _embedders:
        started = time.monotonic()
        try:
            _embedders[model_dir] = embedder = load_embedder(model_dir)
        except ModelUnavailable as error:
            _embedders[model_dir] = error
        else:
            log.info("tool search model %s loaded in %.2f s", embedder.fingerprint, time.monotonic() - started)
    loaded = _embedders[model_dir]
    if isinstance(loaded, ModelUnavailable):
        raise loaded
    return loaded


class _Vectors:
    """Tool vectors in the rows of one matrix, rows reused as tools come and go."""

    def __init__(self, dimension: int) -> None:
        import numpy as np

        self.matrix = np.zeros((64, dimension), dtype=np.float32)
        self.valid = np.zeros(64, dtype=bool)
        self.doc_of_row: list[int] = []
        self.row_of_doc: dict[int, int] = {}
        self._free: list[int] = []

    def add(self, doc_id: int, vector: np.ndarray) -> int:
        import numpy as np

        if self._free:
            row = self._free.pop()
            self.doc_of_row[row] = doc_id
        else:
            row = len(self.doc_of_row)
            if row == len(self.matrix):
                self.matrix = np.concatenate((self.matrix, np.zeros_like(self.matrix)))
                self.valid = np.concatenate((self.valid, np.zeros_like(self.valid)))
            self.doc_of_row.append(doc_id)
        self.matrix[row] = vector
        self.valid[row] = True
        self.row_of_doc[doc_id] = row
        return row

    def remove(self, doc_id: int) -> None:
        row = self.row_of_doc.pop(doc_id)
        self.matrix[row] = 0.0
        self.valid[row] = False
        self.doc_of_row[row] = -1
        self._free.append(row)


class ToolIndex:
    """A hybrid (BM25 + embedding) index of tools grouped by server, updated one server at a time.

    `semantic=False`, or a model that cannot be loaded, leaves BM25 alone. `cache_dir`, when
    given, holds a file of tool vectors so a restart does not embed every tool again (see
    `save_cache`). `embedder`, when given, is used instead of the bundled model: anything with
    `embed(texts)` returning unit vectors, a `fingerprint` and a `dimension` (the embedding
    service of `embedding_service.py`), its vectors kept in `cache_name`.
    `expand_related` makes BM25 count the words of `RELATED_TERMS` at a discount; by default it
    does so only when search is BM25 alone: the embeddings connect such words themselves, and
    on queries the list was not written from it adds nothing to hybrid search.
    """

    def __init__(
        self,
        *,
        expand_related: bool | None = None,
        semantic: bool = True,
        model_dir: Path | None = None,
        cache_dir: Path | None = None,
        cache_interval: float = CACHE_SAVE_INTERVAL,
        embedder: TextEmbedder | None = None,
        cache_name: str = CACHE_FILE_NAME,
    ) -> None:
        self._next_id = 0
        self._names: dict[int, tuple[str, str]] = {}
        self._keys: dict[int, str] = {}
        self._terms: dict[int, Counter[str]] = {}
        self._lengths: dict[int, int] = {}
        self._by_server: dict[str, list[int]] = {}
        self._postings: dict[str, dict[int, int]] = {}
        self._total_length = 0
        # Hybrid search scores BM25 over matrix rows with numpy: each term's posting as arrays of
        # rows and frequencies, and every row's length, built on first use after a change.
        self._row_postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._row_lengths: np.ndarray | None = None
        # The mean of the tool vectors and each row's inverse distance from it, built on first
        # use after a change (see `_centring`).
        self._centre: tuple[np.ndarray, np.ndarray] | None = None

        self._embedder: TextEmbedder | None = None
        self._status = "lexical (semantic search switched off)"
        self._vectors: _Vectors | None = None
        self._text_keys: dict[int, bytes] = {}
        self._doc_of_key: dict[bytes, int] = {}
        self._server_rows: dict[str, np.ndarray] = {}
        self._cache: VectorCache | None = None
        self._spare: dict[bytes, np.ndarray] = {}
        self._embedded = 0
        self._cache_interval = cache_interval
        self._cache_dirty = False
        self._cache_saved_at = -math.inf
        if embedder is not None:
            self._embedder = embedder
        elif semantic:
            try:
                self._embedder = _shared_embedder(model_dir)
            except ModelUnavailable as error:
                self._status = f"lexical ({error})"
                log.warning("tool search falls back to BM25 alone: %s", error)
        self._expand_related = self._embedder is None if expand_related is None else expand_related
        if self._embedder is not None:
            self._status = "hybrid"
            self._vectors = _Vectors(self._embedder.dimension)
            if cache_dir is not None:
                self._cache = VectorCache(cache_dir / cache_name, self._embedder.fingerprint, self._embedder.dimension)
                for key, vector in self._cache.load().items():
                    self._keep_spare(key, vector)

    def __len__(self) -> int:
        return len(self._names)

    @property
    def embedded_tools(self) -> int:
        """How many tool texts this index has run through the model (vectors reused do not count)."""
        return self._embedded

    @property
    def status(self) -> str:
        """Say how search works: "hybrid", or "lexical (why)" when it is BM25 alone."""
        return self._status

    def set_server_tools(self, server: str, tools: Iterable[Mapping[str, Any]]) -> None:
        """Replace every tool of `server` with `tools` (MCP tool definitions in wire form).

        Entries without a string name are skipped; of two tools with the same name, the later
        wins, as a client calling that name could reach only one of them. In hybrid mode a tool
        whose text is unchanged keeps its vector; only new or changed tools are embedded.
        The same as `apply(prepare(server, tools))`.
        """
        self.apply(self.prepare(server, tools))

    def prepare(self, server: str, tools: Iterable[Mapping[str, Any]]) -> PreparedTools:
        """Do the slow part of `set_server_tools` (counting words, embedding) without changing the index.

        It only reads the index, so it may run in a worker thread while the event loop keeps
        searching; `apply` then changes the index quickly, on the loop.
        """
        by_name: dict[str, Mapping[str, Any]] = {}
        for tool in tools:
            name = tool.get("name") if isinstance(tool, Mapping) else None
            if isinstance(name, str) and name:
                by_name[name] = tool
        terms = {name: _weighted_terms(server, tool) for name, tool in by_name.items()}
        if self._embedder is None:
            return PreparedTools(server, terms, {}, {}, {})
        fingerprint = self._embedder.fingerprint
        texts = {name: embedding_text(server, name, tool) for name, tool in by_name.items()}
        keys = {name: text_key(fingerprint, text) for name, text in texts.items()}
        # Single dictionary look-ups only: they are safe against the loop changing the index.
        missing = [name for name, key in keys.items() if key not in self._doc_of_key and key not in self._spare]
        vectors: dict[bytes, np.ndarray] = {}
        if missing:
            embedded = self._embedder.embed([texts[name] for name in missing])
            vectors = {keys[name]: vector for name, vector in zip(missing, embedded, strict=True)}
        return PreparedTools(server, terms, keys, vectors, {keys[name]: texts[name] for name in keys})

    def apply(self, prepared: PreparedTools) -> None:
        """Replace the tools of `prepared.server` with those `prepare` made ready."""
        server = prepared.server
        vectors = dict(prepared.vectors)
        embedded = len(vectors)
        if self._vectors is not None:
            matrix, row_of_doc = self._vectors.matrix, self._vectors.row_of_doc
            for key in prepared.keys.values():
                doc_id = self._doc_of_key.get(key)
                if key not in vectors and doc_id is not None:
                    vectors[key] = matrix[row_of_doc[doc_id]].copy()
        self.remove_server(server)
        if self._embedder is not None:
            for key in prepared.keys.values():
                if key not in vectors and key in self._spare:
                    vectors[key] = self._spare.pop(key)
            # Texts whose vector went away between prepare and apply (the spares are bounded).
            late = [key for key in prepared.keys.values() if key not in vectors]
            if late:
                vectors.update(zip(late, self._embedder.embed([prepared.texts[key] for key in late]), strict=True))
                embedded += len(late)
        self._embedded += embedded
        ids = []
        for name, terms in prepared.terms.items():
            doc_id = self._add(server, name, terms)
            ids.append(doc_id)
            key = prepared.keys.get(name)
            if key is not None and self._vectors is not None:
                self._text_keys[doc_id] = key
                self._doc_of_key[key] = doc_id
                self._vectors.add(doc_id, vectors[key])
        if ids:
            self._by_server[server] = ids
            if self._vectors is not None:
                import numpy as np

                self._server_rows[server] = np.array([self._vectors.row_of_doc[i] for i in ids], dtype=np.int64)
        if embedded:
            self._cache_dirty = True
            if time.monotonic() - self._cache_saved_at >= self._cache_interval:
                self.save_cache()

    def remove_server(self, server: str) -> None:
        """Drop every tool of `server`; unknown servers are ignored."""
        self._server_rows.pop(server, None)
        self._row_postings.clear()
        self._row_lengths = None
        self._centre = None
        for doc_id in self._by_server.pop(server, ()):
            for term in self._terms.pop(doc_id):
                posting = self._postings[term]
                del posting[doc_id]
                if not posting:
                    del self._postings[term]
            self._total_length -= self._lengths.pop(doc_id)
            del self._names[doc_id]
            del self._keys[doc_id]
            if self._vectors is not None:
                # Kept aside so a server that comes back (a restart) needs no new embedding.
                key = self._text_keys.pop(doc_id)
                del self._doc_of_key[key]
                self._keep_spare(key, self._vectors.matrix[self._vectors.row_of_doc[doc_id]].copy())
                self._vectors.remove(doc_id)

    def servers(self) -> list[str]:
        """Return the names of the servers that have tools in the index, sorted."""
        return sorted(self._by_server)

    def search(
        self,
        query: str,
        limit: int,
        *,
        servers: Collection[str] | None = None,
        query_vector: np.ndarray | None = None,
    ) -> list[SearchHit]:
        """Return up to `limit` tools best matching `query`, best first.

        `servers`, when given, keeps only tools of those servers. Scores are computed over the
        whole index, so a tool's score does not depend on the filter. Ties are broken by
        `server:tool` name, so equal input gives equal output. A query without a single word that
        is not a stop word finds nothing. In hybrid mode every tool has a score, so up to `limit`
        tools are returned whenever the query has a word; the score is in [0, 1]. `query_vector`
        is the query's embedding when the caller has it already (from a service, asked without
        blocking the event loop).
        """
        query_terms = Counter(tokenize(query))
        if not query_terms or limit <= 0 or not self._names:
            return []
        if self._embedder is not None:
            return self._hybrid_search(query, query_terms, limit, servers, query_vector)
        # With no terms in the whole index (every tool named like "x"), nothing can match.
        if not self._total_length:
            return []
        allowed: set[int] | None = None
        if servers is not None:
            allowed = {doc_id for server in servers for doc_id in self._by_server.get(server, ())}
            if not allowed:
                return []
        scores = self._bm25_scores(query_terms, allowed)
        keys = self._keys
        best = heapq.nsmallest(limit, scores.items(), key=lambda item: (-item[1], keys[item[0]]))
        return [SearchHit(*self._names[doc_id], score) for doc_id, score in best]

    def _hybrid_search(
        self,
        query: str,
        query_terms: Counter[str],
        limit: int,
        servers: Collection[str] | None,
        query_vector: np.ndarray | None = None,
    ) -> list[SearchHit]:
        import numpy as np

        assert self._embedder is not None and self._vectors is not None
        vectors = self._vectors
        if servers is not None:
            selected = [self._server_rows[server] for server in set(servers) if server in self._server_rows]
            if not selected:
                return []
            candidates = np.concatenate(selected)
        else:
            candidates = np.flatnonzero(vectors.valid)

        used = len(vectors.doc_of_row)
        if query_vector is None:
            query_vector = self._embedder.embed([query])[0]
        # einsum rather than the matrix product: numpy's own loop takes one thread and is several
        # times faster here than a BLAS build made to run on every processor, and its result
        # does not depend on how many rows there are. In float64 so that the scaled scores stay
        # within [0, 1] exactly.
        similarity = np.einsum("ij,j->i", vectors.matrix[:used], query_vector).astype(np.float64)
        # The cosine with each tool vector less the mean of all of them: every text of a catalog
        # shares a large common component (the averaged vectors of "get", "the", "tool", ...),
        # which makes all tools look alike to a query; what is left is what sets a tool apart
        # (Mu and Viswanath, "All-but-the-Top", 2018). The query is left as it is.
        mean, inverse_norms = self._centring(used)
        similarity -= float(np.dot(mean, query_vector))
        similarity *= inverse_norms
        valid = vectors.valid[:used]
        low = float(similarity[valid].min())
        high = float(similarity[valid].max())
        fused = np.zeros(used, dtype=np.float64)
        if high > low:
            fused += SEMANTIC_WEIGHT * (similarity - low) / (high - low)
        if self._total_length:
            lexical = self._bm25_rows(query_terms, used)
            top = float(lexical.max())
            if top > 0.0:  # every matching tool scores above 0
                fused += (1.0 - SEMANTIC_WEIGHT) / top * lexical

        scores = fused[candidates]
        if len(candidates) > limit:
            # Everything scoring at least the limit-th best, so ties at the edge are ordered by name.
            threshold = np.partition(scores, len(scores) - limit)[len(scores) - limit]
            keep = scores >= threshold
            candidates, scores = candidates[keep], scores[keep]
        keys = self._keys
        ranked = sorted(
            (
                (float(score), vectors.doc_of_row[row])
                for row, score in zip(candidates.tolist(), scores.tolist(), strict=True)
            ),
            key=lambda item: (-item[0], keys[item[1]]),
        )
        return [SearchHit(*self._names[doc_id], score) for score, doc_id in ranked[:limit]]

    def _centring(self, used: int) -> tuple[np.ndarray, np.ndarray]:
        """The mean tool vector (float32) and, by matrix row, 1 / |vector - mean| (0 for a row at the
        mean, which then has no direction), kept until the index changes."""
        import numpy as np

        assert self._vectors is not None
        found = self._centre
        if found is None or len(found[1]) != used:
            rows = self._vectors.matrix[:used]
            valid = self._vectors.valid[:used]
            mean = rows[valid].mean(axis=0, dtype=np.float64).astype(np.float32)
            # |v - m|^2 = |v|^2 - 2 v.m + |m|^2, without a centred copy of the matrix.
            squared = (
                np.einsum("ij,ij->i", rows, rows).astype(np.float64)
                - 2.0 * np.einsum("ij,j->i", rows, mean).astype(np.float64)
                + float(np.dot(mean, mean))
            )
            # Rounding can leave a row equal to the mean a hair above zero; such a row is noise.
            apart = squared > 1e-12
            inverse = np.zeros(used, dtype=np.float64)
            np.divide(1.0, np.sqrt(squared, where=apart, out=np.ones(used)), out=inverse, where=apart)
            self._centre = found = (mean, inverse)
        return found

    def _keep_spare(self, key: bytes, vector: np.ndarray) -> None:
        self._spare.pop(key, None)
        self._spare[key] = vector
        while len(self._spare) > CACHE_SPARE_VECTORS:
            del self._spare[next(iter(self._spare))]

    def save_cache(self) -> bool:
        """Write the vectors of every indexed tool, and the spares, to the cache file if any are new.

        `set_server_tools` calls it itself, at most once per `cache_interval` seconds, so that
        a catalog coming up server by server is not written once per server; call it once the
        catalog has settled and on shutdown. Returns whether the file was written.
        """
        if self._cache is None or self._vectors is None or not self._cache_dirty:
            return False
        matrix, row_of_doc = self._vectors.matrix, self._vectors.row_of_doc
        entries = dict(self._spare)
        entries.update((key, matrix[row_of_doc[doc_id]]) for doc_id, key in self._text_keys.items())
        self._cache_saved_at = time.monotonic()
        try:
            self._cache.save(entries)
        except OSError as error:
            log.warning("cannot write the tool vector cache %s: %s", self._cache.path, error)
            return False
        self._cache_dirty = False
        return True

    def _add(self, server: str, name: str, terms: Counter[str]) -> int:
        self._row_postings.clear()
        self._row_lengths = None
        self._centre = None
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

    def _bm25_rows(self, query_terms: Mapping[str, int], used: int) -> np.ndarray:
        """BM25 scores by matrix row (0 where no term matches): `_bm25_scores` with numpy, the
        same arithmetic in the same order, so the scores are equal to the last bit."""
        import numpy as np

        assert self._vectors is not None
        lengths = self._row_lengths
        if lengths is None or len(lengths) != used:
            lengths = np.zeros(used, dtype=np.float64)
            for doc_id, row in self._vectors.row_of_doc.items():
                lengths[row] = self._lengths[doc_id]
            self._row_lengths = lengths
        document_count = len(self._names)
        norm_base = K1 * (1.0 - B)
        norm_per_length = K1 * B * document_count / self._total_length
        total = np.zeros(used, dtype=np.float64)
        for term, count in query_terms.items():
            per_row: np.ndarray | None = None
            for variant, weight in self._variants(term, query_terms):
                posting = self._row_posting(variant)
                if posting is None:
                    continue
                rows, frequencies = posting
                idf = weight * math.log(1.0 + (document_count - len(rows) + 0.5) / (len(rows) + 0.5))
                scale = idf * (K1 + 1.0)
                scores = scale * frequencies / (frequencies + norm_base + norm_per_length * lengths[rows])
                if per_row is None:
                    per_row = np.zeros(used, dtype=np.float64)
                per_row[rows] = np.maximum(per_row[rows], scores)
            if per_row is not None:
                total += count * per_row
        return total

    def _row_posting(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """A term's posting as (matrix rows, frequencies), kept until the index changes."""
        import numpy as np

        assert self._vectors is not None
        found = self._row_postings.get(term)
        if found is None:
            posting = self._postings.get(term)
            if not posting:
                return None
            row_of_doc = self._vectors.row_of_doc
            rows = np.fromiter((row_of_doc[doc_id] for doc_id in posting), dtype=np.int64, count=len(posting))
            frequencies = np.fromiter(posting.values(), dtype=np.float64, count=len(posting))
            self._row_postings[term] = found = (rows, frequencies)
        return found

    def _bm25_scores(self, query_terms: Mapping[str, int], allowed: set[int] | None) -> dict[int, float]:
        scores: dict[int, float] = {}
        for term, count in query_terms.items():
            for doc_id, score in self._term_scores(term, query_terms, allowed).items():
                scores[doc_id] = scores.get(doc_id, 0.0) + count * score
        return scores

    def _variants(self, term: str, query_terms: Mapping[str, int]) -> list[tuple[str, float]]:
        """The words scored for one query term, with their weights: itself, and related words."""
        variants = [(term, 1.0)]
        if self._expand_related:
            # A related word the query also names is scored in its own right, not twice.
            variants += [(other, RELATED_WEIGHT) for other in RELATED_TERMS.get(term, ()) if other not in query_terms]
        return variants

    def _term_scores(self, term: str, query_terms: Mapping[str, int], allowed: set[int] | None) -> dict[int, float]:
        """Score every document for one query term, counting related words at a discount."""
        variants = self._variants(term, query_terms)
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
