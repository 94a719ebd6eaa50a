"""`mcpvisor stdio`: MCP over stdin/stdout for clients that only start local commands, bridged to mcpvisor.

Each JSON-RPC line read from stdin is POSTed, unchanged, to a running mcpvisor's streamable HTTP
endpoint; every message that comes back (a JSON body, the events of a POST's SSE stream, the
events of the session's GET stream: responses, notifications, and the server's own requests such
as sampling or elicitation) is written to stdout as one line. When the endpoint goes away under
it (mcpvisor restarted), the bridge waits for it, opens a new session with the client's own
`initialize` parameters, replays the log level and resource subscriptions, and tells the client
that the lists changed; the client keeps its session and never sees the restart, except for a
request that was in flight on the old connection, which gets an error (a tool call is not
replayed: it may have run).

    python -m mcpvisor.client.stdio_bridge [URL] [--token TOKEN] [-c CONFIG] [--path /mcp] [--serve]
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import re
import signal
import sys
import tomllib
from collections.abc import AsyncIterator, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import trio

DEFAULT_URL = "http://127.0.0.1:8080/mcp"
DEFAULT_LISTEN = "127.0.0.1:8080"

# Requests that change nothing on the server: resent after a reconnect even if the old connection
# may have received them. Anything else (tools/call above all) may have had its effect already.
IDEMPOTENT = frozenset(
    {
        "ping",
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "logging/setLevel",
    }
)
# The body param each of these methods names, mirrored in the Mcp-Name header of the 2026-07-28 era.
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
PROTOCOL_VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
LIST_CHANGED = ("tools", "resources", "prompts")
CONNECTION_LOST = -32000
_HEADER_SAFE = re.compile(r"[\x20-\x7e]*")
_BASE64_SENTINEL = re.compile(r"=\?base64\?.*\?=")
BACKOFF_MAX = 2.0


class BridgeError(Exception):
    """A problem the bridge reports on stderr and exits with status 2 (bad arguments or config)."""


@dataclass
class Options:
    url: str
    token: str | None = None
    serve_config: Path | None = None
    reconnect_timeout: float = 60.0


def _say(text: str) -> None:
    # stdout belongs to the protocol: everything for a human goes to stderr (the client's log).
    print(f"mcpvisor stdio: {text}", file=sys.stderr, flush=True)


def endpoint_from_config(path: Path, endpoint_path: str) -> str:
    """The URL of `endpoint_path` on the `listen` address of a config file (a wildcard host means loopback)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise BridgeError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise BridgeError(f"{path} is not valid TOML: {exc}") from None
    listen = (data.get("mcpvisor") or {}).get("listen", DEFAULT_LISTEN)
    host, sep, port = str(listen).rpartition(":")
    if not sep or not port.isdigit():
        raise BridgeError(f"{path}: listen must be HOST:PORT, got {listen!r}")
    host = host.strip("[]") or "127.0.0.1"
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/{endpoint_path.lstrip('/')}"


def parse_args(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(
        prog="mcpvisor stdio",
        description="Serve MCP over stdin/stdout, bridged to a running mcpvisor's endpoint: for desktop clients "
        "that only start local commands (Claude Desktop). Survives a restart of mcpvisor under it.",
    )
    parser.add_argument("url", nargs="?", help=f"the mcpvisor endpoint (default: {DEFAULT_URL}, or from -c)")
    parser.add_argument("-c", "--config", help="read the endpoint's address from this config's `listen`")
    parser.add_argument("--path", default="/mcp", help="the endpoint on that address, with -c (default: /mcp)")
    parser.add_argument(
        "--serve", action="store_true", help="start `mcpvisor serve -c CONFIG` when nothing answers; stop it on exit"
    )
    parser.add_argument("--token", help="bearer token for the endpoint (default: $MCPVISOR_TOKEN)")
    parser.add_argument(
        "--reconnect-timeout",
        type=float,
        default=60.0,
        help="how long a request waits for mcpvisor to come back before it fails (seconds, default 60)",
    )
    args = parser.parse_args(argv)
    if args.serve and not args.config:
        parser.error("--serve needs -c CONFIG")
    if args.url and args.config and args.serve:
        parser.error("give either URL or -c CONFIG with --serve, not both")
    config = Path(args.config) if args.config else None
    if args.url:
        url = args.url
    elif config is not None:
        url = endpoint_from_config(config, args.path)
    else:
        url = DEFAULT_URL
    if urlsplit(url).scheme not in ("http", "https"):
        parser.error(f"not an http(s) URL: {url!r}")
    return Options(
        url=url,
        token=args.token or os.environ.get("MCPVISOR_TOKEN") or None,
        serve_config=config if args.serve else None,
        reconnect_timeout=args.reconnect_timeout,
    )


def header_value(value: str) -> str:
    """`value` as an HTTP header value: verbatim when it is plain printable ASCII, else `=?base64?...?=`."""
    if _HEADER_SAFE.fullmatch(value) and value == value.strip() and not _BASE64_SENTINEL.fullmatch(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode()).decode('ascii')}?="


def one_line(data: bytes) -> bytes:
    """A JSON message as one line of stdio (SSE data may span lines)."""
    if b"\n" in data or b"\r" in data:
        return json.dumps(json.loads(data), separators=(",", ":")).encode()
    return data


async def sse_messages(lines: AsyncIterator[str]) -> AsyncIterator[bytes]:
    """The data of each event of an SSE stream; events without data (priming, keep-alive) are skipped."""
    data: list[str] = []
    async for line in lines:
        if line == "":
            if message := "\n".join(data).strip():
                yield message.encode()
            data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if message := "\n".join(data).strip():
        yield message.encode()


def _answers_id(data: bytes, request_id: Any) -> bool:
    if request_id is None:
        return False
    try:
        message = json.loads(data)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("id") == request_id and ("result" in message or "error" in message)


def error_response(request_id: Any, code: int, message: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}).encode()


class SessionGone(Exception):
    """The endpoint is unreachable or no longer knows the session: a new one is needed."""

    def __init__(self, sent: bool) -> None:
        self.sent = sent  # the message may have reached the old session
        super().__init__("connection to mcpvisor lost")


@dataclass
class Session:
    """What the bridge keeps of the server session, to open an equivalent one after a restart."""

    generation: int = 0
    session_id: str | None = None
    protocol_version: str | None = None
    init_params: dict[str, Any] | None = None
    log_level: dict[str, Any] | None = None
    subscriptions: set[str] = field(default_factory=set)
    capabilities: dict[str, Any] = field(default_factory=dict)


class Bridge:
    """One stdio client, one mcpvisor session (renewed whenever mcpvisor restarts)."""

    def __init__(self, options: Options, http: httpx2.AsyncClient, to_client: trio.MemorySendChannel[bytes]) -> None:
        self.options = options
        self.http = http
        self.to_client = to_client
        self.session = Session()
        self._renewing = trio.Lock()
        self._ids = itertools.count(1)
        self._get_stream_wanted = trio.Event()

    # -- HTTP ---------------------------------------------------------------------------------

    def _headers(self, message: dict[str, Any] | None) -> dict[str, str]:
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if self.options.token:
            headers["Authorization"] = f"Bearer {self.options.token}"
        if self.session.session_id:
            headers["Mcp-Session-Id"] = self.session.session_id
        if self.session.protocol_version:
            headers["MCP-Protocol-Version"] = self.session.protocol_version
        params = message.get("params") if message else None
        meta = params.get("_meta") if isinstance(params, dict) else None
        if message and isinstance(meta, dict) and isinstance(meta.get(PROTOCOL_VERSION_META_KEY), str):
            # A 2026-07-28 client carries its version in each request; HTTP intermediaries read headers.
            headers["MCP-Protocol-Version"] = meta[PROTOCOL_VERSION_META_KEY]
            headers["Mcp-Method"] = str(message.get("method"))
            key = NAME_BEARING.get(str(message.get("method")))
            if key and isinstance(params, dict) and isinstance(params.get(key), str):
                headers["Mcp-Name"] = header_value(params[key])
        return headers

    async def _post(self, message: dict[str, Any], raw: bytes, deliver: Any) -> None:
        """POST one message; hand every message of the answer to `deliver`. Raises SessionGone."""
        request = self.http.build_request("POST", self.options.url, content=raw, headers=self._headers(message))
        try:
            response = await self.http.send(request, stream=True)
        except (httpx2.ConnectError, httpx2.ConnectTimeout):
            raise SessionGone(sent=False) from None
        except httpx2.TransportError:
            raise SessionGone(sent=True) from None
        try:
            if response.status_code == 404 and self.session.session_id:
                raise SessionGone(sent=False)
            if response.status_code in (502, 503, 504):
                raise SessionGone(sent=False)
            if response.status_code >= 400:
                body = await response.aread()
                await self._deliver_http_error(message, response.status_code, body, deliver)
                return
            if message.get("method") == "initialize" and (session_id := response.headers.get("mcp-session-id")):
                self.session.session_id = session_id
            answered = await self._read_answer(response, message.get("id"), deliver)
        except httpx2.TransportError:
            raise SessionGone(sent=True) from None
        finally:
            await response.aclose()
        if "method" in message and "id" in message and not answered:
            # The stream ended without the response: the server went away in the middle of it.
            raise SessionGone(sent=True)

    async def _read_answer(self, response: httpx2.Response, request_id: Any, deliver: Any) -> bool:
        """Deliver each message of a POST's answer; True when one of them answers `request_id`."""
        answered = False
        content_type = response.headers.get("content-type", "")
        if content_type.startswith("text/event-stream"):
            async for data in sse_messages(response.aiter_lines()):
                answered = answered or _answers_id(data, request_id)
                await deliver(one_line(data))
        elif content_type.startswith("application/json"):
            body = (await response.aread()).strip()
            if body:
                answered = _answers_id(body, request_id)
                await deliver(one_line(body))
        return answered

    async def _deliver_http_error(self, message: dict[str, Any], status: int, body: bytes, deliver: Any) -> None:
        """An HTTP error answer: a JSON-RPC error body goes to the client as it is, else one is made."""
        if "id" not in message or "method" not in message:
            _say(f"mcpvisor refused a {message.get('method', 'response')} message with HTTP {status}")
            return
        with suppress(ValueError):
            decoded = json.loads(body)
            if isinstance(decoded, dict) and "error" in decoded:
                decoded["id"] = message["id"]
                await deliver(json.dumps(decoded).encode())
                return
        reason = "mcpvisor refused the token (use --token or $MCPVISOR_TOKEN)" if status in (401, 403) else ""
        await deliver(error_response(message["id"], -32600, reason or f"mcpvisor answered HTTP {status}"))

    # -- the session ----------------------------------------------------------------------------

    async def forward(self, message: dict[str, Any], raw: bytes) -> None:
        """Send one client message to mcpvisor, renewing the session when mcpvisor has restarted."""
        method = message.get("method")
        is_request = method is not None and "id" in message
        deadline = trio.current_time() + self.options.reconnect_timeout
        while True:
            generation = self.session.generation
            try:
                await self._post(message, raw, self._deliver_from_request(message))
                return
            except SessionGone as gone:
                if gone.sent and is_request and method not in IDEMPOTENT:
                    await self.to_client.send(
                        error_response(
                            message["id"],
                            CONNECTION_LOST,
                            f"the connection to mcpvisor was lost during {method}; it may or may not have run",
                        )
                    )
                    self._get_stream_wanted.set()
                    return
                if method == "initialize":
                    if await self._wait_until_up(deadline):
                        continue
                    await self._not_answering(message["id"])
                    return
            if not is_request and method is None:
                return  # an answer to a request of the old session: nobody is waiting for it any more
            if not await self.renew(generation, deadline):
                if is_request:
                    await self._not_answering(message["id"])
                return

    async def _not_answering(self, request_id: Any) -> None:
        await self.to_client.send(
            error_response(request_id, CONNECTION_LOST, f"mcpvisor at {self.options.url} is not answering")
        )

    def _deliver_from_request(self, message: dict[str, Any]) -> Any:
        async def deliver(data: bytes) -> None:
            if message.get("method") == "initialize":
                self._note_initialized(data)
            elif message.get("method") in ("logging/setLevel", "resources/subscribe", "resources/unsubscribe"):
                self._note_state(message, data)
            await self.to_client.send(data)

        return deliver

    def _note_initialized(self, data: bytes) -> None:
        with suppress(ValueError):
            answer = json.loads(data)
            result = answer.get("result") if isinstance(answer, dict) else None
            if isinstance(result, dict):
                self.session.protocol_version = result.get("protocolVersion")
                self.session.capabilities = result.get("capabilities") or {}

    def _note_state(self, message: dict[str, Any], data: bytes) -> None:
        with suppress(ValueError):
            answer = json.loads(data)
            if not (isinstance(answer, dict) and "result" in answer):
                return
            params = message.get("params") or {}
            if message["method"] == "logging/setLevel":
                self.session.log_level = params
            elif message["method"] == "resources/subscribe":
                self.session.subscriptions.add(str(params.get("uri")))
            else:
                self.session.subscriptions.discard(str(params.get("uri")))

    async def initialize(self, message: dict[str, Any], raw: bytes) -> None:
        """Forward the client's initialize and keep what a new session will need."""
        self.session.init_params = message.get("params") or {}
        self.session.session_id = None
        self.session.protocol_version = None
        await self.forward(message, raw)

    async def _wait_until_up(self, deadline: float) -> bool:
        delay = 0.1
        while trio.current_time() < deadline:
            try:
                await self.http.get(urlsplit(self.options.url)._replace(path="/healthz", query="").geturl())
                return True
            except httpx2.TransportError:
                await trio.sleep(min(delay, max(0.0, deadline - trio.current_time())))
                delay = min(delay * 2, BACKOFF_MAX)
        return False

    async def renew(self, failed_generation: int, deadline: float) -> bool:
        """Open a new session like the client's, once for all the messages that found the old one gone."""
        async with self._renewing:
            if self.session.generation != failed_generation:
                return True
            if self.session.init_params is None:
                # No handshake to repeat (a 2026-07-28 client): just wait for mcpvisor to answer.
                if not await self._wait_until_up(deadline):
                    return False
                self.session.generation += 1
                return True
            delay = 0.1
            while trio.current_time() < deadline:
                if not await self._wait_until_up(deadline):
                    return False
                try:
                    await self._open_session()
                except SessionGone:
                    # Up but not taking sessions yet (still starting, or refusing): try again, less often.
                    await trio.sleep(min(delay, max(0.0, deadline - trio.current_time())))
                    delay = min(delay * 2, BACKOFF_MAX)
                    continue
                self.session.generation += 1
                self._get_stream_wanted.set()
                _say(f"mcpvisor came back: new session on {self.options.url}")
                for kind in LIST_CHANGED:
                    if kind not in self.session.capabilities:
                        continue
                    await self.to_client.send(
                        json.dumps({"jsonrpc": "2.0", "method": f"notifications/{kind}/list_changed"}).encode()
                    )
                return True
            return False

    async def _open_session(self) -> None:
        self.session.session_id = None
        init = {
            "jsonrpc": "2.0",
            "id": f"mcpvisor-stdio-{next(self._ids)}",
            "method": "initialize",
            "params": self.session.init_params,
        }
        answers: list[bytes] = []

        async def keep(data: bytes) -> None:
            answers.append(data)

        await self._post(init, json.dumps(init).encode(), keep)
        if not any(b'"result"' in answer for answer in answers):
            raise SessionGone(sent=False)
        for answer in answers:
            self._note_initialized(answer)
        await self._post_quietly({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if self.session.log_level is not None:
            await self._post_quietly(self._request("logging/setLevel", self.session.log_level))
        for uri in sorted(self.session.subscriptions):
            await self._post_quietly(self._request("resources/subscribe", {"uri": uri}))

    def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": f"mcpvisor-stdio-{next(self._ids)}", "method": method, "params": params}

    async def _post_quietly(self, message: dict[str, Any]) -> None:
        async def drop(_data: bytes) -> None:
            pass

        await self._post(message, json.dumps(message).encode(), drop)

    async def serve_get_stream(self) -> None:
        """Keep the session's GET stream open: the server's own requests and notifications come on it."""
        delay = 0.1
        while True:
            await self._get_stream_wanted.wait()
            generation = self.session.generation
            if not self.session.session_id:
                self._get_stream_wanted = trio.Event()
                continue
            try:
                async with self.http.stream("GET", self.options.url, headers=self._get_headers()) as response:
                    if response.status_code == 405:
                        self._get_stream_wanted = trio.Event()  # the server offers none
                        continue
                    if response.status_code == 404:
                        raise SessionGone(sent=False)
                    if response.status_code >= 400:
                        _say(f"the GET stream was refused with HTTP {response.status_code}")
                        self._get_stream_wanted = trio.Event()
                        continue
                    delay = 0.1
                    async for data in sse_messages(response.aiter_lines()):
                        await self.to_client.send(one_line(data))
            except (httpx2.TransportError, SessionGone):
                # mcpvisor went away: renew now, so an idle client hears of the restart too.
                deadline = trio.current_time() + max(self.options.reconnect_timeout, 3600.0)
                await self.renew(generation, deadline)
                continue
            # A stream the server ended is reopened, after a pause if it keeps ending.
            await trio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)

    def _get_headers(self) -> dict[str, str]:
        headers = self._headers(None)
        headers["Accept"] = "text/event-stream"
        del headers["Content-Type"]
        return headers

    def open_get_stream(self) -> None:
        self._get_stream_wanted.set()

    async def close(self) -> None:
        """End the server session (best effort: mcpvisor may be gone already)."""
        if not self.session.session_id:
            return
        with trio.move_on_after(2), suppress(httpx2.TransportError):
            await self.http.delete(self.options.url, headers=self._get_headers())


async def read_lines(stream: trio.abc.ReceiveStream) -> AsyncIterator[bytes]:
    buffer = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line.strip()
    if buffer.strip():
        yield buffer.strip()


async def write_lines(stream: trio.abc.SendStream, messages: trio.MemoryReceiveChannel[bytes]) -> None:
    async with messages:
        async for message in messages:
            await stream.send_all(message + b"\n")


async def pump_client(bridge: Bridge, stdin: trio.abc.ReceiveStream, nursery: trio.Nursery) -> None:
    """Read the client's messages; the handshake is forwarded in order, everything else concurrently."""
    async for raw in read_lines(stdin):
        try:
            message = json.loads(raw)
        except ValueError:
            await bridge.to_client.send(error_response(None, -32700, "Parse error: not a JSON line"))
            continue
        if not isinstance(message, dict):
            await bridge.to_client.send(error_response(None, -32600, "Invalid Request: one JSON-RPC object a line"))
            continue
        method = message.get("method")
        if method == "initialize" and "id" in message:
            await bridge.initialize(message, raw)
        elif method == "notifications/initialized":
            await bridge.forward(message, raw)
            bridge.open_get_stream()
        else:
            nursery.start_soon(bridge.forward, message, raw)


async def _answers(url: str, http: httpx2.AsyncClient) -> bool:
    try:
        await http.get(urlsplit(url)._replace(path="/healthz", query="").geturl())
    except httpx2.TransportError:
        return False
    return True


async def start_mcpvisor(config: Path, url: str, http: httpx2.AsyncClient) -> Any:
    """Start `mcpvisor serve -c CONFIG` (its output to our stderr) and wait until it answers."""
    from mcpvisor.runtime.lifetime import spawn

    argv = [sys.executable, "-P", "-m", "mcpvisor.supervisor", "serve", "-c", str(config)]
    child = spawn(argv, env=os.environ, output=sys.stderr.fileno())
    _say(f"started mcpvisor (pid {child.pid}) with {config}")
    with trio.move_on_after(60):
        while not await _answers(url, http):
            if child.returncode is not None:
                raise BridgeError(f"mcpvisor serve exited with status {child.returncode} (its log is above)")
            await trio.sleep(0.1)
    return child


async def stop_mcpvisor(child: Any) -> None:
    with trio.CancelScope(shield=True):
        if child.returncode is None and child.send_signal_to_group(signal.SIGTERM):
            with trio.move_on_after(20):
                await child.wait()
        if child.returncode is None:
            child.send_signal_to_group(signal.SIGKILL)
            await child.wait()


async def run(options: Options, stdin: trio.abc.ReceiveStream, stdout: trio.abc.SendStream) -> None:
    timeout = httpx2.Timeout(10.0, read=None)
    async with httpx2.AsyncClient(timeout=timeout) as http:
        child = None
        if options.serve_config is not None and not await _answers(options.url, http):
            child = await start_mcpvisor(options.serve_config, options.url, http)
        try:
            to_client, from_bridge = trio.open_memory_channel[bytes](256)
            bridge = Bridge(options, http, to_client)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write_lines, stdout, from_bridge)
                nursery.start_soon(bridge.serve_get_stream)
                nursery.start_soon(_stop_on_signals, nursery.cancel_scope)
                async with trio.open_nursery() as messages:
                    await pump_client(bridge, stdin, messages)
                # stdin closed and every message answered: the client is gone.
                with trio.CancelScope(shield=True):
                    await bridge.close()
                nursery.cancel_scope.cancel()
        finally:
            if child is not None:
                await stop_mcpvisor(child)


async def _stop_on_signals(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _signum in signals:
            scope.cancel()
            return


def _streams() -> tuple[trio.abc.ReceiveStream, trio.abc.SendStream]:
    # Own copies of the descriptors: FdStream makes them non-blocking and closes them.
    return trio.lowlevel.FdStream(os.dup(0)), trio.lowlevel.FdStream(os.dup(1))


def main(argv: Iterable[str] | None = None) -> None:
    try:
        options = parse_args(list(sys.argv[1:] if argv is None else argv))
    except BridgeError as exc:
        _say(str(exc))
        sys.exit(2)

    async def bridged() -> None:
        stdin, stdout = _streams()
        async with stdin, stdout:
            await run(options, stdin, stdout)

    try:
        trio.run(bridged)
    except BridgeError as exc:
        _say(str(exc))
        sys.exit(1)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
