"""No listing shows a secret: upstream_servers list, tail_log, ctl status and ctl tail; a URL reads the same on each.

Given servers whose config holds secrets (by reference and inline) and an upstream that prints a
token to its stderr, every place an operator or a client can read shows none of them.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx2
import trio

from tests.e2e.test_search_endpoint import call, text_of
from tests.support.stack import UPSTREAMS, free_port, open_stack

DB_PASSWORD = "pw-5ecr3t-value-0042"
ENV_TOKEN = "tok-from-env-7f3a9c2b1e"
FILE_SECRET = "TOPSECRET-line-one"
PRINTED_TOKEN = "ghp_0123456789abcdefghijABCDEFGHIJ012345"
SECRETS = (DB_PASSWORD, ENV_TOKEN, FILE_SECRET, PRINTED_TOKEN)


def leaked(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


async def test_no_listing_shows_a_secret(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret.txt"
    # A file secret with a newline is an illegal header value: the error must not echo it.
    secret_file.write_text(f"{FILE_SECRET}\nsecond line\n")
    echo = str(UPSTREAMS / "echo_server.py")
    servers = {
        "db": {
            "command": sys.executable,
            "args": [echo, "--name", "db"],
            "env": {"DATABASE_URL": f"postgres://app:{DB_PASSWORD}@db.internal/app", "API_TOKEN": "${env:MV_TOKEN}"},
        },
        "chatty": {
            "command": "sh",
            "args": ["-c", f'echo "authenticating with {PRINTED_TOKEN}" >&2; exec "{sys.executable}" "{echo}"'],
        },
        "remote": {
            "url": f"http://127.0.0.1:{free_port()}/mcp",
            "headers": {"X-Steal": f"${{file:{secret_file}}}", "Authorization": "Bearer ${env:MV_TOKEN}"},
        },
    }
    async with open_stack(tmp_path, servers, wait_for=["db", "chatty"], env={"MV_TOKEN": ENV_TOKEN}) as stack:
        # Give the remote server's worker time to try, fail and report its error.
        with trio.fail_after(30):
            while not stack.status().get("remote", {}).get("error"):
                await trio.sleep(0.2)
        async with stack.client("/mcp") as client:
            listing = text_of(await call(client, "upstream_servers", {"operation": "list"}))
            assert "db.internal" in listing  # the listing is there, only its secrets are not
            assert leaked(listing) == []
            for name in ("db", "chatty", "remote"):
                tail = text_of(await call(client, "upstream_servers", {"operation": "tail_log", "name": name}))
                assert leaked(tail) == [], name
            chatty_tail = text_of(await call(client, "upstream_servers", {"operation": "tail_log", "name": "chatty"}))
            assert "authenticating with" in chatty_tail
        status = json.dumps(stack.status())
        assert leaked(status) == []
        code, text = stack.ctl("tail", "chatty", json_output=False)
        assert code == 0 and "authenticating with" in text
        assert leaked(text) == []
        for log in (stack.data_dir / "logs").iterdir():
            if log.name.endswith(".worker.log") or log.name in ("frontend.log", "supervisor.log"):
                assert leaked(log.read_text(errors="replace")) == [], log.name


# -- one URL, every surface --------------------------------------------------------------------------

URL_PASSWORD = "url-pa55word-93c1"
URL_TOKEN = "url-t0ken-5d7e22"


async def serve_refusals(port: int, url: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """A streamable HTTP upstream that refuses every request with an error quoting its own URL whole.

    Upstreams do quote what they were sent; whatever one says reaches `ctl status` and the logs.
    """

    async def answer(stream: trio.SocketStream) -> None:
        data = b""
        with trio.move_on_after(10):
            while b"\r\n\r\n" not in data and (chunk := await stream.receive_some(65536)):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            while length and len(body) < int(length.group(1)) and (chunk := await stream.receive_some(65536)):
                body += chunk
            try:
                request_id = json.loads(body).get("id", 0)
            except ValueError:
                request_id = 0
            error = {"code": -32001, "message": f"refused: {url} is not a known account"}
            payload = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                + f"content-length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    task_status.started()
    await trio.serve_listeners(answer, listeners)


async def test_one_url_reads_the_same_on_every_surface(tmp_path: Path) -> None:
    """ctl inspect, ctl status, ctl pending, the admin API, the console, upstream_servers and the logs."""
    port = free_port()
    url = f"http://bob:{URL_PASSWORD}@127.0.0.1:{port}/mcp?token={URL_TOKEN}&region=eu"
    shown = f"http://bob:***@127.0.0.1:{port}/mcp?token=***&region=eu"

    def clean(text: str) -> bool:
        return URL_PASSWORD not in text and URL_TOKEN not in text

    async with trio.open_nursery() as nursery:
        await nursery.start(serve_refusals, port, url)
        async with open_stack(tmp_path, {"remote": {"url": url}}, wait_for=[]) as stack:
            with trio.fail_after(30):
                while "refused" not in stack.status().get("remote", {}).get("error", ""):
                    await trio.sleep(0.2)

            # ctl status, and ctl inspect of the server as it runs.
            assert shown in stack.status()["remote"]["error"]
            code, inspected = stack.ctl("inspect", "remote")
            assert code == 0 and inspected["url"] == shown
            code, text = stack.ctl("inspect", "remote", json_output=False)
            assert f"url:       {shown} (streamable-http)" in text and clean(text)

            # A client's view, and its proposals of the same URL (a new server, a patch of this one).
            async with stack.client("/mcp") as client:
                added = await call(client, "upstream_servers", {"operation": "add", "name": "copy", "url": url})
                assert not added.is_error and clean(text_of(added)), text_of(added)
                patched = await call(
                    client, "upstream_servers", {"operation": "patch", "name": "remote", "url": f"{url}&x=1"}
                )
                assert not patched.is_error and clean(text_of(patched)), text_of(patched)
                listing = json.loads(text_of(await call(client, "upstream_servers", {"operation": "list"})))
            remote = next(row for row in listing["servers"] if row["name"] == "remote")
            assert remote["url"] == shown and shown in remote["error"]
            assert {row["name"]: row.get("url") for row in listing["pending"]} == {"copy": shown, "remote": None}

            # The operator's review of those proposals.
            code, pending = stack.ctl("pending")
            assert code == 0 and [row.get("url") for row in pending["proposals"]] == [shown, None]
            code, proposal = stack.ctl("inspect", "copy")
            assert code == 0 and proposal["url"] == shown
            code, proposal = stack.ctl("inspect", "remote")
            assert code == 0 and proposal["server"]["url"] == shown
            change = next(change for change in proposal["changes"] if change["field"] == "url")
            assert change == {"field": "url", "before": shown, "after": f"{shown}&x=1"}

            # The admin API, and the same reads through the console's session.
            async with httpx2.AsyncClient(base_url=f"{stack.base_url}/api/v1", timeout=30) as http:
                for headers in ({}, {"X-CSRF-Token": (await http.get("/session")).json()["csrf_token"]}):
                    server = (await http.get("/servers/remote", headers=headers)).json()
                    assert server["config"]["url"] == shown and shown in server["error"]
                    assert (await http.get("/pending/copy", headers=headers)).json()["url"] == shown
                    logs = (await http.get("/servers/remote/logs", headers=headers)).text
                    assert shown in logs and clean(logs)

            # The logs: each names the URL as every listing does, and none holds its secrets.
            assert f"connecting to {shown}" in stack.log("remote.worker.log")
            code, tail = stack.ctl("tail", "remote", json_output=False)
            assert code == 0 and shown in tail and clean(tail)
            for log in (stack.data_dir / "logs").iterdir():
                assert clean(log.read_text(errors="replace")), log.name
            assert clean(stack.supervisor_output())
        nursery.cancel_scope.cancel()
