"""Encoding of wire messages into ZeroMQ frames: [header] or [header, payload]."""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

from mcpvisor.wire.messages import CallsMessage, ControlMessage, EventMessage

M = TypeVar("M")

_encoder = msgspec.msgpack.Encoder()


class Codec(Generic[M]):
    """One decoder per union, built once; the encoder is shared by the process."""

    def __init__(self, union: type[M]) -> None:
        self._decoder = msgspec.msgpack.Decoder(union)

    def encode(self, msg: M, payload: bytes | None = None) -> list[bytes]:
        header = _encoder.encode(msg)
        return [header] if payload is None else [header, payload]

    def decode(self, frames: list[bytes]) -> tuple[M, bytes | None]:
        """Decode [header] or [header, payload]; raises msgspec.DecodeError on garbage."""
        if not frames or len(frames) > 2:
            raise msgspec.DecodeError(f"expected 1 or 2 frames, got {len(frames)}")
        try:
            msg = self._decoder.decode(frames[0])
        except (UnicodeDecodeError, RecursionError) as exc:
            # msgspec lets bad UTF-8 in a string and nesting deeper than the stack through as these;
            # every receiver handles garbage as DecodeError, so that is what it gets.
            raise msgspec.DecodeError(f"undecodable message: {type(exc).__name__}") from None
        return msg, (frames[1] if len(frames) == 2 else None)


calls = Codec(CallsMessage)
control = Codec(ControlMessage)
events = Codec(EventMessage)
