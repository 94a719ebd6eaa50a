"""The conformance suite's client auth scenarios, with mcpvisor as the OAuth client of a remote upstream.

For each scenario the suite (`@modelcontextprotocol/conformance`, pinned in tests/peers) starts a
mock MCP server and authorization server and runs this file as the client: `python
test_conformance_auth.py URL`. Run that way, it puts URL in a config as a remote upstream, runs
`mcpvisor serve`, waits for the upstream to ask for a login, runs `mcpvisor ctl login`, follows the
authorization URL headlessly (the mocks approve at once and redirect to mcpvisor's /oauth/callback),
waits until the upstream is ready and calls its first tool through /mcp/direct. A call refused for
more scope gets one more operator login (step-up) and one retry.

Each scenario is one test; a check with status FAILURE fails it (warnings do not). Scenarios that
cannot pass through mcpvisor say why in CANNOT_PASS.
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
_RESULT_DIR = re.compile(r"^(?P<scenario>auth-.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


# ---- the client the suite runs ------------------------------------------------------------------


def _ctl(config: Path, *args: str, env: dict[str, str]) -> tuple[int, Any]:
    command = [sys.executable, "-P", "-m", "mcpvisor.supervisor", "ctl", "-c", str(config), "--json", *args]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=90, check=False)
    try:
        return result.returncode, json.loads(result.stdout) if result.stdout.strip() else result.stderr
    except json.JSONDecodeError:
        return result.returncode, result.stdout + result.stderr


def _upstream(config: Path, env: dict[str, str]) -> dict[str, Any]:
    _code, rows = _ctl(config, "status", SERVER, env=env)
    return rows[0] if isinstance(rows, list) and rows else {}


def _wait_upstream(config: Path, env: dict[str, str], states: set[str], timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    row: dict[str, Any] = {}
    while time.monotonic() < deadline:
        row = _upstream(config, env)
        if row.get("upstream") in states:
            return row
        time.sleep(0.3)
    raise TimeoutError(f"the upstream never became {states}: {row}")


def _log_in(config: Path, env: dict[str, str]) -> None:
    import httpx2

    code, result = _ctl(config, "login", SERVER, "--no-wait", env=env)
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


def _call_first_tool(url: str) -> str:
    """Call the upstream's first tool through /mcp/direct; the text of a refusal, or '' when it worked."""
    import trio
    from mcp.client.client import Client
    from mcp.shared.exceptions import MCPError

    async def run() -> str:
        async with Client(url) as client:
            tools = [tool.name for tool in (await client.list_tools()).tools if tool.name.startswith(f"{SERVER}:")]
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


def run_client(server_url: str) -> int:
    """What the suite runs: mcpvisor in front of `server_url`, logged in by a headless operator."""
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    import tomli_w

    from tests.support.stack import free_port

    work = Path(tempfile.mkdtemp(prefix="mvauth"))
    run_dir = Path(tempfile.mkdtemp(prefix="mv", dir="/tmp"))
    port = free_port()
    oauth: dict[str, Any] = {"client_metadata_url": CLIENT_METADATA_URL}
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run_dir)}
    env.pop("RUNTIME_DIRECTORY", None)
    if context.get("client_id"):
        oauth["client_id"] = context["client_id"]
        if context.get("client_secret"):
            env["CONFORMANCE_CLIENT_SECRET"] = context["client_secret"]
            oauth["client_secret"] = "${env:CONFORMANCE_CLIENT_SECRET}"
    config = work / "mcpvisor.toml"
    document = {
        "mcpvisor": {"listen": f"127.0.0.1:{port}", "enable_direct_endpoint": True, "data_dir": str(work / "data")},
        "servers": {SERVER: {"url": server_url, "transport": "streamable-http", "oauth": oauth}},
    }
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
        row = _wait_upstream(config, env, {"authenticating", "ready"})
        print(f"upstream: {row.get('upstream')} ({row.get('error', '')})", file=sys.stderr)
        logins = 0
        while True:
            if row.get("upstream") == "authenticating":
                _log_in(config, env)
                logins += 1
                row = _wait_upstream(config, env, {"ready"}, timeout=30)
            refusal = _call_first_tool(f"http://127.0.0.1:{port}/mcp/direct")
            if not refusal:
                return 0
            print(f"refused: {refusal}", file=sys.stderr)
            # A refusal for more scope: the operator logs in again, once (a loop would never end).
            if "ctl login" not in refusal or logins >= 2:
                return 1
            _log_in(config, env)
            logins += 1
            time.sleep(0.5)
            row = _upstream(config, env)
    finally:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
        for name in ("supervisor.out", "data/logs/conf.worker.log"):
            path = work / name
            if path.exists():
                print(f"---- {name}\n{path.read_text(errors='replace')[-4000:]}", file=sys.stderr)


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


# Each scenario starts its own mcpvisor and the suite's mocks, and spends most of its time waiting
# for processes to start: a few at once take a fraction of the time one after another would.
AT_ONCE = 4


@pytest.fixture(scope="module")
def auth_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]] | BaseException]:
    """Every scenario's checks (or why it left none), run a few at a time before the tests read them."""
    conformance_entry()
    runnable = [scenario for scenario in AUTH_SCENARIOS if scenario not in CANNOT_PASS]

    def run(scenario: str) -> list[dict[str, Any]] | BaseException:
        try:
            return run_scenario(scenario, tmp_path_factory.mktemp(scenario.replace("/", "-")))
        except (AssertionError, OSError, subprocess.SubprocessError) as exc:
            return exc

    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        return dict(zip(runnable, pool.map(run, runnable), strict=True))


@pytest.mark.parametrize("scenario", AUTH_SCENARIOS)
def test_auth_scenario(scenario: str, auth_results: dict[str, list[dict[str, Any]] | BaseException]) -> None:
    if scenario in CANNOT_PASS:
        pytest.xfail(CANNOT_PASS[scenario])
    checks = auth_results[scenario]
    if isinstance(checks, BaseException):
        raise checks
    failures = [check for check in checks if check.get("status") == "FAILURE"]
    assert not failures, "\n".join(
        f"{check['id']}: {check.get('errorMessage', '')} {json.dumps(check.get('details'))[:400]}" for check in failures
    )
