"""No input on the control socket ends the service: 1,000 random commands, then everything is as it was."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import trio
import zmq

from mcpvisor.supervisor.commands import load_all
from mcpvisor.wire import codec
from mcpvisor.wire.endpoints import Endpoints
from mcpvisor.wire.messages import Reply
from tests.support.stack import Stack, echo_server, open_stack

COMMANDS = 1000
# Names a random argument must never be: a valid `stop echo` or `restart all` would change pids.
TAKEN = {"echo", "all", "frontend"}
# Commands that are valid with no arguments and would stop or restart something.
NEED_ARGUMENTS = {"shutdown", "reload"}


def random_scalar(rng: random.Random) -> Any:
    return rng.choice(
        [
            lambda: rng.randint(-(2**63), 2**63 - 1),
            lambda: rng.randint(-5, 5),
            lambda: rng.random() * 10 ** rng.randint(-3, 30) * rng.choice([-1, 1]),
            lambda: float("nan"),
            lambda: None,
            lambda: rng.choice([True, False]),
            lambda: random_word(rng),
            lambda: random_word(rng),
            lambda: random_word(rng),
            lambda: rng.randbytes(rng.randint(0, 40)),
        ]
    )()


def random_word(rng: random.Random) -> str:
    word = rng.choice(
        [
            lambda: rng.choice(["-n", "--lines", "--from", "-f", "-", "--", "-5", "worker", "stderr", "x=1,y"]),
            lambda: str(rng.randint(-(10**20), 10**20)),
            lambda: (
                "".join(chr(rng.randint(1, 0x10FFFF)) for _ in range(rng.randint(0, 12)))
                .encode("utf-8", "surrogatepass")
                .decode("utf-8", "replace")
            ),
            lambda: "é☃𝄞\u202e\x00\n" * rng.randint(1, 4),
            lambda: "a" * rng.choice([0, 1, 300, 100_000]),
            lambda: "../" * rng.randint(1, 5) + "etc/passwd",
            lambda: f"worker={rng.randint(-9, 2**40)},stderr={random_scalar_text(rng)}",
        ]
    )()
    return word + "_" if word in TAKEN else word


def random_scalar_text(rng: random.Random) -> str:
    return rng.choice(["abc", "-1", "1e9", "", "=", str(2**70)])


def random_value(rng: random.Random, depth: int = 0) -> Any:
    if depth > 3 or rng.random() < 0.6:
        return random_scalar(rng)
    if rng.random() < 0.5:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {random_word(rng): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def random_command(rng: random.Random, request_id: int, names: list[str]) -> dict[str, Any]:
    name = rng.choice(names) if rng.random() < 0.8 else random_word(rng)
    header: dict[str, Any] = {"t": "cmd", "id": request_id, "name": name}
    if rng.random() < 0.8:
        # Mostly words, as ctl sends them; sometimes anything at all.
        args = [random_word(rng) if rng.random() < 0.8 else random_value(rng) for _ in range(rng.randint(0, 6))]
        header["args"] = args if rng.random() < 0.9 else random_value(rng)
    if name in NEED_ARGUMENTS and not (isinstance(header.get("args"), list) and header["args"]):
        # Checked after the random value too: an empty list there is a valid `shutdown`.
        header["args"] = [random_word(rng)]
    if rng.random() < 0.3:
        header["data"] = random_value(rng)
    if rng.random() < 0.05:
        header[random_word(rng)] = random_value(rng)  # a field no Command has
    return header


def fuzz(endpoint: str, seed: int) -> list[tuple[dict[str, Any], Reply]]:
    """Send the commands one at a time, as ctl does, and collect every reply."""
    rng = random.Random(seed)
    names = sorted(load_all())
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    answered: list[tuple[dict[str, Any], Reply]] = []
    try:
        for request_id in range(1, COMMANDS + 1):
            header = random_command(rng, request_id, names)
            frames = [msgspec.msgpack.encode(header)]
            if rng.random() < 0.05:
                frames.append(rng.randbytes(rng.randint(0, 64)))  # a payload frame nobody expects
            sock.send_multipart(frames)
            assert sock.poll(30_000, zmq.POLLIN), f"no answer to {header!r:.300}"
            reply, _ = codec.control.decode(sock.recv_multipart())
            assert isinstance(reply, Reply) and reply.id == request_id, reply
            answered.append((header, reply))
            if rng.random() < 0.05:
                # Garbage that is not a command at all: dropped without an answer, and harmless.
                sock.send_multipart([rng.randbytes(rng.randint(0, 100))])
    finally:
        sock.close(linger=0)
        ctx.term()
    return answered


def ctl(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-P", "-m", "mcpvisor.supervisor", "ctl", "-c", str(stack.config_path), *args]
    return subprocess.run(command, capture_output=True, text=True, env=stack.env, timeout=60, check=False)


async def test_a_thousand_random_commands_change_nothing(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        before = stack.pids()
        endpoint = Endpoints.in_dir(stack.run_dir).control

        answered = await trio.to_thread.run_sync(fuzz, endpoint, 20261123)

        assert len(answered) == COMMANDS
        internal = [(header, reply.error) for header, reply in answered if "internal error" in reply.error]
        assert not internal, f"commands that raised inside the supervisor: {internal[:3]!r:.2000}"
        assert all(reply.exit_code in (0, 1, 2, 3, 4) for _, reply in answered)
        assert all("\n" not in reply.error for _, reply in answered)
        refused = sum(1 for _, reply in answered if reply.exit_code == 2)
        assert refused > COMMANDS // 4  # most random arguments are bad ones, and are told so
        assert stack.process.poll() is None
        assert stack.pids() == before
        code, rows = await stack.actl("status")
        assert code == 0 and {row["name"] for row in rows} == {"frontend", "echo"}, rows
        assert all(row["state"] == "RUNNING" for row in rows)


async def test_a_bad_argument_gets_one_line_naming_it_and_exit_code_2(tmp_path: Path) -> None:
    async with open_stack(tmp_path, {"echo": echo_server()}) as stack:
        before = stack.pids()
        cases = [
            (("tail", "echo", "-n", "abc"), "-n/--lines"),
            (("tail", "echo", "-n", "-3"), "-n/--lines"),
            (("tail", "echo", "--lines"), "--lines"),
            (("tail", "echo", "--from", "worker=x"), "--from"),
            (("tail",), "NAME"),
            (("tail", "echo", "worker", "extra"), "'extra'"),
            (("enable",), "NAME"),
            (("status", "--bogus"), "'--bogus'"),
            (("shutdown", "now"), "'now'"),
        ]
        for args, named in cases:
            result = await trio.to_thread.run_sync(ctl, stack, *args)
            assert result.returncode == 2, (args, result.stderr)
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and named in lines[0], (args, result.stderr)
            assert "Traceback" not in result.stderr
        assert stack.pids() == before
        assert (await stack.actl("status"))[0] == 0
