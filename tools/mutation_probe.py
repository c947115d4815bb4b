"""Mutation probe: plant one plausible one-line bug at a time in a copy of varstore and see whether tests notice.

Usage (from the repository root, with the development environment):

    .venv/bin/python tools/mutation_probe.py                      # every module below, ~35 min budget
    .venv/bin/python tools/mutation_probe.py --budget 600 varstore/torch/sampler.py
    .venv/bin/python tools/mutation_probe.py --list varstore/format/header.py   # show the mutants, run nothing
    .venv/bin/python tools/mutation_probe.py --only varstore/shard/reader.py:17  # rerun one mutant by number
    .venv/bin/python tools/mutation_probe.py > run.log; ...add tests...; \
        .venv/bin/python tools/mutation_probe.py --rerun run.log      # did the new tests kill the survivors?

Mutants (AST based, one at a time): a comparison operator flipped (< <=, > >=, == !=, in / not in,
is / is not), an integer constant moved by +1 or -1, `and` swapped with `or`, `+` swapped with `-`, and a
statement dropped (a bare call, a `raise`, or an `if` whose body raises).

The probe never touches the working tree: it copies a committed tree (`git archive HEAD`, or --commit REV, or
the working tree with --worktree) to a scratch directory, writes each mutant into that copy and runs the
module's fast test subset (MODULE_TESTS) there with `pytest -x` and a 30 s per-test timeout, importing
varstore from the copy. A mutant is "killed" when the tests fail (or time out), "survived" when they
pass. The mutants are shuffled with a fixed seed and run until the time budget (default 35 minutes,
shared between the modules given, in order,
the time a module leaves unused passing on to the next) is spent, so a rerun on the same commit tries the same ones.
Before the mutants, the unmutated copy must pass its tests (otherwise the probe stops: the baseline is red).

The report lists every survivor with its module, line and change; a survivor that changes stored or
returned data needs a test that kills it.
"""

from __future__ import annotations

import argparse
import ast
import copy
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"

# The fast tests that should notice a bug in each module (run with -x: the first failure kills a mutant).
MODULE_TESTS = {
    "varstore/format/header.py": ["tests/test_spec_vectors.py", "tests/test_boundaries.py", "tests/test_reader.py",
                                  "tests/test_corruption.py", "tests/test_roundtrip.py"],
    "varstore/format/metadata.py": ["tests/test_canonical_json.py", "tests/test_spec_json_rules.py",
                                    "tests/test_reader_metadata.py", "tests/test_spec_vectors.py"],
    "varstore/format/codecs.py": ["tests/test_boundaries.py", "tests/test_roundtrip.py", "tests/test_writer.py",
                                  "tests/test_reader.py", "tests/test_spec_vectors.py"],
    "varstore/shard/writer.py": ["tests/test_boundaries.py", "tests/test_writer.py", "tests/test_roundtrip.py",
                                 "tests/test_faults.py", "tests/test_spec_vectors.py", "tests/test_reader.py"],
    "varstore/shard/reader.py": ["tests/test_boundaries.py", "tests/test_reader.py", "tests/test_corruption.py",
                                 "tests/test_roundtrip.py", "tests/test_spec_vectors.py"],
    "varstore/shard/index.py": ["tests/test_boundaries.py", "tests/test_reader.py", "tests/test_corruption.py",
                                "tests/test_roundtrip.py", "tests/test_spec_vectors.py"],
    "varstore/format/manifest.py": ["tests/test_boundaries.py", "tests/test_sharded.py", "tests/test_resume.py",
                                    "tests/test_corruption.py", "tests/test_manifest_rules.py"],
    "varstore/local/manifest_file.py": ["tests/test_sharded.py", "tests/test_resume.py", "tests/test_manifest_rules.py"],
    "varstore/torch/sampler.py": ["tests/test_torch_sampler.py", "tests/test_boundaries.py"],
    "varstore/torch/token_windows.py": ["tests/test_torch_token_windows.py", "tests/test_boundaries.py"],
    # Round 2's modules (object storage, engines' parts, the journal, streams), with their fastest test files.
    "varstore/remote/filesystems.py": ["tests/test_remote_filesystems.py"],
    "varstore/remote/cache.py": ["tests/test_remote_cache.py"],
    "varstore/dataset/remote_source.py": ["tests/test_remote_open.py"],
    "varstore/dataset/parts.py": ["tests/test_parts.py"],
    "varstore/local/journal.py": ["tests/test_journal_line_checksums.py", "tests/test_resume.py"],
    "varstore/torch/permutation.py": ["tests/test_torch_block_sampler.py", "tests/test_torch_sampler.py"],
    "varstore/torch/stream.py": ["tests/test_torch_stream.py"],
}
DEFAULT_BUDGET_SECONDS = 35 * 60
TEST_TIMEOUT_SECONDS = 30  # per test: a mutant that makes a loop endless is killed after this (no fast test nears it)
RUN_TIMEOUT_SECONDS = 300  # per mutant, all its tests
SEED = 9

COMPARISON_FLIPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                    ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


@dataclass(frozen=True)
class Mutant:
    module: str
    number: int
    line: int
    description: str
    source: str


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
        and isinstance(statement.value.value, str)


def _raises_only(statement: ast.If) -> bool:
    return not statement.orelse and all(isinstance(inner, ast.Raise) for inner in statement.body)


def _sites(tree: ast.Module) -> Iterator[tuple[tuple[int, ...], str, int]]:
    """(path of the node as child positions, kind, line) for every place a mutant can be planted."""
    def walk(node: ast.AST, path: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], str, int]]:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare):
            for position, operator in enumerate(node.ops):
                if type(operator) in COMPARISON_FLIPS:
                    yield path, f"compare:{position}", line
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            yield path, "int:+1", line
            yield path, "int:-1", line
        elif isinstance(node, ast.BoolOp):
            yield path, "boolop", line
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            yield path, "addsub", line
        if isinstance(node, ast.stmt) and not _is_docstring(node) and (
                (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)) or isinstance(node, ast.Raise)
                or (isinstance(node, ast.If) and _raises_only(node))):
            yield path, "drop", line
        for position, child in enumerate(ast.iter_child_nodes(node)):
            yield from walk(child, path + (position,))

    yield from walk(tree, ())


def _node_at(tree: ast.AST, path: tuple[int, ...]) -> tuple[ast.AST, ast.AST | None]:
    """(node, parent) at `path`."""
    parent, node = None, tree
    for position in path:
        parent, node = node, list(ast.iter_child_nodes(node))[position]
    return node, parent


def _apply(tree: ast.Module, path: tuple[int, ...], kind: str) -> str:
    """Plant mutant `kind` at `path` in `tree` (a copy); returns its description."""
    node, parent = _node_at(tree, path)
    before = ast.unparse(node).splitlines()[0][:80]
    if kind.startswith("compare:"):
        position = int(kind.split(":")[1])
        node.ops[position] = COMPARISON_FLIPS[type(node.ops[position])]()
    elif kind in ("int:+1", "int:-1"):
        node.value = node.value + (1 if kind == "int:+1" else -1)
    elif kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "addsub":
        node.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
    elif kind == "drop":
        for _, value in ast.iter_fields(parent):
            if isinstance(value, list) and any(item is node for item in value):
                position = next(index for index, item in enumerate(value) if item is node)
                value[position] = ast.copy_location(ast.Pass(), node)
                break
        return f"drop `{before}`"
    return f"{kind.split(':')[0]} `{before}` -> `{ast.unparse(node).splitlines()[0][:80]}`"


def mutants(module: str, source: str) -> list[Mutant]:
    """Every mutant of `source`, numbered in source order."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found = []
    for path, kind, line in _sites(tree):
        mutated = copy.deepcopy(tree)
        # The source line in the description finds the same mutant again after the module has moved on.
        description = f"{_apply(mutated, path, kind)} in `{lines[line - 1].strip()[:70]}`"
        found.append(Mutant(module, len(found), line, description, ast.unparse(ast.fix_missing_locations(mutated))))
    return found


def _committed_source(commit: str, module: str, worktree: bool) -> str:
    if worktree:
        return (ROOT / module).read_text()
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{module}"], check=True, capture_output=True,
                          text=True).stdout


def prepare_copy(commit: str, worktree: bool) -> Path:
    """A scratch copy of the repository's package and tests at `commit` (or as in the working tree)."""
    scratch = Path(tempfile.mkdtemp(prefix="varstore-mutation-"))
    if worktree:
        for name in ("varstore", "tests", "spec", "pyproject.toml"):
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, scratch / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.exists():
                shutil.copy2(source, scratch / name)
    else:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "varstore", "tests", "spec",
                                  "pyproject.toml"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    return scratch


def run_tests(scratch: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    """("passed" | "failed" | "timeout", seconds) for `tests` run in `scratch`, all within `timeout` seconds."""
    tests = [test for test in tests if (scratch / test).exists()]
    command = [str(PYTHON), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               f"--timeout={TEST_TIMEOUT_SECONDS}", "-o", "addopts=", *tests]
    started = time.monotonic()
    try:
        completed = subprocess.run(command, cwd=scratch, env={"PYTHONPATH": str(scratch), "PATH": "/usr/bin:/bin",
                                                              "HYPOTHESIS_PROFILE": "ci", "PYTHONDONTWRITEBYTECODE": "1"},
                                   capture_output=True, timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - started
    return ("passed" if completed.returncode == 0 else "failed"), time.monotonic() - started


def survivors_in_log(log: Path) -> dict[str, set[str]]:
    """Module -> descriptions of the mutants a previous run's output reports as SURVIVED."""
    found: dict[str, set[str]] = {}
    for line in log.read_text().splitlines():
        if line.startswith("SURVIVED "):
            location, description = line[len("SURVIVED "):].split(": ", 1)
            found.setdefault(location.split(":")[0], set()).add(description)
    return found


def probe(scratch: Path, module: str, budget: float, only: list[int] | None,
          descriptions: set[str] | None = None) -> tuple[int, int, list[Mutant]]:
    """(tried, killed, survivors) for mutants of `module` until `budget` seconds are spent; only those
    numbered `only`, or described as in `descriptions`, if given."""
    path = scratch / module
    original = path.read_text()
    candidates = mutants(module, original)
    if only is not None:
        candidates = [candidates[number] for number in only]
    elif descriptions is not None:
        candidates = [mutant for mutant in candidates if mutant.description in descriptions]
    else:
        random.Random(f"{SEED}:{module}").shuffle(candidates)
    tests = MODULE_TESTS[module]
    deadline = time.monotonic() + budget
    tried, killed, survivors = 0, 0, []
    try:
        for mutant in candidates:
            if time.monotonic() > deadline:
                break
            path.write_text(mutant.source)
            outcome, seconds = run_tests(scratch, tests, RUN_TIMEOUT_SECONDS)
            tried += 1
            if outcome == "passed":
                survivors.append(mutant)
            else:
                killed += 1
            print(f"  {module}:{mutant.number} line {mutant.line}: {outcome:8} {seconds:5.1f}s  {mutant.description}",
                  flush=True)
    finally:
        path.write_text(original)
    print(f"{module}: {len(candidates)} mutants, tried {tried}, killed {killed}, survived {len(survivors)}", flush=True)
    return tried, killed, survivors


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", default=list(MODULE_TESTS), help="module paths (default: all)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_SECONDS, help="total seconds for all modules")
    parser.add_argument("--commit", default="HEAD", help="the commit whose package and tests are mutated and run")
    parser.add_argument("--worktree", action="store_true", help="copy the working tree instead of a commit")
    parser.add_argument("--list", action="store_true", help="list the mutants and run nothing")
    parser.add_argument("--only", help="MODULE:NUMBER[,NUMBER...], the mutants to run")
    parser.add_argument("--rerun", type=Path, help="the saved output of a run: rerun only its survivors (same change, "
                        "found by description, so the module may have moved on)")
    arguments = parser.parse_args(argv)
    only = None
    if arguments.only:
        module, numbers = arguments.only.rsplit(":", 1)
        arguments.modules, only = [module], [int(number) for number in numbers.split(",")]
    if arguments.list:
        for module in arguments.modules:
            for mutant in mutants(module, _committed_source(arguments.commit, module, arguments.worktree)):
                print(f"{module}:{mutant.number} line {mutant.line}: {mutant.description}")
        return 0
    rerun = survivors_in_log(arguments.rerun) if arguments.rerun else None
    if rerun is not None:
        arguments.modules = [module for module in arguments.modules if module in rerun]
    scratch = prepare_copy(arguments.commit, arguments.worktree)
    try:
        baseline_tests = sorted({test for module in arguments.modules for test in MODULE_TESTS[module]})
        outcome, seconds = run_tests(scratch, baseline_tests, RUN_TIMEOUT_SECONDS * 2)
        print(f"baseline (unmutated) {outcome} in {seconds:.0f}s", flush=True)
        if outcome != "passed":
            return 2
        deadline = time.monotonic() + arguments.budget - seconds
        totals, survivors = [0, 0], []
        for position, module in enumerate(arguments.modules):
            share = max(0.0, deadline - time.monotonic()) / (len(arguments.modules) - position)
            tried, killed, survived = probe(scratch, module, share, only, rerun[module] if rerun else None)
            totals[0] += tried
            totals[1] += killed
            survivors += survived
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\ntried {totals[0]}, killed {totals[1]}, survived {len(survivors)}")
    for mutant in survivors:
        print(f"SURVIVED {mutant.module}:{mutant.number} line {mutant.line}: {mutant.description}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
