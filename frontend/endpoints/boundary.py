"""What every HTTP request passes before any endpoint sees it: who is asking, and a body that is sane JSON.

Two checks, both cheap and both answered here with a clear 4xx:
- who: with tenants or an issuer, a bearer token (frontend/endpoints/auth.py; 401 otherwise);
  on a loopback listener without them, the connection must come from the user running
  mcpvisor or root (frontend/endpoints/peer.py), and, where any server is sandboxed, held by a
  process outside every sandbox (whose processes run as that same user). The principal is left
  in the scope;
- a JSON body sent to an MCP endpoint must be there, be UTF-8, hold no lone UTF-16 surrogate,
  nest at most MAX_DEPTH levels and fit in the body limit. Past this boundary the SDK and the fast
  path never meet such a body, so none of it can become a 500 or an internal error.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import os
from collections.abc import Callable
from typing import Any, Final

import msgspec
import trio

from mcpvisor.frontend.endpoints.auth import (
    PRINCIPAL_KEY,
    PUBLIC_PATHS,
    WORKSTATION,
    Authenticator,
    InvalidToken,
    bearer_token,
)
from mcpvisor.frontend.endpoints.http_server import CONNECTION_KEY, Receive, Scope, Send
from mcpvisor.frontend.endpoints.peer import Holders, PeerUnknown, owner_uids, peer_socket, peer_uid, socket_holders
from mcpvisor.store.state_url import StateStoreError

log = logging.getLogger(__name__)


# Levels of arrays and objects in one request, the JSON-RPC envelope included. Tool arguments
# nest a handful of levels; a few hundred make parsers recurse until they fail.
MAX_DEPTH: Final = 64
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
BODY_KEY: Final = "mcpvisor.body"  # the JSON body the boundary read, for the tenant limits
_PEER_UID: Final = "peer_uid"
_SANDBOXED: Final = -1  # in place of a uid: the connection comes from inside a sandbox


class Boundary:
    """Admits a request (returning the `receive` to go on with) or answers it with a 4xx (returning None)."""

    def __init__(
        self,
        *,
        local_users_only: bool,
        max_body: int,
        authenticator: Authenticator | None = None,
        sandboxed: Callable[[], bool] = lambda: False,
    ) -> None:
        self.local_users_only = local_users_only
        # Whether some server runs in a sandbox now (the config can change): only then is a
        # connection's socket looked for among sandboxed processes, which costs a walk of /proc.
        self.sandboxed = sandboxed
        self.max_body = max_body
        self.authenticator = authenticator
        self._allowed_uids = owner_uids()
        self._holders = HolderSearch(os.getuid())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        if self.authenticator is None:
            if self.local_users_only and (refusal := await self._refuse_peer(scope)) is not None:
                await send_json(send, 403, {"error": "forbidden", "message": refusal})
                return None
            scope[PRINCIPAL_KEY] = WORKSTATION
        elif scope["path"].startswith(PUBLIC_PATHS):
            # Anyone may ask; a token that admits its bearer shows an operator more (/healthz).
            if bearer_token(scope) is not None:
                with contextlib.suppress(InvalidToken, StateStoreError):
                    scope[PRINCIPAL_KEY] = await self.authenticator.principal(scope)
        else:
            try:
                scope[PRINCIPAL_KEY] = await self.authenticator.principal(scope)
            except InvalidToken as exc:
                body = {"error": "invalid_token" if exc.given else "unauthorized", "error_description": exc.message}
                challenge = self.authenticator.challenge(exc.message if exc.given else None)
                await send_json(send, 401, body, headers=[(b"www-authenticate", challenge)])
                return None
            except StateStoreError as exc:
                # Tokens live in the shared store: without it no token can be checked, so none admits.
                log.error("cannot check a token: %s", exc)
                message = "the state store cannot be reached to check the token; try again shortly"
                await send_json(
                    send, 503, {"error": "unavailable", "message": message}, headers=[(b"retry-after", b"2")]
                )
                return None
        if scope["method"] != "POST" or not scope["path"].startswith("/mcp"):
            return receive
        # A body declared too large is refused before anything waits for it, whatever its type.
        if self._declared_too_large(scope):
            await self._refuse_too_large(send)
            return None
        if not _is_json(scope):
            return receive
        body = await self._read_body(receive)
        if body is None:
            await self._refuse_too_large(send)
            return None
        if (problem := check_json(body)) is not None:
            await send_json(send, 400, _rpc_error(*problem))
            return None
        scope[BODY_KEY] = body
        return replay(body, receive)

    async def _refuse_peer(self, scope: Scope) -> str | None:
        """Why this connection may not be served (one line), or None."""
        unknown = "This mcpvisor serves only the local user running it, and cannot tell who opened this connection"
        client, server = scope.get("client"), scope.get("server")
        if not client or not server:
            return f"{unknown}."
        # A connection's owner cannot change: asked once per connection where the listener keeps
        # its facts (http_server.py), else for every request. Never across connections: a port is
        # reused by the next one, possibly another user's. Kept for the connection, an admission
        # was made while a process outside every sandbox held its socket: a sandbox can hold it
        # later only from that process's hand. A refusal for want of a holder is asked again.
        facts = scope.get(CONNECTION_KEY)
        uid = facts.get(_PEER_UID) if facts is not None else None
        if uid is None:
            try:
                uid = await self._owner((client[0], int(client[1])), (server[0], int(server[1])))
            except PeerUnknown as exc:
                log.warning("refused a connection from %s:%s: %s", client[0], client[1], exc)
                return f"{unknown}: {exc}."
            if facts is not None:
                facts[_PEER_UID] = uid
        if uid == _SANDBOXED:
            return (
                "This mcpvisor serves only the local user running it and root; this connection comes from "
                "inside a server's sandbox, which may not call mcpvisor."
            )
        if uid in self._allowed_uids:
            return None
        log.info("refused a connection from local uid %d", uid)
        return (
            f"This mcpvisor serves only the local user running it (uid {os.getuid()}) and root; "
            f"this connection belongs to uid {uid}."
        )

    async def _owner(self, client: tuple[str, int], server: tuple[str, int]) -> int:
        """The connection's uid, or _SANDBOXED when a process in a sandbox holds its client end."""
        if not self.sandboxed():
            return peer_uid(client, server)
        uid, inode = peer_socket(client, server)
        # Run by an ordinary user, a sandbox's processes run as that uid (workers/confine.py); run
        # by root, each sandbox has a uid of its own, never 0, refused as another user's. So only
        # our own non-root uid can hide a sandbox (and root may lack CAP_SYS_PTRACE to look).
        if uid != os.getuid() or uid == 0:
            return uid
        holders = await self._holders.find(inode)
        if holders.sandboxed is not None:
            log.info(
                "refused a connection from local uid %d held by process %d inside a sandbox", uid, holders.sandboxed
            )
            return _SANDBOXED
        if holders.ours is None:
            # Sent over a UNIX socket and closed, a socket is in no process's hands: a sandbox's
            # request must not pass for the user's that way.
            raise PeerUnknown("no process outside a sandbox holds its socket")
        return uid

    def _declared_too_large(self, scope: Scope) -> bool:
        return any(
            name.lower() == b"content-length" and value.strip().isdigit() and int(value) > self.max_body
            for name, value in scope["headers"]
        )

    async def _refuse_too_large(self, send: Send) -> None:
        await send_json(send, 413, _rpc_error(INVALID_REQUEST, f"Request body larger than {self.max_body} bytes"))

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None when it is larger than the limit (read no further than that)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away; what was read is what there is
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        return b"".join(chunks)


class HolderSearch:
    """Finds who holds connections' sockets: one walk of /proc at a time, in a worker thread.

    A walk reads every sandboxed process's descriptors, which a sandbox can make thousands: in a
    thread it delays only the connections waiting on it, never the event loop. And a walk looks
    for every socket whose connection waits when it starts, so a flood of connections costs one
    or two walks for all of them, not one each.
    """

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self._lock = trio.Lock()
        self._next = _Walk()

    async def find(self, inode: int) -> Holders:
        """Who holds the socket `inode`, as the next walk finds it; PeerUnknown when it cannot tell."""
        walk = self._next
        walk.inodes.add(inode)
        async with self._lock:
            if walk is self._next:  # not walked yet: this task runs it for all who joined
                self._next = _Walk()
                try:
                    walk.found = await trio.to_thread.run_sync(socket_holders, frozenset(walk.inodes), self.uid)
                except PeerUnknown as exc:
                    walk.failure = str(exc)
        if walk.found is None:
            raise PeerUnknown(walk.failure)
        return walk.found[inode]


class _Walk:
    """The sockets one walk looks for, and what it found."""

    def __init__(self) -> None:
        self.inodes: set[int] = set()
        self.found: dict[int, Holders] | None = None
        self.failure = "the processes holding its socket could not be looked through"


def _is_json(scope: Scope) -> bool:
    """Bodies of other types are left to the endpoint, which refuses them with 415."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


def check_json(body: bytes) -> tuple[int, str] | None:
    """(JSON-RPC code, message) for a body no endpoint should see, or None for one that may pass."""
    if not body.strip():
        return PARSE_ERROR, "Parse error: the request body is empty; send one JSON-RPC message"
    try:
        # msgspec refuses lone UTF-16 surrogates in strings, which Python's json accepts and which
        # then fail wherever the text is encoded again.
        value = msgspec.json.decode(body)
    except UnicodeDecodeError:
        return PARSE_ERROR, "Parse error: the request body is not valid UTF-8"
    except RecursionError:
        return INVALID_REQUEST, f"Invalid request: JSON nested deeper than {MAX_DEPTH} levels"
    except msgspec.DecodeError as exc:
        return PARSE_ERROR, f"Parse error: {exc}"
    if _bracket_depth(body) > MAX_DEPTH and _depth_exceeds(value, MAX_DEPTH):
        return INVALID_REQUEST, f"Invalid request: JSON nested deeper than {MAX_DEPTH} levels"
    return None


# Opening brackets become 2, closing ones 0, everything else is dropped.
_BRACKETS: Final = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKETS: Final = bytes(set(range(256)) - set(b"[{]}"))


def _bracket_depth(body: bytes) -> int:
    """How deep the brackets of `body` nest, those inside strings counted too: at least the JSON's depth.

    Computed by C iterators, so a wide body with many shallow brackets costs little; only one
    over the limit by this bound is walked exactly (brackets inside strings do not nest JSON).
    """
    steps = body.translate(_BRACKETS, _NOT_BRACKETS)
    # After the i-th bracket the depth is (opening brackets so far) - (closing ones) = sum - i.
    return max(map(operator.sub, itertools.accumulate(steps), itertools.count(1)), default=0)


def _depth_exceeds(value: object, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels in `value`."""
    pending: list[tuple[object, int]] = [(value, 1)]
    containers = (dict, list)
    while pending:
        item, depth = pending.pop()
        if depth > limit:
            return True
        children: Any = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, containers):
                pending.append((child, depth + 1))
    return False


def _rpc_error(code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}


async def send_json(send: Send, status: int, body: object, *, headers: list[tuple[bytes, bytes]] = ()) -> None:
    data = msgspec.json.encode(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields an already-read body first, then whatever comes after it."""
    sent = False

    async def replayed() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
