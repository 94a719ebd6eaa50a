"""`python -m mcpvisor.workers`: a worker process, started by the supervisor."""

from __future__ import annotations

import logging
import os
import signal
import sys

import trio

from mcpvisor.runtime import lifetime, logs, telemetry
from mcpvisor.wire import worker_spec
from mcpvisor.workers.upstream import StartupFailed
from mcpvisor.workers.worker import open_worker

log = logging.getLogger("mcpvisor.worker")

EXIT_UPSTREAM_FAILED = 3


async def main(spec: worker_spec.WorkerSpec) -> int:
    """Serve until SIGTERM/SIGINT (then let calls in flight finish) or until the upstream cannot start."""
    failed = False
    tenant, _, server = spec.id.rpartition("/")
    identity = {"mcpvisor.worker_id": spec.id, "mcpvisor.server": server, "mcpvisor.tenant": tenant}
    try:
        async with telemetry.running("worker", **identity), open_worker(spec) as worker, trio.open_nursery() as nursery:

            async def serve() -> None:
                await worker.serve()
                nursery.cancel_scope.cancel()

            nursery.start_soon(serve)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("received %s: finishing %d calls in flight", signal.Signals(signum).name, worker.inflight)
                    # The supervisor SIGKILLs after stopwaitsecs, which bounds this wait.
                    await worker.drain()
                    nursery.cancel_scope.cancel()
                    break
    except* StartupFailed:
        failed = True
    return EXIT_UPSTREAM_FAILED if failed else 0


def entry() -> None:
    lifetime.die_with_parent(int(os.environ.get("MCPVISOR_PARENT_PID", "0")) or None)
    text = os.environ.pop(worker_spec.ENV_VAR, None)
    if text is None:
        print(f"{worker_spec.ENV_VAR} is not set: workers are started by `mcpvisor serve`", file=sys.stderr)
        sys.exit(2)
    spec = worker_spec.decode(text)
    logs.setup(f"worker[{spec.id}]", spec.log_level)
    sys.exit(trio.run(main, spec))


if __name__ == "__main__":
    entry()
