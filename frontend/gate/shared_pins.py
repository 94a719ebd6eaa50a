"""Follow the pins other replicas record in the shared store, so a decision on one holds on all.

An operator's approve or block reaches one replica's frontend; it writes the pins to the store,
which NOTIFYs every replica. Here each frontend then reads the pins again and tells its clients
about every server whose pins changed. A full re-read every few seconds covers a notification
lost with a dropped connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import trio

from mcpvisor.frontend.gate.approvals import ToolApprovals, read_pins
from mcpvisor.wire.state_db import PINS
from mcpvisor.wire.state_pg import Listener, PostgresState
from mcpvisor.wire.state_url import StateStoreError

log = logging.getLogger(__name__)

RESYNC_EVERY: Final = 5.0  # seconds between full re-reads, whatever was notified
WAIT_SLICE: Final = 0.5  # seconds a wait for notifications blocks its thread


async def serve_following_pins(store: PostgresState, approvals: ToolApprovals, changed: Callable[[str], None]) -> None:
    """Keep `approvals` equal to the store's pins; `changed(server)` for each server whose pins moved."""
    listener = Listener(store)
    last_full = -RESYNC_EVERY
    failing = False
    try:
        while True:
            try:
                topics = await trio.to_thread.run_sync(listener.wait, WAIT_SLICE)
                due = trio.current_time() - last_full >= RESYNC_EVERY
                if topics is not None and PINS not in topics and not due:
                    continue
                last_full = trio.current_time()
                # This replica's own pins reach the store first, so reading cannot undo them.
                await approvals.flush()
                version = approvals.version
                pins = await trio.to_thread.run_sync(read_pins, store)
            except StateStoreError as exc:
                if not failing:
                    log.warning("%s; retrying (other replicas' approvals wait)", exc)
                failing = True
                await trio.sleep(1.0)
                continue
            failing = False
            if approvals.version != version:
                continue  # approved here meanwhile: read again on the notification it sends
            for server in sorted(approvals.replace(pins)):
                log.info("pins of %s changed through another replica", server)
                changed(server)
    finally:
        listener.close()
