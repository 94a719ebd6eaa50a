"""Each room imports only the rooms below it: wire/ at the bottom, store/ and runtime/ on it, the processes on top.

wire/ is the contract between processes, store/ the state that outlives one, runtime/ what processes
share to run; supervisor/, workers/, frontend/ and client/ are the processes and never import each
other.

Run as a script (`python tests/unit/test_import_boundary.py [ROOT]`) it prints every cross-room
import under ROOT (the checkout by default) and their count.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What each room may import besides itself.
BELOW: dict[str, frozenset[str]] = {
    "wire": frozenset(),
    "store": frozenset({"wire"}),
    "runtime": frozenset({"wire"}),
    **{process: frozenset({"wire", "store", "runtime"}) for process in ("supervisor", "workers", "frontend", "client")},
}
ROOMS = tuple(BELOW)
# Where a piece two rooms need belongs, told when an import crosses.
ADVICE = (
    "move what both need down: into wire/ if it is part of the contract between processes (messages, "
    "config Structs, endpoints, secret references), store/ if it keeps state beyond a process (SQLite, "
    "PostgreSQL, tokens), runtime/ if it is how processes run (spawning, logs, bwrap argv, trust)"
)
PACKAGE = "mcpvisor"


@dataclass(frozen=True)
class Crossing:
    path: str
    line: int
    target: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: imports {self.target}"


def _module_parts(path: Path, root: Path) -> list[str]:
    parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _targets(node: ast.Import | ast.ImportFrom, path: Path, root: Path) -> list[str]:
    """The absolute dotted names an import statement reaches (a `from X import y` may reach X.y)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = _module_parts(path, root)
        if path.name != "__init__.py":
            package = package[:-1]
        base = package[: len(package) - (node.level - 1)]
        module = ".".join([*base, node.module] if node.module else base)
    else:
        module = node.module or ""
    return [module] + [f"{module}.{alias.name}" for alias in node.names]


def _room_of(dotted: str) -> str | None:
    parts = dotted.split(".")
    if len(parts) >= 2 and parts[0] == PACKAGE and parts[1] in ROOMS:
        return parts[1]
    return None


def cross_room_imports(root: Path = ROOT) -> list[Crossing]:
    """Every import, at any depth of any module of a room, of a room that is not below it."""
    found: list[Crossing] = []
    for room in ROOMS:
        for path in sorted((root / room).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Import | ast.ImportFrom):
                    continue
                rooms = {r for t in _targets(node, path, root) if (r := _room_of(t)) is not None}
                for target in sorted(rooms - {room} - BELOW[room]):
                    found.append(Crossing(str(path.relative_to(root)), node.lineno, target))
    return found


def test_every_room_imports_only_the_rooms_below_it() -> None:
    crossings = cross_room_imports()
    assert not crossings, f"cross-room imports ({ADVICE}):\n" + "\n".join(map(str, crossings))


def test_wire_imports_no_other_room() -> None:
    assert not [c for c in cross_room_imports() if c.path.startswith("wire/")]


def test_store_and_runtime_stand_on_wire_alone() -> None:
    assert not [c for c in cross_room_imports() if c.path.startswith(("store/", "runtime/"))]


def test_the_walk_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    for room in ROOMS:
        (tmp_path / room).mkdir()
        (tmp_path / room / "__init__.py").write_text("")
    (tmp_path / "frontend" / "late.py").write_text(
        "def f():\n    from mcpvisor.supervisor import config\n    return config\n"
    )
    (tmp_path / "client" / "rel.py").write_text("from ..workers import upstream\n")
    (tmp_path / "workers" / "ok.py").write_text(
        "from mcpvisor.wire import codec\nfrom mcpvisor.store import tokens\nfrom mcpvisor.runtime import logs\nfrom . import ok\n"
    )
    (tmp_path / "store" / "up.py").write_text("from mcpvisor.runtime import logs\nfrom mcpvisor.wire import codec\n")
    (tmp_path / "wire" / "up.py").write_text("from mcpvisor.store import tokens\n")
    (tmp_path / "supervisor" / "pkg.py").write_text("import mcpvisor.frontend.main\nfrom mcpvisor import workers\n")

    found = {(c.path, c.target) for c in cross_room_imports(tmp_path)}

    assert found == {
        ("frontend/late.py", "supervisor"),
        ("client/rel.py", "workers"),
        ("supervisor/pkg.py", "frontend"),
        ("supervisor/pkg.py", "workers"),
        ("store/up.py", "runtime"),
        ("wire/up.py", "store"),
    }


if __name__ == "__main__":
    crossings = cross_room_imports(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    for crossing in crossings:
        print(crossing)
    print(f"{len(crossings)} cross-room imports")
