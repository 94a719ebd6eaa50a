"""The distribution installs whole: a wheel built from the tree serves the console and runs the quick start.

Given a wheel built with `pip wheel` from a copy of the sources, installed with `--no-deps` into a
fresh virtualenv (its dependencies are taken from the test's own environment, read-only, so the
test needs no index), when its `mcpvisor serve` runs the quick start's example config, then a
client calls a tool, the console's page and static files are served from the installed package,
and its `mcpvisor ctl status` shows the server running. Nothing is imported from the source tree.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

import httpx2
import pytest
import tomli_w

from tests.support.stack import REPO, Stack, free_port, stop_stack, wait_stack

# The top-level folders pyproject.toml maps into the `mcpvisor` namespace, by package name.
PACKAGE_DIRS = {
    package.removeprefix("mcpvisor."): folder
    for package, folder in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].items()
    if "/" not in folder
}


def build_wheel(out: Path) -> Path:
    """`pip wheel` of a copy of the sources, so no build/ folder of an earlier build can leak into it."""
    source = out / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in PACKAGE_DIRS:
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = (out / "dist").glob("mcpvisor-*.whl")
    return wheel


def fresh_venv(path: Path, wheel: Path) -> Path:
    """A new virtualenv holding the wheel; the dependencies come from this environment's site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # A plain path line: this environment's .pth files (the editable install of the tree) are not run.
    (purelib / "zz-test-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the virtualenv it is installed in)."""
    base = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(base)
    return wheel, fresh_venv(base / "venv", wheel)


def test_the_wheel_holds_every_module_and_the_console(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in PACKAGE_DIRS:
        for path in (REPO / folder).rglob("*.py"):
            inside = f"mcpvisor/{path.relative_to(REPO).as_posix()}"
            assert inside in names, f"{inside} is missing from the wheel: add its package to pyproject.toml"
    static = REPO / "frontend" / "endpoints" / "console_static"
    for path in static.iterdir():
        assert f"mcpvisor/frontend/endpoints/console_static/{path.name}" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "mcpvisor = mcpvisor.supervisor.cli:main" in entry_points
    assert "mcpvisorctl = mcpvisor.supervisor.cli:ctl_main" in entry_points


def test_the_installed_package_is_the_wheel(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, venv = installed
    done = subprocess.run(
        [
            venv / "bin" / "python",
            "-P",
            "-c",
            "import mcpvisor.supervisor, mcpvisor.frontend.endpoints as e; print(mcpvisor.supervisor.__file__);"
            " print(e.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    for line in done.stdout.split():
        assert Path(line).is_relative_to(venv), line
    version = subprocess.run([venv / "bin" / "mcpvisor", "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("mcpvisor ")


def quick_start_config(path: Path, port: int, data_dir: Path) -> None:
    """The quick start's example config on a free port; its npm server left out (npx would fetch it)."""
    config = tomllib.loads((REPO / "deploy" / "examples" / "workstation.toml").read_text())
    assert "time" in config["servers"]
    config["servers"].pop("everything", None)
    config["mcpvisor"].update(listen=f"127.0.0.1:{port}", data_dir=str(data_dir))
    path.write_text(tomli_w.dumps(config))


async def test_the_installed_wheel_runs_the_quick_start_and_serves_the_console(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, venv = installed
    port = free_port()
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    config_path = tmp_path / "mcpvisor.toml"
    quick_start_config(config_path, port, data_dir)
    # `mcp-server-time` as the quick start installs it next to mcpvisor: here, on PATH.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mcp-server-time").symlink_to(Path(sys.executable).parent / "mcp-server-time")
    run_dir = Path(tempfile.mkdtemp(prefix="mv", dir="/tmp"))  # ipc:// paths are short
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCPVISOR_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", HOME=str(tmp_path), XDG_RUNTIME_DIR=str(run_dir))
    env.pop("RUNTIME_DIRECTORY", None)
    with open(data_dir / "supervisor.out", "ab") as out:
        process = subprocess.Popen(
            [venv / "bin" / "mcpvisor", "serve", "-c", str(config_path)],
            stdout=out,
            stderr=out,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
    stack = Stack(process, config_path, data_dir, run_dir / "mcpvisor", port, env)
    try:
        await wait_stack(stack, ["time"])
        async with stack.client("/mcp/direct") as client:
            result = await client.call_tool("time:get_current_time", {"timezone": "UTC"})
            assert not result.is_error
            assert "UTC" in result.content[0].text
        async with httpx2.AsyncClient(base_url=stack.base_url) as http:
            page = await http.get("/ui/")
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
            script = await http.get("/ui/static/console.js")
            assert script.status_code == 200
            assert script.content == (REPO / "frontend/endpoints/console_static/console.js").read_bytes()
        status = subprocess.run(
            [venv / "bin" / "mcpvisor", "ctl", "-c", str(config_path), "status"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert status.returncode == 0, status.stdout + status.stderr
        assert any(line.split()[:2] == ["time", "RUNNING"] for line in status.stdout.splitlines()), status.stdout
    finally:
        await stop_stack(stack)
        shutil.rmtree(run_dir, ignore_errors=True)
