"""Log files: rotation by size, reading the tail, one line per record, and copying a child's output."""

from __future__ import annotations

import io
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing

from mcpvisor.runtime.logs import JsonFormatter, OneLineFormatter, RotatingFile, pump, tail_lines


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "logs" / "worker.log"


def names(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


# -- RotatingFile -----------------------------------------------------------------------------------


def test_writes_go_to_the_file_until_it_would_exceed_max_bytes(log_path: Path) -> None:
    sink = RotatingFile(log_path, max_bytes=20, backups=2)
    try:
        sink.write(b"0123456789")
        sink.write(b"abcdefghij")  # exactly 20 bytes: still fits
    finally:
        sink.close()

    assert log_path.read_bytes() == b"0123456789abcdefghij"
    assert names(log_path) == ["worker.log"]


def test_rotation_shifts_files_and_drops_the_oldest(log_path: Path) -> None:
    sink = RotatingFile(log_path, max_bytes=10, backups=2)
    try:
        for chunk in (b"first....\n", b"second...\n", b"third....\n", b"fourth...\n"):
            sink.write(chunk)
    finally:
        sink.close()

    assert names(log_path) == ["worker.log", "worker.log.1", "worker.log.2"]
    assert log_path.read_bytes() == b"fourth...\n"
    assert log_path.with_name("worker.log.1").read_bytes() == b"third....\n"
    assert log_path.with_name("worker.log.2").read_bytes() == b"second...\n"


def test_a_reopened_file_counts_its_existing_size(log_path: Path) -> None:
    first = RotatingFile(log_path, max_bytes=10, backups=1)
    first.write(b"123456")
    first.close()

    second = RotatingFile(log_path, max_bytes=10, backups=1)
    try:
        second.write(b"789")  # 9 bytes in all: appended
        assert log_path.read_bytes() == b"123456789"
        second.write(b"ab")  # 11 bytes would be too many: rotate first
    finally:
        second.close()

    assert log_path.read_bytes() == b"ab"
    assert log_path.with_name("worker.log.1").read_bytes() == b"123456789"


def test_one_write_larger_than_max_bytes_is_kept_whole_without_an_empty_backup(log_path: Path) -> None:
    sink = RotatingFile(log_path, max_bytes=4, backups=3)
    try:
        sink.write(b"a long line\n")
    finally:
        sink.close()

    assert log_path.read_bytes() == b"a long line\n"
    assert names(log_path) == ["worker.log"]


def test_rotating_file_creates_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c.log"
    RotatingFile(path).close()
    assert path.exists()


# -- tail_lines -------------------------------------------------------------------------------------


def write_lines(path: Path, count: int, *, trailing_newline: bool = True) -> list[str]:
    lines = [f"line {n:05d} " + "x" * (n % 37) for n in range(count)]
    path.write_text("\n".join(lines) + ("\n" if trailing_newline else ""))
    return lines


def test_tail_of_a_small_file(tmp_path: Path) -> None:
    lines = write_lines(tmp_path / "f.log", 10)
    assert tail_lines(tmp_path / "f.log", 3) == lines[-3:]


@pytest.mark.parametrize("count", [1, 5, 500, 1999])
def test_tail_of_a_file_larger_than_one_read_block(tmp_path: Path, count: int) -> None:
    lines = write_lines(tmp_path / "f.log", 2000)  # about 60 KB: several 8 KB blocks
    assert (tmp_path / "f.log").stat().st_size > 7 * 8192
    assert tail_lines(tmp_path / "f.log", count) == lines[-count:]


def test_asking_for_more_lines_than_the_file_has_returns_them_all(tmp_path: Path) -> None:
    lines = write_lines(tmp_path / "f.log", 3000)
    assert tail_lines(tmp_path / "f.log", 10_000) == lines


def test_a_missing_file_has_no_tail(tmp_path: Path) -> None:
    assert tail_lines(tmp_path / "absent.log", 10) == []


@pytest.mark.parametrize("count", [0, -1])
def test_no_lines_asked_no_lines_returned(tmp_path: Path, count: int) -> None:
    write_lines(tmp_path / "f.log", 5)
    assert tail_lines(tmp_path / "f.log", count) == []


@pytest.mark.parametrize("total", [4, 2000])
def test_a_last_line_without_newline_is_included(tmp_path: Path, total: int) -> None:
    lines = write_lines(tmp_path / "f.log", total, trailing_newline=False)
    assert tail_lines(tmp_path / "f.log", 2) == lines[-2:]


def test_an_empty_file_has_no_tail(tmp_path: Path) -> None:
    (tmp_path / "f.log").write_bytes(b"")
    assert tail_lines(tmp_path / "f.log", 5) == []


def test_undecodable_bytes_do_not_break_the_tail(tmp_path: Path) -> None:
    (tmp_path / "f.log").write_bytes(b"ok\nbad \xff\xfe bytes\n")
    assert tail_lines(tmp_path / "f.log", 1) == ["bad \ufffd\ufffd bytes"]


# -- formatters -------------------------------------------------------------------------------------


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.Logger("mcpvisor.test")  # not registered: nothing else sees these records
    logger.addHandler(handler)
    yield logger, stream, handler
    handler.close()


def log_an_exception(logger: logging.Logger) -> None:
    try:
        raise ValueError("upstream went away\nwith a two-line message")
    except ValueError:
        logger.exception("call %s failed", "time:now")


def test_one_line_formatter_layout(captured: tuple[logging.Logger, io.StringIO, logging.Handler]) -> None:
    logger, stream, handler = captured
    handler.setFormatter(OneLineFormatter("worker:time"))

    logger.warning("upstream is %s", "slow")

    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z warning worker:time: upstream is slow\n", stream.getvalue()
    )


def test_one_line_formatter_folds_a_traceback_into_the_line(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = captured
    handler.setFormatter(OneLineFormatter("worker:time"))

    log_an_exception(logger)

    output = stream.getvalue()
    assert output.count("\n") == 1 and output.endswith("\n")
    assert "error   worker:time: call time:now failed | Traceback (most recent call last):" in output
    assert "ValueError: upstream went away | with a two-line message" in output


def test_one_line_formatter_folds_a_multi_line_message(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = captured
    handler.setFormatter(OneLineFormatter("frontend"))

    logger.info("upstream stderr:\n%s", "first\r\nsecond")

    assert stream.getvalue().endswith("info    frontend: upstream stderr: | first | second\n")
    assert stream.getvalue().count("\n") == 1


def test_json_formatter_writes_one_object_per_line_with_the_traceback(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = captured
    handler.setFormatter(JsonFormatter("supervisor"))

    log_an_exception(logger)
    logger.info("state change", extra={"fields": {"event": "state", "name": "worker:time", "to": "RUNNING"}})

    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    failed, changed = (json.loads(line) for line in lines)
    assert failed["level"] == "error"
    assert failed["msg"] == "call time:now failed"
    assert failed["exc"].startswith("Traceback (most recent call last):")
    assert "ValueError: upstream went away" in failed["exc"]
    assert isinstance(changed.pop("ts"), float)
    assert changed == {
        "level": "info",
        "process": "supervisor",
        "msg": "state change",
        "event": "state",
        "name": "worker:time",
        "to": "RUNNING",
    }


# -- pump -------------------------------------------------------------------------------------------


async def test_pump_copies_a_stream_into_the_file_until_eof(log_path: Path) -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    sink = RotatingFile(log_path, max_bytes=1024, backups=1)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, receive, sink)
            for n in range(5):
                await send.send_all(f"line {n}\n".encode())
            await send.aclose()
    finally:
        sink.close()

    assert await trio.Path(log_path).read_text() == "".join(f"line {n}\n" for n in range(5))
    with pytest.raises(trio.ClosedResourceError):
        await receive.receive_some(1)  # pump closed its end


async def test_pump_copies_a_real_pipe_until_the_writer_closes(log_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    reader = trio.lowlevel.FdStream(read_fd)
    writer = trio.lowlevel.FdStream(write_fd)
    sink = RotatingFile(log_path)
    payload = b"".join(b"child output %05d\n" % n for n in range(10_000))  # larger than a pipe buffer
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, reader, sink)
            await writer.send_all(payload)
            await writer.aclose()
    finally:
        sink.close()

    assert await trio.Path(log_path).read_bytes() == payload


async def test_pump_stops_quietly_when_the_stream_is_broken(log_path: Path) -> None:
    class Broken(trio.abc.ReceiveStream):
        closed = False

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            raise trio.BrokenResourceError

        async def aclose(self) -> None:
            self.closed = True

    stream = Broken()
    sink = RotatingFile(log_path)
    try:
        await pump(stream, sink)
    finally:
        sink.close()
    assert stream.closed


def test_a_record_for_the_event_log_alone_stays_off_the_console(tmp_path: Path) -> None:
    """Every `ctl` call is recorded in the JSON event log, and not shown on the console."""
    from mcpvisor.runtime import logs

    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        logs.setup("supervisor", "info", json_file=tmp_path / "supervisor.log")
        console = root.handlers[0]
        shown = io.StringIO()
        console.setStream(shown)  # type: ignore[attr-defined]
        log = logging.getLogger("mcpvisor.test")
        log.info("command status : ok", extra={"fields": {"event": "command"}, "console": False})
        log.info("worker:echo: STARTING -> RUNNING")
    finally:
        for handler in root.handlers:
            if isinstance(handler, logs.RotatingHandler):
                handler.sink.close()
        root.handlers[:], root.level = saved_handlers, saved_level
    assert "STARTING -> RUNNING" in shown.getvalue()
    assert "command status" not in shown.getvalue()
    events = (tmp_path / "supervisor.log").read_text()
    assert "command status" in events and "STARTING -> RUNNING" in events
