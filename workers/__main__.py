"""`python -m mcpvisor.workers`: a worker process, started by the supervisor."""

from __future__ import annotations

import logging
import os
import signal
import sys

import trio

from mcpvisor.wire import lifetime, logs
from mcpvisor.workers import spec as worker_spec
from mcpvisor.workers.worker import run

log = logging.getLogger("mcpvisor.worker")


async def main(spec: worker_spec.WorkerSpec) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, spec)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received %s, stopping", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                return


def entry() -> None:
    lifetime.die_with_parent(int(os.environ.get("MCPVISOR_PARENT_PID", "0")) or None)
    text = os.environ.pop(worker_spec.ENV_VAR, None)
    if text is None:
        print(f"{worker_spec.ENV_VAR} is not set: workers are started by `mcpvisor serve`", file=sys.stderr)
        sys.exit(2)
    spec = worker_spec.decode(text)
    logs.setup(f"worker[{spec.id}]", spec.log_level)
    trio.run(main, spec)


if __name__ == "__main__":
    entry()
