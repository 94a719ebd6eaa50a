"""A login's flow against an upstream that lies: where it may send the worker, and what of its answers is repeated.

The upstream and its authorization server are an httpx2 MockTransport here, so an upstream can sit on a
public address and name internal ones; the flow is the real `UpstreamAuth.login`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
import trio
import trio.testing
from mcp.shared.auth import AuthorizationCodeResult
from trio.testing import MockClock

from mcpvisor.runtime.addresses import Reach, reach
from mcpvisor.store import oauth_store
from mcpvisor.store.oauth_store import LOGIN_AFTER_OPENING
from mcpvisor.workers.oauth import LoginError, UpstreamAuth
from mcpvisor.workers.oauth_login import CallbackParams, LoginDesk

PUBLIC = "93.184.215.14"  # a global address, written as one so nothing is resolved
AS_PUBLIC = "93.184.215.15"
SECRET_BODY = "INTERNAL-ONLY: db_password=hunter2"
REDIRECT = "http://127.0.0.1:8080/oauth/callback"

Handler = Callable[[httpx2.Request], httpx2.Response]


def upstream(
    base: str,
    *,
    resource_metadata: str | None = None,
    authorization_server: str | None = None,
    registration: str | None = None,
    register_status: int = 201,
    token_status: int = 200,
    token_body: dict | None = None,
) -> tuple[Handler, list[str]]:
    """An MCP server at `base`/mcp that asks for a login, and what the flow fetched from it."""
    issuer = authorization_server or base
    prm_url = resource_metadata or f"{base}/.well-known/oauth-protected-resource/mcp"
    seen: list[str] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        url = str(request.url)
        seen.append(f"{request.method} {url}")
        if url == f"{base}/mcp":
            return httpx2.Response(401, headers={"WWW-Authenticate": f'Bearer resource_metadata="{prm_url}"'})
        if url == prm_url:
            return httpx2.Response(200, json={"resource": f"{base}/mcp", "authorization_servers": [issuer]})
        if url.startswith(f"{issuer}/.well-known/oauth-authorization-server"):
            return httpx2.Response(
                200,
                json={
                    "issuer": issuer,
                    "authorization_endpoint": f"{issuer}/authorize",
                    "token_endpoint": f"{issuer}/token",
                    "registration_endpoint": registration or f"{issuer}/register",
                    "response_types_supported": ["code"],
                    "code_challenge_methods_supported": ["S256"],
                },
            )
        if url == (registration or f"{issuer}/register"):
            if register_status != 201:
                return httpx2.Response(register_status, text=SECRET_BODY)
            uris = json.loads(request.content)["redirect_uris"]
            return httpx2.Response(
                201, json={"client_id": "c1", "redirect_uris": uris, "token_endpoint_auth_method": "none"}
            )
        if url == f"{issuer}/token":
            if token_status != 200:
                return httpx2.Response(token_status, text=SECRET_BODY)
            return httpx2.Response(200, json=token_body or {"access_token": "a1", "token_type": "Bearer"})
        return httpx2.Response(404, text=SECRET_BODY)

    return handle, seen


async def log_in(tmp_path: Path, base: str, handler: Handler) -> UpstreamAuth:
    """`ctl login` against the mock: the flow runs, the "browser" brings a code back once the URL is out."""
    auth = UpstreamAuth(f"{base}/mcp", oauth_store.FileRecord(tmp_path / "login.json"), None, lambda _: None)
    auth.begin_login()
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as http, trio.open_nursery() as nursery:

        async def browser() -> None:
            await auth.wait_for_url()
            auth.deliver(AuthorizationCodeResult(code="code-1", state=auth.state, iss=None))

        nursery.start_soon(browser)
        failure: LoginError | None = None
        try:
            await auth.login(REDIRECT, http)
        except LoginError as exc:
            failure = exc
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return auth


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("8.8.8.8", Reach.PUBLIC),
        ("10.0.0.7", Reach.PRIVATE),
        ("100.64.1.1", Reach.PRIVATE),
        ("fd00::1", Reach.PRIVATE),
        ("127.0.0.1", Reach.LOOPBACK),
        ("::ffff:127.0.0.1", Reach.LOOPBACK),
        ("169.254.169.254", Reach.SPECIAL),
        ("fe80::1%eth0", Reach.SPECIAL),
        ("0.0.0.0", Reach.SPECIAL),
        ("224.0.0.1", Reach.SPECIAL),
    ],
)
def test_addresses_are_ranked_from_public_to_internal(address: str, expected: Reach) -> None:
    assert reach(address) is expected


@pytest.mark.parametrize(
    ("names", "internal"),
    [
        ({"resource_metadata": "http://169.254.169.254/latest/meta-data/prm"}, "169.254.169.254"),
        ({"authorization_server": "http://10.0.0.7:8500"}, "10.0.0.7:8500"),
        ({"registration": "http://127.0.0.1:2379/v2/keys/secret"}, "127.0.0.1:2379"),
    ],
)
async def test_a_public_upstream_cannot_send_the_login_to_an_internal_address(
    tmp_path: Path, names: dict[str, str], internal: str
) -> None:
    handler, seen = upstream(f"http://{PUBLIC}", **names)
    with pytest.raises(LoginError, match="may not reach") as refused:
        await log_in(tmp_path, f"http://{PUBLIC}", handler)
    assert internal in str(refused.value)
    assert not [line for line in seen if internal in line], seen  # never fetched


async def test_a_refused_registration_is_told_by_status_and_host_never_its_body(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    handler, _ = upstream(f"http://{PUBLIC}", authorization_server=f"https://{AS_PUBLIC}", register_status=403)
    with caplog.at_level(logging.DEBUG), pytest.raises(LoginError) as refused:
        await log_in(tmp_path, f"http://{PUBLIC}", handler)
    assert str(refused.value) == f"{AS_PUBLIC} answered HTTP 403 to the client registration"
    assert "hunter2" not in caplog.text


async def test_a_refused_token_request_is_told_by_status_and_host_never_its_body(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    handler, _ = upstream(f"http://{PUBLIC}", token_status=400)
    with caplog.at_level(logging.DEBUG), pytest.raises(LoginError) as refused:
        await log_in(tmp_path, f"http://{PUBLIC}", handler)
    assert str(refused.value) == f"{PUBLIC} answered HTTP 400 to the token request"
    assert "hunter2" not in caplog.text


async def test_an_unreadable_token_answer_is_not_quoted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    handler, _ = upstream(f"http://{PUBLIC}", token_body={"db_password": "hunter2"})
    with caplog.at_level(logging.DEBUG), pytest.raises(LoginError) as refused:
        await log_in(tmp_path, f"http://{PUBLIC}", handler)
    assert "hunter2" not in str(refused.value) and "hunter2" not in caplog.text
    assert PUBLIC in str(refused.value)


async def test_an_upstream_on_loopback_may_name_loopback_endpoints(tmp_path: Path) -> None:
    # A local setup: the upstream and its authorization server on one machine.
    handler, _ = upstream("http://127.0.0.1:9", authorization_server="http://127.0.0.1:10")
    auth = await log_in(tmp_path, "http://127.0.0.1:9", handler)
    assert auth.has_tokens


async def test_a_private_upstream_may_not_name_a_metadata_address(tmp_path: Path) -> None:
    handler, seen = upstream("http://10.0.0.5", resource_metadata="http://169.254.169.254/latest/meta-data/prm")
    with pytest.raises(LoginError, match="may not reach"):
        await log_in(tmp_path, "http://10.0.0.5", handler)
    assert not [line for line in seen if "169.254" in line]


async def test_a_tenants_login_waits_for_its_link_then_for_the_browser(tmp_path: Path, mock_clock: MockClock) -> None:
    # login_link_ttl = 3600: the link opened in its last second still finds its login waiting.
    handler, _ = upstream("http://127.0.0.1:9")
    auth = UpstreamAuth("http://127.0.0.1:9/mcp", oauth_store.FileRecord(tmp_path / "login.json"), None, lambda _: None)
    failures: list[str] = []
    desk = LoginDesk(
        "alice/remote",
        auth,
        lambda: None,
        failures.append,
        http=lambda: httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
    )
    async with trio.open_nursery() as nursery:
        await desk.start(REDIRECT, nursery, binding="b1", link_ttl=3600)
        mock_clock.jump(3600 + LOGIN_AFTER_OPENING - 1)
        await trio.testing.wait_all_tasks_blocked()
        assert desk.pending and not failures
        answer = await desk.callback(CallbackParams(state=auth.state, code="code-1", binding="b1"))
        assert answer["ok"] is True, answer

        # A link nobody opens: the login ends once the browser's time is up as well.
        await desk.start(REDIRECT, nursery, binding="b2", link_ttl=3600)
        mock_clock.jump(3600 + LOGIN_AFTER_OPENING + 1)
        await trio.testing.wait_all_tasks_blocked()
        assert not desk.pending and failures == ["the login was not completed in time; start it again"]


async def test_a_login_replaced_before_its_link_is_ready_is_not_reported_as_connected(tmp_path: Path) -> None:
    """A tenant who asks for the login link twice at once: the first answer is not "connected"."""
    handler, _ = upstream("http://127.0.0.1:9")
    discovery_open = trio.Event()

    async def slow_discovery(request: httpx2.Request) -> httpx2.Response:
        if "oauth-authorization-server" in str(request.url):
            await discovery_open.wait()
        return handler(request)

    auth = UpstreamAuth("http://127.0.0.1:9/mcp", oauth_store.FileRecord(tmp_path / "login.json"), None, lambda _: None)
    desk = LoginDesk(
        "alice/remote",
        auth,
        lambda: None,
        lambda _: None,
        http=lambda: httpx2.AsyncClient(transport=httpx2.MockTransport(slow_discovery)),
    )
    answers: dict[str, object] = {}

    async def start(name: str, binding: str) -> None:
        try:
            answers[name] = await desk.start(REDIRECT, nursery, binding=binding, link_ttl=60)
        except LoginError as exc:
            answers[name] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(start, "first", "b1")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(start, "second", "b2")  # replaces the first before its link is ready
        await trio.testing.wait_all_tasks_blocked()
        discovery_open.set()
        with trio.fail_after(10):
            while "second" not in answers:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert isinstance(answers["first"], LoginError) and "replaced" in str(answers["first"]), answers["first"]
    assert isinstance(answers["second"], dict) and answers["second"]["url"], answers["second"]
