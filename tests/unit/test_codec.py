"""The wire codec: every message survives the trip, payloads pass through, bad frames are refused."""

from __future__ import annotations

import typing

import msgspec
import pytest

from mcpvisor.wire import codec
from mcpvisor.wire.config import ServerConfig
from mcpvisor.wire.errors import ErrorCode
from mcpvisor.wire.messages import (
    Answer,
    Ask,
    CallsMessage,
    Cancel,
    Command,
    ConfigChanged,
    ControlMessage,
    EventMessage,
    Failure,
    Heartbeat,
    Notify,
    OperatorReply,
    OperatorRequest,
    ProcessEvent,
    Reply,
    Report,
    Request,
    Response,
    Snapshot,
    SnapshotRequest,
)
from mcpvisor.wire.operator import Decision, Finding, Inspection, Pending, PendingServer, ToolReview
from mcpvisor.wire.states import ProcessState, UpstreamState

# Every message type with every field set away from its default, next to the codec of its channel.
MESSAGES = [
    (codec.calls, Heartbeat(pid=4121, catalog_seq=7, state=UpstreamState.READY)),
    (codec.calls, SnapshotRequest()),
    (
        codec.calls,
        Snapshot(
            pid=4121,
            catalog_seq=8,
            state=UpstreamState.ERROR,
            error="connection refused",
            server_name="github-mcp",
        ),
    ),
    (codec.calls, Request(id=1, method="tools/call", timeout=120.0)),
    (codec.calls, Cancel(id=1, reason="client went away")),
    (codec.calls, Response(id=2**40)),
    (codec.calls, Failure(id=3, code=ErrorCode.UPSTREAM_ERROR, message="bad params", mcp_code=-32602)),
    (codec.calls, Notify(method="notifications/progress", id=4)),
    (codec.calls, Ask(id=5, method="sampling/createMessage", call_id=4)),
    (codec.calls, Answer(id=5, ok=False, code=-32600, message="no sampling capability")),
    (codec.control, Command(id=9, name="restart", args=["github", "time"])),
    (
        codec.control,
        Reply(id=9, ok=False, result={"github": ["RUNNING", 4121], "n": 1.5}, error="no such", exit_code=4),
    ),
    (
        codec.control,
        Report(
            name="worker:github",
            pid=4121,
            upstream_state=UpstreamState.READY,
            tools=12,
            error="slow start",
            fatal="command not found",
            discoveries=3,
        ),
    ),
    (codec.control, OperatorRequest(id=8, action="approve", name="github", tools=["create_issue"])),
    (
        codec.control,
        OperatorReply(
            id=8,
            result=Pending(
                servers=[
                    PendingServer(
                        name="github", reason="changed", state="ready", tools=3, risk="low", changed=["create_issue"]
                    )
                ]
            ),
            error="partly",
            exit_code=1,
        ),
    ),
    (
        codec.control,
        OperatorReply(
            id=9,
            result=Inspection(
                name="github",
                quarantined=True,
                enabled=True,
                connected=True,
                transport="stdio",
                command=["github-mcp", "--read-only"],
                env=["GITHUB_TOKEN"],
                risk="high",
                score=7.5,
                tools=[
                    ToolReview(
                        tool="create_issue",
                        approval="not approved",
                        risk="high",
                        score=7.5,
                        summary="hidden instruction",
                        findings=[Finding(kind="poisoning", rule="hidden", severity="high", evidence="<x>")],
                    )
                ],
            ),
        ),
    ),
    (codec.control, OperatorReply(id=10, result=Decision(name="github", action="block", quarantined=True))),
    (codec.events, ProcessEvent(name="github", state=ProcessState.BACKOFF, pid=4121, description="exit 1")),
    (
        codec.events,
        ConfigChanged(
            servers={"time": ServerConfig(command="mcp-server-time", args=["--local-timezone", "UTC"])}, version=2
        ),
    ),
]
IDS = [type(msg).__name__ for _, msg in MESSAGES]

UNIONS = {codec.calls: CallsMessage, codec.control: ControlMessage, codec.events: EventMessage}

PAYLOAD = b'{"name":"search","arguments":{"q":"caf\xc3\xa9","n":1.0000000000000002,"x":[1,2]}}'


@pytest.mark.parametrize("channel", UNIONS, ids=["calls", "control", "events"])
def test_every_message_type_has_a_sample(channel: codec.Codec) -> None:
    union = UNIONS[channel]
    types = set(typing.get_args(union)) or {union}

    assert types == {type(msg) for c, msg in MESSAGES if c is channel}


@pytest.mark.parametrize(("channel", "msg"), MESSAGES, ids=IDS)
def test_header_alone_round_trips(channel: codec.Codec, msg: object) -> None:
    frames = channel.encode(msg)

    assert len(frames) == 1
    assert channel.decode(frames) == (msg, None)


@pytest.mark.parametrize(("channel", "msg"), MESSAGES, ids=IDS)
def test_header_and_payload_round_trip(channel: codec.Codec, msg: object) -> None:
    frames = channel.encode(msg, PAYLOAD)

    decoded, payload = channel.decode(frames)

    assert decoded == msg
    assert type(decoded) is type(msg)
    assert payload == PAYLOAD


def test_defaults_round_trip() -> None:
    msg = Failure(id=3, code=ErrorCode.BUSY, message="too many calls in flight")

    decoded, _ = codec.calls.decode(codec.calls.encode(msg))

    assert decoded == msg
    assert decoded.mcp_code is None
    assert decoded.code is ErrorCode.BUSY


def test_payload_is_passed_through_not_reencoded() -> None:
    # JSON whose re-encoding would differ: key order, spacing, a float msgspec would print differently.
    payload = b'{ "z": 1.50, "a": "\\u00e9" }'

    frames = codec.calls.encode(Response(id=5), payload)
    _, decoded = codec.calls.decode(frames)

    assert frames[1] is payload
    assert decoded is payload


def test_empty_payload_is_kept_apart_from_no_payload() -> None:
    _, payload = codec.calls.decode(codec.calls.encode(Response(id=5), b""))

    assert payload == b""


@pytest.mark.parametrize(
    "frames",
    [
        [b"\xc1"],  # an opcode msgpack never uses
        [b""],
        [codec.calls.encode(Request(id=1, method="m", timeout=1.0))[0][:-3]],  # truncated
        [b"\xc1", b"{}"],
        [b"\x82\xa1t\xa3req\xa6method\xa3\xbe\xbe\xbe"],  # a string that is not UTF-8
    ],
    ids=["bad-opcode", "empty", "truncated", "bad-header-with-payload", "bad-utf8"],
)
def test_garbage_header_is_a_decode_error(frames: list[bytes]) -> None:
    with pytest.raises(msgspec.DecodeError) as info:
        codec.calls.decode(frames)

    assert type(info.value) is msgspec.DecodeError


def test_data_nested_deeper_than_the_stack_is_a_decode_error() -> None:
    header = msgspec.msgpack.encode({"t": "cmd", "id": 1, "name": "x"})
    deep = b"\x84" + header[1:] + msgspec.msgpack.encode("data") + b"\x91" * 100_000 + b"\xc0"

    with pytest.raises(msgspec.DecodeError) as info:
        codec.control.decode([deep])

    assert type(info.value) is msgspec.DecodeError


@pytest.mark.parametrize(
    "header",
    [
        msgspec.msgpack.encode(5),
        msgspec.msgpack.encode({"id": 1}),  # no tag
        msgspec.msgpack.encode({"t": "nope", "id": 1}),
        msgspec.msgpack.encode({"t": "req", "id": 1, "method": "m"}),  # timeout missing
        msgspec.msgpack.encode({"t": "req", "id": "1", "method": "m", "timeout": 1.0}),
        msgspec.msgpack.encode({"t": "fail", "id": 1, "code": 999, "message": "m"}),
        msgspec.msgpack.encode({"t": "hb", "pid": 1, "catalog_seq": 1, "state": "asleep"}),
    ],
    ids=["not-a-map", "no-tag", "unknown-tag", "missing-field", "wrong-type", "unknown-code", "bad-state"],
)
def test_well_formed_but_wrong_header_is_a_validation_error(header: bytes) -> None:
    with pytest.raises(msgspec.ValidationError):
        codec.calls.decode([header])


@pytest.mark.parametrize("count", [0, 3, 4])
def test_wrong_frame_count_is_a_decode_error(count: int) -> None:
    header = codec.calls.encode(Response(id=1))[0]
    frames = [header, *[b"{}"] * (count - 1)] if count else []

    with pytest.raises(msgspec.DecodeError, match=f"got {count}") as info:
        codec.calls.decode(frames)

    assert type(info.value) is msgspec.DecodeError


@pytest.mark.parametrize(
    ("sender", "receiver", "msg"),
    [
        (codec.control, codec.calls, Command(id=1, name="status")),
        (codec.events, codec.calls, ProcessEvent(name="github", state=ProcessState.RUNNING)),
        (codec.calls, codec.control, Request(id=1, method="tools/call", timeout=1.0)),
        (codec.events, codec.control, ProcessEvent(name="github", state=ProcessState.RUNNING)),
        (codec.calls, codec.events, Heartbeat(pid=1, catalog_seq=1, state=UpstreamState.READY)),
        (codec.control, codec.events, Reply(id=1, ok=True)),
    ],
    ids=[
        "control-on-calls",
        "event-on-calls",
        "call-on-control",
        "event-on-control",
        "call-on-events",
        "control-on-events",
    ],
)
def test_message_of_another_channel_is_a_validation_error(
    sender: codec.Codec, receiver: codec.Codec, msg: object
) -> None:
    frames = sender.encode(msg, PAYLOAD)

    with pytest.raises(msgspec.ValidationError, match=r"Invalid value .* at `\$\.t`"):
        receiver.decode(frames)


class NewerRequest(Request, tag="req"):
    """A Request as a newer peer might send it: one more field, with a default."""

    trace_id: str = ""


class NewerFailure(Failure, tag="fail"):
    retry_after: float = 0.0
    hints: list[str] = []


def test_newer_peers_extra_fields_are_ignored() -> None:
    frames = codec.calls.encode(NewerRequest(id=7, method="tools/call", timeout=3.0, trace_id="abc"), PAYLOAD)
    assert b"trace_id" in frames[0]  # the extra field is really on the wire

    msg, payload = codec.calls.decode(frames)

    assert msg == Request(id=7, method="tools/call", timeout=3.0)
    assert type(msg) is Request
    assert payload == PAYLOAD


def test_newer_peers_extra_structured_fields_are_ignored() -> None:
    newer = NewerFailure(id=8, code=ErrorCode.TIMEOUT, message="slow", retry_after=2.5, hints=["a", "b"])

    msg, _ = codec.calls.decode(codec.calls.encode(newer))

    assert msg == Failure(id=8, code=ErrorCode.TIMEOUT, message="slow")
