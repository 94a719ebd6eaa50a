"""One call-timeout decision (`ServerConfig.call_timeout`), taken alike by the frontend and the worker.

The frontend decides how long a call may take and sends that in the request; the worker decides
again from its launch spec and the request. For every combination of `[mcpvisor] call_timeout`
and a server's `policy.call_timeout`, both arrive at the same number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import tomli_w

from mcpvisor.frontend.door.catalog import Catalog
from mcpvisor.frontend.door.upstreams import Upstreams
from mcpvisor.supervisor.config import load
from mcpvisor.supervisor.supervisor import Supervisor
from mcpvisor.wire import frontend_spec, worker_spec
from mcpvisor.wire.config import ServerConfig
from mcpvisor.wire.messages import Request
from mcpvisor.workers.worker import Worker

GRID = [0.001, 0.5, 1.0, 3.0, 120.0, 86400.0]


@pytest.mark.parametrize("default", GRID)
@pytest.mark.parametrize("policy", [None, *GRID])
@pytest.mark.parametrize("asked", [0.0, *GRID])
def test_the_policy_wins_over_the_default_and_a_caller_can_only_shorten_it(
    default: float, policy: float | None, asked: float
) -> None:
    server = msgspec.convert({"command": "x", "policy": {"call_timeout": policy}}, ServerConfig)
    own = policy if policy is not None else default
    assert server.call_timeout(default) == own
    assert server.call_timeout(default, asked) == (min(own, asked) if asked > 0 else own)


@pytest.mark.parametrize(("default", "policy"), [(120.0, None), (120.0, 5.0), (3.0, 60.0), (0.5, None), (300.0, 299.5)])
def test_the_frontend_and_the_worker_hold_a_call_to_the_same_deadline(
    default: float, policy: float | None, tmp_path: Path
) -> None:
    """From one config file, through the launch specs the supervisor gives each process."""
    server: dict[str, Any] = {"command": "x"} | ({"policy": {"call_timeout": policy}} if policy is not None else {})
    path = tmp_path / "mcpvisor.toml"
    settings = {"call_timeout": default, "data_dir": str(tmp_path)}
    path.write_text(tomli_w.dumps({"mcpvisor": settings, "servers": {"alpha": server}}))
    sup = Supervisor(load(path), path)
    front = frontend_spec.decode(sup.frontend_launch().env[frontend_spec.ENV_VAR])
    back = worker_spec.decode(sup.worker_launch("alpha").env[worker_spec.ENV_VAR])

    # Deciding needs none of the door's other parts.
    none: Any = None
    door = Upstreams(
        front.settings, front.servers, catalog=Catalog(), router=none, gate=none, activity=none, index=none, rounds=none
    )
    asked = door.call_timeout("alpha")  # what the frontend puts in its request to the worker
    worker = Worker(back, sock=none)
    try:
        assert worker._timeout_for(Request(id=1, method="tools/call", timeout=asked)) == asked
        assert worker._call_timeout == asked == (policy if policy is not None else default)
    finally:
        worker.upstream._stderr_log.close()  # the worker's process would close it on exit
