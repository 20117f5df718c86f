"""The one rule between the parts: producers/ and consumer/ import schemas/, never each other
(and schemas/ imports neither)."""

from __future__ import annotations

import ast
import gc
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"producers": {"consumer", "rollstream"}, "consumer": {"producers", "rollstream"},
             "schemas": {"producers", "consumer", "rollstream"}}


def imported_packages(path: Path) -> set[str]:
    source = path.read_text(encoding="utf-8")
    # CPython 3.11 keeps one AST recursion counter per interpreter: a garbage collection
    # inside ast.parse that finalizes an asyncio task left over by an earlier test logs its
    # traceback, which parses too, and the outer parse fails with "AST constructor recursion
    # depth mismatch" (seen once in a full run). No collection while parsing.
    gc.disable()
    try:
        tree = ast.parse(source)
    finally:
        gc.enable()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_keep_to_their_imports(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    for path in files:
        bad = imported_packages(path) & FORBIDDEN[package]
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_repository_stands_alone():
    # a user's clone has nothing beside it: no document, config or test leans on a sibling
    # folder (test data lives in tests/data/)
    texts = [ROOT / "README.md", ROOT / "pyproject.toml"]
    for folder in ("docs", "compose", "configs", "tests", "schemas", "producers", "consumer",
                   "rollstream", "bench", "examples", "scripts"):
        texts += [p for p in (ROOT / folder).rglob("*") if p.suffix in
                  (".md", ".py", ".yaml", ".yml", ".toml", "") and p.is_file()]
    leaning = [str(p.relative_to(ROOT)) for p in texts
               if p.name != "test_layout.py" and "../shared" in p.read_text(errors="replace")]
    assert not leaning


# -- no import circles -------------------------------------------------------------------------
# A circle means two modules are one idea or a third is missing; counted are all imports, at
# module level, under `if TYPE_CHECKING:` and inside functions alike (imports inside functions
# only hide a circle at run time).
PACKAGES = ("schemas", "producers", "consumer", "rollstream")


def module_names(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of `packages` under `root` by dotted name (a package by its own name)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def parsed(path: Path) -> ast.Module:
    gc.disable()  # see imported_packages
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    finally:
        gc.enable()


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that module `name` (at `path`) imports anywhere in its file."""

    def known(dotted: str) -> str | None:  # the module itself, else its nearest package
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str | None] = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found |= {known(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per extra dot
                package = name.split(".") if path.name == "__init__.py" else \
                    name.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from pkg import name` reads pkg's namespace, so pkg must have run first (a
            # package whose __init__ imports this module is then in a circle with it); and
            # it imports pkg.name too when that is a module
            found.add(known(base))
            found |= {f"{base}.{alias.name}" for alias in node.names} & modules.keys()
    return {module for module in found if module is not None and module != name}


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    modules = module_names(root, packages)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """The import circles of `graph`: each the modules that all reach one another (a strongly
    connected group of more than one) and one way around it."""

    def tree(start: str) -> dict[str, str | None]:  # what `start` reaches, each with the
        parent: dict[str, str | None] = {start: None}  # module it was reached from
        todo = [start]
        while todo:
            current = todo.pop()
            for imported in sorted(graph.get(current, ())):
                if imported not in parent:
                    parent[imported] = current
                    todo.append(imported)
        return parent

    trees = {name: tree(name) for name in graph}
    found, placed = [], set()
    for name in sorted(graph):
        if name in placed:
            continue
        group = sorted(other for other in trees[name] if name in trees[other])
        placed.update(group)
        if len(group) < 2:
            continue
        first = next(m for m in sorted(graph[name]) if m in group)  # name imports first, and
        way = [name]  # first reaches name again: walk its tree back from name
        while way[-1] != first:
            parent = trees[first][way[-1]]
            assert parent is not None
            way.append(parent)
        found.append((group, [name, *reversed(way)]))
    return found


def test_no_import_circles():
    found = circles(import_graph(ROOT))
    assert not found, "import circles: " + "; ".join(
        f"{', '.join(group)} ({' -> '.join(way)})" for group, way in found)


def test_the_circle_check_counts_every_kind_of_import(tmp_path):
    """The graph behind `test_no_import_circles`, on a small tree: a circle closed only by an
    import under TYPE_CHECKING and a relative one inside a function is found, and so is a
    package whose __init__ imports a module that reads the package (`from pkg import d`)."""
    files = {
        "pkg/__init__.py": "from pkg.c import C\n",
        "pkg/a.py": "def f():\n    from . import b\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
        "pkg/c.py": "from pkg.d import D\nC = D\n",
        "pkg/d.py": "import os\nD = os.sep\n",
        "pkg/sub/__init__.py": "from .. import d\nfrom ..c import C\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("pkg",))
    assert graph == {"pkg": {"pkg.c"}, "pkg.a": {"pkg", "pkg.b"}, "pkg.b": {"pkg.a"},
                     "pkg.c": {"pkg.d"}, "pkg.d": set(), "pkg.sub": {"pkg", "pkg.c", "pkg.d"}}
    assert circles(graph) == [(["pkg.a", "pkg.b"], ["pkg.a", "pkg.b", "pkg.a"])]
    (tmp_path / "pkg/c.py").write_text("from pkg import d\nC = d.D\n")
    assert circles(import_graph(tmp_path, ("pkg",))) == [
        (["pkg", "pkg.c"], ["pkg", "pkg.c", "pkg"]),
        (["pkg.a", "pkg.b"], ["pkg.a", "pkg.b", "pkg.a"])]


def test_the_command_line_starts_without_the_heavy_parts():
    """`rollstream --help`, `config check`, `status`, `pause`... run as processes in the
    hundreds (operators' scripts, this suite); the CLI imports what one command needs when
    it runs (`schemas` names on first use, the consumer and the wire format inside the
    commands): numpy, the consumer, the producers and aiohttp are not imported at start.
    Measured: `rollstream --help` 0.73 s -> 0.36 s (docs/decisions/testing.md)."""
    code = ("import sys, rollstream.cli, schemas.config, schemas.redisconn; "
            "print(' '.join(sorted(m for m in ('numpy', 'consumer', 'producers', 'aiohttp', "
            "'schemas.codec') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "", out.stdout
