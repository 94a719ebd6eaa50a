"""A sandbox's own network: outbound only, through pasta, as rootless Podman gives its containers.

The sandbox starts in a network namespace of its own (made before bwrap runs, see
runtime.namespaces), where only the loopback interface exists and routes of type `prohibit` cover
what it must never reach: link-local addresses (a cloud's metadata service), the host's own
addresses, and unless allowed the private ranges. Then pasta (Debian's `passt`) joins that
namespace and gives it an interface whose packets it turns into ordinary sockets of the host:
outbound TCP, UDP and ICMP echo work; the host's loopback is the namespace's own (pasta runs
with `--no-map-gw`, and `-T none -U none` forwards nothing to the host's ports); nothing outside
can connect in (`-t none -u none`); abstract UNIX sockets are the namespace's own. A process in
the sandbox has no capability over the namespace, so it cannot change a route.

DNS: the sandbox's /etc/resolv.conf names pasta's forwarder (`--dns-forward`, the address Podman
uses), which relays to the host's own resolver, wherever that is (systemd-resolved on loopback,
a private address): the one address of a blocked range that stays open, for DNS only.

The arguments follow containers/common's libnetwork/pasta: `--config-net`, `-t none -u none -T
none -U none`, `--no-map-gw`, `--quiet`, `--dns-forward 169.254.1.1`.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import struct
from collections.abc import Iterable, Sequence

DNS_FORWARD = "169.254.1.1"
ALWAYS = ("169.254.0.0/16", "fe80::/10", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4", "ff00::/8")
PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7", "64:ff9b::/96")
FIX_PASTA = 'install passt (apt-get install passt, dnf install passt), or set the sandbox\'s network = "host"'
READY_TIMEOUT = 10.0

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def blocked(*, private: bool, host: Iterable[str] = ()) -> list[Network]:
    """The prefixes a sandbox's outbound network refuses, the DNS forwarder carved out."""
    found: list[Network] = [ipaddress.ip_network(prefix) for prefix in ALWAYS]
    if not private:
        found += [ipaddress.ip_network(prefix) for prefix in PRIVATE]
    for address in host:
        ip = ipaddress.ip_address(address.split("%")[0])
        if ip.is_loopback:
            continue  # the namespace's own loopback
        found.append(ipaddress.ip_network(f"{ip}/{ip.max_prefixlen}"))
    forwarder = ipaddress.ip_network(f"{DNS_FORWARD}/32")
    result: list[Network] = []
    for network in found:
        if network.version == 4 and forwarder.subnet_of(network):  # type: ignore[arg-type]
            result += sorted(network.address_exclude(forwarder))  # type: ignore[arg-type]
        else:
            result.append(network)
    return list(dict.fromkeys(result))


def host_addresses() -> list[str]:
    """Every address of this host's interfaces (IPv4 from /proc/net/fib_trie, IPv6 from if_inet6)."""
    found: list[str] = []
    try:
        with open("/proc/net/fib_trie") as trie:
            last = ""
            for line in trie:
                text = line.strip()
                if text.startswith("|--"):
                    last = text[3:].strip()
                elif text.startswith("/32 host LOCAL") and last:
                    found.append(last)
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6") as table:
            for line in table:
                raw = line.split()[0]
                found.append(str(ipaddress.IPv6Address(bytes.fromhex(raw))))
    except OSError:
        pass
    return list(dict.fromkeys(found))


# -- rtnetlink: loopback up, and the prohibit routes ---------------------------------------------

_RTM_NEWLINK, _RTM_NEWROUTE, _NLMSG_ERROR = 16, 24, 2
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
_RT_TABLE_MAIN, _RTPROT_STATIC, _RTN_PROHIBIT, _RTA_DST, _RTA_PRIORITY = 254, 4, 8, 1, 6
_IFF_UP = 0x1


def _message(kind: int, flags: int, body: bytes, seq: int) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, flags | _NLM_F_REQUEST | _NLM_F_ACK, seq, 0) + body


def _attribute(kind: int, data: bytes) -> bytes:
    padded = data + b"\0" * (-len(data) % 4)
    return struct.pack("=HH", 4 + len(data), kind) + padded


def _ask(sock: socket.socket, message: bytes) -> None:
    sock.send(message)
    reply = sock.recv(65536)
    _length, kind, _flags, _seq, _pid = struct.unpack_from("=IHHII", reply)
    if kind == _NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", reply, 16)
        if error:
            raise OSError(-error, os.strerror(-error))


def confine_namespace(prefixes: Sequence[Network]) -> None:
    """In the new network namespace (the caller is in it, with CAP_NET_ADMIN over it): loopback up,
    and a `prohibit` route over each prefix, so a connection there fails at once (EACCES)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        # ifinfomsg: family, pad, type, index 1 (lo is always 1 in a new namespace), flags, change
        _ask(sock, _message(_RTM_NEWLINK, 0, struct.pack("=BBHiII", 0, 0, 0, 1, _IFF_UP, _IFF_UP), 1))
        for seq, network in enumerate(prefixes, start=2):
            family = socket.AF_INET if network.version == 4 else socket.AF_INET6
            # rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
            head = struct.pack(
                "=BBBBBBBBI", family, network.prefixlen, 0, 0, _RT_TABLE_MAIN, _RTPROT_STATIC, 0, _RTN_PROHIBIT, 0
            )
            # Metric 1: ahead of the kernel's own routes of the same prefix (fe80::/64 on pasta's interface).
            body = head + _attribute(_RTA_DST, network.network_address.packed) + _attribute(_RTA_PRIORITY, b"\1\0\0\0")
            _ask(sock, _message(_RTM_NEWROUTE, _NLM_F_CREATE | _NLM_F_EXCL, body, seq))


# -- pasta ---------------------------------------------------------------------------------------


def pasta() -> str | None:
    return shutil.which("pasta")


TUN = "/dev/net/tun"


def problem(*, privileged: bool) -> str | None:
    """Why a sandbox's own network cannot be made here (the fix named), or None."""
    if pasta() is None:
        return f"the sandbox's own network needs pasta, which is not installed: {FIX_PASTA}"
    try:
        mode = os.stat(TUN).st_mode
    except OSError:
        return (
            f"the sandbox's own network needs {TUN}, which this system or container lacks (a container:"
            ' --device /dev/net/tun, see docs/sandbox-deployment.md), or set network = "host"'
        )
    # pasta opens it as mcpvisor's user, or as nobody when mcpvisor is root.
    usable = mode & 0o006 == 0o006 if privileged else os.access(TUN, os.R_OK | os.W_OK)
    if not usable:
        return f"pasta cannot open {TUN} (mode {mode & 0o777:o}): make it 0666, the mode udev gives it"
    return None


def pasta_argv(tool: str, netns_fd: int, userns_fd: int) -> list[str]:
    """pasta joining the sandbox's namespaces, held open by fds it inherits; it stays in the foreground
    (a child of the worker, which stops it) and quits when the namespace is gone."""
    return [
        tool,
        "--foreground",
        "--quiet",
        "--config-net",
        *("--tcp-ports", "none", "--udp-ports", "none", "--tcp-ns", "none", "--udp-ns", "none"),
        "--no-map-gw",
        *("--dns-forward", DNS_FORWARD),
        *("--userns", f"/proc/self/fd/{userns_fd}"),
        *("--netns", f"/proc/self/fd/{netns_fd}"),
    ]


def resolv_conf(host: str = "/etc/resolv.conf") -> bytes:
    """The sandbox's resolv.conf: the host's search domains and options, pasta's forwarder as server."""
    lines = [f"nameserver {DNS_FORWARD}"]
    try:
        with open(host, encoding="utf-8", errors="replace") as conf:
            lines += [line.rstrip() for line in conf if line.split()[:1] in (["search"], ["domain"], ["options"])]
    except OSError:
        pass
    return ("\n".join(lines) + "\n").encode()


def is_ready(pid: int) -> bool:
    """Whether pasta has configured the namespace that process `pid` is in (it has a default route)."""
    for table, default in (("route", "00000000"), ("ipv6_route", "0" * 32)):
        try:
            with open(f"/proc/{pid}/net/{table}") as routes:
                for line in routes:
                    fields = line.split()
                    if table == "route" and len(fields) > 7 and fields[1] == fields[7] == default:
                        return True
                    if table == "ipv6_route" and fields[:2] == [default, "00"] and fields[-1] != "lo":
                        return True
        except OSError:
            return False
    return False
