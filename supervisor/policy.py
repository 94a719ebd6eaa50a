"""Restart policy as plain functions: no I/O, no clock of its own."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


def should_restart(autorestart: bool | str, exit_code: int | None, exitcodes: list[int]) -> bool:
    """supervisord's `autorestart`: true, false, or 'unexpected' (only for codes not in exitcodes)."""
    if autorestart in (True, "true"):
        return True
    if autorestart in (False, "false"):
        return False
    return exit_code not in exitcodes


@dataclass
class FlapDetector:
    """Counts exits in a sliding window: `count` exits within `window` seconds is flapping."""

    window: float
    count: int
    _exits: deque[float] = field(default_factory=deque)

    def record_exit(self, now: float) -> bool:
        """Record an exit at monotonic time `now`; True when the process is flapping."""
        self._exits.append(now)
        while self._exits and now - self._exits[0] > self.window:
            self._exits.popleft()
        return len(self._exits) >= self.count

    def reset(self) -> None:
        self._exits.clear()


def format_uptime(seconds: float) -> str:
    """supervisord's `uptime H:MM:SS` (days as `N days, H:MM:SS`)."""
    seconds = int(max(0, seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{days} day{'s' if days != 1 else ''}, {clock}" if days else clock
