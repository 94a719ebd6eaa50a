"""The run's last lines name the system packages whose tests skipped because they are missing.

Tests that drive a system program (Chromium, bubblewrap, PostgreSQL, HAProxy) skip where it is not
installed, with a reason that starts with `system package missing: ` and the Debian package's
name. A run that skipped such a real part says so at its very end, where it cannot be missed.
"""

from __future__ import annotations

from collections import Counter

import pytest

SYSTEM_PACKAGE_MISSING = "system package missing: "


def missing_packages(reports: list[pytest.TestReport | pytest.CollectReport]) -> Counter[str]:
    """Debian package -> how many skipped tests (or modules) named it missing."""
    found: Counter[str] = Counter()
    for report in reports:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")
        if (start := reason.find(SYSTEM_PACKAGE_MISSING)) >= 0:
            words = reason[start + len(SYSTEM_PACKAGE_MISSING) :].split()
            if words:
                found[words[0].strip(".,;:()`'\"")] += 1
    return found


def pytest_unconfigure(config: pytest.Config) -> None:
    # After pytest's own summary line, on the controller of an xdist run (its workers report to it).
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput"):
        return
    missing = missing_packages(reporter.stats.get("skipped", []))
    if not missing:
        return
    reporter.write_sep("=", "system packages missing: their tests were skipped", yellow=True, bold=True)
    for package, count in sorted(missing.items()):
        reporter.write_line(f"{package}: {count} skipped")
    names = " ".join(sorted(missing))
    reporter.write_line(f"install them (Debian): apt-get install {names}; tests/run installs them where it may")
