"""The `mcpvisor` command line."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys
from pathlib import Path

from mcpvisor.runtime import bwrap, logs, telemetry, trust
from mcpvisor.supervisor import config as config_mod
from mcpvisor.supervisor.instance import AlreadyRunning, InstanceLock
from mcpvisor.wire import sandboxing, tenant_secrets
from mcpvisor.wire.config import ConfigError, parse_listen

DEFAULT_CONFIG = "mcpvisor.toml"


def _config_path(value: str | None) -> Path:
    if value:
        return Path(value)
    if env := os.environ.get("MCPVISOR_CONFIG"):
        return Path(env)
    return Path(DEFAULT_CONFIG)


def _config_named() -> bool:
    """Whether the config file was named ($MCPVISOR_CONFIG) rather than the implicit ./mcpvisor.toml."""
    return bool(os.environ.get("MCPVISOR_CONFIG"))


def _load(args: argparse.Namespace) -> tuple[Path, config_mod.Config] | None:
    """The config file `-c` names (or the default) and its contents; None once the error is printed."""
    path = _config_path(args.config)
    try:
        return path, config_mod.load(path)
    except ConfigError as exc:
        print(f"mcpvisor: config error: {exc}", file=sys.stderr)
        return None


def listen_problem(listen: str) -> str | None:
    """Why the frontend could not listen on `listen` (the address is in use), tried as it binds; None if it can."""
    host, port = parse_listen(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot listen on {listen}: {exc.strerror}"
    for family, kind, proto, _name, address in infos[:1]:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the frontend's listener does
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return f"cannot listen on {listen}: the address is in use (another program listens there)"
                return f"cannot listen on {listen}: {exc.strerror or exc}"
    return None


def cmd_serve(args: argparse.Namespace) -> int:
    import trio

    from mcpvisor.supervisor import configstore
    from mcpvisor.supervisor.supervisor import serve

    if (loaded := _load(args)) is None:
        return 2
    path, config = loaded
    from mcpvisor.supervisor.policy_files import load_policies

    try:
        # Refused here with the file and line, before anything starts (and whether or not another
        # instance runs: a broken file is the first thing to say).
        load_policies(config, path)
    except ConfigError as exc:
        print(f"mcpvisor: config error: {exc}", file=sys.stderr)
        return 2
    if (problem := _sandbox_limits(config)) is not None:
        print(f"mcpvisor: {path}: {problem}", file=sys.stderr)
        return 1
    data_dir = config_mod.data_dir(config, path.resolve())
    # Before anything binds a socket: a second `serve` of this config must not take the first's over.
    try:
        lock = InstanceLock(data_dir).acquire()
    except AlreadyRunning as exc:
        print(f"mcpvisor: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"mcpvisor: cannot lock {data_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if (problem := listen_problem(config.mcpvisor.listen)) is not None:
        print(f"mcpvisor: {problem}", file=sys.stderr)
        return 1
    # stderr (the terminal, or journald) gets readable lines; the data dir keeps a JSON event log.
    log_file = data_dir / "logs" / "supervisor.log"
    logs.setup("supervisor", args.log_level or config.mcpvisor.log_level, structured=args.json_log, json_file=log_file)
    if (warning := trust.exposure_warning(config.mcpvisor, authenticated=config.authenticated)) is not None:
        logging.getLogger("mcpvisor.supervisor").warning("%s", warning)
    configstore.remove_stale_temp(path)
    # Before anything starts: the frontend and the workers inherit the variables the table sets.
    telemetry.apply_table(config.telemetry)
    shared = None
    if config.mcpvisor.state_url:
        from mcpvisor.store.state_url import StateStoreError
        from mcpvisor.supervisor.shared import SharedState

        try:
            shared = SharedState.open(config.mcpvisor.state_url)
        except StateStoreError as exc:
            print(f"mcpvisor: {exc}", file=sys.stderr)
            return 1
    try:
        return trio.run(serve, config, path, shared, lock.run_dir)
    finally:
        if shared is not None:
            shared.close()
        lock.release()


def cmd_check(args: argparse.Namespace) -> int:
    if (loaded := _load(args)) is None:
        return 2
    path, config = loaded
    # A sandbox that cannot be built stops its upstream from starting: say so before anything starts.
    if config_mod.needs_sandbox(config) and (problem := bwrap.probe()) is not None:
        print(f"mcpvisor: {path}: sandboxes are required but cannot be built: {problem}", file=sys.stderr)
        return 1
    from mcpvisor.supervisor.policy_files import load_policies, policy_warnings, rules_of

    try:
        policies = load_policies(config, path)
    except ConfigError as exc:
        print(f"mcpvisor: config error: {exc}", file=sys.stderr)
        return 2
    problems = command_problems(config)
    if (problem := _sandbox_limits(config)) is not None:
        problems.append(problem)
    for line in problems:
        print(f"mcpvisor: {path}: {line}", file=sys.stderr)
    if problems:
        return 1
    print(f"{path}: ok, {len(config.servers)} servers")
    if policies is not None:
        data = config_mod.data_dir(config, path.resolve())
        print(f"policies: {len(rules_of(policies))} in {len(policies.sources)} files, {policies.config.mode}")
        for warning in policy_warnings(policies, config, data):
            print(f"warning: {warning}")
    # Per-tenant secret references ({tenant} in a path): which tenants lack which (never a value).
    tenants = {name: table.servers for name, table in config.tenants.items()}
    for tenant, server, reference in tenant_secrets.missing_by_tenant(config.servers, tenants):
        print(f"tenant {tenant} lacks {reference} (server {server}): it waits for the operator")
    if (problem := _code_execution_sandbox(path, config)) is not None:
        refused, line = problem
        print(f"mcpvisor: {line}", file=sys.stderr)
        return 1 if refused else 0
    return 0


def command_problems(config: config_mod.Config) -> list[str]:
    """Each enabled stdio server whose command the worker could not start, looked up as the worker does."""
    from mcpvisor.runtime.commands import child_environment, command_problem
    from mcpvisor.wire.secrets import SecretError, resolve_all

    problems = []
    for name, server in config.servers.items():
        if server.kind != "stdio" or not server.enabled or server.command is None:
            continue
        # In a sandbox the command is looked up in mcpvisor's own PATH, as the worker does.
        sandboxed = sandboxing.wanted(config.mcpvisor, server, None)
        configured = {key: value for key, value in server.env.items() if key == "PATH" and not sandboxed}
        try:
            search_path = child_environment(resolve_all(configured)).get("PATH")
        except SecretError as exc:
            problems.append(f"server {name}: its PATH cannot be resolved: {exc}")
            continue
        if (problem := command_problem(server.command, search_path, server.cwd)) is not None:
            problems.append(f"server {name}: {problem}")
    return problems


def _sandbox_limits(config: config_mod.Config) -> str | None:
    """Why the sandboxes cannot be what the config asks here (a tenant's without a writable cgroup, an
    outbound network without pasta or /dev/net/tun), or None."""
    from mcpvisor.runtime import network
    from mcpvisor.runtime.cgroups import cgroup_problem

    if (problem := cgroup_problem(config.mcpvisor, config.servers, config.tenants)) is not None:
        return problem
    for tenant, table in [("", None), *config.tenants.items()]:
        for name in table.servers if table is not None else config.servers:
            server = config.servers.get(name)
            found = sandboxing.plan(name, config.mcpvisor, server, table, data_dir="/") if server else None
            if found is not None and found.network == "outbound":
                why = network.problem(privileged=bwrap.mounts_as_root())
                return None if why is None else f"{f'{tenant}/' if tenant else ''}{name}: {why}"
    return None


def _code_execution_sandbox(path: Path, config: config_mod.Config) -> tuple[bool, str] | None:
    """Whether code_execution's sandbox can be built here, tried as `serve` will: (refused, line) if not."""
    if not config.mcpvisor.enable_code_execution:
        return None
    from mcpvisor.runtime import script_runner
    from mcpvisor.supervisor.supervisor import hidden_paths
    from mcpvisor.wire.endpoints import runtime_dir

    data = config_mod.data_dir(config, path.resolve())
    hidden = hidden_paths(config, path.resolve(), data, runtime_dir(data))
    required = script_runner.sandbox_required(config.mcpvisor, config.tenants)
    decision = script_runner.decide(sys.executable, hidden, required=required)
    return None if decision.warning is None else (decision.refused, decision.warning)


def cmd_import(args: argparse.Namespace) -> int:
    from mcpvisor.supervisor import configstore
    from mcpvisor.supervisor.importer import import_servers

    path = _config_path(args.config)
    try:
        config = config_mod.load(path) if path.exists() else config_mod.Config()
        new, added, skipped = import_servers(Path(args.source), config, replace=args.replace, fmt=args.format)
    except ConfigError as exc:
        print(f"mcpvisor: {exc}", file=sys.stderr)
        return 2
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    if not added:
        print("no servers imported", file=sys.stderr)
        return 1
    if args.dry_run:
        print(configstore.dumps(new), end="")
        return 0
    configstore.save_servers(path, new, added)
    print(f"{path}: imported {', '.join(added)}")
    print("secrets found in the file were replaced by ${env:NAME} references: set those variables where mcpvisor runs")
    print("running? apply it with `mcpvisor ctl update` (or SIGHUP)")
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    """`token add|list|revoke`: straight on the state store, so it works whether mcpvisor runs or not."""
    import datetime
    import json

    from mcpvisor.store.state_db import open_store
    from mcpvisor.store.state_url import StateStoreError
    from mcpvisor.store.tokens import TokenError, TokenStore, parse_expiry

    if (loaded := _load(args)) is None:
        return 2
    path, config = loaded
    try:
        db = open_store(str(config_mod.data_dir(config, path.resolve())), config.mcpvisor.state_url)
    except StateStoreError as exc:
        print(f"mcpvisor: token {args.token_command}: {exc}", file=sys.stderr)
        return 1
    store = TokenStore(db)

    def when(value: float | None) -> str:
        if value is None:
            return "-"
        return datetime.datetime.fromtimestamp(value, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    try:
        if args.token_command == "add":
            if args.tenant not in config.tenants and not args.admin:
                known = ", ".join(sorted(config.tenants)) or "none configured"
                print(f"mcpvisor: token add: no tenant {args.tenant!r} (tenants: {known})", file=sys.stderr)
                return 4
            expires = parse_expiry(args.expires) if args.expires else None
            info, token = store.add(args.tenant, admin=args.admin, expires=expires)
            kind = "admin token" if args.admin else "token"
            print(f"{kind} {info.id} for tenant {info.tenant!r}, expires {when(expires)}")
            print("shown once; it is stored only as a hash:")
            print(token)
        elif args.token_command == "list":
            rows = store.list()
            if args.json:
                print(json.dumps([row.as_row() for row in rows], indent=2))
            elif not rows:
                print("no tokens")
            else:
                print(f"{'ID':<10}{'TENANT':<20}{'ADMIN':<7}{'CREATED':<22}{'EXPIRES':<22}LAST USED")
                for row in rows:
                    print(
                        f"{row.id:<10}{row.tenant:<20}{'yes' if row.admin else 'no':<7}{when(row.created):<22}"
                        f"{when(row.expires):<22}{when(row.last_used)}"
                    )
        else:
            info = store.revoke(args.id)
            print(f"revoked token {info.id} of tenant {info.tenant!r}")
    except TokenError as exc:
        print(f"mcpvisor: token {args.token_command}: {exc}", file=sys.stderr)
        return 4 if args.token_command == "revoke" else 2
    except StateStoreError as exc:
        print(f"mcpvisor: token {args.token_command}: {exc}", file=sys.stderr)
        return 1
    finally:
        db.close()
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from mcpvisor.supervisor import config_reference

    text = config_reference.schema_json() if args.config_command == "schema" else config_reference.markdown()
    sys.stdout.write(text)
    return 0


def cmd_ctl(args: argparse.Namespace) -> int:
    from mcpvisor.supervisor import ctl

    return ctl.main(args.rest, _config_path(None), named=_config_named())


def version() -> str:
    """The installed distribution's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("mcpvisor")
    except PackageNotFoundError:  # run from a tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcpvisor",
        description="A supervised MCP aggregator: one MCP endpoint in front of many upstream MCP servers, "
        "each in its own worker process, kept running like programs under supervisord.",
    )
    parser.add_argument("--version", action="version", version=f"mcpvisor {version()}")
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

    imp = sub.add_parser(
        "import",
        help="add the servers another MCP client is configured with (Claude Desktop, Claude Code, Cursor, VS Code, "
        "Codex, Gemini CLI) to the config",
        description="Add the servers of another MCP client's config file to the config file: the `mcpServers` JSON "
        "of Claude Desktop (claude_desktop_config.json), Cursor (mcp.json) and VS Code (.vscode/mcp.json), Claude "
        "Code's ~/.claude.json (its own servers and every project's), the Codex CLI's ~/.codex/config.toml and the "
        "Gemini CLI's ~/.gemini/settings.json. Literal secrets in env and headers are not copied: they become "
        "${env:NAME} references.",
    )
    imp.add_argument("source", help="the file to read")
    imp.add_argument(
        "--format",
        choices=["auto", "mcpservers", "claude-code", "codex", "gemini"],
        default="auto",
        help="the file's format (default: recognised from the file)",
    )
    imp.add_argument("-c", "--config", help="the TOML config to add to (created if missing)")
    imp.add_argument("--replace", action="store_true", help="replace servers that already exist under that name")
    imp.add_argument("--dry-run", action="store_true", help="print the resulting config instead of writing it")
    imp.set_defaults(func=cmd_import)

    stdio = sub.add_parser(
        "stdio",
        help="serve MCP over stdin/stdout, bridged to a running mcpvisor (for Claude Desktop); see `stdio --help`",
        add_help=False,
    )
    stdio.add_argument("rest", nargs=argparse.REMAINDER)

    token = sub.add_parser(
        "token",
        help="add, list and revoke the access tokens of tenants and operators",
        description="Access tokens for clients (a tenant's) and operators (--admin). A token is printed once, "
        "alone on the last line, and stored only as a hash in the data dir's state store. Clients send it as "
        "`Authorization: Bearer TOKEN`. Works whether mcpvisor runs or not; a running one sees a new or revoked "
        "token at its next request.",
    )
    token_sub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    token_add = token_sub.add_parser("add", help="create a token and print it once")
    token_add.add_argument("tenant", help="the tenant the token belongs to (any label with --admin)")
    token_add.add_argument("--admin", action="store_true", help="an operator's token: admin API, console, every tenant")
    token_add.add_argument("--expires", help="a lifetime (30d, 12h, 90m) or an ISO date; default: never")
    token_list = token_sub.add_parser("list", help="list tokens: id, tenant, created, last used (never the token)")
    token_list.add_argument("--json", action="store_true", help="print JSON")
    token_revoke = token_sub.add_parser("revoke", help="delete a token; a running mcpvisor refuses it at once")
    token_revoke.add_argument("id", help="the token's id, from `token list`")
    for each in (token_add, token_list, token_revoke):
        each.add_argument("-c", "--config", help="TOML config file (default: $MCPVISOR_CONFIG or ./mcpvisor.toml)")
    token.set_defaults(func=cmd_token)

    config = sub.add_parser(
        "config",
        help="describe the config file: its JSON Schema (for editors) or its reference page",
        description="Describe the config file from the Structs mcpvisor reads it into, so the description cannot "
        "drift from what `mcpvisor check` accepts.",
    )
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    config_sub.add_parser(
        "schema",
        help="print the JSON Schema of the config file",
        description="Print the JSON Schema of the config file. Save it and name it on the first line of the file "
        "(`#:schema ./mcpvisor.schema.json`): editors that use Taplo (Even Better TOML) then complete keys, show "
        "their meaning and mark unknown ones.",
    )
    config_sub.add_parser(
        "docs", help="print the configuration reference (Markdown): every key, its type, default and meaning"
    )
    config.set_defaults(func=cmd_config)

    from mcpvisor.supervisor import activity_cli, policy_cli

    config_help = "TOML config file (default: $MCPVISOR_CONFIG or ./mcpvisor.toml)"
    policy_cli.add_parser(sub, config_help, _config_path)
    activity_cli.add_parser(sub, config_help, _config_path)

    check = sub.add_parser("check", help="validate a config file (and its policy files) and exit")
    check.add_argument("-c", "--config", help="TOML config file")
    check.set_defaults(func=cmd_check)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "ctl":
        # ctl has its own parser: its options may come before the command.
        from mcpvisor.supervisor import ctl

        sys.exit(ctl.main(argv[1:], _config_path(None), named=_config_named()))
    if argv and argv[0] == "stdio":
        # The bridge is a client of mcpvisor, not part of the supervisor: it runs as its own program.
        os.execv(sys.executable, [sys.executable, "-P", "-m", "mcpvisor.client.stdio_bridge", *argv[1:]])
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
