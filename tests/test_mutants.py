"""scripts/mutants.py stays in step with the code: every snippet is still there, once.

A guard whose code changes must have its mutant's snippet updated, or the mutation check
would stop testing it; these tests go red first. They run no mutant (that is the script's
job: `python scripts/mutants.py`).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("mutants_script", ROOT / "scripts" /
                                                  "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


mutants = load_script()


def test_mutant_ids_are_unique_and_cover_every_guard():
    ids = [m.id for m in mutants.MUTANTS]
    assert len(ids) == len(set(ids))
    assert {"commit-lease", "commit-pause", "commit-val-round", "commit-cursor-advance",
            "batcher-is-stale", "batcher-oldest-first", "batcher-inflight-priority",
            "batcher-group-complete", "batcher-sync-pause", "import-canary"} <= set(ids)


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.id)
def test_every_snippet_occurs_exactly_once_in_its_file(mutant):
    text = (ROOT / mutant.file).read_text(encoding="utf-8")
    assert text.count(mutant.snippet) == 1, (
        f"{mutant.id}: update its snippet in scripts/mutants.py to the guard's current code")
    assert mutant.replacement != mutant.snippet


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.id)
def test_every_named_test_exists(mutant):
    assert mutant.tests
    for node in mutant.tests:
        path, _, name = node.partition("::")
        name = name.partition("[")[0]  # a parametrized case names its function
        source = (ROOT / path).read_text(encoding="utf-8")
        assert re.search(rf"^def {re.escape(name)}\(", source, re.M), f"{node} not found"


def test_apply_replaces_once_and_refuses_a_missing_or_repeated_snippet(tmp_path):
    mutant = mutants.Mutant("m", "f.py", "x = 1", "x = 2", "test", ("t",))
    (tmp_path / "f.py").write_text("x = 1\ny = 1\n")
    mutants.apply(mutant, tmp_path)
    assert (tmp_path / "f.py").read_text() == "x = 2\ny = 1\n"
    with pytest.raises(mutants.MutantError, match="found 0 times"):
        mutants.apply(mutant, tmp_path)
    (tmp_path / "f.py").write_text("x = 1\nx = 1\n")
    with pytest.raises(mutants.MutantError, match="found 2 times"):
        mutants.apply(mutant, tmp_path)
