"""Start a command confined as a worker confines it (workers.confine), from a test without a worker.

A `Confined` is more than an argv: bwrap inherits fds (the seccomp filter, binds opened without
following what a sandbox can write), the forked child makes namespaces before it execs bwrap
(`prepare`), and with an outbound network pasta joins once the child is up. `popen` and `run`
do what workers/stdio.py does, with subprocess.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mcpvisor.workers.confine import Confined

# A uid the tests' plans get as root (the supervisor takes one from its table instead).
TEST_UID = (1 << 30) + 4242


@contextmanager
def popen(confined: Confined, **kwargs: Any) -> Iterator[subprocess.Popen[Any]]:
    """The confined command running (its network up, when it has its own); killed and closed after."""
    try:
        process = subprocess.Popen(
            confined.argv, env=confined.env, pass_fds=confined.pass_fds, preexec_fn=confined.prepare, **kwargs
        )
    except subprocess.SubprocessError as exc:
        confined.close()
        raise RuntimeError(f"the sandbox could not be prepared: {confined.failure() or exc}") from None
    try:
        confined.started()
        if confined.outbound is not None:
            confined.outbound.start_blocking(process.pid, confined.namespaces)
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9) if kwargs.get("start_new_session") else process.kill()
        process.wait()
        confined.close()


def run(confined: Confined, *, input: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the confined command to its end: its exit status, stdout and stderr."""
    with popen(confined, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        out, err = process.communicate(input, timeout=timeout)
        return subprocess.CompletedProcess(confined.argv, process.returncode, out, err)
