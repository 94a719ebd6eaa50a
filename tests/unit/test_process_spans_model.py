"""The supervisor's process spans over every sequence of supervisord's transitions, against a model.

A RuleBasedStateMachine plays what `Program` does (start, up, early exits, exits, flapping, stops,
a start out of FATAL) on two programs at once, feeding `process_spans.changed` exactly as
`Program._set_state` does. The model says which spans must have ended, with which name and status;
after every step the spans exported are those, and a program has a span open exactly while it is
STARTING or STOPPING: none is lost, none ends twice, none leaks into the other program's.
"""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mcpvisor.runtime import telemetry, telemetry_export
from mcpvisor.supervisor import process_spans
from mcpvisor.wire.states import ProcessState as S

NAMES = ("worker:a", "worker:tenant/b")
OPEN_WHILE = (S.STARTING, S.STOPPING)


class ProcessSpans(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.previous = telemetry.active
        telemetry.active = telemetry.Telemetry("test", self.provider, None, telemetry_export.Deliveries("m"), {})
        process_spans._open.clear()
        self.programs = {
            name: SimpleNamespace(name=name, state=S.STOPPED, pid=0, spawns=0, exit_code=None) for name in NAMES
        }
        self.expected: list[tuple[str, str]] = []  # (span name, status), in the order they end

    def teardown(self) -> None:
        telemetry.active = self.previous
        process_spans._open.clear()
        self.provider.shutdown()

    # -- what Program does ----------------------------------------------------------------------

    def go(self, name: str, state: S) -> None:
        program = self.programs[name]
        process_spans.changed(program, state)  # type: ignore[arg-type]
        program.state = state

    def ended(self, name: str, verb: str, status: str) -> None:
        self.expected.append((f"{verb} {name}", status))

    def starting(self, name: str) -> None:
        program = self.programs[name]
        program.verb = "restart" if program.state in (S.EXITED, S.BACKOFF) else "start"
        program.pid = 0
        self.go(name, S.STARTING)

    @rule(name=st.sampled_from(NAMES))
    @precondition(
        lambda self: any(p.state in (S.STOPPED, S.EXITED, S.BACKOFF, S.FATAL) for p in self.programs.values())
    )
    def start(self, name: str) -> None:
        program = self.programs[name]
        if program.state not in (S.STOPPED, S.EXITED, S.BACKOFF, S.FATAL):
            return
        if program.state is S.FATAL:
            self.go(name, S.STOPPED)  # only an explicit start leaves FATAL, through STOPPED
        self.starting(name)

    @rule(name=st.sampled_from(NAMES), pid=st.integers(100, 200))
    def up(self, name: str, pid: int) -> None:
        program = self.programs[name]
        if program.state is not S.STARTING:
            return
        program.pid, program.spawns = pid, program.spawns + 1
        self.ended(name, program.verb, "UNSET")
        self.go(name, S.RUNNING)

    @rule(name=st.sampled_from(NAMES), last_try=st.booleans())
    def exits_too_quickly(self, name: str, last_try: bool) -> None:
        if self.programs[name].state is not S.STARTING:
            return
        self.ended(name, self.programs[name].verb, "ERROR")
        self.go(name, S.FATAL if last_try else S.BACKOFF)

    @rule(name=st.sampled_from(NAMES), code=st.sampled_from([0, 1, -9]))
    def exits(self, name: str, code: int) -> None:
        program = self.programs[name]
        if program.state is not S.RUNNING:
            return
        program.exit_code = code
        self.expected.append((f"exit {name}", "UNSET" if code == 0 else "ERROR"))
        self.go(name, S.EXITED)

    @rule(name=st.sampled_from(NAMES), flapping=st.booleans())
    def restarts_by_policy(self, name: str, flapping: bool) -> None:
        if self.programs[name].state is not S.EXITED:
            return
        if flapping:
            self.go(name, S.BACKOFF)  # nothing was open: no span ends
        else:
            self.starting(name)

    @rule(name=st.sampled_from(NAMES))
    def stop(self, name: str) -> None:
        program = self.programs[name]
        if program.state not in (S.STARTING, S.RUNNING):
            return
        if program.state is S.STARTING:
            self.ended(name, program.verb, "UNSET")
        self.go(name, S.STOPPING)

    @rule(name=st.sampled_from(NAMES))
    def stopped(self, name: str) -> None:
        if self.programs[name].state is not S.STOPPING:
            return
        self.ended(name, "stop", "UNSET")
        self.go(name, S.STOPPED)

    # -- what must hold after every step -----------------------------------------------------------

    @invariant()
    def the_spans_that_ended_are_the_models(self) -> None:
        found = [(span.name, span.status.status_code.name) for span in self.exporter.get_finished_spans()]
        assert found == self.expected

    @invariant()
    def a_span_is_open_exactly_while_starting_or_stopping(self) -> None:
        for name, program in self.programs.items():
            assert (name in process_spans._open) == (program.state in OPEN_WHILE), (name, program.state)

    @invariant()
    def every_span_is_a_trace_of_its_own_about_its_program(self) -> None:
        for span in self.exporter.get_finished_spans():
            attributes = dict(span.attributes or {})
            assert span.parent is None
            assert span.name.endswith(" " + attributes["mcpvisor.process.name"])
            assert attributes["mcpvisor.worker_id"] == attributes["mcpvisor.process.name"].removeprefix("worker:")


ProcessSpans.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_process_spans_follow_every_sequence_of_transitions = ProcessSpans.TestCase
