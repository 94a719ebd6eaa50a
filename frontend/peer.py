"""Which local user opened a loopback TCP connection: the kernel's socket table, looked up per request.

On a loopback listener with no tokens, mcpvisor serves only the user running it (and root). The
peer's uid is the owner of the client's end of the connection: the row of `/proc/net/tcp` (or
`tcp6`) whose local address is the client's address and port and whose remote address is ours.
Nothing is cached: a port is reused by the next connection, possibly another user's.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path
from typing import Final

TCP_TABLES: Final = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


class PeerUnknown(Exception):
    """The peer's uid cannot be found out here; the message says why (callers refuse the connection)."""


def _hex_address(host: str, port: int) -> tuple[str, str]:
    """`(ADDRESS:PORT as /proc/net/tcp prints it, the table it is in)` for one socket address.

    The kernel prints each 32-bit word of the address in the host's byte order, and an IPv4
    address seen by an IPv6 socket as `::ffff:a.b.c.d`.
    """
    address = ipaddress.ip_address(host.split("%", 1)[0])
    packed = address.packed
    words = "".join(f"{int.from_bytes(packed[i : i + 4], sys.byteorder):08X}" for i in range(0, len(packed), 4))
    return f"{words}:{port:04X}", "tcp" if address.version == 4 else "tcp6"


def _forms(host: str) -> list[str]:
    """`host` and its other spelling across IPv4 and IPv6 sockets (`a.b.c.d` is `::ffff:a.b.c.d`)."""
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if address.version == 4:
        return [str(address), f"::ffff:{address}"]
    if address.ipv4_mapped is not None:
        return [str(address), str(address.ipv4_mapped)]
    return [str(address)]


def peer_uid(client: tuple[str, int], server: tuple[str, int], tables: tuple[Path, ...] = TCP_TABLES) -> int:
    """The uid owning the client end of the TCP connection `client` -> `server` on this host."""
    try:
        candidates = [
            (_hex_address(local, client[1]), _hex_address(remote, server[1]))
            for local, remote in zip(_forms(client[0]), _forms(server[0]), strict=False)
        ]
    except ValueError:
        raise PeerUnknown(f"the connection's addresses {client[0]!r} and {server[0]!r} are not IP addresses") from None
    read_any = False
    for table in tables:
        wanted = [(local, remote) for (local, family), (remote, _) in candidates if family == table.name]
        if not wanted:
            continue
        try:
            text = table.read_text(encoding="ascii")
        except OSError:
            continue
        read_any = True
        for local, remote in wanted:
            for line in text.splitlines()[1:]:
                # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
                fields = line.split()
                if len(fields) > 7 and fields[1] == local and fields[2] == remote:
                    return int(fields[7])
    if not read_any:
        raise PeerUnknown(f"the kernel's socket table ({', '.join(map(str, tables))}) cannot be read here")
    raise PeerUnknown("the connection is not in the kernel's socket table (closed, or from another network namespace)")


def owner_uids() -> frozenset[int]:
    """The uids allowed on a loopback listener without tokens: ours, and root."""
    return frozenset({os.getuid(), 0})
