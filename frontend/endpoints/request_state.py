"""The `requestState` of 2026-07-28 rounds, sealed: a client gets it back as it got it, or not at all.

A call whose upstream asks the client something answers `input_required` with a `requestState`
(frontend/door/rounds.py keeps the waiting call under a random id); the client sends it back with
its answers. The client is untrusted, so the state it holds is signed (HMAC-SHA256 under a key of
this process), bound to the request it belongs to (method, the tool or URI, a digest of the
arguments) and to the credential that asked, and dated: anything else is refused with -32602
"Invalid or expired requestState", the reason going to the log only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Final

from mcpvisor.frontend.endpoints.rpc import INVALID_PARAMS, RpcError

log = logging.getLogger(__name__)

_PREFIX: Final = "v1."
_MAC_LENGTH: Final = 16


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:
        raise ValueError("not canonical base64url")
    return raw


def binding(method: str, params: dict[str, Any]) -> tuple[str, str]:
    """(target, arguments digest) of the request a state belongs to."""
    if method == "resources/read":
        target, arguments = str(params.get("uri", "")), {}
    else:
        target, arguments = str(params.get("name", "")), params.get("arguments") or {}
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True, separators=(",", ":")).encode()).digest()
    return target, _b64(digest[:16])


class StateSeal:
    """Seals and opens `requestState` values for the rounds of one frontend process."""

    def __init__(self, ttl: float, *, key: bytes | None = None, clock: Callable[[], float] = time.time) -> None:
        self.ttl = ttl
        self._key = key or os.urandom(32)
        self._clock = clock

    def seal(self, state: str, method: str, params: dict[str, Any], owner: str) -> str:
        target, arguments = binding(method, params)
        claims = {
            "s": state,
            "m": method,
            "t": target,
            "a": arguments,
            "o": self._owner(owner),
            "e": self._clock() + self.ttl,
        }
        body = _PREFIX + _b64(json.dumps(claims, separators=(",", ":")).encode())
        return body + "." + _b64(self._mac(body))

    def open(self, token: Any, method: str, params: dict[str, Any], owner: str) -> str:
        """The state sealed in `token` for this very request; RpcError for anything else."""
        try:
            if not isinstance(token, str) or not token.startswith(_PREFIX):
                raise ValueError("malformed")
            body, _, mac = token.rpartition(".")
            if not hmac.compare_digest(_unb64(mac), self._mac(body)):
                raise ValueError("seal")
            claims = json.loads(_unb64(body[len(_PREFIX) :]))
            if not isinstance(claims, dict) or not isinstance(claims.get("s"), str):
                raise ValueError("malformed")
            expiry = claims.get("e")
            if not isinstance(expiry, int | float) or not self._clock() < expiry:
                raise ValueError("expired")
            if (claims.get("m"), claims.get("t"), claims.get("a")) != (method, *binding(method, params)):
                raise ValueError("request binding")
            if claims.get("o") != self._owner(owner):
                raise ValueError("credential")
        except (ValueError, TypeError) as exc:
            log.warning("requestState refused on %s: %s", method, exc)
            raise RpcError(
                INVALID_PARAMS, "Invalid or expired requestState", {"reason": "invalid_request_state"}
            ) from None
        return claims["s"]

    def _mac(self, body: str) -> bytes:
        return hmac.new(self._key, body.encode(), hashlib.sha256).digest()[:_MAC_LENGTH]

    def _owner(self, owner: str) -> str:
        return _b64(hmac.new(self._key, b"owner:" + owner.encode(), hashlib.sha256).digest()[:12])
