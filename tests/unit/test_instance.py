"""One mcpvisor per data dir: the lock, what it says about its holder, and where a second data dir goes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcpvisor.supervisor.instance import AlreadyRunning, InstanceLock, find_runtime_dir, own_runtime_dir, read_holder

HOLD = """
import sys, time
from pathlib import Path
from mcpvisor.supervisor.instance import InstanceLock
InstanceLock(Path(sys.argv[1])).acquire()
print("locked", flush=True)
time.sleep(60)
"""


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "mcpvisor"


def hold(data_dir: Path, env_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(env_dir)}
    env.pop("RUNTIME_DIRECTORY", None)
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(data_dir)], stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None and process.stdout.readline().strip() == "locked"
    return process


def end(holder: subprocess.Popen[str]) -> None:
    holder.kill()
    holder.wait()
    assert holder.stdout is not None
    holder.stdout.close()


def test_the_lock_names_its_holder_and_a_second_one_is_refused_naming_it(tmp_path: Path, runtime: Path) -> None:
    data = tmp_path / "data"
    holder = hold(data, runtime.parent)
    try:
        with pytest.raises(AlreadyRunning) as refused:
            InstanceLock(data).acquire()
        message = str(refused.value)
        assert f"pid {holder.pid}" in message and f"{runtime}/control.sock" in message
        assert read_holder(data).pid == holder.pid
    finally:
        end(holder)


def test_a_lock_left_by_a_killed_instance_is_taken_over(tmp_path: Path, runtime: Path) -> None:
    data = tmp_path / "data"
    holder = hold(data, runtime.parent)
    end(holder)
    assert (data / "mcpvisor.lock").exists()
    lock = InstanceLock(data).acquire()
    try:
        assert read_holder(data).pid == os.getpid()
        assert lock.run_dir == runtime
    finally:
        lock.release()


def test_another_data_dir_takes_a_runtime_dir_of_its_own_and_ctl_finds_each(tmp_path: Path, runtime: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    holder = hold(first, runtime.parent)
    try:
        lock = InstanceLock(second).acquire()
        try:
            assert lock.run_dir == own_runtime_dir(second) != runtime
            assert find_runtime_dir(first) == runtime
            assert find_runtime_dir(second) == own_runtime_dir(second)
        finally:
            lock.release()
    finally:
        end(holder)


def test_files_of_the_lock_are_private(tmp_path: Path, runtime: Path) -> None:
    lock = InstanceLock(tmp_path / "data").acquire()
    try:
        for directory in (tmp_path / "data", runtime):
            assert (directory / "mcpvisor.lock").stat().st_mode & 0o077 == 0
        assert runtime.stat().st_mode & 0o077 == 0
    finally:
        lock.release()


def test_ctl_still_finds_an_instance_in_its_own_dir_after_the_other_one_is_gone(tmp_path: Path, runtime: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    holder = hold(first, runtime.parent)
    lock = InstanceLock(second).acquire()
    try:
        end(holder)  # its lock file and socket may stay behind in the shared dir
        assert find_runtime_dir(second) == own_runtime_dir(second)
    finally:
        lock.release()
