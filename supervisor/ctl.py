"""`mcpvisor ctl`: drive a running mcpvisor over its control socket, like supervisorctl."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import webbrowser
from pathlib import Path
from typing import Any

import msgspec
import zmq

from mcpvisor.supervisor import config as config_mod
from mcpvisor.supervisor.commands import EXIT_UNKNOWN, EXIT_USAGE, load_all
from mcpvisor.supervisor.commands.status import describe_expiry
from mcpvisor.supervisor.instance import find_runtime_dir
from mcpvisor.wire import codec
from mcpvisor.wire.config import ConfigError
from mcpvisor.wire.endpoints import Endpoints
from mcpvisor.wire.messages import Command, Reply

LOGIN_WAIT = 600.0  # how long `ctl login` waits for the browser's round trip


class NoDaemon(Exception):
    """Nothing answers on the control socket."""


class BadConfig(Exception):
    """The config file named cannot be read: which mcpvisor to control is unknown."""


def control_endpoint(config_path: Path, *, named: bool = True) -> str:
    """$MCPVISOR_CONTROL, else the control socket of the mcpvisor serving `config_path`.

    A file that was `named` (`-c`, $MCPVISOR_CONFIG) must be readable, or it is BadConfig: another
    instance's socket must never answer for it. The implicit ./mcpvisor.toml may be missing: then
    the default data dir's instance is the one (the user service's, from a shell).
    """
    if endpoint := os.environ.get("MCPVISOR_CONTROL"):
        return endpoint
    if not named and not config_path.exists():
        data_dir = config_mod.default_data_dir()
    else:
        try:
            config = config_mod.load(config_path)
        except ConfigError as exc:
            raise BadConfig(str(exc)) from None
        data_dir = config_mod.data_dir(config, config_path.resolve())
    return Endpoints.in_dir(find_runtime_dir(data_dir)).control


def _check_listening(path: str) -> None:
    """Fail at once when nobody listens (ZeroMQ would silently retry until the timeout)."""
    if not os.path.exists(path):
        raise NoDaemon(f"no mcpvisor is running (no control socket at {path})")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        raise NoDaemon(f"no mcpvisor is running (the control socket at {path} refuses: {exc.strerror})") from None
    finally:
        probe.close()


class Connection:
    """A DEALER to the supervisor; one request at a time."""

    def __init__(self, endpoint: str, timeout: float) -> None:
        path = endpoint.removeprefix("ipc://")
        if endpoint.startswith("ipc://"):
            _check_listening(path)
        self.endpoint = endpoint
        self.timeout = timeout
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self._next_id = 1

    def call(self, name: str, args: list[str]) -> Reply:
        request_id = self._next_id
        self._next_id += 1
        self.sock.send_multipart(codec.control.encode(Command(id=request_id, name=name, args=args)))
        deadline = time.monotonic() + self.timeout
        while (remaining := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(remaining * 1000), zmq.POLLIN):
                break
            msg, _ = codec.control.decode(self.sock.recv_multipart())
            if isinstance(msg, Reply) and msg.id == request_id:
                return msg
        raise NoDaemon(f"no answer from mcpvisor at {self.endpoint} within {self.timeout:g}s")

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def _print_result(spec: Any, reply: Reply, as_json: bool) -> None:
    if as_json:
        print(json.dumps(reply.result, indent=2))
    elif (text := spec.render(reply.result)) if spec is not None else json.dumps(reply.result):
        print(text)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _follow(conn: Connection, args: list[str], as_json: bool) -> int:
    """`tail -f`: print the end, then what is appended, until interrupted."""
    reply = conn.call("tail", args)
    if not reply.ok:
        print(f"ERROR: {reply.error}", file=sys.stderr)
        return reply.exit_code or 1
    spec = load_all()["tail"]
    _print_result(spec, reply, as_json)
    sys.stdout.flush()
    offsets = {s["stream"]: s["offset"] for s in reply.result["streams"]}
    # Ended by Ctrl-C, or by SIGTERM from whatever runs it (`timeout`, a job runner that has
    # SIGINT ignored): both mean "stop following", not an error.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(0.5)
            since = ",".join(f"{k}={v}" for k, v in offsets.items())
            reply = conn.call("tail", [*args, "--from", since])
            if not reply.ok:
                print(f"ERROR: {reply.error}", file=sys.stderr)
                return reply.exit_code or 1
            for stream in reply.result["streams"]:
                offsets[stream["stream"]] = stream["offset"]
                if stream["text"]:
                    sys.stdout.write(stream["text"])
                    sys.stdout.flush()
    except KeyboardInterrupt:
        return 0


def _follow_activity(conn: Connection, args: list[str], as_json: bool) -> int:
    """`activity -f`: print the newest calls, then each new one, until interrupted."""
    spec = load_all()["activity"]
    signal.signal(signal.SIGTERM, _interrupt)
    since: list[str] = []
    try:
        while True:
            reply = conn.call("activity", [*args, *since])
            if not reply.ok:
                print(f"ERROR: {reply.error}", file=sys.stderr)
                return reply.exit_code or 1
            for row in reply.result["rows"]:
                print(json.dumps(row) if as_json else spec.render({"rows": [row], "follow": True}), flush=True)
            since = ["--after", str(reply.result["last"])]
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0


def _login(conn: Connection, args: list[str], as_json: bool) -> int:
    """`login NAME`: print the authorization URL, open a browser where there is one, wait for the login."""
    wait = "--no-wait" not in args
    args = [arg for arg in args if arg != "--no-wait"]
    reply = conn.call("login", args)
    if not reply.ok:
        if as_json:
            print(json.dumps({"error": reply.error, "exit_code": reply.exit_code}))
        else:
            print(f"ERROR: {reply.error}", file=sys.stderr)
        return reply.exit_code or 1
    _print_result(load_all()["login"], reply, as_json)
    sys.stdout.flush()
    url, name = reply.result.get("url"), reply.result.get("name", "")
    if not url or not wait:
        return 0
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        webbrowser.open(url)
    print("waiting for the login to complete (Ctrl-C stops waiting, not the login)...", file=sys.stderr)
    signal.signal(signal.SIGTERM, _interrupt)
    deadline = time.monotonic() + LOGIN_WAIT
    try:
        while time.monotonic() < deadline:
            time.sleep(1.0)
            status = conn.call("status", [name])
            rows = status.result if status.ok and isinstance(status.result, list) else []
            row = rows[0] if rows else {}
            if row.get("upstream") == "ready":
                expiry = f" ({describe_expiry(row['token_expires'])})" if row.get("token_expires") else ""
                print(f"{name}: logged in{expiry}", file=sys.stderr)
                return 0
            if "the login failed" in row.get("error", ""):
                print(f"ERROR: {name}: {row['error']}", file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        return 0
    print(f"ERROR: {name}: no login within {LOGIN_WAIT:g}s", file=sys.stderr)
    return 1


def command_help() -> str:
    commands = {name: spec for name, spec in load_all().items() if spec.ctl}
    width = max(len(spec.usage or name) for name, spec in commands.items()) + 2
    lines = ["commands:"]
    for name, spec in sorted(commands.items()):
        lines.append(f"  {(spec.usage or name):<{width}}{spec.summary}")
    lines.append("  help COMMAND" + " " * max(2, width - 12) + "the full help of one command")
    return "\n".join(lines)


def command_usage(spec: Any) -> str:
    """`ctl help NAME` and `ctl NAME --help`: the usage line, the command's docstring, the options ctl adds."""
    options = [("--json", "print the result as JSON")]
    if spec.name in ("tail", "activity"):
        options.insert(0, ("-f", "follow what is appended, until interrupted"))
    if spec.name == "login":
        options.insert(0, ("--no-wait", "print the URL and return without waiting for the login"))
    listed = "\n".join(f"  {flag:<11}{text}" for flag, text in options)
    return f"usage: mcpvisor ctl {spec.usage or spec.name}\n\n{spec.help}\n\noptions:\n{listed}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcpvisor ctl",
        description="Control a running mcpvisor (as supervisorctl controls supervisord).",
        epilog=command_help() + "\n\nexit codes: 0 ok, 1 error, 2 bad argument or bad config, "
        "3 something is not running (status), 4 unknown name or no mcpvisor answering",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-c", "--config", help="the config file of the mcpvisor to control (finds its socket)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for an answer (default 60)")
    parser.add_argument("command", nargs="?", help="the command (see below)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def main(argv: list[str], config_path: Path, *, named: bool = True) -> int:
    """`named`: `config_path` was named ($MCPVISOR_CONFIG) rather than the implicit ./mcpvisor.toml."""
    parser = build_parser()
    opts = parser.parse_args(argv)
    if opts.config:
        config_path = Path(opts.config)
        named = True
    if not opts.command:
        parser.print_help()
        return 2
    registry = load_all()
    if opts.command == "help":
        if not opts.args:
            print(command_help())
            return 0
        spec = registry.get(opts.args[0])
        if spec is None or not spec.ctl:
            print(f"no such command: {opts.args[0]}", file=sys.stderr)
            return EXIT_UNKNOWN
        print(command_usage(spec))
        return 0
    spec = registry.get(opts.command)
    if spec is None or not spec.ctl:
        print(f"no such command: {opts.command} (see mcpvisor ctl help)", file=sys.stderr)
        return EXIT_UNKNOWN
    args = list(opts.args)
    if "-h" in args or "--help" in args:
        # Answered here, before the control socket is looked for: help must not need a running mcpvisor.
        print(command_usage(spec))
        return 0
    if "--json" in args:  # `ctl approve NAME --json` means what `ctl --json approve NAME` does
        args = [arg for arg in args if arg != "--json"]
        opts.json = True
    follow = opts.command in ("tail", "activity") and "-f" in args
    if follow:
        args.remove("-f")
    try:
        conn = Connection(control_endpoint(config_path, named=named), opts.timeout)
    except BadConfig as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NoDaemon as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN
    try:
        if follow:
            return (_follow if opts.command == "tail" else _follow_activity)(conn, args, opts.json)
        if opts.command == "login":
            return _login(conn, args, opts.json)
        reply = conn.call(opts.command, args)
    except NoDaemon as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        print(f"ERROR: undecodable answer: {exc}", file=sys.stderr)
        return 1
    finally:
        conn.close()
    if not reply.ok:
        if opts.json:
            print(json.dumps({"error": reply.error, "exit_code": reply.exit_code}))
        else:
            print(f"ERROR: {reply.error}", file=sys.stderr)
        return reply.exit_code or 1
    _print_result(spec, reply, opts.json)
    return reply.exit_code
