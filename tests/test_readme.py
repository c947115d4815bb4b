"""The README is executable: every code block runs as printed, top to bottom, twice in one folder.

Each fenced block is one of:
- ```` ```python ````: run as a script (a fresh interpreter) in a shared working folder; an unlabeled
  block right after it is its exact output;
- an unlabeled block whose first line starts with ``$ ``: a shell transcript; each ``$ command`` runs
  with bash in the same folder and must print exactly the lines up to the next ``$ ``;
- anything else must be preceded by a marker saying why it is not run:
  ``<!-- readme-test: skip: REASON -->``.

Markers (HTML comments on the line right before a fence) also say
``<!-- readme-test: timings vary -->`` (output compared with durations and rates masked: ``0.03 s``, ``1.6 GiB/s``)
and ``<!-- readme-test: torchrun N -->`` (the python block runs under ``torchrun --nproc_per_node=N``).
The whole README runs twice in one folder, so an example that works once but not on a second try fails;
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

README = Path(__file__).resolve().parent.parent / "README.md"
BIN = Path(sys.executable).parent
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!-- readme-test: (.+?) -->\s*$")
_DIGITS = re.compile(r"\d+")
_TIMING = re.compile(r"\d[\d,.]*\s?(?:s|ms|µs|ns|[KMG]i?B/s|MB/s|GB/s)\b")
BLOCK_TIMEOUT = 150


@dataclass
class Block:
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


def _blocks(markdown: str) -> list[Block]:
    lines = markdown.splitlines()
    blocks: list[Block] = []
    position = 0
    while position < len(lines):
        fence = _FENCE.match(lines[position])
        if not fence:
            position += 1
            continue
        end = next(i for i in range(position + 1, len(lines)) if lines[i].startswith("```"))
        marker = _MARKER.match(lines[position - 1]) if position else None
        block = Block(position + 1, fence.group(1), "\n".join(lines[position + 1 : end]) + "\n", marker and marker.group(1))
        previous = blocks[-1] if blocks else None
        if previous and previous.kind == "python" and previous.output is None and block.language == "" and not block.marker:
            if lines[position - 1].startswith("```"):  # directly after the python block: its output
                previous.output = block.text
                position = end + 1
                continue
        blocks.append(block)
        position = end + 1
    return blocks


BLOCKS = _blocks(README.read_text(encoding="utf-8"))
RUN = [block for block in BLOCKS if block.kind in ("python", "transcript")]


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
    assert result.returncode == 0, f"README block at line {block.line} failed:\n{result.stderr[-3000:]}"
    if not block.marker:  # torchrun's launcher talks on stderr; a plain script must not (warnings, unclosed files)
        assert result.stderr == "", f"README block at line {block.line} wrote to stderr:\n{result.stderr[-3000:]}"
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
            f"README line {block.line}: `$ {command}` printed:\n{printed}"
        )


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readme")


def test_every_block_is_run_or_says_why_not():
    unclassified = [f"line {block.line}" for block in BLOCKS if block.kind == "unclassified"]
    assert not unclassified, f"README blocks neither run nor marked `<!-- readme-test: skip: REASON -->`: {unclassified}"


@pytest.mark.parametrize("block", RUN, ids=[f"line-{block.line}" for block in RUN])
@pytest.mark.parametrize("round_", [1, 2], ids=["first-run", "second-run"])
def test_readme_block_runs_as_printed(block: Block, round_: int, folder: Path):
    if block.kind == "python":
        printed = _run_python(block, folder)
        if block.output is not None:
            assert _masked(printed, block.marker, round_) == _masked(block.output, block.marker, round_), (
                f"README line {block.line} printed:\n{printed}"
            )
    else:
        _run_transcript(block, folder, round_)
