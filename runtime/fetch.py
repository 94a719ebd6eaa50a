"""One bounded GET of a JSON document: no redirects followed, no proxy from the environment, a size cap.

Callers (an issuer's metadata and keys, a server registry) turn `FetchError` into their own words.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

import httpx2


class FetchError(Exception):
    """Why no JSON came back: `kind` says which way it failed, `detail` the status or the exception's name."""

    def __init__(self, kind: Literal["status", "too_large", "timeout", "unreachable", "not_json"], detail: Any = None):
        super().__init__(kind)
        self.kind = kind
        self.detail = detail


async def get_json(
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
) -> Any:
    """The JSON document at `url` (HTTP 200 only; a redirect is a `status` failure, never followed)."""
    try:
        # trust_env=False: a proxy from the environment would defeat the callers' address checks.
        client = httpx2.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False)
        request = {"params": dict(params or {}), "headers": dict(headers or {})}
        async with client as http, http.stream("GET", url, **request) as response:
            if response.status_code != 200:
                raise FetchError("status", response.status_code)
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise FetchError("too_large")
    except httpx2.TimeoutException:
        raise FetchError("timeout") from None
    except httpx2.HTTPError as exc:
        raise FetchError("unreachable", type(exc).__name__) from None
    try:
        return json.loads(body)
    except ValueError:
        raise FetchError("not_json") from None
