"""Supervision over its state space: hypothesis drives a real mcpvisor against supervisord's rules.

A short, seeded run (the long run is tests/bench/bench_supervision_model.py). The machine, its
model and its invariants are in tests/support/supervision_model.py.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import get_state_machine_test

from tests.support.supervision_model import SupervisionMachine

SEED = 20261126


def test_supervision_against_its_model() -> None:
    run = get_state_machine_test(
        SupervisionMachine,
        settings=settings(
            # The first program hypothesis tries is its simplest (one rule, repeated): two more are
            # drawn at random. About two minutes on a two-core machine.
            max_examples=3,
            stateful_step_count=8,
            deadline=None,
            database=None,
            phases=[Phase.generate],  # shrinking a run of real processes is for the long run
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        ),
    )
    seed(SEED)(run)()
