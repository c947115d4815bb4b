"""The front page and the manual keep their shape, their links resolve, and the site builds.

README.md is the front page (at most 350 lines, linking every page of the manual); every ``docs/`` page
starts with ``# Title``, a blank line and a summary of at most two lines; every relative link or image of
README.md and of the pages names a file of the checkout (and an anchor, a heading of its page); and
``mkdocs build --strict`` builds the manual from ``mkdocs.yml``. tests/test_readme.py runs the pages' code.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DOC_PAGES = sorted(DOCS.glob("*.md"))
PAGES = [README, *DOC_PAGES]
README_MAX_LINES = 350
SUMMARY_MAX_LINES = 2

_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6}) (.+?)\s*#*\s*$")
_NAV_ENTRY = re.compile(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w./-]+\.md)\s*$")


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _prose_lines(path: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, with their line numbers."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it (MkDocs agrees for the headings used here; it checks its own)."""
    text = heading.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(match.group(2)) for _, line in _prose_lines(path) if (match := _HEADING.match(line))}


def _links(path: Path) -> list[tuple[int, str]]:
    links = []
    for number, line in _prose_lines(path):
        for match in _LINK.finditer(_CODE_SPAN.sub("code", line)):
            links.append((number, match.group(1)))
    return links


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}: move text to docs/"


def test_readme_links_every_page_of_the_manual():
    linked = {(README.parent / target.split("#")[0]).resolve() for _, target in _links(README)}
    missing = [_name(page) for page in DOC_PAGES if page.resolve() not in linked]
    assert not missing, f"README.md does not link these pages of the manual: {missing}"


@pytest.mark.parametrize("page", DOC_PAGES, ids=_name)
def test_page_starts_with_a_title_and_a_short_summary(page: Path):
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines and re.match(r"^# \S", lines[0]), f"{_name(page)}: the first line must be its `# Title`"
    assert len(lines) > 2 and lines[1] == "" and lines[2].strip(), (
        f"{_name(page)}: the title must be followed by a blank line and a summary paragraph"
    )
    summary = []
    for line in lines[2:]:
        if not line.strip():
            break
        summary.append(line)
    assert len(summary) <= SUMMARY_MAX_LINES, (
        f"{_name(page)}: the summary under the title has {len(summary)} lines; at most {SUMMARY_MAX_LINES}"
    )
    markup = [line for line in summary if re.match(r"^(#|[-*+>|] |\d+\. |<|```)", line)]
    assert not markup, f"{_name(page)}: the summary must be a plain paragraph, not {markup}"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_resolve(page: Path):
    broken = []
    for number, target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"line {number}: {target} (no file {resolved})")
        elif not resolved.is_relative_to(ROOT):
            broken.append(f"line {number}: {target} (outside the repository)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"line {number}: {target} (no heading #{anchor} in {_name(resolved)})")
    assert not broken, f"{_name(page)}: broken links:\n" + "\n".join(broken)


def test_mkdocs_nav_lists_every_page():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = [match.group(1) for line in config.splitlines() if (match := _NAV_ENTRY.match(line))]
    pages = [page.name for page in DOC_PAGES]
    assert sorted(nav) == sorted(pages), f"mkdocs.yml nav {nav} is not exactly the pages of docs/ {pages}"


def test_mkdocs_build_strict(tmp_path: Path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (it is in the `dev` extra: pip install -e '.[dev]')")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
