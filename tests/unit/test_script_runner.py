"""What code_execution's script sandbox shows and hides, decided without running bwrap."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcpvisor.runtime import script_runner
from mcpvisor.runtime.bwrap import Bind
from mcpvisor.wire.config import SandboxConfig, Settings, TenantConfig


def test_the_view_is_the_system_libraries_and_this_python_read_only() -> None:
    spec = script_runner.spec_for(sys.executable)
    system = {entry.path if hasattr(entry, "path") else entry.source for entry in spec.system}
    assert "/usr" in system and "/etc" not in system and "/sbin" not in system
    bound = [bind.source for bind in spec.binds]
    assert all(isinstance(bind, Bind) and not bind.writable for bind in spec.binds)
    assert sys.prefix in bound or any(sys.prefix.startswith(path + "/") for path in bound)
    assert os.path.realpath(sys.base_prefix).startswith(("/usr", *bound))
    workers = os.path.dirname(script_runner.importlib.util.find_spec(script_runner.MODULE).origin or "")
    assert any(workers == path or workers.startswith(path + "/") for path in bound)
    assert spec.home is None and spec.network is False and spec.cwd == "/"


def test_a_hidden_path_inside_a_bound_dir_is_covered(tmp_path: Path) -> None:
    hidden_dir = os.path.join(sys.prefix, "lib")  # stands for a data dir that happens to be inside a prefix
    argv = script_runner.Decision(
        confined=True, spec=script_runner.spec_for(sys.executable, [hidden_dir, str(tmp_path / "absent")])
    ).argv(["python"])
    covered = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"]
    assert hidden_dir in covered or os.path.realpath(hidden_dir) in covered
    assert str(tmp_path / "absent") not in argv  # nothing exists there, so nothing to cover


def test_required_with_tenants_or_the_global_switch() -> None:
    assert script_runner.sandbox_required(Settings(), {}) is False
    assert script_runner.sandbox_required(Settings(), {"alice": TenantConfig()}) is True
    assert script_runner.sandbox_required(Settings(sandbox=True), {}) is True
    assert script_runner.sandbox_required(Settings(sandbox=SandboxConfig(memory_mb=512)), {}) is True
    assert script_runner.sandbox_required(Settings(sandbox=SandboxConfig(enabled=False)), {}) is False


def test_the_uid_of_scripts_under_a_root_mcpvisor() -> None:
    assert script_runner.script_uid([(0, 4294967295)]) == (1 << 30) + 1
    # A rootless container maps 65536 ids: a high one of those, not nobody (65534).
    assert script_runner.script_uid([(0, 65536)]) == 65533


def test_bwraps_complaints_become_the_fix() -> None:
    proc = script_runner.explain("bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n")
    assert "systempaths=unconfined" in proc and "procMount: Unmasked" in proc
    userns = script_runner.explain("bwrap: No permissions to creating new namespace, likely because ...")
    assert "user namespaces are refused" in userns and "seccomp-bwrap.json" in userns
    mount = script_runner.explain("bwrap: Failed to make / slave: Permission denied")
    assert "seccomp profile, AppArmor" in mount
    inner = script_runner.explain("Traceback ...\nModuleNotFoundError: No module named 'py_mini_racer'")
    assert inner.startswith("the script process fails inside bwrap")


def test_unconfined_decisions_run_the_command_as_it_is() -> None:
    decision = script_runner.Decision(confined=False, problem="bwrap is not installed", refused=False)
    assert decision.argv(["python", "-m", "x"]) == ["python", "-m", "x"]
    assert decision.warning == "code_execution runs in V8 alone, without its bubblewrap sandbox: bwrap is not installed"
    refused = script_runner.Decision(confined=False, problem="bwrap is not installed", refused=True)
    assert refused.warning == "code_execution is refused: its sandbox cannot be built here: bwrap is not installed"
