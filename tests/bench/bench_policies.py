"""What a policy decision costs: alone, and in a tool call through mcpvisor.

    python tests/bench/bench_policies.py [--decisions 20000] [--calls 300] [--sizes 5,50,500]

First the decision itself (the frontend's PolicyGate over cedarpy), in microseconds, for policy
sets of several sizes: a call whose policies read its arguments, a list decision the first time
and cached, and the same call without policies (what every request costs without `[policy]`).
Then `tools/call` p50 and p99 in one run, side by side: the echo upstream called directly over
streamable HTTP, through mcpvisor without `[policy]`, and through mcpvisor with the largest set.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import trio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mcpvisor.frontend.gate.policy_gate import PolicyGate
from mcpvisor.wire.config import PolicyConfig
from mcpvisor.wire.policy_sources import PolicyBundle, PolicyText
from tests.bench.bench_latency import http_upstream, percentile
from tests.support.stack import echo_server, open_stack


def policy_text(size: int) -> str:
    """About `size` policies of the kinds the docs show: a baseline, read-only tenants, approvals,
    argument conditions, one tenant's forbidden tools."""
    lines = ['@id("baseline")\npermit(principal, action, resource);']
    lines.append(
        '@id("destructive-waits")\n@approval("operator")\n'
        'permit(principal, action == Action::"call", resource is Tool) when { resource.destructive };'
    )
    tenant = 0
    while len(lines) < size:
        name = f"team{tenant}"
        lines.append(
            f'@id("{name}-read-only")\n@reason("{name} may only read")\n'
            f'forbid(principal == Tenant::"{name}", action == Action::"call", resource is Tool)'
            " unless { resource.read_only };"
        )
        lines.append(
            f'@id("{name}-repos")\n@reason("{name} works in {name}/* only")\n'
            f'forbid(principal == Tenant::"{name}", action, resource == Tool::"github:create_issue")'
            f' unless {{ context.args has repo && context.args.repo like "{name}/*" }};'
        )
        lines.append(
            f'@id("{name}-hidden")\n'
            f'forbid(principal == Tenant::"{name}", action == Action::"list", resource is Tool)'
            ' when { resource.server == "admin" };'
        )
        tenant += 1
    return "\n\n".join(lines[:size]) + "\n"


def gate_of(size: int) -> PolicyGate:
    bundle = PolicyBundle(config=PolicyConfig(), sources=[PolicyText(path="bench.cedar", text=policy_text(size))])
    return PolicyGate(bundle)


def timed(run: Callable[[], object], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter_ns()
        run()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def micro(sizes: list[int], count: int) -> None:
    create = {"name": "create_issue", "annotations": {"destructiveHint": False}}
    args = {"repo": "team1/widgets", "title": "A bug", "body": "x" * 2000, "labels": ["bug", "p1"]}
    print(f"A decision, in microseconds ({count} each; p50 / p99):")
    print(
        f"{'policies':>9}  {'call + arguments':>18}  {'list, first time':>18}  {'list, cached':>14}  {'no policies':>12}"
    )
    none = PolicyGate(None)
    baseline = timed(lambda: none.decide("team1", "tool", "github", create, args, endpoint="/mcp", via="direct"), count)
    for size in sizes:
        gate = gate_of(size)
        call = timed(
            lambda g=gate: g.decide("team1", "tool", "github", create, args, endpoint="/mcp", via="direct"), count
        )
        names = iter([{"name": f"tool{n}", "annotations": {"readOnlyHint": n % 2 == 0}} for n in range(count)])
        first = timed(lambda g=gate, names=names: g.shown("team1", "tool", "github", next(names)), count)
        cached = timed(lambda g=gate: g.shown("team1", "tool", "github", create), count)
        print(f"{size:>9}  {_pair(call):>18}  {_pair(first):>18}  {_pair(cached):>14}  {_pair(baseline):>12}")


def _pair(samples: list[float]) -> str:
    return f"{statistics.median(samples):.1f} / {percentile(samples, 0.99):.1f}"


async def latency(url: str, calls: int) -> list[float]:
    async with Client(url, mode="legacy") as client:
        for _ in range(30):
            await client.call_tool("echo:echo" if "/mcp/direct" in url else "echo", {"text": "warm-up"})
        samples = []
        tool = "echo:echo" if "/mcp/direct" in url else "echo"
        for i in range(calls):
            start = time.perf_counter()
            result = await client.call_tool(tool, {"text": f"call {i}"})
            samples.append((time.perf_counter() - start) * 1000)
            assert not result.is_error, result
        return samples


async def macro(size: int, calls: int) -> None:
    import tempfile

    results: dict[str, list[float]] = {}
    async with http_upstream() as (_process, url):
        results["direct"] = await latency(url, calls)
    with tempfile.TemporaryDirectory() as tmp:
        async with open_stack(Path(tmp), {"echo": echo_server()}) as stack:
            results["mcpvisor, no [policy]"] = await latency(stack.direct_url, calls)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "policies.cedar").write_text(policy_text(size))
        tables = {"policy": {"files": ["policies.cedar"]}}
        async with open_stack(Path(tmp), {"echo": echo_server()}, tables=tables) as stack:
            results[f"mcpvisor, {size} policies"] = await latency(stack.direct_url, calls)
    print(f"\ntools/call of echo (2025-11-25 client, {calls} sequential calls), milliseconds:")
    for label, samples in results.items():
        print(f"  {label:<26} p50 {statistics.median(samples):6.2f}   p99 {percentile(samples, 0.99):6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=20000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--sizes", default="5,50,500")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    micro(sizes, args.decisions)
    trio.run(macro, max(sizes), args.calls)


if __name__ == "__main__":
    main()
