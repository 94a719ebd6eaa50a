"""The policy files the supervisor read, as it hands them to the frontend (launch spec, ConfigChanged).

The supervisor reads and validates the files named by `[policy] files` (a broken file is refused
like a broken config); the frontend compiles the text it is given, so both decide from the same
text even if a file changes on disk in between.
"""

from __future__ import annotations

import msgspec

from mcpvisor.wire.config import PolicyConfig


class PolicyText(msgspec.Struct, frozen=True, kw_only=True):
    path: str  # as the config file names it
    text: str


class PolicyBundle(msgspec.Struct, frozen=True, kw_only=True):
    """`[policy]` and the text of each of its files, in their order."""

    config: PolicyConfig
    sources: list[PolicyText] = []
