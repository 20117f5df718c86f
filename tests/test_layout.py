"""The one rule between the parts: producers/ and consumer/ import schemas/, never each other
(and schemas/ imports neither)."""

from __future__ import annotations

import ast
import gc
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
