"""A stdio MCP server with no SDK, quick to start, that misbehaves on request: `python raw_server.py [FLAGS]`.

Flags choose how it lives and dies, for supervision tests:

  --crash-at-start          exit 1 before reading anything (a command that cannot start)
  --crash-after SECONDS     exit 1 that long after starting (a server that dies later)
  --exit-after SECONDS      exit 0 that long after starting (a server that ends cleanly)
  --hang-on-initialize      never answer `initialize` (a server stuck at start)
  --ignore-term             ignore SIGTERM and the end of stdin: only SIGKILL ends it
  --id-last                 write `id` after `result` in answers, as some SDKs do
  --pid-file FILE           append its pid to FILE when it starts
  --tag TAG                 nothing but a mark in its command line, for a test to find it by

Tools: `echo(text)`, `add(a, b)`, `pid()`, `sleep(seconds)`, `crash()` (exit 1 at once), and
`big(size)`: a text result whose JSON is exactly `size` bytes, written in 1 MiB pieces so the
server itself never holds it (with `pause` seconds between pieces, an upstream slow to write it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

TOOLS = [
    {"name": "echo", "description": "Echo the text back.", "inputSchema": {"type": "object"}},
    {"name": "add", "description": "Add two integers.", "inputSchema": {"type": "object"}},
    {"name": "pid", "description": "The process id of this upstream.", "inputSchema": {"type": "object"}},
    {"name": "sleep", "description": "Sleep, then answer.", "inputSchema": {"type": "object"}},
    {"name": "crash", "description": "Exit with status 1 at once.", "inputSchema": {"type": "object"}},
    {"name": "big", "description": "A text result of `size` bytes of JSON.", "inputSchema": {"type": "object"}},
]
PIECE = 1024 * 1024
_EMPTY_TEXT = len(json.dumps({"content": [{"type": "text", "text": ""}]}, separators=(",", ":")))

out = sys.stdout.buffer
lock = threading.Lock()


def write(data: bytes) -> None:
    with lock:
        out.write(data)
        out.flush()


def answer(request_id: object, result: object, id_last: bool) -> None:
    rid = json.dumps(request_id)
    body = json.dumps(result, separators=(",", ":"))
    if id_last:
        write(f'{{"result":{body},"jsonrpc":"2.0","id":{rid}}}\n'.encode())
    else:
        write(f'{{"jsonrpc":"2.0","id":{rid},"result":{body}}}\n'.encode())


def fail(request_id: object, code: int, message: str) -> None:
    write(
        json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}).encode() + b"\n"
    )


def text(value: object) -> dict[str, object]:
    return {"content": [{"type": "text", "text": str(value)}]}


def big(request_id: object, size: int, pause: float, id_last: bool) -> None:
    """Stream a result of exactly `size` bytes: the server holds one piece at a time."""
    filler = max(0, size - _EMPTY_TEXT)
    rid = json.dumps(request_id).encode()
    head = b'{"result":' if id_last else b'{"jsonrpc":"2.0","id":' + rid + b',"result":'
    tail = b',"jsonrpc":"2.0","id":' + rid + b"}\n" if id_last else b"}\n"
    piece = b"x" * PIECE
    with lock:
        out.write(head + b'{"content":[{"type":"text","text":"')
        left = filler
        while left > 0:
            out.write(piece[: min(PIECE, left)])
            left -= min(PIECE, left)
            if pause:
                out.flush()
                time.sleep(pause)
        out.write(b'"}]}' + tail)
        out.flush()


def call(request_id: object, params: dict[str, object], id_last: bool) -> None:
    name = params.get("name")
    args = params.get("arguments") or {}
    assert isinstance(args, dict)
    if name == "echo":
        answer(request_id, text(args.get("text", "")), id_last)
    elif name == "add":
        answer(request_id, text(int(args.get("a", 0)) + int(args.get("b", 0))), id_last)
    elif name == "pid":
        answer(request_id, text(os.getpid()), id_last)
    elif name == "sleep":
        time.sleep(float(args.get("seconds", 1)))
        answer(request_id, text("slept"), id_last)
    elif name == "crash":
        os._exit(1)
    elif name == "big":
        big(request_id, int(args.get("size", 0)), float(args.get("pause", 0)), id_last)
    else:
        fail(request_id, -32602, f"unknown tool {name!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crash-at-start", action="store_true")
    parser.add_argument("--crash-after", type=float)
    parser.add_argument("--exit-after", type=float)
    parser.add_argument("--hang-on-initialize", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--id-last", action="store_true")
    parser.add_argument("--pid-file")
    parser.add_argument("--tag")
    args = parser.parse_args()
    if args.pid_file:
        with open(args.pid_file, "a") as pids:
            pids.write(f"{os.getpid()}\n")
    if args.crash_at_start:
        print("crashing at start, as asked", file=sys.stderr)
        sys.exit(1)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for delay, code in ((args.crash_after, 1), (args.exit_after, 0)):
        if delay is not None:
            timer = threading.Timer(delay, os._exit, (code,))
            timer.daemon = True
            timer.start()
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # a notification
        if method == "initialize":
            if args.hang_on_initialize:
                continue
            version = (message.get("params") or {}).get("protocolVersion", "2025-06-18")
            result = {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "1"},
            }
            answer(request_id, result, args.id_last)
        elif method == "ping":
            answer(request_id, {}, args.id_last)
        elif method == "tools/list":
            answer(request_id, {"tools": TOOLS}, args.id_last)
        elif method == "tools/call":
            # A thread per call: a slow call does not hold up pings or other calls.
            threading.Thread(target=call, args=(request_id, message.get("params") or {}, args.id_last)).start()
        else:
            fail(request_id, -32601, f"method not found: {method}")
    if args.ignore_term:
        while True:  # stdin is closed; it goes on anyway, until SIGKILL
            time.sleep(3600)


if __name__ == "__main__":
    main()
