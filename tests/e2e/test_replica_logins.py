"""Upstream OAuth logins shared by two replicas through a real PostgreSQL.

A login done through one replica serves the other's worker; both replicas refreshing around every
expiry of a short-lived token, against an authorization server that rotates refresh tokens and
revokes the whole grant when one is used twice, keep the grant alive; a logout through one replica
stops the other's use. The upstream and its authorization server are tests/upstreams/oauth_upstream.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import psycopg
import trio

from tests.e2e.test_oauth_upstream import log_in, oauth_upstream, refusal, upstream_state
from tests.support import postgres
from tests.support.stack import open_replicas

postgres_cluster = postgres.cluster_fixture()
postgres_url = postgres.database_fixture()


def stored_login(url: str, worker: str) -> dict[str, object]:
    """The login record a replica keeps in the store (read by the test only)."""
    with psycopg.connect(url) as connection:
        row = connection.execute("SELECT body FROM oauth_logins WHERE worker = %s", (worker,)).fetchone()
    assert row is not None, f"no login stored for {worker}"
    return json.loads(row[0])


async def test_a_login_through_one_replica_serves_the_other_and_a_logout_ends_it_on_both(
    tmp_path: Path, postgres_url: str
) -> None:
    async with (
        oauth_upstream(tmp_path) as upstream,
        open_replicas(tmp_path, 2, {"remote": {"url": upstream.url}}, state_url=postgres_url, wait_for=[]) as (
            first,
            second,
        ),
    ):
        await upstream_state(first, "remote", "authenticating")
        await upstream_state(second, "remote", "authenticating")

        await log_in(first, "remote")
        await first.wait_ready(["remote"])
        # The second replica's worker finds the login in the store and connects, with no login of its own.
        await upstream_state(second, "remote", "ready")
        async with second.client() as client:
            answer = await client.call_tool("remote:echo", {"text": "from the second"})
            assert not answer.is_error and answer.content[0].text == "from the second", answer
        assert (await upstream.stats())["authorizations"] == 1

        # The record lives in the store, not in either replica's data dir.
        record = stored_login(postgres_url, "remote")
        assert record["tokens"]
        for stack in (first, second):
            assert not (stack.data_dir / "oauth").exists() or not list((stack.data_dir / "oauth").iterdir())
            code, rows = await stack.actl("logins")
            assert code == 0 and [row["name"] for row in rows] == ["remote"], rows
            code, status = await stack.actl("status", "remote")
            assert code == 0 and status[0].get("token_expires"), status
            shown = json.dumps(rows) + json.dumps(status)
            for secret in (record["tokens"]["access_token"], record["tokens"]["refresh_token"]):  # type: ignore[index]
                assert secret not in shown

        # A logout through the first replica ends the login on the second as well.
        code, result = await first.actl("logout", "remote")
        assert code == 0 and result["connected"] is True, result
        row = await upstream_state(second, "remote", "authenticating")
        assert "ctl login remote" in row["error"], row
        async with second.client() as client:
            refused = await refusal(client, "remote:echo", {"text": "after the logout"})
            assert "ctl login remote" in refused, refused
        code, rows = await second.actl("logins")
        assert code == 0 and rows == [], rows

        # And a new login through the second replica brings the first back.
        await log_in(second, "remote")
        await upstream_state(first, "remote", "ready")
        async with first.client() as client:
            assert not (await client.call_tool("remote:echo", {"text": "back"})).is_error


async def test_two_replicas_refreshing_a_rotating_token_keep_the_grant(tmp_path: Path, postgres_url: str) -> None:
    servers = {"remote": {"url": "", "policy": {"ping_interval": 1}}}
    async with oauth_upstream(tmp_path, access_ttl=6, reuse_revokes=True) as upstream:
        servers["remote"]["url"] = upstream.url
        async with open_replicas(tmp_path, 2, servers, state_url=postgres_url, wait_for=[]) as (first, second):
            await upstream_state(first, "remote", "authenticating")
            await log_in(first, "remote")
            await first.wait_ready(["remote"])
            await upstream_state(second, "remote", "ready")

            # Both workers ping every second and both find the token due 1.5 s before it expires:
            # each expiry is met by two replicas at once, and only one may spend the refresh token.
            with trio.fail_after(60):
                while (await upstream.stats())["refreshes"] < 5:
                    await trio.sleep(0.5)
            stats = await upstream.stats()
            print(
                f"\nrefreshes {stats['refreshes']}, refused {stats['refused_refreshes']}, reused {stats['reused_refreshes']}"
            )
            assert stats["reused_refreshes"] == 0 and stats["refused_refreshes"] == 0, stats
            for stack in (first, second):
                assert stack.status()["remote"]["upstream"] == "ready"
                async with stack.client() as client:
                    answer = await client.call_tool("remote:echo", {"text": "still in"})
                    assert not answer.is_error, answer

            # Access tokens refused before their time: each replica's next request meets a 401, and
            # the one that does not refresh first re-reads the store and takes the new token.
            before = await upstream.stats()
            await upstream.revoke_access_tokens()
            for stack in (first, second):
                async with stack.client() as client:
                    answer = await client.call_tool("remote:echo", {"text": "after a 401"})
                    assert not answer.is_error and answer.content[0].text == "after a 401", answer
            after = await upstream.stats()
            assert after["refused_tokens"] > before["refused_tokens"] and after["refreshes"] > before["refreshes"]
            assert after["reused_refreshes"] == 0 and after["refused_refreshes"] == 0, after

            # The authorization server really ends the grant when a refresh token is spent twice:
            # what an uncoordinated replica would have caused.
            record = stored_login(postgres_url, "remote")
            form = {
                "grant_type": "refresh_token",
                "refresh_token": record["tokens"]["refresh_token"],  # type: ignore[index]
                "client_id": record["client"]["client_id"],  # type: ignore[index]
            }
            async with httpx2.AsyncClient(timeout=10) as http:
                answers = [(await http.post(f"{upstream.issuer}/token", data=form)).status_code for _ in range(2)]
            # (The first answer is 200 unless a replica refreshed in between: then both are reuses.)
            assert answers[1] == 400, answers
            assert (await upstream.stats())["reused_refreshes"] >= 1
            await upstream_state(first, "remote", "authenticating")
            await upstream_state(second, "remote", "authenticating")
