"""A server registry for the tests: the official MCP Registry API v0.1, on loopback, from recorded data.

`python registry_server.py [--port 0] [--token T] [--remote-url URL]` prints `listening on PORT`
once it accepts connections. It serves `registry_data/servers.json` (entries written to the
published server.json schema) the way the API describes:

- `GET /v0.1/servers?search=&limit=&cursor=&version=latest`: `search` is a case-insensitive
  substring of the name, `limit` defaults to 30 (at most --max-page, 100), the cursor is opaque;
  deleted servers are left out; `version=latest` keeps the latest version of each server.
- `GET /v0.1/servers/{name}/versions/latest` (name URL-encoded), 404 `{"error": ...}` otherwise.

The same API under a path prefix misbehaves on purpose: `/private/` wants `Authorization: Bearer T`,
`/broken/` answers 500 with HTML, `/notjson/` answers text, `/wrongshape/` answers JSON without
`servers`, `/huge/` answers 5 MB, `/redirect/` redirects elsewhere, and `/offhost/` points its
next page at another host. `{{REMOTE_URL}}` in the data becomes --remote-url (a test upstream).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

DATA = Path(__file__).parent / "registry_data" / "servers.json"


def load(remote_url: str) -> list[dict[str, Any]]:
    text = DATA.read_text(encoding="utf-8").replace("{{REMOTE_URL}}", remote_url)
    return json.loads(text)["servers"]


def official(entry: dict[str, Any]) -> dict[str, Any]:
    return entry.get("_meta", {}).get("io.modelcontextprotocol.registry/official", {})


class Handler(BaseHTTPRequestHandler):
    servers: list[dict[str, Any]] = []
    token: str | None = None
    port = 0
    max_page = 100

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, status: int, body: bytes, content_type: str = "application/json", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def answer_json(self, status: int, value: Any) -> None:
        self.answer(status, json.dumps(value).encode())

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        path, query = parts.path, parse_qs(parts.query)
        mode = ""
        for prefix in ("private", "broken", "notjson", "wrongshape", "huge", "redirect", "offhost"):
            if path.startswith(f"/{prefix}/"):
                mode, path = prefix, path[len(prefix) + 1 :]
        if mode == "private" and self.headers.get("Authorization") != f"Bearer {self.token}":
            return self.answer_json(401, {"error": "Invalid or missing token"})
        if mode == "broken":
            return self.answer(500, b"<html><body>Internal Server Error</body></html>", "text/html")
        if mode == "notjson":
            return self.answer(200, b"hello, this is not JSON", "text/plain")
        if mode == "wrongshape":
            return self.answer_json(200, {"items": []})
        if mode == "huge":
            return self.answer(200, b'{"servers": [' + b" " * (5 * 1024 * 1024) + b"]}")
        if mode == "redirect":
            return self.answer(302, b"", "text/plain", Location="http://127.0.0.1:1/v0.1/servers")
        if path == "/v0.1/servers":
            return self.list_servers(query, mode)
        prefix, suffix = "/v0.1/servers/", "/versions/latest"
        if path.startswith(prefix) and path.endswith(suffix):
            name = unquote(path[len(prefix) : -len(suffix)])
            for entry in self.servers:
                meta = official(entry)
                if entry["server"]["name"] == name and meta.get("isLatest", True) and meta.get("status") != "deleted":
                    return self.answer_json(200, entry)
            return self.answer_json(404, {"error": "Server not found"})
        return self.answer_json(404, {"error": "Not found"})

    def list_servers(self, query: dict[str, list[str]], mode: str) -> None:
        search = query.get("search", [""])[0].lower()
        try:
            limit = min(self.max_page, max(1, int(query.get("limit", ["30"])[0])))
        except ValueError:
            return self.answer_json(400, {"error": "limit must be an integer"})
        latest_only = query.get("version", [""])[0] == "latest"
        matches = [
            e
            for e in self.servers
            if search in e["server"]["name"].lower()
            and official(e).get("status") != "deleted"
            and (not latest_only or official(e).get("isLatest", True))
        ]
        start = 0
        if cursor := query.get("cursor", [""])[0]:
            try:
                start = int(base64.urlsafe_b64decode(cursor.encode()).decode())
            except ValueError:
                return self.answer_json(400, {"error": "invalid cursor"})
        page = matches[start : start + limit]
        metadata: dict[str, Any] = {"count": len(page)}
        if start + limit < len(matches):
            metadata["nextCursor"] = base64.urlsafe_b64encode(str(start + limit).encode()).decode()
            if mode == "offhost":
                metadata["nextCursor"] = f"http://127.0.0.2:{self.port}/v0.1/servers?cursor={metadata['nextCursor']}"
        return self.answer_json(200, {"servers": page, "metadata": metadata})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default="registry-test-token")
    parser.add_argument("--remote-url", default="http://127.0.0.1:9/mcp")
    parser.add_argument("--max-page", type=int, default=100, help="the most servers one page holds")
    args = parser.parse_args()
    Handler.servers = load(args.remote_url)
    Handler.token = args.token
    Handler.max_page = args.max_page
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    Handler.port = server.server_address[1]
    print(f"listening on {Handler.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
