"""The conformance suite's client auth scenarios, with mcpvisor as the OAuth client of a remote upstream.

For each scenario the suite (`@modelcontextprotocol/conformance`, pinned in tests/peers) starts a
mock MCP server and authorization server and runs this file as the client: `python
test_conformance_auth.py URL`. Run that way, it adds URL as a remote upstream to the mcpvisor the
tests started (run by hand: to a new `mcpvisor serve`), waits for the upstream to ask for a login,
runs `mcpvisor ctl login`, follows the authorization URL headlessly (the mocks approve at once and
redirect to mcpvisor's /oauth/callback), waits until the upstream is ready and calls its first tool
through /mcp/direct. A call refused for more scope gets one more operator login (step-up) and one
retry.

Each scenario is one test; a check with status FAILURE fails it (warnings do not). Scenarios that
cannot pass through mcpvisor say why in CANNOT_PASS.

TENANT_SCENARIOS run a second time with the login driven by a tenant's own MCP client instead of
`ctl`: the tenant finds the upstream's `NAME:login` tool, calls it, opens the single-use link it
answers with (which binds the browser, then goes on to the authorization server), and calls the
first tool once its tools are listed; a refusal for more scope answers with a new link.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# `conformance list --client` of the pinned version, the auth scenarios an authorization-code client meets.
AUTH_SCENARIOS = (
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/metadata-var2",
    "auth/metadata-var3",
    "auth/basic-cimd",
    "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined",
    "auth/scope-step-up",
    "auth/scope-retry-limit",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none",
    "auth/pre-registration",
    "auth/2025-03-26-oauth-metadata-backcompat",
    "auth/2025-03-26-oauth-endpoint-fallback",
    "auth/resource-mismatch",
    "auth/offline-access-scope",
    "auth/offline-access-not-supported",
    "auth/authorization-server-migration",
    "auth/iss-supported",
    "auth/iss-not-advertised",
    "auth/iss-supported-missing",
    "auth/iss-wrong-issuer",
    "auth/iss-unexpected",
    "auth/iss-normalized",
    "auth/metadata-issuer-mismatch",
)
# Client-credentials, enterprise, DPoP and workload-identity scenarios are extensions mcpvisor does not
# offer: its logins are an operator's authorization-code flow (`mcpvisor ctl login`).
CANNOT_PASS: dict[str, str] = {}
# Scenarios run at another wire version than their own, and why. The migration scenario exists only
# at 2026-07-28, whose mock serves only the stateless lifecycle and answers the worker's handshake
# (`initialize`, the era mcpvisor speaks toward upstreams) with -32020 "Missing MCP-Protocol-Version
# header" before any authorization happens; at 2025-11-25 its OAuth checks (SEP-2352) all run.
FORCED_VERSION = {"auth/authorization-server-migration": "2025-11-25"}
# The client metadata document the suite's mock authorization server expects (it does not fetch it).
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"
SERVER = "conf"
TENANT = "acme"
# The scenarios a tenant's own client drives as well: discovery variants, registration by metadata
# document, dynamic and pre-registered clients, each token endpoint authentication, step-up, the
# issuer and resource checks.
TENANT_SCENARIOS = (
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/basic-cimd",
    "auth/scope-from-www-authenticate",
    "auth/scope-step-up",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/pre-registration",
    "auth/2025-03-26-oauth-metadata-backcompat",
    "auth/resource-mismatch",
    "auth/iss-supported",
    "auth/iss-wrong-issuer",
)
_RESULT_DIR = re.compile(r"^(?P<scenario>auth-.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


# ---- the client the suite runs ------------------------------------------------------------------

# Set by the tests' fixture: one mcpvisor serves every scenario, each adding its upstream under a
# name of its own (`update`, as an operator would) and removing it at the end. Starting an mcpvisor
# per scenario cost more CPU than the scenario itself. Run by hand, the client starts its own.
SHARED_ENV = "MCPVISOR_AUTH_SHARED"


@dataclass
class Gateway:
    config: Path
    env: dict[str, str]
    control: str
    port: int
    name: str
    data: Path
    tenant_token: str = ""  # set when a tenant's client drives the login


def _ctl(gateway: Gateway, *args: str) -> tuple[int, Any]:
    command = [sys.executable, "-P", "-m", "mcpvisor.supervisor", "ctl", "-c", str(gateway.config), "--json", *args]
    result = subprocess.run(command, capture_output=True, text=True, env=gateway.env, timeout=90, check=False)
    try:
        return result.returncode, json.loads(result.stdout) if result.stdout.strip() else result.stderr
    except json.JSONDecodeError:
        return result.returncode, result.stdout + result.stderr


def _ask(control: str, command: str, *args: str) -> Any:
    """A control-socket question: polling with a `ctl` process each time would cost more CPU than
    the scenario itself (the login below runs the real `ctl login`). None when nobody answers."""
    from mcpvisor.supervisor.ctl import NoDaemon
    from tests.support.stack import ask

    try:
        reply = ask(control, command, *args, timeout=60)
    except NoDaemon:
        return None
    if not reply.ok:
        print(f"{command} {' '.join(args)}: {reply.error}", file=sys.stderr)
        return None
    return reply.result


def _upstream(gateway: Gateway) -> dict[str, Any]:
    rows = _ask(gateway.control, "status", gateway.name)
    return rows[0] if isinstance(rows, list) and rows else {}


def _wait_upstream(gateway: Gateway, states: set[str], timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    row: dict[str, Any] = {}
    while time.monotonic() < deadline:
        row = _upstream(gateway)
        if row.get("upstream") in states:
            return row
        time.sleep(0.3)
    raise TimeoutError(f"the upstream never became {states}: {row}")


def _log_in(gateway: Gateway) -> None:
    import httpx2

    code, result = _ctl(gateway, "login", gateway.name, "--no-wait")
    print(f"ctl login: exit {code}: {result}", file=sys.stderr)
    if code != 0 or not isinstance(result, dict) or not result.get("url"):
        raise RuntimeError(f"ctl login failed: {result}")
    with httpx2.Client(timeout=30) as browser:
        consent = browser.get(result["url"])
        location = consent.headers.get("location")
        if consent.status_code not in (301, 302, 303, 307, 308) or not location:
            raise RuntimeError(f"the authorization endpoint answered {consent.status_code}, not a redirect")
        page = browser.get(location)
        print(f"callback: {page.status_code}: {page.text[:300]}", file=sys.stderr)


def _call_first_tool(gateway: Gateway) -> str:
    """Call the upstream's first tool through /mcp/direct; the text of a refusal, or '' when it worked."""
    import trio
    from mcp.client.client import Client
    from mcp.shared.exceptions import MCPError

    async def run() -> str:
        async with Client(f"http://127.0.0.1:{gateway.port}/mcp/direct") as client:
            listed = (await client.list_tools()).tools
            tools = [tool.name for tool in listed if tool.name.startswith(f"{gateway.name}:")]
            print(f"tools: {tools}", file=sys.stderr)
            if not tools:
                return "no tools"
            try:
                result = await client.call_tool(tools[0], {})
            except MCPError as exc:
                return exc.message
            text = result.content[0].text if result.content and hasattr(result.content[0], "text") else ""
            print(f"call: error={result.is_error} {text[:200]}", file=sys.stderr)
            return text if result.is_error and "ctl login" in text else ""

    return trio.run(run)


def _oauth(context: dict[str, Any], work: Path) -> dict[str, Any]:
    """The upstream's [oauth] table; a pre-registered secret goes in a file, referenced by `${file:}`."""
    oauth: dict[str, Any] = {"client_metadata_url": CLIENT_METADATA_URL}
    if context.get("client_id"):
        oauth["client_id"] = context["client_id"]
        if context.get("client_secret"):
            secret = work / "client-secret"
            secret.touch(mode=0o600)
            secret.write_text(context["client_secret"])
            oauth["client_secret"] = f"${{file:{secret}}}"
    return oauth


@contextmanager
def _own_gateway(server: dict[str, Any] | None, *, tenant_token: str = "") -> Iterator[Gateway]:
    """A new mcpvisor with the upstream as its one server (None: no server yet), stopped afterwards.

    With `tenant_token`, tenant `acme` holds that token and no server yet (scenarios add theirs).
    """
    import tomli_w

    from mcpvisor.wire.endpoints import Endpoints
    from tests.support.stack import free_port

    work = Path(tempfile.mkdtemp(prefix="mvauth"))
    run_dir = Path(tempfile.mkdtemp(prefix="mv", dir="/tmp"))
    port = free_port()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run_dir)}
    env.pop("RUNTIME_DIRECTORY", None)
    config = work / "mcpvisor.toml"
    settings = {"listen": f"127.0.0.1:{port}", "enable_direct_endpoint": True, "data_dir": str(work / "data")}
    document: dict[str, Any] = {"mcpvisor": settings, "servers": {SERVER: server} if server else {}}
    if tenant_token:
        (work / "tenant.token").write_text(tenant_token)
        document["tenants"] = {TENANT: {"servers": [], "token_files": [str(work / "tenant.token")]}}
    config.write_text(tomli_w.dumps(document))
    with open(work / "supervisor.out", "wb") as out:
        supervisor = subprocess.Popen(
            [sys.executable, "-P", "-m", "mcpvisor.supervisor", "serve", "-c", str(config)],
            stdout=out,
            stderr=out,
            env=env,
            start_new_session=True,
        )
    try:
        control = Endpoints.in_dir(run_dir / "mcpvisor").control
        yield Gateway(config, env, control, port, SERVER, work / "data", tenant_token)
    finally:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
        path = work / "supervisor.out"
        print(f"---- supervisor.out\n{path.read_text(errors='replace')[-4000:]}", file=sys.stderr)


def _edit_servers(config: Path, control: str, change: Any) -> None:
    """Change the shared config under a lock (scenarios run at once) and `update`."""
    import fcntl
    import tomllib

    import tomli_w

    with open(config.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        document = tomllib.loads(config.read_text())
        change(document)
        config.write_text(tomli_w.dumps(document))
        result = _ask(control, "update")
        print(f"update: {result}", file=sys.stderr)


@contextmanager
def _shared_gateway(shared: dict[str, Any], server: dict[str, Any]) -> Iterator[Gateway]:
    """The fixture's mcpvisor, with the upstream added as `conf<pid>` for the scenario's length."""
    config = Path(shared["config"])
    name = f"{SERVER}{os.getpid()}"
    token = shared.get("tenant_token", "")

    def add(document: dict[str, Any]) -> None:
        document.setdefault("servers", {})[name] = server
        if token:
            document["tenants"][TENANT]["servers"].append(name)

    def remove(document: dict[str, Any]) -> None:
        if token:
            document["tenants"][TENANT]["servers"].remove(name)
        document.setdefault("servers", {}).pop(name, None)

    _edit_servers(config, shared["control"], add)
    try:
        env = {**os.environ, "MCPVISOR_CONTROL": shared["control"]}
        yield Gateway(config, env, shared["control"], shared["port"], name, Path(shared["data"]), token)
    finally:
        _edit_servers(config, shared["control"], remove)


def run_client(server_url: str) -> int:
    """What the suite runs: mcpvisor in front of `server_url`, logged in by a headless operator."""
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    work = Path(tempfile.mkdtemp(prefix="mvauth"))
    server = {"url": server_url, "transport": "streamable-http", "oauth": _oauth(context, work)}
    shared = json.loads(os.environ[SHARED_ENV]) if os.environ.get(SHARED_ENV) else None
    with _shared_gateway(shared, server) if shared else _own_gateway(server) as gateway:
        try:
            return _tenant_logs_in_and_calls(gateway) if gateway.tenant_token else _log_in_and_call(gateway)
        finally:
            worker = f"{TENANT}@{gateway.name}" if gateway.tenant_token else gateway.name
            log = gateway.data / "logs" / f"{worker}.worker.log"
            if log.exists():
                print(f"---- {log.name}\n{log.read_text(errors='replace')[-4000:]}", file=sys.stderr)


def _log_in_and_call(gateway: Gateway) -> int:
    row = _wait_upstream(gateway, {"authenticating", "ready"})
    print(f"upstream: {row.get('upstream')} ({row.get('error', '')})", file=sys.stderr)
    logins = 0
    while True:
        if row.get("upstream") == "authenticating":
            _log_in(gateway)
            logins += 1
            row = _wait_upstream(gateway, {"ready"}, timeout=30)
        refusal = _call_first_tool(gateway)
        if not refusal:
            return 0
        print(f"refused: {refusal}", file=sys.stderr)
        # A refusal for more scope: the operator logs in again, once (a loop would never end).
        if "ctl login" not in refusal or logins >= 2:
            return 1
        _log_in(gateway)
        logins += 1
        time.sleep(0.5)
        row = _upstream(gateway)


def _tenant_logs_in_and_calls(gateway: Gateway) -> int:
    """The tenant's client finds `NAME:login`, the tenant's browser opens its link; then the first tool."""
    import httpx2
    import trio
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client

    login = f"{gateway.name}:login"

    def browse(link: str) -> None:
        with httpx2.Client(timeout=30) as browser:
            start = browser.get(link)  # sets the login's cookie, then on to the authorization server
            print(f"link: {start.status_code}", file=sys.stderr)
            consent = browser.get(start.headers["location"])
            location = consent.headers.get("location")
            if consent.status_code not in (301, 302, 303, 307, 308) or not location:
                raise RuntimeError(f"the authorization endpoint answered {consent.status_code}, not a redirect")
            page = browser.get(location)
            print(f"callback: {page.status_code}: {page.text[:300]}", file=sys.stderr)

    async def run() -> int:
        headers = {"Authorization": f"Bearer {gateway.tenant_token}"}
        url = f"http://127.0.0.1:{gateway.port}/mcp/direct"
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):

            async def tools() -> list[str]:
                listed = (await client.list_tools()).tools
                return [tool.name for tool in listed if tool.name.startswith(f"{gateway.name}:")]

            logins = 0
            with trio.move_on_after(90):
                while not (names := await tools()):
                    await trio.sleep(0.3)  # the tenant's worker starts on its first request
            print(f"tools: {names}", file=sys.stderr)
            while True:
                if names == [login]:
                    answer = await client.call_tool(login, {})
                else:
                    answer = await client.call_tool(names[0], {})
                    text = answer.content[0].text if answer.content and hasattr(answer.content[0], "text") else ""
                    print(f"call: error={answer.is_error} {text[:200]}", file=sys.stderr)
                link = (answer.structured_content or {}).get("login_url")
                if not link:
                    return 1 if answer.is_error else 0
                if logins >= 2:
                    return 1  # a refusal for more scope gets one more login, not a loop
                await trio.to_thread.run_sync(browse, link)
                logins += 1
                with trio.move_on_after(30):
                    # Until the real tools are listed: the login tool goes first, then the upstream reconnects.
                    while (names := await tools()) in ([], [login]):
                        await trio.sleep(0.3)
                if not names:
                    return 1

    return trio.run(run)


if __name__ == "__main__":
    sys.exit(run_client(sys.argv[-1]))


# ---- the tests ----------------------------------------------------------------------------------

from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import pytest  # noqa: E402

from tests.e2e.test_conformance import conformance, conformance_entry  # noqa: E402


def run_scenario(scenario: str, out_dir: Path) -> list[dict[str, Any]]:
    command = f"{sys.executable} {Path(__file__).resolve()}"
    version = ["--spec-version", FORCED_VERSION[scenario], "--force"] if scenario in FORCED_VERSION else []
    result = conformance(
        "client",
        "--command",
        command,
        "--scenario",
        scenario,
        *version,
        "--timeout",
        "150000",
        "-o",
        str(out_dir),
        timeout=300,
    )
    # Results land in OUT/auth/<name>-<timestamp>/checks.json.
    for checks in out_dir.rglob("checks.json"):
        if _RESULT_DIR.match(f"auth-{checks.parent.name}"):
            return json.loads(checks.read_text())
    raise AssertionError(f"{scenario} left no results: {result.stdout[-3000:]}{result.stderr[-3000:]}")


def test_the_auth_scenarios_are_the_pinned_suites() -> None:
    conformance_entry()
    listed = conformance("list", "--client", timeout=60).stdout
    names = re.findall(r"^\s+- (auth/\S+) \[(.*)\]", listed, flags=re.M)
    assert tuple(name for name, versions in names if versions != "extension") == AUTH_SCENARIOS


# Each scenario starts the suite's mocks and a client process, and spends most of its time waiting
# for processes to start: a few at once take a fraction of the time one after another would.
AT_ONCE = 4


Results = dict[str, list[dict[str, Any]] | BaseException]


@pytest.fixture(scope="module")
def auth_results(tmp_path_factory: pytest.TempPathFactory) -> Results:
    """Every scenario's checks (or why it left none), run a few at a time before the tests read them."""
    return _run_all(tmp_path_factory, [s for s in AUTH_SCENARIOS if s not in CANNOT_PASS])


@pytest.fixture(scope="module")
def tenant_auth_results(tmp_path_factory: pytest.TempPathFactory) -> Results:
    """TENANT_SCENARIOS' checks with a tenant's own client driving each login."""
    import secrets

    return _run_all(tmp_path_factory, list(TENANT_SCENARIOS), tenant_token=secrets.token_urlsafe(32))


def _run_all(tmp_path_factory: pytest.TempPathFactory, runnable: list[str], *, tenant_token: str = "") -> Results:
    conformance_entry()
    # Made here, not in the threads: pytest creates its base temporary directory on first use, and
    # threads racing to do that remove each other's.
    prefix = "tenant-" if tenant_token else ""
    out_dirs = {scenario: tmp_path_factory.mktemp(prefix + scenario.replace("/", "-")) for scenario in runnable}

    def run(scenario: str) -> list[dict[str, Any]] | BaseException:
        try:
            return run_scenario(scenario, out_dirs[scenario])
        except (AssertionError, OSError, subprocess.SubprocessError) as exc:
            return exc

    with _own_gateway(None, tenant_token=tenant_token) as gateway:
        _wait_serving(gateway)
        shared = {
            "config": str(gateway.config),
            "control": gateway.control,
            "port": gateway.port,
            "tenant_token": tenant_token,
        }
        os.environ[SHARED_ENV] = json.dumps({**shared, "data": str(gateway.data)})
        try:
            with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
                return dict(zip(runnable, pool.map(run, runnable), strict=True))
        finally:
            del os.environ[SHARED_ENV]


def _wait_serving(gateway: Gateway, timeout: float = 60.0) -> None:
    import httpx2

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"http://127.0.0.1:{gateway.port}/healthz", timeout=5).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the shared mcpvisor did not serve within {timeout:g}s")


@pytest.mark.parametrize("scenario", AUTH_SCENARIOS)
def test_auth_scenario(scenario: str, auth_results: Results) -> None:
    if scenario in CANNOT_PASS:
        pytest.xfail(CANNOT_PASS[scenario])
    checks = auth_results[scenario]
    if isinstance(checks, BaseException):
        raise checks
    _assert_passed(checks)


@pytest.mark.parametrize("scenario", TENANT_SCENARIOS)
def test_auth_scenario_driven_by_a_tenants_client(scenario: str, tenant_auth_results: Results) -> None:
    checks = tenant_auth_results[scenario]
    if isinstance(checks, BaseException):
        raise checks
    _assert_passed(checks)


def _assert_passed(checks: list[dict[str, Any]]) -> None:
    failures = [check for check in checks if check.get("status") == "FAILURE"]
    assert not failures, "\n".join(
        f"{check['id']}: {check.get('errorMessage', '')} {json.dumps(check.get('details'))[:400]}" for check in failures
    )
