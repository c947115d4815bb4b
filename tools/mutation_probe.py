"""Mutation probe: plant one plausible one-line bug at a time in a copy of varstore and see whether tests notice.

Usage (from the repository root, with the development environment):

    .venv/bin/python tools/mutation_probe.py                      # every module below, ~35 min budget
    .venv/bin/python tools/mutation_probe.py --budget 600 varstore/torch/sampler.py
    .venv/bin/python tools/mutation_probe.py --list varstore/format/header.py   # show the mutants, run nothing
    .venv/bin/python tools/mutation_probe.py --only varstore/shard/reader.py:17  # rerun one mutant by number
    .venv/bin/python tools/mutation_probe.py --only varstore/shard/reader.py:17 --tests tests/test_x.py  # other tests
    .venv/bin/python tools/mutation_probe.py > run.log; ...add tests...; \
        .venv/bin/python tools/mutation_probe.py --rerun run.log      # did the new tests kill the survivors?

Mutants (AST based, one at a time): a comparison operator flipped (< <=, > >=, == !=, in / not in,
is / is not), an integer constant moved by +1 or -1, `and` swapped with `or`, `+` swapped with `-`, and a
statement dropped (a bare call, a `raise`, or an `if` whose body raises). In the C extension
(varstore/_speedups.c) the same flips, constants and `&&`/`||`, `+`/`-` swaps are planted token by token in the
functions of its read and CRC paths (C_FUNCTIONS), and the copy's extension is rebuilt for each mutant (one
that does not compile is reported "unbuilt" and not counted).

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
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"

# The fast tests that should notice a bug in each module (run with -x: the first failure kills a mutant); an entry
# starting with "-" is a pytest option.
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
    # Round 2's modules (object storage, engines' parts, the journal, locks, streams), with their fast test files.
    "varstore/remote/filesystems.py": ["tests/test_remote_filesystems.py", "tests/test_remote_faults.py"],
    "varstore/remote/cache.py": ["tests/test_remote_cache.py", "tests/test_remote_cache_keys.py",
                                 "tests/test_blind_spots_remote.py"],
    "varstore/remote/location.py": ["tests/test_remote_open.py", "tests/test_remote_filesystems.py"],
    "varstore/remote/transport.py": ["tests/test_remote_faults.py", "tests/test_remote_filesystems.py"],
    "varstore/shard/remote_shard.py": ["tests/test_remote_reader.py", "tests/test_remote_attacks.py"],
    "varstore/dataset/remote_source.py": ["tests/test_remote_open.py", "tests/test_remote_open_attacks.py",
                                          "tests/test_blind_spots_remote.py"],
    "varstore/dataset/remote_target.py": ["tests/test_remote_writer.py"],
    "varstore/dataset/parts.py": ["tests/test_parts.py", "tests/test_blind_spots_parts.py"],
    "varstore/local/journal.py": ["tests/test_journal_line_checksums.py", "tests/test_resume.py",
                                  "tests/test_blind_spots_journal.py"],
    "varstore/local/locks.py": ["tests/test_lock_files.py", "tests/test_blind_spots_locks.py"],
    "varstore/torch/blended.py": ["tests/test_torch_blended.py", "tests/test_blend_weight_bounds.py",
                                  "tests/test_blind_spots_torch.py"],
    "varstore/torch/permutation.py": ["tests/test_torch_block_sampler.py", "tests/test_torch_sampler.py"],
    "varstore/torch/stream.py": ["tests/test_torch_stream.py", "tests/test_blind_spots_torch.py"],
    "varstore/torch/prefetch.py": ["tests/test_blind_spots_torch.py", "tests/test_torch_stream.py",
                                   "tests/test_page_cache_probe.py"],
    "varstore/_speedups.c": ["tests/test_speedups.py", "tests/test_speedups_attacks.py", "tests/test_corruption.py",
                             "tests/test_reader.py", ("--deselect=tests/test_speedups_attacks.py::"  # needs setup.py
                                                      "test_a_wheel_built_without_a_compiler_installs_and_runs_pure_python")],
}
C_EXTENSION = "varstore/_speedups.c"
# The extension's read and CRC paths: the functions whose tokens C mutants change.
C_FUNCTIONS = ("crc_tables_init", "crc_software", "crc_hardware", "crc32c_of", "checksum_ranges", "crc32c_ranges",
               "crc32c_each", "slicer_init", "slice_record", "resolve", "slicer_get", "gather_positions",
               "slicer_get_batch", "software_crc32c")
DEFAULT_BUDGET_SECONDS = 35 * 60
# Per test: a mutant that makes a loop endless is killed after this. Generous: on a loaded machine (load 20 on 2 cores)
# remote tests took over 30 s, and pytest-timeout's thread method then ends the whole run, which read as a kill.
TEST_TIMEOUT_SECONDS = 120
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


# Longest first, so that `<<`, `->`, `++`, `+=` ... are read as one token and left alone.
_C_TOKEN = re.compile(r"<<=|>>=|<<|>>|->|\+\+|--|\+=|-=|<=|>=|==|!=|&&|\|\||[<>+-]"
                      r"|\b(?:0[xX][0-9a-fA-F]+|[0-9]+)(?:[uUlL]*)\b")
_C_FLIPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "&&": "||", "||": "&&", "+": "-",
            "-": "+"}
_C_NOT_CODE = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|^[ \t]*#[^\n]*",
                         re.DOTALL | re.MULTILINE)


def _c_function_spans(source: str) -> list[tuple[int, int]]:
    """(start, end) offsets of the bodies of the C_FUNCTIONS in `source`: from the name to the `}` closing at column 0."""
    spans = []
    for name in C_FUNCTIONS:
        found = re.search(rf"^[^\n;]*\b{name}\(.*?^}}", source, re.DOTALL | re.MULTILINE)
        if found is None:
            raise SystemExit(f"{C_EXTENSION}: no function {name} (C_FUNCTIONS is out of date)")
        spans.append(found.span())
    return spans


def c_mutants(module: str, source: str) -> list[Mutant]:
    """Every token mutant of the C_FUNCTIONS of `source`, numbered in source order."""
    code = _C_NOT_CODE.sub(lambda match: re.sub(r"[^\n]", " ", match.group()), source)  # comments, strings blanked
    found = []
    for start, end in sorted(_c_function_spans(code)):
        for token in _C_TOKEN.finditer(code, start, end):
            text = token.group()
            if text in _C_FLIPS:
                kind, replacements = ("boolop" if text in ("&&", "||") else "addsub" if text in "+-" else "compare",
                                      [_C_FLIPS[text]])
            elif text[0].isdigit():
                digits = text.rstrip("uUlL")
                value, suffix = int(digits, 0), text[len(digits):]
                as_text = hex if digits[:2].lower() == "0x" else str
                kind, replacements = "int", [as_text(value + 1) + suffix] + ([as_text(value - 1) + suffix] if value else [])
            else:
                continue
            line = source.count("\n", 0, token.start()) + 1
            for replacement in replacements:
                mutated = source[:token.start()] + replacement + source[token.end():]
                description = f"{kind} `{text}` -> `{replacement}` in `{source.splitlines()[line - 1].strip()[:70]}`"
                found.append(Mutant(module, len(found), line, description, mutated))
    return found


def build_extension(scratch: Path) -> bool:
    """Compile the copy's C extension in place (as setup.py does, -O3); False if it does not compile."""
    command = [*sysconfig.get_config_var("CC").split(), "-O3", "-DNDEBUG", "-fwrapv", "-fPIC", "-shared",
               f"-I{sysconfig.get_paths()['include']}", str(scratch / C_EXTENSION), "-o",
               str(scratch / "varstore" / f"_speedups{sysconfig.get_config_var('EXT_SUFFIX')}")]
    return subprocess.run(command, capture_output=True, check=False).returncode == 0


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


def run_tests(scratch: Path, tests: list[str], timeout: float) -> tuple[str, float, str]:
    """("passed" | "failed" | "timeout", seconds, pytest's summary line or the failure) for `tests` run in
    `scratch`, all within `timeout` seconds."""
    tests = [test for test in tests if test.startswith("-") or (scratch / test.split("::")[0]).exists()]
    command = [str(PYTHON), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               f"--timeout={TEST_TIMEOUT_SECONDS}", "-o", "addopts=", *tests]
    started = time.monotonic()
    try:
        completed = subprocess.run(command, cwd=scratch, env={"PYTHONPATH": str(scratch), "PATH": "/usr/bin:/bin",
                                                              "HYPOTHESIS_PROFILE": "ci", "PYTHONDONTWRITEBYTECODE": "1"},
                                   capture_output=True, timeout=timeout + 30, check=False)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - started, ""
    output = completed.stdout.decode(errors="replace").splitlines()
    summary = [line for line in output if line.startswith(("FAILED", "ERROR", "Timeout"))] or output[-1:]
    return ("passed" if completed.returncode == 0 else "failed"), time.monotonic() - started, "; ".join(summary)


def survivors_in_log(log: Path) -> dict[str, set[str]]:
    """Module -> descriptions of the mutants a previous run's output reports as SURVIVED."""
    found: dict[str, set[str]] = {}
    for line in log.read_text().splitlines():
        if line.startswith("SURVIVED "):
            location, description = line[len("SURVIVED "):].split(": ", 1)
            found.setdefault(location.split(":")[0], set()).add(description)
    return found


def probe(scratch: Path, module: str, budget: float, only: list[int] | None,
          descriptions: set[str] | None = None, tests: list[str] | None = None) -> tuple[int, int, list[Mutant]]:
    """(tried, killed, survivors) for mutants of `module` until `budget` seconds are spent; only those
    numbered `only`, or described as in `descriptions`, if given; against `tests` (default: MODULE_TESTS's)."""
    path = scratch / module
    original = path.read_text()
    is_c = module.endswith(".c")
    candidates = (c_mutants if is_c else mutants)(module, original)
    if only is not None:
        candidates = [candidates[number] for number in only]
    elif descriptions is not None:
        candidates = [mutant for mutant in candidates if mutant.description in descriptions]
    else:
        random.Random(f"{SEED}:{module}").shuffle(candidates)
    tests = tests or MODULE_TESTS[module]
    deadline = time.monotonic() + budget
    tried, killed, survivors = 0, 0, []
    try:
        for mutant in candidates:
            if time.monotonic() > deadline:
                break
            path.write_text(mutant.source)
            if is_c and not build_extension(scratch):
                print(f"  {module}:{mutant.number} line {mutant.line}: unbuilt   {mutant.description}", flush=True)
                continue
            outcome, seconds, _ = run_tests(scratch, tests, RUN_TIMEOUT_SECONDS)
            tried += 1
            if outcome == "passed":
                survivors.append(mutant)
            else:
                killed += 1
            print(f"  {module}:{mutant.number} line {mutant.line}: {outcome:8} {seconds:5.1f}s  {mutant.description}",
                  flush=True)
    finally:
        path.write_text(original)
        if is_c and not build_extension(scratch):
            raise SystemExit(f"{C_EXTENSION}: the unmutated source no longer compiles in the copy")
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
    parser.add_argument("--tests", nargs="+", help="test files to run instead of the module's (MODULE_TESTS), e.g. "
                        "to find which file kills a survivor")
    parser.add_argument("--rerun", type=Path, help="the saved output of a run: rerun only its survivors (same change, "
                        "found by description, so the module may have moved on)")
    arguments = parser.parse_args(argv)
    only = None
    if arguments.only:
        module, numbers = arguments.only.rsplit(":", 1)
        arguments.modules, only = [module], [int(number) for number in numbers.split(",")]
    if arguments.list:
        for module in arguments.modules:
            source = _committed_source(arguments.commit, module, arguments.worktree)
            for mutant in (c_mutants if module.endswith(".c") else mutants)(module, source):
                print(f"{module}:{mutant.number} line {mutant.line}: {mutant.description}")
        return 0
    rerun = survivors_in_log(arguments.rerun) if arguments.rerun else None
    if rerun is not None:
        arguments.modules = [module for module in arguments.modules if module in rerun]
    scratch = prepare_copy(arguments.commit, arguments.worktree)
    try:
        if C_EXTENSION in arguments.modules and not build_extension(scratch):
            print(f"baseline: {C_EXTENSION} does not compile", flush=True)
            return 2
        baseline_tests = arguments.tests or sorted({test for module in arguments.modules for test in MODULE_TESTS[module]})
        outcome, seconds, failures = run_tests(scratch, baseline_tests, RUN_TIMEOUT_SECONDS * max(2, len(baseline_tests)))
        print(f"baseline (unmutated) {outcome} in {seconds:.0f}s {failures}", flush=True)
        if outcome != "passed":
            return 2
        deadline = time.monotonic() + arguments.budget - seconds
        totals, survivors = [0, 0], []
        for position, module in enumerate(arguments.modules):
            share = max(0.0, deadline - time.monotonic()) / (len(arguments.modules) - position)
            tried, killed, survived = probe(scratch, module, share, only, rerun[module] if rerun else None,
                                            arguments.tests)
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
