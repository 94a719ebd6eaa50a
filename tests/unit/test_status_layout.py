"""`ctl status` as supervisorctl lays it out, with the upstream's state and tools beside each worker."""

from __future__ import annotations

from mcpvisor.supervisor.commands.status import render


def test_columns_stay_apart_whatever_the_upstreams_state() -> None:
    rows = [
        {"name": "frontend", "state": "RUNNING", "description": "pid 1, uptime 0:00:01"},
        {"name": "slow", "state": "STARTING", "description": "pid 2", "upstream": "connecting", "tools": 0},
        {"name": "remote", "state": "RUNNING", "description": "pid 3", "upstream": "authenticating", "tools": 1},
        {"name": "echo", "state": "RUNNING", "description": "pid 4", "upstream": "ready", "tools": 13},
    ]
    lines = render(rows).splitlines()
    assert lines[1].endswith("connecting      0 tools")
    assert lines[2].endswith("authenticating  1 tool")
    assert lines[3].endswith("ready           13 tools")
