"""`python -m mcpvisor.frontend`: the frontend process, started by the supervisor."""

from __future__ import annotations

import logging
import os
import signal
import sys
from contextlib import AsyncExitStack

import msgspec
import trio
import zmq
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from mcpvisor.frontend import spec as frontend_spec
from mcpvisor.frontend.app import FrontendApp
from mcpvisor.frontend.catalog import Catalog
from mcpvisor.frontend.direct import build_direct_server
from mcpvisor.frontend.gateway import Gateway
from mcpvisor.frontend.router import Router
from mcpvisor.supervisor.config import parse_listen
from mcpvisor.wire import codec, lifetime, logs
from mcpvisor.wire.messages import ProcessEvent
from mcpvisor.wire.states import ProcessState
from mcpvisor.wire.zsocket import ZSocket

log = logging.getLogger("mcpvisor.frontend")


async def serve_events(sock: ZSocket, router: Router) -> None:
    """Fail calls to a worker the moment the supervisor sees it stop, instead of at the timeout."""
    while True:
        for frames in await sock.receive_batch():
            try:
                event, _ = codec.events.decode(frames[1:])
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("undecodable event: %s", exc)
                continue
            if (
                isinstance(event, ProcessEvent)
                and event.name.startswith("worker:")
                and event.state not in (ProcessState.RUNNING, ProcessState.STARTING)
            ):
                router.fail_worker(event.name.removeprefix("worker:"), f"worker {event.state}")


async def run(
    spec: frontend_spec.FrontendSpec, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    settings = spec.settings
    host, port = parse_listen(settings.listen)
    ctx = zmq.Context()
    calls_raw = ctx.socket(zmq.ROUTER)
    calls_raw.setsockopt(zmq.SNDHWM, 10000)
    calls_raw.setsockopt(zmq.RCVHWM, 10000)
    calls_raw.bind(spec.calls_endpoint)
    events_raw = ctx.socket(zmq.SUB)
    events_raw.setsockopt(zmq.SUBSCRIBE, b"process.")
    events_raw.connect(spec.events_endpoint)
    calls, events = ZSocket(calls_raw), ZSocket(events_raw)

    catalog = Catalog(settings.direct_tool_names)
    gateway = Gateway(spec, catalog)
    router = Router(calls, catalog, gateway.catalog_changed)
    gateway.router = router
    endpoints = {}
    if settings.enable_direct_endpoint:
        endpoints["/mcp/direct"] = build_direct_server(gateway)
    app = FrontendApp(gateway, endpoints, host, settings.max_body_bytes)

    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 75
    try:
        async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
            await app.run(stack)
            nursery.start_soon(router.serve)
            nursery.start_soon(serve_events, events, router)
            nursery.start_soon(gateway.serve_notifications)
            binds = await nursery.start(hypercorn_serve, app, config)
            log.info("serving MCP on %s (endpoints: %s)", ", ".join(binds), ", ".join(endpoints) or "none")
            task_status.started()
    finally:
        calls.close()
        events.close()
        ctx.term()


async def main(spec: frontend_spec.FrontendSpec) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, spec)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received %s, stopping", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                return


def entry() -> None:
    lifetime.die_with_parent(int(os.environ.get("MCPVISOR_PARENT_PID", "0")) or None)
    text = os.environ.pop(frontend_spec.ENV_VAR, None)
    if text is None:
        print(
            f"{frontend_spec.ENV_VAR} is not set: the frontend is started by `mcpvisor serve`",
            file=sys.stderr,
        )
        sys.exit(2)
    spec = frontend_spec.decode(text)
    logs.setup("frontend", spec.settings.log_level)
    trio.run(main, spec)


if __name__ == "__main__":
    entry()
