"""`python -m mcpvisor.workers.forkserver`: the template process workers are forked from.

Started by the supervisor (see `mcpvisor.runtime.forkserver`). It imports everything a worker runs,
then freezes its heap so the collector never writes to those objects and their pages stay shared
with every worker. It holds no ZeroMQ context and runs no trio loop: a worker creates both after
the fork, as an exec'd worker does after exec.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import sys
import traceback

import msgspec

from mcpvisor.runtime import forkserver, lifetime

# What a worker imports on its way up or on first use, so that no worker pays for it again.
PRELOAD = (
    "mcpvisor.workers.__main__",
    "anyio._backends._trio",
    "mcp.client.sse",
    "mcp.client.streamable_http",
)


def preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)


def serve(sock: socket.socket) -> None:
    """Fork a worker per request until the supervisor closes the socket."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, forkserver.MAX_MESSAGE, 1)
        except InterruptedError:
            continue
        if not data:
            return
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            sock.send(forkserver.encode(forkserver.ForkReply(error="a request must carry one output descriptor")))
            continue
        try:
            request = forkserver.request_codec.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            os.close(fds[0])
            sock.send(forkserver.encode(forkserver.ForkReply(error=f"undecodable request: {exc}")))
            continue
        try:
            pid = fork_worker(sock, request, fds[0])
        except OSError as exc:
            reply = forkserver.ForkReply(error=f"fork failed: {exc.strerror or exc}")
        else:
            reply = forkserver.ForkReply(pid=pid)
        finally:
            os.close(fds[0])
        sock.send(forkserver.encode(reply))


def fork_worker(sock: socket.socket, request: forkserver.ForkRequest, output: int) -> int:
    """Double-fork a worker; its pid once the intermediate has exited (so it is re-parented)."""
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    intermediate = os.fork()
    if intermediate == 0:
        code = 1
        try:
            os.close(read_end)
            me = os.getpid()
            worker = os.fork()
            if worker == 0:
                os.close(write_end)
                become_worker(sock, request, output, me)  # never returns
            os.write(write_end, str(worker).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read()
    os.waitpid(intermediate, 0)
    if not text:
        raise OSError("the intermediate process could not fork")
    return int(text)


def become_worker(sock: socket.socket, request: forkserver.ForkRequest, output: int, intermediate: int) -> None:
    """In the forked worker: detach from the template, take the supervisor's request, run."""
    code = 1
    try:
        os.setsid()  # its own process group, which the supervisor signals as a whole
        sock.close()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # Once the intermediate is gone our parent is the supervisor; the worker's entry asks
        # for SIGKILL when it dies, and exits if it is already gone.
        lifetime.wait_for_reparent(intermediate)
        os.environ.clear()
        os.environ.update(request.env)
        from mcpvisor.workers.__main__ import entry

        entry()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def main() -> None:
    lifetime.die_with_parent(int(os.environ.get("MCPVISOR_PARENT_PID", "0")) or None)
    fd = os.environ.pop(forkserver.FD_VAR, None)
    if fd is None:
        print(f"{forkserver.FD_VAR} is not set: the forkserver is started by `mcpvisor serve`", file=sys.stderr)
        sys.exit(2)
    sock = socket.socket(fileno=int(fd))
    # Workers get the default dispositions back; the template itself just goes with its supervisor.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload()
    gc.collect()
    gc.freeze()
    sock.send(forkserver.READY)
    serve(sock)


if __name__ == "__main__":
    main()
