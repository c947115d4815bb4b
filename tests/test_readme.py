"""The documentation is executable: every code block of README.md and of each docs/ page runs as printed.

Each page is its own sequence: its blocks run top to bottom, twice, in a fresh working folder of the page's
own, so every page must write the data it reads (a page that reads a dataset starts with a block writing it).

Each fenced block is one of:
- ```` ```python ````: run as a script (a fresh interpreter) in the page's working folder; an unlabeled
  block right after it is its exact output;
- an unlabeled block whose first line starts with ``$ ``: a shell transcript; each ``$ command`` runs
  with bash in the same folder and must print exactly the lines up to the next ``$ ``;
- anything else must be preceded by a marker saying why it is not run:
  ``<!-- readme-test: skip: REASON -->``.

Markers (HTML comments on the line right before a fence) also say
``<!-- readme-test: timings vary -->`` (output compared with durations and rates masked: ``0.03 s``, ``1.6 GiB/s``)
and ``<!-- readme-test: torchrun N -->`` (the python block runs under ``torchrun --nproc_per_node=N``).
Each page runs twice in its folder, so an example that works once but not on a second try fails;
the second time every number is masked, since a dataset written again with ``overwrite`` names its shards
anew (``shard-000007`` on) — names are never reused.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!-- readme-test: (.+?) -->\s*$")
_DIGITS = re.compile(r"\d+")
_TIMING = re.compile(r"\d[\d,.]*\s?(?:s|ms|µs|ns|[KMG]i?B/s|MB/s|GB/s)\b")
BLOCK_TIMEOUT = 150


def page_name(path: Path) -> str:
    """A page as the repository names it: ``README.md``, ``docs/cli.md``."""
    return path.relative_to(ROOT).as_posix()


@dataclass
class Block:
    page: str
    line: int
    language: str
    text: str
    marker: str | None
    output: str | None = None  # the expected output of a python block

    @property
    def kind(self) -> str:
        if self.marker and self.marker.startswith("skip:"):
            return "skip"
        if self.language == "python":
            return "python"
        if self.language == "" and self.text.startswith("$ "):
            return "transcript"
        return "unclassified"

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


def _blocks(markdown: str, page: str) -> list[Block]:
    lines = markdown.splitlines()
    blocks: list[Block] = []
    position = 0
    while position < len(lines):
        fence = _FENCE.match(lines[position])
        if not fence:
            position += 1
            continue
        end = next((i for i in range(position + 1, len(lines)) if lines[i].startswith("```")), None)
        if end is None:
            raise ValueError(f"{page} line {position + 1}: a code block that is never closed")
        marker = _MARKER.match(lines[position - 1]) if position else None
        block = Block(page, position + 1, fence.group(1), "\n".join(lines[position + 1 : end]) + "\n", marker and marker.group(1))
        previous = blocks[-1] if blocks else None
        if previous and previous.kind == "python" and previous.output is None and block.language == "" and not block.marker:
            if lines[position - 1].startswith("```"):  # directly after the python block: its output
                previous.output = block.text
                position = end + 1
                continue
        blocks.append(block)
        position = end + 1
    return blocks


BLOCKS = {page_name(path): _blocks(path.read_text(encoding="utf-8"), page_name(path)) for path in PAGES}
ROUNDS = {1: "first-run", 2: "second-run"}
# Page after page; within a page, every block of the first run, then every block of the second.
RUN = [
    (block, round_)
    for blocks in BLOCKS.values()
    for round_ in ROUNDS
    for block in blocks
    if block.kind in ("python", "transcript")
]


def _masked(text: str, marker: str | None, round_: int) -> str:
    text = "\n".join(line.rstrip() for line in text.strip("\n").splitlines())
    text = _TIMING.sub("T", text) if marker == "timings vary" else text
    return _DIGITS.sub("N", text) if round_ == 2 else text


def _environment() -> dict[str, str]:
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONWARNINGS="error")
    environment.pop("PYTHONPATH", None)
    return environment


def _run_python(block: Block, folder: Path) -> str:
    script = folder / f"readme_block_{block.line}.py"
    script.write_text(block.text, encoding="utf-8")
    command = [sys.executable, script.name]
    if block.marker and block.marker.startswith("torchrun "):
        nproc = block.marker.split()[1]
        command = [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={nproc}", script.name]
    result = subprocess.run(command, cwd=folder, env=_environment(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    assert result.returncode == 0, f"{block.where}: the block failed:\n{result.stderr[-3000:]}"
    if not block.marker:  # torchrun's launcher talks on stderr; a plain script must not (warnings, unclosed files)
        assert result.stderr == "", f"{block.where}: the block wrote to stderr:\n{result.stderr[-3000:]}"
    return result.stdout


def _transcript_steps(text: str) -> list[tuple[str, str]]:
    steps: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], ""))
        else:
            command, output = steps[-1]
            steps[-1] = (command, output + line + "\n")
    return steps


def _run_transcript(block: Block, folder: Path, round_: int) -> None:
    for command, expected in _transcript_steps(block.text):
        result = subprocess.run(
            ["bash", "-c", command], cwd=folder, env=_environment(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT
        )
        printed = result.stdout + result.stderr
        assert _masked(printed, block.marker, round_) == _masked(expected, block.marker, round_), (
            f"{block.where}: `$ {command}` printed:\n{printed}"
        )


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The working folder of each page, made at its first block and kept for both runs."""
    made: dict[str, Path] = {}

    def folder(page: str) -> Path:
        if page not in made:
            made[page] = tmp_path_factory.mktemp(re.sub(r"\W", "-", page))
        return made[page]

    return folder


@pytest.mark.parametrize("page", list(BLOCKS))
def test_every_block_is_run_or_says_why_not(page: str):
    unclassified = [f"line {block.line}" for block in BLOCKS[page] if block.kind == "unclassified"]
    assert not unclassified, f"{page}: blocks neither run nor marked `<!-- readme-test: skip: REASON -->`: {unclassified}"


@pytest.mark.parametrize(("block", "round_"), RUN, ids=[f"{block.page}-{ROUNDS[round_]}-line-{block.line}" for block, round_ in RUN])
def test_readme_block_runs_as_printed(block: Block, round_: int, folders):
    folder = folders(block.page)
    if block.kind == "python":
        printed = _run_python(block, folder)
        if block.output is not None:
            assert _masked(printed, block.marker, round_) == _masked(block.output, block.marker, round_), (
                f"{block.where} printed:\n{printed}"
            )
    else:
        _run_transcript(block, folder, round_)
