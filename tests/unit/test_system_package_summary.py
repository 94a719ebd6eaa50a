"""A run that skips tests for a missing system package names the packages in its last lines.

Given a test file whose tests skip with `system package missing: PACKAGE` (as a mark, from inside
a test, and for a whole module), when pytest runs it with the project's conftest, with and without
xdist, then the output ends with each package, how many tests it cost, and how to install them;
other skips are not listed, and the exit code stays pytest's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SYSTEM_PACKAGE_MISSING

REPO = Path(__file__).resolve().parents[2]

TESTS = f'''
import pytest

def test_runs():
    assert True

def test_needs_haproxy():
    pytest.skip("{SYSTEM_PACKAGE_MISSING}haproxy")

@pytest.mark.skipif(True, reason="{SYSTEM_PACKAGE_MISSING}chromium")
def test_needs_chromium():
    pass

@pytest.mark.skipif(True, reason="{SYSTEM_PACKAGE_MISSING}chromium")
def test_needs_chromium_too():
    pass

def test_skips_for_another_reason():
    pytest.skip("not on this platform")
'''

MODULE_SKIP = f'''
import pytest

pytest.skip("{SYSTEM_PACKAGE_MISSING}postgresql", allow_module_level=True)

def test_never_runs():
    pass
'''


def run_pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_parts.py").write_text(TESTS)
    (tmp_path / "test_database.py").write_text(MODULE_SKIP)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", os.devnull, "-p", "tests.conftest", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_last_lines_name_the_missing_packages(tmp_path: Path, workers: str) -> None:
    done = run_pytest(tmp_path, "-n", workers, "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.rstrip().splitlines()
    assert lines[-5].lstrip("= ").startswith("system packages missing"), lines[-6:]
    assert lines[-4:-1] == ["chromium: 2 skipped", "haproxy: 1 skipped", "postgresql: 1 skipped"]
    assert "apt-get install chromium haproxy postgresql" in lines[-1]
    assert "platform" not in "\n".join(lines[-5:])


def test_a_failure_keeps_pytests_exit_code(tmp_path: Path) -> None:
    (tmp_path / "test_fails.py").write_text("def test_fails():\n    assert False\n")
    done = run_pytest(tmp_path, "-n", "0", "-q")
    assert done.returncode == 1
    assert done.stdout.rstrip().splitlines()[-1].startswith("install them (Debian)")


def test_nothing_is_added_when_nothing_is_missing(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "-n", "0", "-q", "-k", "runs", "test_parts.py")
    assert done.returncode == 0
    assert "system packages missing" not in done.stdout
