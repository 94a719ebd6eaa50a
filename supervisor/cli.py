"""The `mcpvisor` command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mcpvisor.supervisor import config as config_mod
from mcpvisor.wire import logs

DEFAULT_CONFIG = "mcpvisor.toml"


def _config_path(value: str | None) -> Path:
    if value:
        return Path(value)
    if env := os.environ.get("MCPVISOR_CONFIG"):
        return Path(env)
    return Path(DEFAULT_CONFIG)


def cmd_serve(args: argparse.Namespace) -> int:
    import trio

    from mcpvisor.supervisor.supervisor import serve

    path = _config_path(args.config)
    try:
        config = config_mod.load(path)
    except config_mod.ConfigError as exc:
        print(f"mcpvisor: config error: {exc}", file=sys.stderr)
        return 2
    logs.setup("supervisor", args.log_level or config.mcpvisor.log_level, structured=args.json_log)
    trio.run(serve, config, path)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    path = _config_path(args.config)
    try:
        config = config_mod.load(path)
    except config_mod.ConfigError as exc:
        print(f"mcpvisor: config error: {exc}", file=sys.stderr)
        return 2
    print(f"{path}: ok, {len(config.servers)} servers")
    return 0


def cmd_ctl(args: argparse.Namespace) -> int:
    from mcpvisor.supervisor import ctl

    return ctl.main(args.rest, _config_path(None))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcpvisor",
        description="A supervised MCP aggregator: one MCP endpoint in front of many upstream MCP servers, "
        "each in its own worker process, kept running like programs under supervisord.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the supervisor, the frontend and one worker per server")
    serve.add_argument("-c", "--config", help=f"TOML config file (default: $MCPVISOR_CONFIG or ./{DEFAULT_CONFIG})")
    serve.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="override [mcpvisor].log_level"
    )
    serve.add_argument("--json-log", action="store_true", help="log one JSON object per line")
    serve.set_defaults(func=cmd_serve)

    ctl = sub.add_parser(
        "ctl",
        help="control a running mcpvisor: status, start, stop, restart, tail, update, ... (see `ctl help`)",
        add_help=False,
    )
    ctl.add_argument("rest", nargs=argparse.REMAINDER)
    ctl.set_defaults(func=cmd_ctl)

    check = sub.add_parser("check", help="validate a config file and exit")
    check.add_argument("-c", "--config", help="TOML config file")
    check.set_defaults(func=cmd_check)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "ctl":
        # ctl has its own parser: its options may come before the command.
        from mcpvisor.supervisor import ctl

        sys.exit(ctl.main(argv[1:], _config_path(None)))
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        sys.exit(2)
    sys.exit(args.func(args))


def ctl_main(argv: list[str] | None = None) -> None:
    """`mcpvisorctl ...` is `mcpvisor ctl ...`."""
    main(["ctl", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
