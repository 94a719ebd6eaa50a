"""The activity log's pieces: the request id in a result's `_meta`, retention, and stored arguments."""

from __future__ import annotations

import time

import msgspec
import pytest

from mcpvisor.frontend.gate import activity as activity_module
from mcpvisor.frontend.gate.activity import META_KEY, ActivityLog, trace_context, with_request_id
from mcpvisor.store import audit_chain
from mcpvisor.store.state_db import open_state_db


@pytest.mark.parametrize(
    "result",
    [
        b'{"content":[{"type":"text","text":"hi"}]}',
        b"  {}",
        b'{ "isError": true, "content": [] }',
        b'{"content":[{"type":"text","text":"{\\"_meta\\": 1}"}]}',  # "_meta" only inside a string
        b'{"content":[],"_meta":{"other/key":1}}',
        b'{"content":[],"_meta":null}',
    ],
)
def test_the_request_id_joins_what_the_result_had(result: bytes) -> None:
    before = msgspec.json.decode(result)
    after = msgspec.json.decode(with_request_id(result, "r1"))
    assert after["_meta"][META_KEY] == "r1"
    assert {k: v for k, v in after.items() if k != "_meta"} == {k: v for k, v in before.items() if k != "_meta"}
    if isinstance(before.get("_meta"), dict):
        assert before["_meta"].items() <= after["_meta"].items()


def test_what_is_not_an_object_is_left_alone() -> None:
    assert with_request_id(b"[1]", "r1") == b"[1]"
    assert with_request_id(b'{"_meta": broken', "r1") == b'{"_meta": broken'


def record(log: ActivityLog, tool: str, **extra: object) -> None:
    log.record(server="s", tool=tool, variant="direct", intent=None, outcome="ok", duration=0.001, **extra)  # type: ignore[arg-type]


def test_pruning_keeps_the_newest_rows_within_age_and_count() -> None:
    db = open_state_db("")
    log = ActivityLog(db, retention_days=1, max_rows=3)
    for n in range(5):
        record(log, f"t{n}")
    assert log.prune() == 2  # t0 and t1 by count
    assert [r.tool for r in reversed(log.recent(10))] == ["t2", "t3", "t4"]
    db.execute("UPDATE calls SET time = time - 2 * 86400 WHERE tool = 't2'")
    assert log.prune() == 1  # t2 by age
    assert log.prune() == 0
    assert audit_chain.verify(db).intact


def test_pruning_by_age_deletes_only_the_oldest_rows_so_the_chain_still_verifies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A row stamped earlier than an older one (another replica's clock) waits for the rows before it."""
    db = open_state_db("")
    log = ActivityLog(db, retention_days=1, max_rows=100)
    now = time.time()
    for n in range(5):
        stamp = now - 2 * 86400 if n in (0, 3) else now
        monkeypatch.setattr(activity_module.time, "time", lambda stamp=stamp: stamp)
        record(log, f"t{n}")
    monkeypatch.undo()
    assert log.prune() == 1  # t0; t3 is older than its time says it may be, but t1 and t2 are not
    assert [r.tool for r in reversed(log.recent(10))] == ["t1", "t2", "t3", "t4"]
    assert audit_chain.verify(db).intact


def test_arguments_and_results_are_kept_only_when_asked_and_then_redacted() -> None:
    secret = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    for keep in (False, True):
        db = open_state_db("")
        log = ActivityLog(db, record_arguments=keep)
        record(log, "t", arguments={"token": secret, "n": msgspec.Raw(b"1")}, result=f'{{"text":"{secret}"}}'.encode())
        arguments, result = db.execute("SELECT arguments, result FROM calls").fetchone()
        if not keep:
            assert (arguments, result) == (None, None)
        else:
            assert secret not in arguments and secret not in result
            assert msgspec.json.decode(arguments)["n"] == 1


def test_trace_context_comes_from_meta_else_headers_and_junk_is_dropped() -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    headers = {"traceparent": parent, "tracestate": "h=1"}

    assert trace_context({"traceparent": parent, "tracestate": "m=1"}, {}) == (parent, "m=1")
    assert trace_context({}, headers) == (parent, "h=1")
    assert trace_context({"traceparent": "not-a-trace\nforged"}, {}) == ("", "")
    assert trace_context({"traceparent": parent + "\n"}, {}) == ("", "")
    assert trace_context({}, {}) == ("", "")
