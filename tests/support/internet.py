"""A stand-in for the internet: an HTTP server in a network namespace of its own, reached over a veth pair.

The machine has no network but its package registries, so a sandbox's outbound network is tried
against this: `ip netns add`, a veth pair whose host end is 198.18.0.1/30-ish (198.18.0.0/15 is
the benchmarking range, neither private nor the host's loopback) and whose other end, in the
namespace, serves HTTP. From the host it is an ordinary remote address; from a sandbox it is
reached through pasta like any other. Needs root (ip netns); elsewhere the tests skip.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

SERVER = r"""
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the internet"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
"""


@dataclass(frozen=True)
class Internet:
    address: str  # the server's, in its namespace
    host_side: str  # the host's own address on the veth pair (a host address a sandbox must not reach)
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/"


def missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root to make a network namespace (ip netns)"
    if shutil.which("ip") is None:
        return "system package missing: iproute2"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def internet(port: int = 8088) -> Iterator[Internet]:
    """The namespace, the veth pair and the server, removed afterwards."""
    tag = secrets.token_hex(3)
    name, host_if, inner_if = f"mcpv-inet-{tag}", f"mvh{tag}", f"mvi{tag}"
    # A /30 of its own per run, so two runs at once do not share addresses.
    third = int(tag[:2], 16)
    host_side, address = f"198.19.{third}.1", f"198.19.{third}.2"
    _ip("netns", "add", name)
    server = None
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", inner_if)
        _ip("link", "set", inner_if, "netns", name)
        _ip("addr", "add", f"{host_side}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        for args in (
            ("addr", "add", f"{address}/30", "dev", inner_if),
            ("link", "set", inner_if, "up"),
            ("link", "set", "lo", "up"),
            ("route", "add", "default", "via", host_side),
        ):
            _ip("netns", "exec", name, "ip", *args)
        server = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", SERVER, address, str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://{address}:{port}/"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    answer.read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.1)
        yield Internet(address, host_side, port)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
