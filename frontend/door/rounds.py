"""2026-07-28 calls whose upstream asks the client something: answered over several rounds.

A handshake-era client is asked mid-call, on the stream of its call. A 2026-07-28 client is
not: the server ends the round with an `input_required` result that names what it needs, and the
client calls again with the answers and the `requestState` it was given. Upstreams still ask
mid-call (they speak the handshake era to their worker), so mcpvisor keeps the upstream call
running between rounds: each question becomes one of the round's input requests, and the answers
the client brings back go to the upstream that is waiting for them.

`requestState` is sealed, bound to the call and given a lifetime where the endpoints meet the
client (frontend/endpoints/request_state.py); here it is the plain id of the waiting call. A call
the client does not come back to within that lifetime is cancelled upstream.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from typing import Any

import msgspec
import trio

from mcpvisor.frontend.door.calls import AskFailed, ClientCall
from mcpvisor.wire.errors import INVALID_PARAMS, ErrorCode, WireError

log = logging.getLogger(__name__)

_encode = msgspec.json.encode

# Requests whose 2026-07-28 result may be `input_required`.
ROUND_METHODS = frozenset({"tools/call", "prompts/get", "resources/read"})
# How long a call waits for its client to come back with input (a person may be answering).
ROUND_TTL = 600.0
# Questions an upstream asks at once reach mcpvisor one message apart: gathered this long, they go
# to the client as one round, as the upstream meant them.
ROUND_GATHER = 0.05


def input_required(result: dict[str, Any]) -> bool:
    return result.get("resultType") == "input_required"


class _Question:
    __slots__ = ("answer", "answered", "method", "params")

    def __init__(self, method: str, params: dict[str, Any]) -> None:
        self.method = method
        self.params = params
        self.answered = trio.Event()
        self.answer: bytes | AskFailed | None = None

    def settle(self, answer: bytes | AskFailed) -> None:
        if not self.answered.is_set():
            self.answer = answer
            self.answered.set()


class _Waiting:
    """One upstream call that outlives the client's rounds."""

    def __init__(self, state: str, server: str, method: str, call: ClientCall) -> None:
        self.state = state
        self.server = server
        self.method = method
        self.keys = itertools.count(1)
        self.unasked: dict[str, _Question] = {}  # asked by the upstream, not yet put to the client
        self.asked: dict[str, _Question] = {}  # put to the client in the last round
        self.changed = trio.Event()
        self.done = trio.Event()
        self.outcome: bytes | WireError | BaseException | None = None
        self.scope = trio.CancelScope()
        self.expiry: trio.CancelScope | None = None
        self.call = call  # its ctx follows the client's newest round

    async def ask(self, method: str, params: dict[str, Any]) -> bytes:
        question = _Question(method, params)
        self.unasked[f"{method.split('/')[0]}-{next(self.keys)}"] = question
        self.changed.set()
        await question.answered.wait()
        assert question.answer is not None
        if isinstance(question.answer, AskFailed):
            raise question.answer
        return question.answer

    def abandon(self, reason: str) -> None:
        """Stop the upstream call and fail whatever it still waits on."""
        for question in [*self.asked.values(), *self.unasked.values()]:
            question.settle(AskFailed(INVALID_PARAMS, reason))
        self.scope.cancel()


class Rounds:
    """The 2026-07-28 calls waiting on their clients, by the id their `requestState` carries."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._waiting: dict[str, _Waiting] = {}
        self._nursery: trio.Nursery | None = None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the upstream calls that outlive a round, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def __len__(self) -> int:
        return len(self._waiting)

    async def forward(
        self,
        request: Any,
        server: str,
        method: str,
        params: dict[str, Any],
        call: ClientCall,
    ) -> bytes | dict[str, Any]:
        """The upstream's JSON result, or an `input_required` result for the client to answer.

        `request(params, call)` runs the upstream call; `params` may carry the answers of a
        previous round (`inputResponses`, `requestState`), which are taken out here.
        """
        state = params.pop("requestState", None)
        responses = params.pop("inputResponses", None)
        if state is None:
            if responses:
                raise WireError(ErrorCode.BAD_REQUEST, "inputResponses without the requestState they answer")
            waiting = self._start(request, server, method, params, call)
        else:
            waiting = self._resume(state, server, method, responses or {}, call)
        try:
            return await self._round(waiting)
        except trio.Cancelled:
            # The client gave up on this round: nobody will come back for the call.
            self._finish(waiting, "the client went away")
            raise

    def _start(self, request: Any, server: str, method: str, params: dict[str, Any], call: ClientCall) -> _Waiting:
        if self._nursery is None:
            raise WireError(ErrorCode.INTERNAL, "this endpoint cannot carry a call over several rounds")
        waiting = _Waiting(secrets.token_urlsafe(16), server, method, call)
        call.rounds = waiting

        async def run() -> None:
            try:
                with waiting.scope:
                    waiting.outcome = await request(params, call)
                if waiting.scope.cancelled_caught and waiting.outcome is None:
                    waiting.outcome = WireError(ErrorCode.CANCELLED, "the call was abandoned while waiting for input")
            except WireError as exc:
                waiting.outcome = exc
            except Exception as exc:  # reported to the client on its round, not lost in a log
                log.exception("call to %s failed", server)
                waiting.outcome = exc
            finally:
                waiting.done.set()
                waiting.changed.set()

        self._nursery.start_soon(run)
        return waiting

    def _resume(self, state: Any, server: str, method: str, responses: dict[str, Any], call: ClientCall) -> _Waiting:
        waiting = self._waiting.get(state) if isinstance(state, str) else None
        if waiting is None or waiting.server != server or waiting.method != method:
            raise WireError(
                ErrorCode.BAD_REQUEST,
                "requestState names no call waiting for input here (it ended, expired, or mcpvisor restarted)",
            )
        unknown = sorted(set(responses) - set(waiting.asked))
        if unknown:
            raise WireError(
                ErrorCode.BAD_REQUEST, f"inputResponses answers nothing that was asked: {', '.join(unknown)}"
            )
        if waiting.expiry is not None:
            waiting.expiry.cancel()
            waiting.expiry = None
        # Progress and logs of the rest of the call ride this round's stream.
        waiting.call.request = call.request
        for key, question in waiting.asked.items():
            if key in responses:
                question.settle(_encode(responses[key]))
            else:
                question.settle(AskFailed(INVALID_PARAMS, f"the client did not answer {question.method}"))
        waiting.asked = {}
        return waiting

    async def _round(self, waiting: _Waiting) -> bytes | dict[str, Any]:
        while not waiting.done.is_set() and not waiting.unasked:
            await waiting.changed.wait()
            waiting.changed = trio.Event()
        with trio.move_on_after(ROUND_GATHER):
            while not waiting.done.is_set():
                await waiting.changed.wait()
                waiting.changed = trio.Event()
        if waiting.done.is_set():
            self._finish(waiting, "")
            outcome = waiting.outcome
            if isinstance(outcome, bytes):
                return outcome
            if isinstance(outcome, WireError):
                raise outcome
            raise WireError(ErrorCode.INTERNAL, f"the call failed in mcpvisor: {outcome}")
        waiting.asked, waiting.unasked = waiting.unasked, {}
        self._waiting[waiting.state] = waiting
        assert self._nursery is not None
        self._nursery.start_soon(self._expire, waiting)
        requests = {key: {"method": q.method, "params": q.params} for key, q in waiting.asked.items()}
        return {"resultType": "input_required", "inputRequests": requests, "requestState": waiting.state}

    async def _expire(self, waiting: _Waiting) -> None:
        with trio.CancelScope() as scope:
            waiting.expiry = scope
            await trio.sleep(self.ttl)
            log.info("a call to %s waited %gs for its client's input: cancelled", waiting.server, self.ttl)
            self._finish(waiting, f"the client did not come back with input within {self.ttl:g}s")

    def _finish(self, waiting: _Waiting, reason: str) -> None:
        self._waiting.pop(waiting.state, None)
        if waiting.expiry is not None:
            waiting.expiry.cancel()
            waiting.expiry = None
        if not waiting.done.is_set():
            waiting.abandon(reason)
