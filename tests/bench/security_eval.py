"""Measure the quarantine security analysis on mcpproxy-go's frozen, labelled security corpora.

Usage: python tests/bench/security_eval.py [--datasets DIR] [--errors] [--all]

A tool counts as flagged when its risk is medium or high. For each corpus the script prints the
confusion counts, precision, recall, F1 and false-positive rate, recall per malicious category and
the flag rate per hard-negative group, next to the figures of mcpproxy-go's detector from
baseline_v1 where they measure the same thing:

- security_corpus_v1 (43 descriptions, no tool names): baseline_v1["security"] holds mcpproxy-go's
  deterministic "sensitive-data" detector on exactly this corpus and verdict (malicious or not),
  so precision, recall, F1, FPR and the confusion counts compare directly. That detector only
  looks for secrets and path leaks; it was never meant to catch prompt injection.
- detect_corpus_v1 (57 entries with server, tool and peers): baseline_v1 has no figures for it.
  Peers on other servers are passed as `other_tools`, as the frontend passes the catalog.
- corpus_v1.tools (45 tools of the official reference servers): unlabelled; all are treated as
  benign, so the figure printed is the share flagged (a false-positive rate on real descriptions).

Entries of security_corpus_v1 have no tool name; they are analyzed as a tool named "tool".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcpvisor.frontend.gate.security import ToolReport, analyze_tool

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATASETS = REPO.parent / "shared" / "datasets" / "mcpproxy-eval"
FLAGGED = ("medium", "high")


@dataclass
class Case:
    id: str
    malicious: bool
    group: str  # category for malicious entries, the resembled category for hard negatives
    report: ToolReport


@dataclass
class Scores:
    tp: int = 0
    fp: int = 0
    tn: int = 0
    fn: int = 0
    groups: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, case: Case) -> None:
        flagged = case.report.risk in FLAGGED
        if case.malicious:
            self.tp += flagged
            self.fn += not flagged
        else:
            self.fp += flagged
            self.tn += not flagged
        counter = self.groups.setdefault(case.group, Counter())
        counter["total"] += 1
        counter["flagged"] += flagged

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        total = self.precision + self.recall
        return 2 * self.precision * self.recall / total if total else 0.0

    @property
    def fpr(self) -> float:
        return self.fp / (self.fp + self.tn) if self.fp + self.tn else 0.0


def load_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as file:
        return json.load(file)


def security_cases(corpus: dict[str, Any]) -> Iterable[Case]:
    for entry in corpus["entries"]:
        report = analyze_tool("corpus", {"name": "tool", "description": entry["description"]})
        malicious = entry["label"] == "malicious"
        group = entry["category"]
        if group == "hard_negative":
            # ids read "hn_<resembled category>_NN"; only the group label is taken from them.
            group = "hn:" + entry["id"].removeprefix("hn_").rsplit("_", 1)[0]
        yield Case(entry["id"], malicious, group, report)


def detect_cases(corpus: dict[str, Any]) -> Iterable[Case]:
    for entry in corpus["entries"]:
        server = entry["server"]
        other_tools = []
        for peer in entry.get("peers", []):
            if peer["server"] != server:
                other_tools += [f"{peer['server']}:{peer['tool']['name']}", peer["tool"]["name"]]
        report = analyze_tool(server, entry["tool"], other_tools=other_tools)
        malicious = entry["label"] == "malicious"
        group = entry["category"] if malicious else "hn:" + entry.get("resembles", entry["category"])
        yield Case(entry["id"], malicious, group, report)


def reference_cases(corpus: dict[str, Any]) -> Iterable[Case]:
    tools = corpus["tools"]
    for entry in tools:
        other_tools = [t["tool_id"] for t in tools if t["server"] != entry["server"]]
        other_tools += [t["tool"] for t in tools if t["server"] != entry["server"]]
        tool = {"name": entry["tool"], "description": entry["description"]}
        yield Case(entry["tool_id"], False, "reference", analyze_tool(entry["server"], tool, other_tools=other_tools))


def describe(case: Case) -> str:
    report = case.report
    label = "malicious" if case.malicious else "benign"
    top = report.findings[0] if report.findings else None
    reason = f"{top.severity} {top.rule}: {top.evidence}" if top else "no findings"
    return f"  {case.id:<32} {label:<9} {report.risk:<6} {report.score:.2f}  {reason}"


def print_corpus(
    title: str, cases: list[Case], baseline: dict[str, Any] | None, *, errors: bool, show_all: bool
) -> None:
    scores = Scores()
    for case in cases:
        scores.add(case)
    malicious = scores.tp + scores.fn
    print(f"\n{title}: {len(cases)} entries, {malicious} malicious, {len(cases) - malicious} benign")
    reference = f"mcpproxy-go {baseline['detector']}" if baseline else ""
    print(f"  {'metric':<12}{'mcpvisor':>10}  {reference}")
    rows = [("FPR", scores.fpr, "fpr")]
    if malicious:  # precision, recall and F1 mean nothing without malicious entries
        rows = [
            ("precision", scores.precision, "precision"),
            ("recall", scores.recall, "recall"),
            ("F1", scores.f1, "f1"),
            *rows,
        ]
    for name, value, key in rows:
        theirs = f"{baseline[key]:.3f}" if baseline else ""
        print(f"  {name:<12}{value:>10.3f}  {theirs:>10}")
    for key in ("tp", "fp", "tn", "fn"):
        theirs = f"{baseline[key]}" if baseline else ""
        print(f"  {key:<12}{getattr(scores, key):>10}  {theirs:>10}")
    print("  per group (flagged / total):")
    for group, counter in sorted(scores.groups.items(), key=lambda item: (item[0].startswith("hn:"), item[0])):
        what = "flag rate (false positives)" if group.startswith(("hn:", "benign", "reference")) else "recall"
        share = counter["flagged"] / counter["total"]
        print(f"    {group:<28}{counter['flagged']:>3} / {counter['total']:<3} {what} {share:.2f}")
    wrong = [c for c in cases if (c.report.risk in FLAGGED) != c.malicious]
    if show_all or (errors and wrong):
        print("  entries:" if show_all else "  misclassified:")
        for case in cases if show_all else wrong:
            print(describe(case))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS, help="the mcpproxy-eval folder")
    parser.add_argument("--errors", action="store_true", help="list misclassified entries")
    parser.add_argument("--all", action="store_true", help="list every entry with its verdict")
    args = parser.parse_args(argv)
    if not args.datasets.is_dir():
        print(f"datasets folder not found: {args.datasets} (use --datasets DIR)", file=sys.stderr)
        return 2
    baseline = load_json(args.datasets / "baseline_v1.json")["security"]
    detector = baseline["per_detector"][0]
    gate = baseline["gate"]

    security = list(security_cases(load_json(args.datasets / "security_corpus_v1.json")))
    print_corpus("security_corpus_v1", security, detector, errors=args.errors, show_all=args.all)
    scores = Scores()
    for case in security:
        scores.add(case)
    fpr_ok = scores.fpr <= gate["fpr_ceiling"]
    recall_ok = scores.recall >= gate["recall_floor"]
    print(
        f"  mcpproxy-go CI gate: FPR <= {gate['fpr_ceiling']} {'pass' if fpr_ok else 'FAIL'}, "
        f"recall >= {gate['recall_floor']} {'pass' if recall_ok else 'FAIL'}"
    )

    detect = list(detect_cases(load_json(args.datasets / "detect_corpus_v1.json")))
    print_corpus(
        "detect_corpus_v1 (no baseline figures in baseline_v1)",
        detect,
        None,
        errors=args.errors,
        show_all=args.all,
    )

    reference = list(reference_cases(load_json(args.datasets / "corpus_v1.tools.json")))
    print_corpus(
        "corpus_v1.tools (real reference-server tools, all assumed benign)",
        reference,
        None,
        errors=args.errors,
        show_all=args.all,
    )

    combined = Scores()
    for case in security + detect:
        combined.add(case)
    print(
        f"\nsecurity + detect combined: precision {combined.precision:.3f}, recall {combined.recall:.3f}, "
        f"F1 {combined.f1:.3f}, FPR {combined.fpr:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
