"""Time and size the `retrieve_tools` index: search at 10,000 tools, embedding, restart, memory, answer size.

Usage: python tests/bench/bench_search.py [--datasets DIR] [--tools N]

- Search: the 527 LiveMCPTool tools copied under renamed servers up to N tools (default 10,000),
  every evaluation query of both sets (LiveMCPTool and mcpproxy-eval) searched and turned into the
  `retrieve_tools` answer (built and encoded by frontend/tools/retrieval.py as the frontend builds
  it): the default answer (within `[search] answer_tokens`, up to 100 tools searched) and one with
  limit 5: p50, p90 and max per call, hybrid and BM25 alone. In-process: the HTTP and MCP layers
  around it are not part of this figure.
- Embedding: a new server of 500 tools not seen before, added to the full index (median of 5).
- Restart: a second index over the same catalog with the same cache dir: time, tools embedded.
- Memory: in a fresh interpreter, RSS and PSS before and after loading the model and embedding one
  text (/proc/self/status, /proc/self/smaps_rollup); tool vectors are 1 KiB each on top.
- Answer size: for each LiveMCPTool query, the `retrieve_tools` answer text with limit 5 next to
  a `tools/list` of the same 5 tools and of all 527; tokens approximated as characters / 4.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mcpvisor.frontend.door.search import SearchHit, ToolIndex
from mcpvisor.frontend.tools.retrieval import MAX_LIMIT, budgeted_answer, full_answer
from mcpvisor.wire.config import SearchConfig

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATASETS = REPO.parent / "shared" / "datasets"
QUERIES = REPO / "tests" / "bench" / "data" / "livemcptool_queries.json"
LIMIT = 5
NEW_SERVER_TOOLS = 500

MEMORY_PROBE = """
import sys
def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))
def pss():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
# What the frontend has loaded anyway before the index exists.
import trio, msgspec, mcp.server.lowlevel, mcpvisor.frontend.door.search
before = (status("VmRSS:"), pss())
from mcpvisor.frontend.door.semantic import load_embedder
embedder = load_embedder()
embedder.embed(["warm up the tokenizer and the table"])
after = (status("VmRSS:"), pss())
print(after[0] - before[0], after[1] - before[1], after[0])
"""


def load_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as file:
        return json.load(file)


def wire_tool(entry: dict[str, Any]) -> dict[str, Any]:
    tool = {"name": entry["tool"], "description": entry["description"]}
    if entry.get("inputSchema"):
        tool["inputSchema"] = entry["inputSchema"]
    return tool


def catalog(tools: Sequence[dict[str, Any]], size: int) -> dict[str, list[dict[str, Any]]]:
    """The corpus's servers, copied under new names ("weather-2") until `size` tools are reached."""
    by_server: dict[str, list[dict[str, Any]]] = {}
    for entry in tools:
        by_server.setdefault(entry["server"], []).append(wire_tool(entry))
    servers: dict[str, list[dict[str, Any]]] = {}
    count, copy = 0, 0
    while count < size:
        copy += 1
        for server, server_tools in by_server.items():
            if count >= size:
                break
            taken = server_tools[: size - count]
            servers[server if copy == 1 else f"{server}-{copy}"] = taken
            count += len(taken)
    return servers


def answer_text(
    query: str,
    hits: Sequence[SearchHit],
    definitions: dict[tuple[str, str], dict[str, Any]],
    search: SearchConfig | None = None,
) -> str:
    """The `retrieve_tools` result text: with `search`, the default answer; else every hit in full."""
    found = [(hit, definitions[(hit.server, hit.tool)]) for hit in hits]
    answer = budgeted_answer(query, found, search) if search is not None else full_answer(query, found)
    return dumps(answer)


def dumps(value: Any) -> str:
    # As frontend/tool_args.py encodes tool results.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def time_searches(
    index: ToolIndex,
    queries: Sequence[str],
    definitions: dict[tuple[str, str], dict[str, Any]],
    rounds: int,
    search: SearchConfig | None = None,
) -> tuple[list[float], list[float]]:
    """Return the wall-clock and the CPU time of each call (CPU time is what other load does not inflate)."""
    wall, cpu = [], []
    limit = MAX_LIMIT if search is not None else LIMIT
    for _ in range(rounds):
        for query in queries:
            start, start_cpu = time.perf_counter(), time.process_time()
            answer_text(query, index.search(query, limit), definitions, search)
            cpu.append(time.process_time() - start_cpu)
            wall.append(time.perf_counter() - start)
    return wall, cpu


def build(servers: dict[str, list[dict[str, Any]]], **options: Any) -> tuple[ToolIndex, float]:
    start = time.perf_counter()
    index = ToolIndex(**options)
    for server, tools in servers.items():
        index.set_server_tools(server, tools)
    return index, time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--datasets", type=Path, default=DEFAULT_DATASETS, help="folder with mcpproxy-eval/, livemcptool/"
    )
    parser.add_argument("--tools", type=int, default=10_000, help="tools in the timed index")
    args = parser.parse_args(argv)
    corpus = load_json(args.datasets / "livemcptool" / "tools.json")["tools"]
    live_queries = [query["query"] for query in load_json(QUERIES)["queries"]]
    golden = load_json(args.datasets / "mcpproxy-eval" / "retrieval_golden_v1.json")["queries"]
    queries = live_queries + [query["query"] for query in golden]

    servers = catalog(corpus, args.tools)
    definitions = {(server, tool["name"]): tool for server, tools in servers.items() for tool in tools}
    print(f"index: {len(definitions)} tools of {len(servers)} servers; {len(queries)} queries, limit {LIMIT}")

    with tempfile.TemporaryDirectory() as cache_dir:
        start_cpu = time.process_time()
        # Written once, below, rather than every 30 s: the figures are of embedding, not of file writes.
        hybrid, built = build(servers, cache_dir=Path(cache_dir), cache_interval=math.inf)
        if hybrid.status != "hybrid":
            raise SystemExit(f"the embedding model is not available: {hybrid.status}")
        hybrid.save_cache()
        print(
            f"hybrid index built in {built:.2f} s, {time.process_time() - start_cpu:.2f} s CPU "
            f"({hybrid.embedded_tools} tools embedded, cache written)"
        )
        start_cpu = time.process_time()
        restarted, rebuilt = build(servers, cache_dir=Path(cache_dir))
        cache_size = (Path(cache_dir) / "tool-vectors.npz").stat().st_size
        print(
            f"restart with the cache: built in {rebuilt:.2f} s, {time.process_time() - start_cpu:.2f} s CPU, "
            f"{restarted.embedded_tools} tools embedded; cache file {cache_size / 2**20:.1f} MiB"
        )
    del restarted
    start_cpu = time.process_time()
    lexical, lexical_built = build(servers, semantic=False)
    print(f"BM25-only index built in {lexical_built:.2f} s, {time.process_time() - start_cpu:.2f} s CPU")

    for (label, index), (shape, search) in itertools.product(
        (("hybrid", hybrid), ("BM25 alone", lexical)), (("default answer", SearchConfig()), (f"limit {LIMIT}", None))
    ):
        time_searches(index, queries[:20], definitions, rounds=1, search=search)  # warm-up
        wall, cpu = time_searches(index, queries, definitions, rounds=5, search=search)
        print(
            f"retrieve_tools search + answer, {label}, {shape}: p50 {ms(statistics.median(wall))} "
            f"({ms(statistics.median(cpu))} CPU), p90 {ms(percentile(wall, 0.9))}, max {ms(max(wall))} "
            f"over {len(wall)} calls"
        )

    new_server_times, new_server_cpu = [], []
    for attempt in range(5):
        fresh = [
            {**tool, "description": f"{tool.get('description', '')} (variant {attempt}-{number})"}
            for number, tool in enumerate(
                [wire_tool(entry) for entry in corpus] * (NEW_SERVER_TOOLS // len(corpus) + 1)
            )
        ][:NEW_SERVER_TOOLS]
        for number, tool in enumerate(fresh):
            tool["name"] = f"{tool['name']}_{number}"
        before = hybrid.embedded_tools
        start, start_cpu = time.perf_counter(), time.process_time()
        hybrid.set_server_tools(f"new-upstream-{attempt}", fresh)
        new_server_cpu.append(time.process_time() - start_cpu)
        new_server_times.append(time.perf_counter() - start)
        assert hybrid.embedded_tools - before == NEW_SERVER_TOOLS
    print(
        f"adding a new upstream of {NEW_SERVER_TOOLS} unseen tools (embedding + both indexes): "
        f"median {ms(statistics.median(new_server_times))} ({ms(statistics.median(new_server_cpu))} CPU), "
        f"max {ms(max(new_server_times))}"
    )

    probe = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.split()
    rss_delta, pss_delta, rss_total = (int(value) for value in probe)
    print(
        f"model memory in a fresh interpreter with the frontend's libraries loaded: RSS +{rss_delta / 1024:.1f} MiB, "
        f"PSS +{pss_delta / 1024:.1f} MiB (process RSS {rss_total / 1024:.1f} MiB); "
        f"tool vectors: {len(definitions) * 1024 / 2**20:.1f} MiB for {len(definitions)} tools"
    )

    small = ToolIndex()
    live_servers = catalog(corpus, len(corpus))
    live_definitions = {(server, tool["name"]): tool for server, tools in live_servers.items() for tool in tools}
    for server, tools in live_servers.items():
        small.set_server_tools(server, tools)
    answers, listings = [], []
    for query in live_queries:
        hits = small.search(query, LIMIT)
        answers.append(len(answer_text(query, hits, live_definitions)))
        listings.append(len(dumps({"tools": [live_definitions[(hit.server, hit.tool)] for hit in hits]})))
    everything = len(dumps({"tools": [tool for tools in live_servers.values() for tool in tools]}))
    print(
        f"answer size over {len(corpus)} LiveMCPTool tools, tokens ~ characters / 4, median over "
        f"{len(live_queries)} queries: retrieve_tools limit {LIMIT}: {statistics.median(answers) / 4:.0f} tokens; "
        f"tools/list of the same {LIMIT} tools: {statistics.median(listings) / 4:.0f}; "
        f"tools/list of all {len(corpus)}: {everything / 4:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
