"""Which local user opened a loopback TCP connection, asked of the kernel once per connection.

On a loopback listener with no tokens, mcpvisor serves only the user running it (and root). The
peer's uid is the owner of the client's end of the connection: the socket whose local address is
the client's address and port and whose remote address is ours. The kernel is asked by that exact
address pair over sock_diag netlink (a hash lookup); where that is not available, its socket
table in `/proc/net/tcp` and `tcp6` is read instead (a walk of every socket on the host, tens of
milliseconds on a big one). No answer is cached here: a port is reused by the next connection,
possibly another user's. The boundary keeps it for the connection it belongs to, where the
listener keeps that connection's facts. Only the parsing of addresses is cached (the same few).

A sandboxed upstream runs as that same user on a workstation (bwrap maps it through a user
namespace), so where any server is sandboxed the uid is not enough: the socket's inode (in the
same answer) is looked for among the open files of the processes, and the connection is the
user's own only while a process in our PID and user namespaces holds it and none in another
does. Finding no holder proves nothing: a sandbox can send its socket to itself over a UNIX
socket and close it, leaving it in no process's hands while its request is read.

Some of the user's processes cannot be looked into: ssh-agent, gpg-agent and the like make
themselves non-dumpable. Such a process could hold the socket unseen, yet it can be one of our
sandboxes only if it descends from mcpvisor's supervisor (the frontend's parent), which
`/proc/PID/stat` tells of any process: one elsewhere is passed over, one inside leaves the answer
unknown.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Final

TCP_TABLES: Final = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))

# linux/sock_diag.h, linux/inet_diag.h, linux/netlink.h
_NETLINK_SOCK_DIAG: Final = 4
_SOCK_DIAG_BY_FAMILY: Final = 20
_NLM_F_REQUEST: Final = 1
_NLMSG_ERROR: Final = 2
_NO_COOKIE: Final = 0xFFFFFFFF
_HEADER: Final = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_UID_OFFSET: Final = _HEADER.size + 4 + 48 + 12  # inet_diag_msg: family..retrans, sockid, expires..wqueue
_INODE_OFFSET: Final = _UID_OFFSET + 4  # idiag_inode follows idiag_uid
PROC: Final = Path("/proc")
NAMESPACES: Final = ("pid", "user")  # a sandbox has its own of both; the frontend shares the host's
# nlmsghdr, then inet_diag_req_v2: family, protocol, ext, pad, states; inet_diag_sockid: ports (in
# network order, hence htons), addresses (16 bytes: struct pads an IPv4 one with zeros), interface, cookie.
_REQUEST: Final = struct.Struct("=IHHIIBBBBIHH16s16sIII")


class PeerUnknown(Exception):
    """The peer's uid cannot be found out here; the message says why (callers refuse the connection)."""


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@functools.lru_cache(maxsize=1024)
def _forms(host: str) -> tuple[Address, ...]:
    """`host` and its other spelling across IPv4 and IPv6 sockets (`a.b.c.d` is `::ffff:a.b.c.d`).

    Parsing both costs more than asking the kernel; a listener sees the same few addresses.
    """
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if address.version == 4:
        return (address, ipaddress.IPv6Address(f"::ffff:{address}"))
    if address.ipv4_mapped is not None:
        return (address, address.ipv4_mapped)
    return (address,)


def peer_uid(
    client: tuple[str, int], server: tuple[str, int], tables: tuple[Path, ...] = TCP_TABLES, *, netlink: bool = True
) -> int:
    """The uid owning the client end of the TCP connection `client` -> `server` on this host."""
    return peer_socket(client, server, tables, netlink=netlink)[0]


def peer_socket(
    client: tuple[str, int], server: tuple[str, int], tables: tuple[Path, ...] = TCP_TABLES, *, netlink: bool = True
) -> tuple[int, int]:
    """(uid, inode) of the client end of the TCP connection `client` -> `server` on this host."""
    try:
        pairs = list(zip(_forms(client[0]), _forms(server[0]), strict=False))
    except ValueError:
        raise PeerUnknown(f"the connection's addresses {client[0]!r} and {server[0]!r} are not IP addresses") from None
    if netlink:
        try:
            for local, remote in pairs:
                if (found := _diag_socket(local, client[1], remote, server[1])) is not None:
                    return found
        except OSError:
            pass  # no sock_diag here (kernel, seccomp): the tables tell the same, more slowly
    return _table_socket(pairs, client[1], server[1], tables)


def _diag_socket(local: Address, local_port: int, remote: Address, remote_port: int) -> tuple[int, int] | None:
    """(owner, inode) of the TCP socket with exactly these ends, from sock_diag; None when there is none."""
    family = socket.AF_INET if local.version == 4 else socket.AF_INET6
    message = _REQUEST.pack(
        _REQUEST.size,
        _SOCK_DIAG_BY_FAMILY,
        _NLM_F_REQUEST,
        1,
        0,
        family,
        socket.IPPROTO_TCP,
        0,
        0,
        0xFFFFFFFF,  # every TCP state
        socket.htons(local_port),
        socket.htons(remote_port),
        local.packed,
        remote.packed,
        0,
        _NO_COOKIE,
        _NO_COOKIE,
    )
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(1.0)
        sock.sendto(message, (0, 0))
        answer = sock.recv(8192)
    return parse_diag_answer(answer)


def parse_diag_answer(answer: bytes) -> tuple[int, int] | None:
    """(uid, inode) from a sock_diag answer; None for "no such socket"; OSError for any other."""
    _length, kind, _flags, _sequence, _port = _HEADER.unpack_from(answer)
    if kind == _NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", answer, _HEADER.size)
        if -code == errno.ENOENT:
            return None  # no such socket (or no tcp_diag: the tables will tell)
        raise OSError(-code, os.strerror(-code))
    if kind != _SOCK_DIAG_BY_FAMILY or len(answer) < _INODE_OFFSET + 4:
        raise OSError(errno.EPROTO, "unexpected sock_diag answer")
    uid, inode = struct.unpack_from("=II", answer, _UID_OFFSET)
    return uid, inode


def _hex_address(address: Address, port: int) -> str:
    """ADDRESS:PORT as /proc/net/tcp prints it: each 32-bit word of the address in host byte order."""
    packed = address.packed
    words = "".join(f"{int.from_bytes(packed[i : i + 4], sys.byteorder):08X}" for i in range(0, len(packed), 4))
    return f"{words}:{port:04X}"


def _table_socket(
    pairs: list[tuple[Address, Address]], local_port: int, remote_port: int, tables: tuple[Path, ...]
) -> tuple[int, int]:
    """(uid, inode) in the row of the kernel's socket table whose ends are one of `pairs`."""
    read_any = False
    for table in tables:
        family = 4 if table.name == "tcp" else 6
        wanted = [
            (_hex_address(local, local_port), _hex_address(remote, remote_port))
            for local, remote in pairs
            if local.version == family
        ]
        if not wanted:
            continue
        try:
            text = table.read_text(encoding="ascii")
        except OSError:
            continue
        read_any = True
        for line in text.splitlines()[1:]:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            fields = line.split()
            if len(fields) > 9 and (fields[1], fields[2]) in wanted:
                return int(fields[7]), int(fields[9])
    if not read_any:
        raise PeerUnknown(f"the kernel's socket table ({', '.join(map(str, tables))}) cannot be read here")
    raise PeerUnknown("the connection is not in the kernel's socket table (closed, or from another network namespace)")


def owner_uids() -> frozenset[int]:
    """The uids allowed on a loopback listener without tokens: ours, and root."""
    return frozenset({os.getuid(), 0})


def socket_link(inode: int) -> str:
    """What `/proc/PID/fd/N` reads for a descriptor of the socket with this inode."""
    return f"socket:[{inode}]"


def other_namespace(ours: dict[str, str], theirs: dict[str, str]) -> bool:
    """Whether a process whose namespace links are `theirs` lives in another namespace than `ours`."""
    return any(theirs.get(kind) != link for kind, link in ours.items())


def _namespaces(pid_dir: str) -> dict[str, str]:
    # Plain strings, not Paths: this runs for every process of the host, and pathlib's joins
    # cost more than the system calls.
    return {kind: os.readlink(f"{pid_dir}/ns/{kind}") for kind in NAMESPACES}


def real_uid(status: str) -> int | None:
    """The real uid in the text of `/proc/PID/status`, or None."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


@dataclass(frozen=True)
class Holders:
    """Processes holding a socket (pids): one in our PID and user namespaces, and one in another (a sandbox)."""

    ours: int | None = None
    sandboxed: int | None = None


def socket_holders(
    inodes: Collection[int], uid: int, proc: Path = PROC, *, supervisor: int | None = None
) -> dict[int, Holders]:
    """For each socket inode, a process in our namespaces and one in another that hold it (or None).

    One walk of the processes answers for all the sockets. Every sandboxed process's descriptors
    are read; among ours, only until each socket has a holder, highest pid first (clients are mostly
    young, daemons with many files old). A process that leaves while it is looked at holds nothing. One
    the kernel will not let us inspect is another user's, or one of `uid`'s that made itself
    non-dumpable. The sockets are `uid`'s, so such a process descending from `supervisor` (by
    default our parent, mcpvisor's supervisor) could be a sandboxed holder hiding its descriptors,
    and the answer is "unknown" (PeerUnknown). One of `uid`'s elsewhere (ssh-agent, gpg-agent) is
    no sandbox of ours and is passed over: see `descends_from` for why a sandbox cannot be there.
    """
    root = os.getppid() if supervisor is None else supervisor
    try:
        ours = _namespaces(f"{proc}/self")
        pids = sorted((int(entry) for entry in os.listdir(proc) if entry.isdigit()), reverse=True)
    except OSError as exc:
        raise PeerUnknown(f"the processes of this host cannot be listed here ({exc.strerror})") from None
    wanted = {socket_link(inode): inode for inode in inodes}
    held_by_ours: dict[int, int] = {}
    held_inside: dict[int, int] = {}
    for pid in pids:
        pid_dir = f"{proc}/{pid}"
        try:
            inside = other_namespace(ours, _namespaces(pid_dir))
            if not inside and len(held_by_ours) == len(wanted):
                continue  # each socket has a holder of ours: only sandboxed ones are still looked into
            descriptors = os.listdir(f"{pid_dir}/fd")
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone meanwhile
        except OSError as exc:
            gone = not os.path.exists(pid_dir) or _exited(proc, pid)
            if gone or (isinstance(exc, PermissionError) and _passed_over(pid, uid, root, proc)):
                continue
            raise PeerUnknown(f"process {pid}'s namespaces or descriptors cannot be read ({exc.strerror})") from None
        held = held_inside if inside else held_by_ours
        for descriptor in descriptors:
            try:
                inode = wanted.get(os.readlink(f"{pid_dir}/fd/{descriptor}"))
            except OSError:
                continue  # closed meanwhile
            if inode is not None:
                held.setdefault(inode, pid)
    if supervisor is None and os.getppid() != root:
        # The supervisor left during the walk: its sandboxes may have been adopted elsewhere.
        raise PeerUnknown("mcpvisor's supervisor exited while the processes were looked through")
    return {inode: Holders(ours=held_by_ours.get(inode), sandboxed=held_inside.get(inode)) for inode in inodes}


def _exited(proc: Path, pid: int) -> bool:
    """Whether `pid` has exited and waits to be reaped: the kernel closed its descriptors at exit.

    Such a process (a zombie) holds no socket, and it may no longer be inspected: a sandbox's
    first process, gone and not yet reaped by bwrap, answers "Permission denied". A first thread
    that ended while others of its process run shows as a zombie too, and those others still hold
    the descriptors: only a zombie that is its process's last thread counts as exited.
    """
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as file:
            state = file.read().rpartition(")")[2].split()[:1]
        with open(f"{proc}/{pid}/status", encoding="utf-8", errors="replace") as file:
            threads = [line.split()[1:2] for line in file if line.startswith("Threads:")]
    except OSError:
        return False
    return state in (["Z"], ["X"]) and threads == [["1"]]


def _passed_over(pid: int, uid: int, root: int, proc: Path) -> bool:
    """Whether a process we may not inspect can be no holder of `uid`'s sockets we must know of."""
    owner = _real_uid_of(f"{proc}/{pid}")
    if owner is None:
        return False
    if owner != uid:
        return True  # another user's: the sockets are `uid`'s, and our sandboxes run as `uid`
    return descends_from(pid, root, functools.partial(read_lineage, proc)) is not True


def read_lineage(proc: Path, pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of process `pid` from `/proc/PID/stat`; None once it has left.

    Readable for every process, non-dumpable ones too. PeerUnknown when it cannot be read.
    """
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as file:
            text = file.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        raise PeerUnknown(f"process {pid}'s parent cannot be read ({exc.strerror})") from None
    found = parent_and_start(text)
    if found is None:
        raise PeerUnknown(f"process {pid}'s parent cannot be read (unexpected /proc/{pid}/stat)")
    return found


def parent_and_start(stat: str) -> tuple[int, int] | None:
    """(ppid, start time in clock ticks) in the text of `/proc/PID/stat`, or None."""
    # pid (comm) state ppid ... starttime is the 22nd field; comm may hold spaces and parentheses.
    fields = stat.rpartition(")")[2].split()
    if len(fields) < 20 or not fields[1].isdigit() or not fields[19].isdigit():
        return None
    return int(fields[1]), int(fields[19])


# A line of parents longer than this is not followed (a sandbox can fork one that deep, and is
# then refused); a climb the tree keeps changing under is tried this many times.
MAX_DEPTH: Final = 4096
CLIMBS: Final = 3


def descends_from(pid: int, ancestor: int, lineage: Callable[[int], tuple[int, int] | None]) -> bool | None:
    """Whether process `pid` is `ancestor` or descends from it; None once `pid` has left.

    `lineage(pid)` is (parent pid, start time), None for a process that has left. This is why
    every sandboxed process descends from the supervisor: bwrap is started by a worker (or, for a
    script, the frontend), both the supervisor's children, and its sandbox is a PID namespace of
    its own that no process inside can leave. An orphan there is adopted by a subreaper or the
    namespace's init, both inside, and when that init dies the kernel kills the namespace; one
    outside it (bwrap, the worker) is adopted by the nearest subreaper above, at worst the
    supervisor. Adoption only ever moves a process up its own line, so none of our tree leaves it
    while the supervisor lives (socket_holders checks that it did), and none from elsewhere enters.

    What can mislead is a pid reused while the line is followed: the parent read may already be
    another process with the dead parent's pid. So a parent counts only once its child is seen to
    have kept it (same parent, same start time) after the parent was read: a child's parent changes
    only when that parent exits, so it lived all along and its pid was no other process's. When
    the tree changes under the climb, it starts again; PeerUnknown once it keeps changing.
    """
    for _climb in range(CLIMBS):
        facts = lineage(pid)
        if facts is None:
            return None
        child = pid
        for _step in range(MAX_DEPTH):
            if child == ancestor:
                return True
            parent = facts[0]
            if parent == 0:
                return False  # the root of the PID namespace (init, kthreadd), and no ancestor met
            parent_facts = lineage(parent)
            if parent_facts is None or lineage(child) != facts:
                break  # a parent left meanwhile: its children were adopted, climb again
            child, facts = parent, parent_facts
        else:
            raise PeerUnknown(f"process {pid}'s line of parents is deeper than {MAX_DEPTH}")
    raise PeerUnknown(f"process {pid}'s line of parents kept changing while it was followed")


def _real_uid_of(pid_dir: str) -> int | None:
    try:
        return real_uid(Path(pid_dir, "status").read_text(encoding="ascii", errors="replace"))
    except OSError:
        return None
