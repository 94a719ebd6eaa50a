"""Follow the pins other replicas record in the shared store, so a decision on one holds on all.

An operator's approve or block reaches one replica's frontend; it writes the pins to the store,
which NOTIFYs every replica. Here each frontend then reads the pins again and tells its clients
about every server whose pins changed. A full re-read every few seconds covers a notification
lost with a dropped connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from mcpvisor.frontend.gate.approvals import ToolApprovals, read_pins
from mcpvisor.store.state_db import PINS
from mcpvisor.store.state_pg import PostgresState, follow

log = logging.getLogger(__name__)


async def serve_following_pins(store: PostgresState, approvals: ToolApprovals, changed: Callable[[str], None]) -> None:
    """Keep `approvals` equal to the store's pins; `changed(server)` for each server whose pins moved."""

    async def read_again(_: frozenset[str]) -> None:
        # This replica's own pins reach the store first, so reading cannot undo them.
        await approvals.flush()
        version = approvals.version
        pins = await trio.to_thread.run_sync(read_pins, store)
        if approvals.version != version:
            return  # approved here meanwhile: read again on the notification it sends
        for server in sorted(approvals.replace(pins)):
            log.info("pins of %s changed through another replica", server)
            changed(server)

    await follow(store, frozenset({PINS}), read_again, waiting="other replicas' approvals")
