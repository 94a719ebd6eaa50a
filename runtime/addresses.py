"""How internal an IP address is: the guard for URLs that someone other than the operator names.

A server registry's host and the endpoints an upstream's OAuth metadata points at are chosen by a
remote party; fetching them from inside the host's network must not reach what only that network
can (a cloud metadata service, a database's HTTP port, a loopback admin API).
"""

from __future__ import annotations

import enum
import ipaddress
import socket

import trio

_SHARED_SPACE = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: private in practice


class Reach(enum.IntEnum):
    """Address classes, from the most public to the most internal."""

    PUBLIC = 0
    PRIVATE = 1  # RFC 1918, unique local, shared address space
    LOOPBACK = 2
    SPECIAL = 3  # link-local (cloud metadata), multicast, reserved, unspecified


def reach(address: str) -> Reach:
    """The class of one IP address (a zone index such as `%eth0` is ignored)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return Reach.LOOPBACK
    if ip.is_link_local or ip.is_multicast or ip.is_reserved or ip.is_unspecified:
        return Reach.SPECIAL
    if ip.is_global:
        return Reach.PUBLIC
    if ip.is_private or (isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED_SPACE):
        return Reach.PRIVATE
    return Reach.SPECIAL


def public_address(address: str) -> bool:
    return reach(address) is Reach.PUBLIC


async def resolve_reach(host: str, port: int) -> Reach:
    """The most internal class among the addresses `host` resolves to; OSError if it does not resolve."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return max(reach(str(info[4][0])) for info in infos)
