"""What a command needs inside its sandbox, found on the host: prefixes, virtualenvs, scripts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcpvisor.runtime.bwrap import Bind, Symlink
from mcpvisor.workers.confine import argument_files, command_link, install_paths, masks, sandbox_env


def test_a_virtualenv_brings_the_python_it_was_made_from(tmp_path: Path) -> None:
    base = tmp_path / "pyenv" / "versions" / "3.11"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python3").write_text("")
    venv = tmp_path / "project" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\nversion = 3.11\n")
    os.symlink(base / "bin" / "python3", venv / "bin" / "python")
    tool = venv / "bin" / "mcp-server-time"
    tool.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\n")
    assert set(install_paths(str(tool))) == {str(venv), str(base)}


def test_a_system_program_needs_nothing_more() -> None:
    assert install_paths("/usr/bin/env") == []


def test_a_shebang_through_env_names_the_interpreter_found_on_path(tmp_path: Path) -> None:
    node = tmp_path / "opt" / "node" / "bin" / "node"
    node.parent.mkdir(parents=True)
    node.write_text("")
    node.chmod(0o755)
    script = tmp_path / "opt" / "tool" / "bin" / "tool"
    script.parent.mkdir(parents=True)
    script.write_text("#!/usr/bin/env node\n")
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{node.parent}:{old}"
    try:
        assert set(install_paths(str(script))) == {str(tmp_path / "opt" / "tool"), str(tmp_path / "opt" / "node")}
    finally:
        os.environ["PATH"] = old


def test_script_arguments_are_bound_alone_and_directories_never(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text("")
    (tmp_path / "secret.txt").write_text("s")
    found = argument_files(["--name", "x", str(script), str(tmp_path), "server.py"], str(tmp_path))
    assert found == [(str(script), str(script))]


def test_a_symlinked_node_modules_script_brings_its_tree_at_both_paths(tmp_path: Path) -> None:
    real = tmp_path / "real" / "node_modules"
    entry = real / "@scope" / "pkg" / "dist" / "index.js"
    entry.parent.mkdir(parents=True)
    entry.write_text("")
    (tmp_path / "link").mkdir()
    os.symlink(real, tmp_path / "link" / "node_modules")
    given = tmp_path / "link" / "node_modules" / "@scope" / "pkg" / "dist" / "index.js"
    assert argument_files([str(given)], None) == [
        (str(real), str(tmp_path / "link" / "node_modules")),
        (str(real), str(real)),
    ]


def test_the_environment_is_the_configured_one_over_a_minimal_base() -> None:
    os.environ["MCPVISOR_SECRET_PROBE"] = "not for the sandbox"
    try:
        env = sandbox_env({"API_KEY": "k", "LANG": "de_DE.UTF-8"}, "/opt/tool/bin/tool")
    finally:
        del os.environ["MCPVISOR_SECRET_PROBE"]
    assert env["API_KEY"] == "k" and env["LANG"] == "de_DE.UTF-8" and env["HOME"] == "/home/sandbox"
    assert env["PATH"].startswith("/opt/tool/bin:")
    assert env["npm_config_cache"] == "/home/sandbox/.npm" and env["UV_CACHE_DIR"] == "/home/sandbox/.cache/uv"
    assert not any(key.startswith("MCPVISOR") for key in env)
    assert set(env) == {
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
        "XDG_CACHE_HOME",
        "npm_config_cache",
        "UV_CACHE_DIR",
        "API_KEY",
    }


def test_only_hidden_paths_that_exist_are_masked(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("")
    (tmp_path / "data").mkdir()
    found = masks([str(tmp_path / "config.toml"), str(tmp_path / "config.toml.bak"), str(tmp_path / "data")])
    assert [(m.path, m.directory) for m in found] == [
        (str(tmp_path / "config.toml"), False),
        (str(tmp_path / "data"), True),
    ]


def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "rev"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("KEY")
    monkeypatch.setenv("HOME", str(home))
    return home


def test_a_program_right_in_a_home_brings_itself_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = fake_home(tmp_path, monkeypatch)
    tool = home / "bin" / "mytool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    assert install_paths(str(tool)) == [str(tool)]
    direct = home / "tool"  # the home itself would be its prefix
    direct.write_text("#!/bin/sh\n")
    assert install_paths(str(direct)) == [str(direct)]


def test_a_symlinked_program_brings_the_prefix_it_leads_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uv and pipx put links in ~/.local/bin: that dir's parent (~/.local) is not the install."""
    home = fake_home(tmp_path, monkeypatch)
    venv = home / ".local" / "share" / "uv" / "tools" / "srv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "srv").write_text("#!/bin/sh\n")
    link = home / ".local" / "bin" / "srv"
    link.parent.mkdir()
    link.symlink_to(venv / "bin" / "srv")
    assert install_paths(str(link)) == [str(venv)]
    # The link itself is made inside, unless a bind shows it.
    made = command_link(str(link), [Bind(source=str(venv))])
    assert made == Symlink(path=str(link), target=str(venv / "bin" / "srv"))
    assert command_link(str(link), [Bind(source=str(home / ".local"))]) is None
    assert command_link(str(venv / "bin" / "srv"), []) is None


def test_a_virtualenvs_python_link_still_brings_the_virtualenv(tmp_path: Path) -> None:
    venv = tmp_path / "project" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    assert install_paths(str(venv / "bin" / "python")) == [str(venv)]


def test_nothing_in_a_writable_place_is_followed(tmp_path: Path) -> None:
    """The upstream rewrites pyvenv.cfg, `#!` lines and symlinks where it can write."""
    rw, other = tmp_path / "rw", tmp_path / "other"
    (other / "bin").mkdir(parents=True)
    (other / "bin" / "python3").write_text("")
    venv = rw / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {other / 'bin'}\n")
    (venv / "bin" / "tool").write_text(f"#!{other / 'bin' / 'python3'}\n")
    (rw / "link.py").symlink_to(other / "bin" / "python3")
    assert set(install_paths(str(venv / "bin" / "tool"))) == {str(venv), str(other)}
    assert install_paths(str(venv / "bin" / "tool"), [str(rw)]) == []
    assert argument_files([str(rw / "link.py")], None, [str(rw)]) == []
