"""How long to wait before trying again: one exponential backoff for restarts and reconnects.

The supervisor waits before restarting a process that failed to start (1, 2, 4, ... seconds up to
`backoff_max`, as supervisord); a worker waits before reconnecting to an upstream that dropped
(0.5, 1, 2, ... up to `reconnect_backoff_max`, with a little jitter so that workers of one
upstream do not all knock at once). Plain arithmetic, no clock: tested without waiting.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_delay(
    attempt: int, cap: float, *, base: float = 1.0, jitter: float = 0.0, draw: Callable[[], float] = random.random
) -> float:
    """The wait before try number `attempt` after a failure (1: the first retry): base, 2 base, 4 base, ...

    Never more than `cap`; `jitter` spreads it by up to that fraction either way (`draw` gives a
    number in [0, 1)). Nothing before the first try (`attempt` 0 or less).
    """
    if attempt <= 0:
        return 0.0
    delay = min(cap, base * 2.0 ** min(attempt - 1, 64))
    if jitter:
        delay *= 1 + jitter * (2 * draw() - 1)
    return min(cap, delay)
