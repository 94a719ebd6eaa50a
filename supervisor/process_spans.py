"""Spans of the supervisor's work on its processes, each a trace of its own: a start (or a restart
by policy) from STARTING until RUNNING or a failure, a stop from STOPPING to STOPPED, and an exit
that nobody asked for.

Fed by `Program._set_state`, the one place states change. Their status says what happened
(BACKOFF, FATAL, an exit code), never why in the process's own words: those stay in `ctl status`
and the logs, where an upstream's last stderr line is not sent to a collector.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context
from opentelemetry.trace import Span, StatusCode

from mcpvisor.runtime import telemetry
from mcpvisor.wire.states import ProcessState

if TYPE_CHECKING:
    from mcpvisor.supervisor.process import Program

WORKER_PREFIX = "worker:"
_RESTARTED_FROM = (ProcessState.EXITED, ProcessState.BACKOFF)

_open: dict[str, Span] = {}  # the start or stop span of each program, while it lasts


def _attributes(program: Program) -> dict[str, Any]:
    found: dict[str, Any] = {"mcpvisor.process.name": program.name, "mcpvisor.process.restarts": program.spawns}
    if program.name.startswith(WORKER_PREFIX):
        worker = program.name.removeprefix(WORKER_PREFIX)
        tenant, _, server = worker.rpartition("/")
        found |= {"mcpvisor.worker_id": worker, "mcpvisor.server": server}
        if tenant:
            found["mcpvisor.tenant"] = tenant
    return found


def _finish(program: Program, state: ProcessState, *, failed: bool) -> None:
    span = _open.pop(program.name, None)
    if span is None:
        return
    span.set_attribute("mcpvisor.process.state", str(state))
    if program.pid:
        span.set_attribute("mcpvisor.process.pid", program.pid)
    if failed:
        span.set_attribute("error.type", str(state).lower())
        span.set_status(StatusCode.ERROR, str(state))
    span.end()


def changed(program: Program, state: ProcessState) -> None:
    """`program` goes from its current state to `state`."""
    tel = telemetry.active
    if tel is None:
        return
    previous = program.state
    match state:
        case ProcessState.STARTING:
            _finish(program, previous, failed=False)
            verb = "restart" if previous in _RESTARTED_FROM else "start"
            _open[program.name] = tel.tracer.start_span(
                f"{verb} {program.name}", context=Context(), attributes=_attributes(program)
            )
        case ProcessState.STOPPING:
            _finish(program, previous, failed=False)
            _open[program.name] = tel.tracer.start_span(
                f"stop {program.name}", context=Context(), attributes=_attributes(program)
            )
        case ProcessState.RUNNING | ProcessState.STOPPED:
            _finish(program, state, failed=False)
        case ProcessState.BACKOFF | ProcessState.FATAL:
            _finish(program, state, failed=True)
        case ProcessState.EXITED:
            _finish(program, state, failed=True)
            found = _attributes(program)
            code = program.exit_code
            if code is not None:
                found["process.exit.code"] = code
            span = tel.tracer.start_span(f"exit {program.name}", context=Context(), attributes=found)
            if code != 0:
                span.set_attribute("error.type", "exited" if code is None or code > 0 else "killed")
                span.set_status(StatusCode.ERROR, f"exit status {code}")
            span.end()
