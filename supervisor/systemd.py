"""sd_notify: READY, STATUS, STOPPING and WATCHDOG datagrams to systemd, when it asks for them."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    """Sends sd_notify messages to $NOTIFY_SOCKET; does nothing when it is not set."""

    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._sock: socket.socket | None = None
        self._address = ""
        if address:
            # An address starting with '@' is in the abstract namespace.
            self._address = "\0" + address[1:] if address.startswith("@") else address
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.ready_sent = False

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *lines: str) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendto("\n".join(lines).encode(), self._address)
        except OSError as exc:
            log.warning("sd_notify failed: %s", exc)

    def ready(self, status: str) -> None:
        if not self.ready_sent:
            self.ready_sent = True
            self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def watchdog_interval(self) -> float | None:
        """Half of $WATCHDOG_USEC in seconds, when systemd watches this process."""
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        if not usec or (pid and int(pid) != os.getpid()):
            return None
        return int(usec) / 2 / 1_000_000

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
