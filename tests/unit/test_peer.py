"""Who is connecting (the kernel's socket table), who may, and which bodies pass the request boundary."""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import socket
import stat
import struct
import sys
import threading
from pathlib import Path

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from mcpvisor.frontend.endpoints import boundary
from mcpvisor.frontend.endpoints.boundary import INVALID_REQUEST, MAX_DEPTH, PARSE_ERROR, check_json
from mcpvisor.frontend.endpoints.http_server import CONNECTION_KEY
from mcpvisor.frontend.endpoints.peer import (
    Holders,
    PeerUnknown,
    descends_from,
    other_namespace,
    parent_and_start,
    parse_diag_answer,
    peer_socket,
    peer_uid,
    real_uid,
    socket_holders,
    socket_link,
)
from mcpvisor.runtime import logs
from mcpvisor.runtime.trust import exposure_problem, exposure_warning, is_loopback, local_users_only
from mcpvisor.store.state_db import open_state_db
from mcpvisor.supervisor import configstore
from mcpvisor.wire.config import Settings

linux_only = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc/net/tcp")


@linux_only
@pytest.mark.parametrize("netlink", [True, False], ids=["sock_diag", "proc-tables"])
@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_a_loopback_connection_is_traced_to_the_user_who_opened_it(family: int, host: str, netlink: bool) -> None:
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    with socket.socket(family) as listener:
        try:
            listener.bind((host, 0))
        except OSError:
            pytest.skip(f"cannot bind {host} here")
        listener.listen()
        with socket.socket(family) as client:
            client.connect(listener.getsockname()[:2])
            accepted, _ = listener.accept()
            with accepted:
                # As the server sees it: the peer is the client, the local end is ours.
                peer, ours = accepted.getpeername()[:2], accepted.getsockname()[:2]
                assert peer_uid(peer, ours, netlink=netlink) == os.getuid()
                # A port off by one is another connection, which does not exist: refused, never guessed.
                with pytest.raises(PeerUnknown):
                    peer_uid((peer[0], peer[1] + 1), ours, netlink=netlink)


@linux_only
@pytest.mark.parametrize("netlink", [True, False], ids=["sock_diag", "proc-tables"])
def test_an_ipv4_client_of_a_dual_stack_listener_is_found_under_its_ipv4_address(netlink: bool) -> None:
    with socket.socket(socket.AF_INET6) as listener:
        try:
            listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            listener.bind(("::", 0))
        except OSError:
            pytest.skip("no dual-stack sockets here")
        listener.listen()
        with socket.socket(socket.AF_INET) as client:
            client.connect(("127.0.0.1", listener.getsockname()[1]))
            accepted, _ = listener.accept()
            with accepted:
                peer, ours = accepted.getpeername()[:2], accepted.getsockname()[:2]
                assert peer[0] == "::ffff:127.0.0.1"
                assert peer_uid(peer, ours, netlink=netlink) == os.getuid()


def _row(local: str, remote: str, uid: int) -> str:
    return f"   0: {local} {remote} 01 00000000:00000000 00:00000000 00000000 {uid:5d}        0 12345 1\n"


def _hex4(ip: str, port: int) -> str:
    return f"{int.from_bytes(socket.inet_aton(ip), sys.byteorder):08X}:{port:04X}"


def test_the_row_is_the_clients_end_not_the_servers(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    client, server = ("127.0.0.1", 40000), ("127.0.0.1", 8080)
    table.write_text(
        header
        + _row(_hex4(*server), _hex4(*client), 0)  # the server's end of the same connection
        + _row(_hex4(*client), _hex4(*server), 65534)
    )
    assert peer_uid(client, server, (table,), netlink=False) == 65534


def test_unknown_connections_and_missing_tables_fail_closed(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text("  sl  local_address rem_address\n")
    with pytest.raises(PeerUnknown, match="not in the kernel's socket table"):
        peer_uid(("127.0.0.1", 1), ("127.0.0.1", 2), (table,))
    with pytest.raises(PeerUnknown, match="cannot be read"):
        peer_uid(("127.0.0.1", 1), ("127.0.0.1", 2), (tmp_path / "missing" / "tcp",), netlink=False)
    with pytest.raises(PeerUnknown, match="not IP addresses"):
        peer_uid(("unix-socket", 1), ("127.0.0.1", 2), (table,))


@pytest.mark.parametrize(
    "host,loopback",
    [("127.0.0.1", True), ("127.0.0.5", True), ("localhost", True), ("::1", True), ("[::1]", True),
     ("0.0.0.0", False), ("::", False), ("192.0.2.10", False), ("example.org", False)],
)  # fmt: skip
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_network_listen_address_needs_authentication_or_an_explicit_opt_out() -> None:
    local = Settings(listen="127.0.0.1:8080")
    assert exposure_problem(local) is None and exposure_warning(local) is None
    assert local_users_only(local)
    exposed = Settings(listen="0.0.0.0:8080")
    problem = exposure_problem(exposed)
    assert problem is not None and "allow_unauthenticated_network" in problem and "\n" not in problem
    assert not local_users_only(exposed)
    opted_out = Settings(listen="0.0.0.0:8080", allow_unauthenticated_network=True)
    assert exposure_problem(opted_out) is None
    warning = exposure_warning(opted_out)
    assert warning is not None and "allow_unauthenticated_network" in warning


@pytest.mark.parametrize(
    "body,code,words",
    [
        (b"", PARSE_ERROR, "empty"),
        (b"  \n", PARSE_ERROR, "empty"),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"\xff\xfe"}}', PARSE_ERROR, "UTF-8"),
        (rb'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"\ud800"}}', PARSE_ERROR, "Parse error"),
        (rb'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"\udc00"}}', PARSE_ERROR, "surrogate"),
        (rb'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"\ud800":1}}', PARSE_ERROR, "Parse error"),
        (b'{"a":' + b"[" * 999 + b"]" * 999 + b"}", INVALID_REQUEST, "nested deeper"),
        (b"[" * 5000 + b"]" * 5000, INVALID_REQUEST, "nested deeper"),
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), INVALID_REQUEST, "nested deeper"),
        (b"{not json", PARSE_ERROR, "Parse error"),
    ],
)
def test_bodies_no_endpoint_should_see_are_named(body: bytes, code: int, words: str) -> None:
    problem = check_json(body)
    assert problem is not None
    assert problem[0] == code
    assert words in problem[1]


@pytest.mark.parametrize(
    "body",
    [
        rb'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e","arguments":{"t":"\ud83d\ude00 ok"}}}',
        '{"t": "caf\u00e9 \u4e2d\u6587"}'.encode(),
        b"[" * MAX_DEPTH + b"]" * MAX_DEPTH,
        b"[" + b"[1]," * 500 + b"[2]]",  # many brackets, shallow
        b'{"code": "' + b"[" * 200 + b'"}',  # brackets in a string do not nest anything
        rb'{"t": "\\ud800 is only text here"}',
    ],
)
def test_ordinary_bodies_pass(body: bytes) -> None:
    assert check_json(body) is None


def test_a_runtime_config_write_keeps_the_files_mode_and_its_bak_too(tmp_path: Path) -> None:
    config = tmp_path / "mcpvisor.toml"
    config.write_text('[servers.a]\ncommand = "x"\n')
    config.chmod(0o600)
    (tmp_path / "mcpvisor.toml.bak").write_text("old\n")
    (tmp_path / "mcpvisor.toml.bak").chmod(0o644)
    configstore.write_atomic(config, '[servers.a]\ncommand = "y"\n')
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "mcpvisor.toml.bak").stat().st_mode) == 0o600
    assert (tmp_path / "mcpvisor.toml.bak").read_text() == '[servers.a]\ncommand = "x"\n'
    config.chmod(0o640)
    configstore.write_atomic(config, '[servers.a]\ncommand = "z"\n')
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    fresh = tmp_path / "new.toml"
    configstore.write_atomic(fresh, "")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


def test_a_temp_file_left_by_a_killed_write_is_removed(tmp_path: Path) -> None:
    config = tmp_path / "mcpvisor.toml"
    configstore.temp_path(config).write_text('headers = { Authorization = "Bearer half-written" }\n')
    configstore.remove_stale_temp(config)
    assert not configstore.temp_path(config).exists()
    configstore.remove_stale_temp(config)  # nothing left: nothing to do


def test_log_files_and_the_directories_made_for_them_are_private(tmp_path: Path) -> None:
    sink = logs.RotatingFile(tmp_path / "data" / "logs" / "x.log", max_bytes=10)
    sink.write(b"0123456789\n")
    sink.write(b"more\n")  # rotates: the new file is created too
    sink.close()
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "data" / "logs").stat().st_mode) == 0o700
    for name in ("x.log", "x.log.1"):
        assert stat.S_IMODE((tmp_path / "data" / "logs" / name).stat().st_mode) == 0o600


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_state_store_and_its_wal_files_are_private(tmp_path: Path) -> None:
    db = open_state_db(str(tmp_path / "data"))
    try:
        db.execute(
            "INSERT INTO calls (id, time, server, tool, variant, outcome, duration_ms) VALUES (1, 0, 's', 't', 'read', 'ok', 1.0)"
        )
        assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
        for name in ("state.sqlite", "state.sqlite-wal", "state.sqlite-shm"):
            assert stat.S_IMODE((tmp_path / "data" / name).stat().st_mode) == 0o600, name
    finally:
        db.close()


def test_files_an_earlier_version_left_open_to_others_are_narrowed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "logs").mkdir(parents=True)
    for name in ("state.sqlite-wal", "logs/x.log"):
        (data / name).write_bytes(b"")
        (data / name).chmod(0o644)
    logs.RotatingFile(data / "logs" / "x.log").close()
    open_state_db(str(data)).close()
    assert _mode(data / "logs" / "x.log") == 0o600
    assert _mode(data / "state.sqlite") == 0o600


async def test_the_boundary_asks_who_is_connecting_once_per_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, int]] = []

    def owner(client: tuple[str, int], server: tuple[str, int]) -> int:
        asked.append(client)
        return os.getuid() if client[1] != 2 else 65534

    monkeypatch.setattr(boundary, "peer_uid", owner)
    gate = boundary.Boundary(local_users_only=True, max_body=1024)
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    def scope(port: int, facts: dict[str, object] | None) -> dict[str, object]:
        request = {"method": "GET", "path": "/healthz", "headers": [], "client": ("127.0.0.1", port)}
        request["server"] = ("127.0.0.1", 80)
        if facts is not None:
            request[CONNECTION_KEY] = facts
        return request

    first, second = {}, {}
    for facts, port in ((first, 1), (first, 1), (second, 2), (second, 2), (None, 1), (None, 1)):
        admitted = await gate(scope(port, facts), receive, send)
        assert (admitted is None) == (port == 2)
    # Once for each listener connection (the second one another user's, refused twice), then on
    # every request where the listener keeps no facts (hypercorn's connections).
    assert asked == [("127.0.0.1", 1), ("127.0.0.1", 2), ("127.0.0.1", 1), ("127.0.0.1", 1)]
    assert [message["status"] for message in sent if "status" in message] == [403, 403]


async def test_where_a_server_is_sandboxed_a_connection_held_inside_a_sandbox_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "getuid", lambda: 1000)  # an ordinary user's workstation
    scanned: list[int] = []

    def holders(inodes: list[int], uid: int) -> dict[int, Holders]:
        (inode,) = inodes
        scanned.append(inode)
        if inode == 3:
            raise PeerUnknown("process 9's namespaces or descriptors cannot be read (Permission denied)")
        # 1: the user's client; 2: a sandbox's; 4: in no process's hands (sent over a UNIX socket);
        # 5: the user's client and a sandbox both.
        found = {1: Holders(ours=100), 2: Holders(sandboxed=4242), 5: Holders(ours=100, sandboxed=4242)}
        return {inode: found.get(inode, Holders())}

    # The client's port stands for its socket's inode here.
    monkeypatch.setattr(boundary, "peer_socket", lambda client, server: (1000, client[1]))
    monkeypatch.setattr(boundary, "peer_uid", lambda client, server: 1000)
    monkeypatch.setattr(boundary, "socket_holders", holders)
    sandboxes = [True]
    gate = boundary.Boundary(local_users_only=True, max_body=1024, sandboxed=lambda: sandboxes[0])
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    def scope(port: int) -> dict[str, object]:
        return {
            "method": "GET",
            "path": "/healthz",
            "headers": [],
            "client": ("127.0.0.1", port),
            "server": ("127.0.0.1", 80),
            CONNECTION_KEY: {},
        }

    assert await gate(scope(1), receive, send) is not None  # the user's own client
    assert await gate(scope(2), receive, send) is None  # held inside a sandbox
    assert b"inside a server's sandbox" in sent[-1]["body"]  # type: ignore[operator]
    assert await gate(scope(3), receive, send) is None  # cannot tell: refused
    assert b"cannot tell who opened this connection" in sent[-1]["body"]  # type: ignore[operator]
    assert await gate(scope(4), receive, send) is None  # held by no one: nothing shows it is the user's
    assert b"no process outside a sandbox holds its socket" in sent[-1]["body"]  # type: ignore[operator]
    assert await gate(scope(5), receive, send) is None
    assert b"inside a server's sandbox" in sent[-1]["body"]  # type: ignore[operator]
    assert [message["status"] for message in sent if "status" in message] == [403] * 4
    # No sandbox configured: no scan at all, the plain workstation path.
    sandboxes[0] = False
    assert await gate(scope(2), receive, send) is not None
    assert scanned == [1, 2, 3, 4, 5]


async def test_a_slow_walk_of_the_processes_leaves_the_event_loop_free_and_answers_all_who_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "getuid", lambda: 1000)  # an ordinary user's workstation
    release = threading.Event()
    walks: list[set[int]] = []

    def holders(inodes: list[int], uid: int) -> dict[int, Holders]:
        walks.append(set(inodes))
        if len(walks) == 1:
            release.wait(30)  # a sandbox with thousands of descriptors: the first walk is slow
        return {inode: Holders(ours=100) for inode in inodes}

    # The client's port stands for its socket's inode; port 99 is root's client, which needs no walk.
    monkeypatch.setattr(boundary, "peer_socket", lambda client, server: (0 if client[1] == 99 else 1000, client[1]))
    monkeypatch.setattr(boundary, "socket_holders", holders)
    gate = boundary.Boundary(local_users_only=True, max_body=1024, sandboxed=lambda: True)
    admitted: list[int] = []

    async def send(message: dict[str, object]) -> None:
        pass

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def connect(port: int) -> None:
        scope = {"method": "GET", "path": "/healthz", "headers": [], CONNECTION_KEY: {}}
        scope.update(client=("127.0.0.1", port), server=("127.0.0.1", 80))
        if await gate(scope, receive, send) is not None:
            admitted.append(port)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(connect, 1)
        await wait_all_tasks_blocked()  # the first walk is under way
        for port in range(2, 12):  # a flood of connections meanwhile
            nursery.start_soon(connect, port)
        await wait_all_tasks_blocked()
        # The event loop still serves: root's client is answered while the walk goes on.
        await connect(99)
        assert admitted == [99]
        release.set()
    # The flood cost one more walk, which answered all of it.
    assert walks == [{1}, set(range(2, 12))]
    assert sorted(admitted) == [1, *range(2, 12), 99]


def test_the_table_row_gives_the_sockets_inode_too(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    client, server = ("127.0.0.1", 40000), ("127.0.0.1", 8080)
    table.write_text("  sl  local_address rem_address\n" + _row(_hex4(*client), _hex4(*server), 1000))
    assert peer_socket(client, server, (table,), netlink=False) == (1000, 12345)


def test_a_sock_diag_answer_gives_uid_and_inode_and_an_error_is_no_answer() -> None:
    # nlmsghdr, then inet_diag_msg: family, state, timer, retrans, sockid (48 bytes), expires,
    # rqueue, wqueue, uid, inode.
    body = struct.pack("=BBBB48xIIIII", socket.AF_INET, 1, 0, 0, 0, 0, 0, 1000, 987654)
    answer = struct.pack("=IHHII", 16 + len(body), 20, 0, 1, 0) + body
    assert parse_diag_answer(answer) == (1000, 987654)
    missing = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -errno.ENOENT) + bytes(16)
    assert parse_diag_answer(missing) is None
    refused = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -errno.EPERM) + bytes(16)
    with pytest.raises(OSError):
        parse_diag_answer(refused)
    with pytest.raises(OSError, match="unexpected"):
        parse_diag_answer(answer[:-4])


@linux_only
def test_the_kernels_inode_is_the_one_the_clients_descriptor_names() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.socket() as client:
            client.connect(listener.getsockname())
            accepted, _ = listener.accept()
            with accepted:
                peer, ours = accepted.getpeername(), accepted.getsockname()
                link = os.readlink(f"/proc/self/fd/{client.fileno()}")
                for netlink in (True, False):
                    uid, inode = peer_socket(peer, ours, netlink=netlink)
                    assert (uid, socket_link(inode)) == (os.getuid(), link)


def _process(
    proc: Path, pid: str, namespaces: dict[str, str], links: list[str], uid: int = 1000, parent: int = 1
) -> None:
    (proc / pid / "ns").mkdir(parents=True)
    (proc / pid / "fd").mkdir()
    for kind, target in namespaces.items():
        (proc / pid / "ns" / kind).symlink_to(target)
    for n, target in enumerate(links):
        (proc / pid / "fd" / str(n)).symlink_to(target)
    (proc / pid / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (proc / pid / "stat").write_text(_stat(pid, "x", parent, 100))


def _stat(pid: str, name: str, parent: int, start: int) -> str:
    """A `/proc/PID/stat` line: pid (comm) state ppid, then fields up to starttime (the 22nd) and on."""
    return f"{pid} ({name}) S {parent} " + "0 " * 17 + f"{start} 0 0\n"


HOST_NS = {"pid": "pid:[4026531836]", "user": "user:[4026531837]"}


def test_the_holders_of_sockets_inside_and_outside_other_namespaces_are_found(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _process(proc, "self", HOST_NS, [])
    _process(proc, "10", HOST_NS, ["socket:[111]", "/dev/null", "socket:[555]"])
    _process(proc, "11", HOST_NS, ["socket:[111]"])  # one holder of ours is enough: the highest pid
    _process(proc, "20", {**HOST_NS, "pid": "pid:[4026532001]"}, ["pipe:[5]", "socket:[222]"])
    _process(proc, "30", {**HOST_NS, "user": "user:[4026532002]"}, ["socket:[333]", "socket:[555]"])
    (proc / "net").mkdir()  # not a process
    assert socket_holders([111, 222, 333, 444, 555, 0], 1000, proc) == {
        111: Holders(ours=11),
        222: Holders(sandboxed=20),
        333: Holders(sandboxed=30),
        444: Holders(),  # in no process's hands (in transit over a UNIX socket, say)
        555: Holders(ours=10, sandboxed=30),
        0: Holders(),
    }
    with pytest.raises(PeerUnknown, match="cannot be listed"):
        socket_holders([222], 1000, tmp_path / "nothing")


def _hidden(monkeypatch: pytest.MonkeyPatch, *pids: str) -> None:
    """Make these fake processes answer as the kernel does for one we may not trace (tests run as root)."""
    readlink, listdir = os.readlink, os.listdir

    def refused(path: str) -> None:
        if any(f"/{pid}/" in str(path) or str(path).endswith(f"/{pid}/fd") for pid in pids):
            raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "readlink", lambda path: refused(path) or readlink(path))
    monkeypatch.setattr(os, "listdir", lambda path: refused(path) or listdir(path))


def test_a_process_of_the_same_user_that_cannot_be_inspected_is_not_ruled_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "proc"
    _process(proc, "self", HOST_NS, [])
    _process(proc, "1", HOST_NS, [], uid=0, parent=0)
    _process(proc, "5", HOST_NS, [])  # mcpvisor's supervisor
    _process(proc, "10", HOST_NS, ["socket:[222]"])
    _process(proc, "30", HOST_NS, [], parent=5)  # bwrap, started by a worker
    _process(proc, "40", HOST_NS, [], uid=1000, parent=30)  # inside a sandbox, non-dumpable
    _hidden(monkeypatch, "40")
    with pytest.raises(PeerUnknown, match="process 40"):
        socket_holders([222], 1000, proc, supervisor=5)
    # Another user's process: the socket is uid 2000's, and that process is not one of them.
    assert socket_holders([222], 2000, proc, supervisor=5) == {222: Holders(ours=10)}
    # One that left meanwhile is no holder.
    shutil.rmtree(proc / "40")
    assert socket_holders([222], 1000, proc, supervisor=5) == {222: Holders(ours=10)}


def test_a_hidden_process_of_the_same_user_outside_mcpvisor_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "proc"
    _process(proc, "self", HOST_NS, [])
    _process(proc, "1", HOST_NS, [], uid=0, parent=0)
    _process(proc, "5", HOST_NS, [], parent=7)  # mcpvisor's supervisor, under the user's service manager
    _process(proc, "7", HOST_NS, [])  # the user's service manager
    _process(proc, "10", HOST_NS, ["socket:[222]"])
    _process(proc, "50", HOST_NS, [], parent=7)  # ssh-agent: non-dumpable, the supervisor's sibling
    _process(proc, "60", HOST_NS, [], parent=1)  # gpg-agent, daemonized
    _hidden(monkeypatch, "50", "60")
    assert socket_holders([222], 1000, proc, supervisor=5) == {222: Holders(ours=10)}
    # One whose parent cannot be read is not passed over.
    (proc / "60" / "stat").write_text("60 (gpg-agent")
    with pytest.raises(PeerUnknown, match="process 60's parent cannot be read"):
        socket_holders([222], 1000, proc, supervisor=5)


def test_a_process_that_exited_holds_nothing_even_when_it_cannot_be_inspected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "proc"
    _process(proc, "self", HOST_NS, [])
    _process(proc, "5", HOST_NS, [])  # mcpvisor's supervisor
    _process(proc, "10", HOST_NS, ["socket:[222]"])
    _process(proc, "20", {"pid": "pid:[1]", "user": "user:[2]"}, [], parent=5)  # a sandbox's first process
    _hidden(monkeypatch, "20")
    with pytest.raises(PeerUnknown, match="process 20's namespaces or descriptors cannot be read"):
        socket_holders([222], 1000, proc, supervisor=5)
    # Its first thread ended while another runs on (and holds the descriptors): not gone.
    (proc / "20" / "stat").write_text(_stat("20", "bwrap", 5, 100).replace(" S ", " Z ", 1))
    (proc / "20" / "status").write_text("Name:\tbwrap\nUid:\t1000\t1000\t1000\t1000\nThreads:\t2\n")
    with pytest.raises(PeerUnknown, match="process 20's namespaces or descriptors cannot be read"):
        socket_holders([222], 1000, proc, supervisor=5)
    # It exited, and bwrap has not reaped it yet.
    (proc / "20" / "status").write_text("Name:\tbwrap\nUid:\t1000\t1000\t1000\t1000\nThreads:\t1\n")
    assert socket_holders([222], 1000, proc, supervisor=5) == {222: Holders(ours=10)}


def test_a_line_of_parents_counts_only_as_the_kernel_kept_it() -> None:
    # 5 is the supervisor; 20 its child (bwrap), 30 a sandboxed process under it; 1 init.
    tree = {1: (0, 1), 5: (1, 50), 7: (1, 60), 20: (5, 200), 30: (20, 300), 40: (7, 400)}
    assert descends_from(30, 5, tree.get) is True
    assert descends_from(5, 5, tree.get) is True
    assert descends_from(40, 5, tree.get) is False
    assert descends_from(7, 5, tree.get) is False
    assert descends_from(99, 5, tree.get) is None  # gone

    # 20 exits while 30's line is followed: 30 is adopted by the supervisor (a subreaper) and pid
    # 20 is at once another process, outside. Read as found, 30 would seem to descend from init.
    now = dict(tree)

    def racing(pid: int) -> tuple[int, int] | None:
        if pid == 20 and now[30] == (20, 300):
            now.update({30: (5, 300), 20: (1, 900)})
        return now.get(pid)

    assert descends_from(30, 5, racing) is True

    # A tree that keeps changing under the climb, or a line no real tree has, is no answer.
    reads = itertools.count()
    with pytest.raises(PeerUnknown, match="kept changing"):
        descends_from(30, 5, lambda pid: (20 + next(reads) % 2, 300) if pid == 30 else tree[5])
    with pytest.raises(PeerUnknown, match="deeper than"):
        descends_from(30, 5, lambda pid: (pid, 0))


def test_stat_parsing() -> None:
    assert parent_and_start(_stat("42", "a) (b c", 7, 12345)) == (7, 12345)
    assert parent_and_start("42 (x) S") is None
    assert parent_and_start("42 (x) S y" + " 0" * 30) is None


def test_namespace_and_status_parsing() -> None:
    assert not other_namespace(HOST_NS, dict(HOST_NS))
    assert other_namespace(HOST_NS, {**HOST_NS, "user": "user:[1]"})
    assert other_namespace(HOST_NS, {"pid": HOST_NS["pid"]})
    assert real_uid("Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\n") == 1000
    assert real_uid("Name:\tbash\n") is None
