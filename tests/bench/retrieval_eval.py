"""Measure the `retrieve_tools` search index on mcpproxy-go's frozen retrieval set, and time it.

Usage: python tests/bench/retrieval_eval.py [--datasets DIR] [--misses]

Quality: the 45 tools of corpus_v1 are indexed (no input schemas exist there), each of the 47
queries of retrieval_golden_v1 is run, and Recall@1/3/5/10 and MRR are printed next to
mcpproxy-go's figures from baseline_v1. Recall@k is the share of a query's relevant tools
(relevance > 0) found in the top k, averaged over queries; the reciprocal rank is that of the
first relevant tool in the full ranking (0 when none matches at all).

Speed: mean time of one search over the 47 queries on that small index, and on a synthetic,
deterministically generated index of 5,000 tools.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mcpvisor.frontend.search import ToolIndex

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATASETS = REPO.parent / "shared" / "datasets" / "mcpproxy-eval"
CUTOFFS = (1, 3, 5, 10)
SYNTHETIC_SERVERS = 100
SYNTHETIC_TOOLS_PER_SERVER = 50


def load_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as file:
        return json.load(file)


def corpus_index(corpus: dict[str, Any], *, expand_related: bool) -> ToolIndex:
    by_server: dict[str, list[dict[str, Any]]] = {}
    for entry in corpus["tools"]:
        tool = {"name": entry["tool"], "description": entry["description"]}
        by_server.setdefault(entry["server"], []).append(tool)
    index = ToolIndex(expand_related=expand_related)
    for server, tools in by_server.items():
        index.set_server_tools(server, tools)
    return index


def evaluate(index: ToolIndex, queries: Sequence[dict[str, Any]]) -> tuple[dict[str, float], list[str]]:
    """Return the averaged metrics and a description of each query that misses its top 5."""
    recall_sums = dict.fromkeys(CUTOFFS, 0.0)
    reciprocal_rank_sum = 0.0
    misses = []
    for query in queries:
        relevant = {label["tool_id"] for label in query["labels"] if label["relevance"] > 0}
        ranking = [f"{hit.server}:{hit.tool}" for hit in index.search(query["query"], len(index))]
        for k in CUTOFFS:
            recall_sums[k] += len(relevant.intersection(ranking[:k])) / len(relevant)
        first = next((rank for rank, tool_id in enumerate(ranking, 1) if tool_id in relevant), None)
        if first is not None:
            reciprocal_rank_sum += 1.0 / first
        if relevant - set(ranking[:5]):
            misses.append(
                f"  {query['id']}: {query['query']!r}\n"
                f"    wanted {sorted(relevant)}, first relevant at {first}\n"
                f"    top 5 {ranking[:5]}"
            )
    count = len(queries)
    metrics = {f"Recall@{k}": total / count for k, total in recall_sums.items()}
    metrics["MRR"] = reciprocal_rank_sum / count
    return metrics, misses


def synthetic_index(vocabulary: Sequence[str], seed: int = 5000) -> tuple[ToolIndex, list[dict[str, Any]]]:
    """Build a 5,000-tool index whose text follows a Zipf-like draw from `vocabulary`.

    Returns the index and the tool list of its first server, for timing a one-server update.
    """
    rng = random.Random(seed)
    # Zipf-like weights make a few words very common, as "file" or "the" are in real catalogs,
    # so that some query terms hit thousands of documents.
    weights = [1.0 / rank for rank in range(1, len(vocabulary) + 1)]

    def words(count: int) -> list[str]:
        return rng.choices(vocabulary, weights, k=count)

    index = ToolIndex()
    first_server_tools: list[dict[str, Any]] = []
    for server_number in range(SYNTHETIC_SERVERS):
        tools = []
        for tool_number in range(SYNTHETIC_TOOLS_PER_SERVER):
            parameters = {
                "_".join(words(rng.randint(1, 2))): {"type": "string", "description": " ".join(words(8))}
                for _ in range(rng.randint(0, 4))
            }
            tools.append(
                {
                    "name": "_".join([*words(rng.randint(1, 3)), str(tool_number)]),
                    "description": " ".join(words(rng.choice((6, 12, 25, 60, 200)))),
                    "inputSchema": {"type": "object", "properties": parameters},
                }
            )
        index.set_server_tools(f"server-{server_number}", tools)
        if server_number == 0:
            first_server_tools = tools
    return index, first_server_tools


def mean_seconds(action: Callable[[], object], rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        action()
    return (time.perf_counter() - start) / rounds


def search_times(index: ToolIndex, queries: Sequence[str], rounds: int) -> list[float]:
    """Return the mean time of one search for each query, over `rounds` repetitions."""
    return [mean_seconds(lambda query=query: index.search(query, 15), rounds) for query in queries]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS, help="the mcpproxy-eval folder")
    parser.add_argument("--misses", action="store_true", help="list the queries that miss their top 5")
    args = parser.parse_args(argv)
    if not (args.datasets / "corpus_v1.tools.json").is_file():
        parser.error(f"no corpus_v1.tools.json in {args.datasets}; point --datasets at mcpproxy-eval")

    corpus = load_json(args.datasets / "corpus_v1.tools.json")
    queries = load_json(args.datasets / "retrieval_golden_v1.json")["queries"]
    baseline = load_json(args.datasets / "baseline_v1.json")

    index = corpus_index(corpus, expand_related=True)
    metrics, misses = evaluate(index, queries)
    plain_metrics, _ = evaluate(corpus_index(corpus, expand_related=False), queries)
    reference = {f"Recall@{k}": baseline["recall_at"][str(k)] for k in CUTOFFS}
    reference["MRR"] = baseline["mrr"]

    print(f"{len(index)} tools, {len(queries)} queries ({args.datasets})")
    print(f"{'metric':<10} {'mcpvisor':>9} {'no related terms':>17} {'mcpproxy-go':>12}")
    for name, value in metrics.items():
        print(f"{name:<10} {value:>9.3f} {plain_metrics[name]:>17.3f} {reference[name]:>12.3f}")
    if args.misses:
        print(f"queries missing a relevant tool in their top 5 ({len(misses)}):")
        print("\n".join(misses))

    texts = [query["query"] for query in queries]
    small = search_times(index, texts, rounds=200)
    vocabulary = sorted({word for entry in corpus["tools"] for word in entry["description"].split()})
    # A fixed shuffle decides which words are common, independent of their alphabetical order.
    random.Random(0).shuffle(vocabulary)
    build_start = time.perf_counter()
    large_index, first_tools = synthetic_index(vocabulary)
    build = time.perf_counter() - build_start
    large = search_times(large_index, texts, rounds=20)
    update = mean_seconds(lambda: large_index.set_server_tools("server-0", first_tools), rounds=20)

    def milliseconds(seconds: float) -> str:
        return f"{seconds * 1000:.3f} ms"

    print(
        f"search time: mean {milliseconds(statistics.mean(small))} over {len(texts)} queries "
        f"on {len(index)} tools; on {len(large_index)} synthetic tools mean "
        f"{milliseconds(statistics.mean(large))}, slowest query {milliseconds(max(large))}"
    )
    print(
        f"synthetic index: built in {build:.2f} s; replacing one server's "
        f"{SYNTHETIC_TOOLS_PER_SERVER} tools takes {milliseconds(update)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
