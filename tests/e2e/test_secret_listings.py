"""No listing shows a secret: upstream_servers list, tail_log, ctl status and ctl tail.

Given servers whose config holds secrets (by reference and inline) and an upstream that prints a
token to its stderr, every place an operator or a client can read shows none of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
