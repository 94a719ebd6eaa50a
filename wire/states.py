"""Process states (supervisord's) and upstream connection states (seed 002)."""

from __future__ import annotations

import enum


class ProcessState(enum.StrEnum):
    """A supervised process, with supervisord's names and meanings."""

    STOPPED = "STOPPED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    BACKOFF = "BACKOFF"
    STOPPING = "STOPPING"
    EXITED = "EXITED"
    FATAL = "FATAL"
    UNKNOWN = "UNKNOWN"


RUNNING_STATES = frozenset({ProcessState.RUNNING, ProcessState.STARTING, ProcessState.BACKOFF})
STOPPED_STATES = frozenset({ProcessState.STOPPED, ProcessState.EXITED, ProcessState.FATAL})


class UpstreamState(enum.StrEnum):
    """The worker's connection to its upstream MCP server."""

    DISCONNECTED = "disconnected"
    CONNECTING = "connecting"
    AUTHENTICATING = "authenticating"
    READY = "ready"
    ERROR = "error"
