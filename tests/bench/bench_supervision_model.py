"""The long run of the model-based supervision test: thousands of steps against a real mcpvisor.

    python tests/bench/bench_supervision_model.py [--seeds 10] [--first-seed 1] [--examples 5] [--steps 40] [--shrink]

For each seed, hypothesis runs `--examples` programs of up to `--steps` steps each (a fresh mcpvisor
per program) of tests/support/supervision_model.py's SupervisionMachine: ctl commands, signals,
config edits and kill -9 of workers and upstreams, with every process compared with supervisord's
rules and the invariants checked after every step. A failing seed prints the shortest program
hypothesis found (`--shrink`; without it, the failing program as run) and the broken invariant,
then the run goes on with the next seed. Printed at the end: seeds, programs, steps, wall time,
and each finding.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, seed, settings
from hypothesis.stateful import get_state_machine_test

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.supervision_model import SupervisionMachine


class CountedMachine(SupervisionMachine):
    programs = 0
    steps = 0

    def __init__(self) -> None:
        CountedMachine.programs += 1
        super().__init__()

    def teardown(self) -> None:
        CountedMachine.steps += self.steps
        super().teardown()


def main(args: argparse.Namespace) -> int:
    findings: list[tuple[int, str]] = []
    started = time.monotonic()
    phases = [Phase.generate, Phase.shrink] if args.shrink else [Phase.generate]
    for number in range(args.first_seed, args.first_seed + args.seeds):
        before = (CountedMachine.programs, CountedMachine.steps, time.monotonic())
        run = get_state_machine_test(
            CountedMachine,
            settings=settings(
                max_examples=args.examples,
                stateful_step_count=args.steps,
                deadline=None,
                database=None,
                phases=phases,
                suppress_health_check=list(HealthCheck),
                verbosity=Verbosity.normal,
                print_blob=True,
            ),
        )
        outcome = "ok"
        try:
            seed(number)(run)()
        except Exception as exc:  # a finding: printed, counted, and the next seed runs
            message = "".join(traceback.format_exception_only(exc)).strip().splitlines()[-1]
            findings.append((number, message))
            outcome = f"FINDING {message}"
            traceback.print_exc()
        programs, steps, then = before
        print(
            f"seed {number}: {CountedMachine.programs - programs} programs, {CountedMachine.steps - steps} steps, "
            f"{time.monotonic() - then:.0f} s: {outcome}",
            flush=True,
        )
    wall = time.monotonic() - started
    print(
        f"\n{args.seeds} seeds ({args.first_seed}..{args.first_seed + args.seeds - 1}), "
        f"{CountedMachine.programs} programs, {CountedMachine.steps} steps, {wall / 60:.1f} min, "
        f"{len(findings)} findings"
    )
    for number, message in findings:
        print(f"  seed {number}: {message}")
    return 1 if findings else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--examples", type=int, default=5, help="programs per seed")
    parser.add_argument("--steps", type=int, default=40, help="steps per program at most")
    parser.add_argument("--shrink", action="store_true", help="shrink a failing program (slow: real processes)")
    sys.exit(main(parser.parse_args()))
