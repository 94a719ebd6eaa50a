"""The waiting-calls state machine of tests/e2e/test_approval_model.py, run long against one real stack.

    python tests/bench/bench_approval_model.py [--examples 50] [--steps 30] [--seed N]

Every defect such a run finds becomes an example test. Without `--seed` the runs are derandomized
(the same as the suite's, only more of them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hypothesis import HealthCheck, seed, settings

from tests.e2e.test_approval_model import Approvals, LiveStack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=50)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, help="a random seed instead of the derandomized runs")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        live = LiveStack(Path(tmp))
        try:
            Approvals.live = live
            case = Approvals.TestCase
            case.settings = settings(
                max_examples=args.examples,
                stateful_step_count=args.steps,
                deadline=None,
                derandomize=args.seed is None,
                suppress_health_check=list(HealthCheck),
            )
            if args.seed is not None:
                case = seed(args.seed)(case)
            case().runTest()
            made = len(list(live.files.iterdir()))
        finally:
            live.close()
    print(f"{args.examples} runs of up to {args.steps} steps: every step matched the model")
    print(f"calls that ran and wrote their file: {made}; {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
