"""The docs site builds with warnings as errors, and the README's links land.

`mkdocs build --strict` with mkdocs.yml's `validation:` turns a broken link, a broken #anchor,
a page missing from `nav` and a docstring the reference cannot render into a failed build.
The second test proves those settings still do that, on a tiny site of its own (a few pages,
no reference), so removing them from mkdocs.yml fails the suite rather than passing quietly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

try:
    from markdown.extensions.toc import slugify
except ImportError:  # pragma: no cover - the docs extra is part of [test]
    pytest.fail('the docs extra is missing: pip install -e ".[test]"', pytrace=False)


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # never -v: MkDocs 1.6 skips anchor validation when its log level is DEBUG
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        cwd=config.parent, capture_output=True, text=True, timeout=110,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # a banner, not a warning
    )


def warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines()
            if line.startswith(("WARNING", "ERROR"))]


def test_the_site_builds_with_no_warning(tmp_path):
    result = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0 and not warnings(result), (
        "mkdocs build --strict:\n" + "\n".join(warnings(result) or [result.stderr[-2000:]]))
    assert (tmp_path / "site" / "reference" / "index.html").read_text().count(
        "consumer.Batcher") > 0  # the reference was rendered from the docstrings
    assert (tmp_path / "site" / "grpo_frozenlake.png").is_file()


def test_a_broken_link_an_anchor_or_a_page_off_the_nav_fails_the_build(tmp_path):
    real = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(
        "# Home\n\n[gone](missing.md), [no such part](other.md#no-such-heading), "
        "[fine](other.md#a-heading)\n")
    (docs / "other.md").write_text("# Other\n\n## A heading\n")
    (docs / "orphan.md").write_text("# Not in nav\n")
    config = {key: real[key] for key in ("site_name", "strict", "validation",
                                         "markdown_extensions")}
    config.update(docs_dir="docs", theme={"name": real["theme"]["name"]},
                  nav=["index.md", "other.md"])
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    result = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    found = "\n".join(warnings(result))
    assert result.returncode != 0, found
    assert "'missing.md', but the target is not found" in found, found
    assert "does not contain an anchor '#no-such-heading'" in found, found
    assert "not included in the \"nav\"" in found and "- orphan.md" in result.stderr, found
    assert "#a-heading" not in found, found  # an anchor that exists is no warning


def anchors(path: Path) -> set[str]:
    found, fence = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#+ (.*)", line)):
            found.add(slugify(re.sub(r"[`*]", "", m.group(1)), "-"))
    return found


def test_the_readmes_links_land():
    # the README is outside the site (mkdocs does not check it): its relative links, and
    # their #anchors into docs pages, are checked here
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    broken = []
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.exists():
            broken.append(link)
        elif anchor and anchor not in anchors(target):
            broken.append(link)
    assert not broken, f"README links that land nowhere: {broken}"
