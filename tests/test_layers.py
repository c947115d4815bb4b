"""varstore's layers: every module of varstore/ has a rank, and imports point down only.

From the bottom: errors, what is on disk (format), the operating system (local), object storage (remote), one
shard, many shards (dataset), operations on datasets, the loaders and engines, the CLI, and last the thin public
modules (``varstore`` itself, ``varstore.ray``, ``varstore.spark``). A module may import a lower rank, or its own
rank inside its own sub-package; no import circles. The checks read the source with `ast` and never import it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "varstore"

# Rank of each module prefix below the package ("" is the package's __init__.py); the longest prefix wins.
LAYERS = {
    "errors": 0, "_native": 0, "_speedups": 0, "_version": 0, "progress": 0,
    "format": 1,
    "local": 2,
    "remote": 3,
    "shard": 4,
    "dataset": 5,
    "operations": 6, "conversion": 6,
    "torch": 7, "engines": 7,
    "cli": 8,
    "": 9, "__main__": 9, "ray": 9, "spark": 9, "grain": 9,
}  # fmt: skip
IGNORED = {"_speedups"}  # the C extension: no .py file to read
OPTIONAL_EXTRAS = {
    "torch", "ray", "pyspark", "fsspec", "s3fs", "pandas", "pyarrow", "obstore", "zstandard", "tqdm", "matplotlib"
}  # fmt: skip


class Arrow(NamedTuple):
    where: str  # file:line
    importer: str
    imported: str


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of root/package by dotted name; a package is its __init__.py (which wins over a same-named .py)."""
    found: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py"), key=lambda p: p.name == "__init__.py"):
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" not in parts:
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def arrows(root: Path, package: str) -> list[Arrow]:
    """Every import of a module of the package, wherever it stands (functions and TYPE_CHECKING blocks too)."""
    found = modules(root, package)
    ignored = {f"{package}.{name}" for name in IGNORED}
    known = set(found) | ignored
    result = []
    for importer, path in found.items():
        here = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = ".".join(here.split(".")[: len(here.split(".")) - node.level + 1])
                    base = f"{anchor}.{base}" if base else anchor
                # `from x import y` imports the submodule x.y when there is one, else the name y of module x.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for target in targets:
                inside = target == package or target.startswith(package + ".")
                skipped = target == importer or any(target == i or target.startswith(i + ".") for i in ignored)
                if inside and not skipped:
                    result.append(Arrow(f"{path.relative_to(root)}:{node.lineno}", importer, target))
    return sorted(set(result))


def rank(module: str, package: str) -> int | None:
    """The rank of the longest prefix of LAYERS the module matches ("" matches the package's __init__ alone)."""
    parts = module.split(".")[1:]
    prefixes = [".".join(parts[:length]) for length in range(len(parts), 0, -1)] or [""]
    return next((LAYERS[prefix] for prefix in prefixes if prefix in LAYERS), None)


def subpackage(module: str, package: str, found: dict[str, Path]) -> str:
    """The first package below `package` that holds the module; the package itself for its top-level modules."""
    parts = module.split(".")
    in_one = len(parts) > 2 or (len(parts) == 2 and module in found and found[module].name == "__init__.py")
    return ".".join(parts[:2]) if in_one else package


def upward_arrows(root: Path, package: str) -> list[tuple[Arrow, int, int]]:
    found = modules(root, package)
    bad = []
    for arrow in arrows(root, package):
        low, high = rank(arrow.importer, package), rank(arrow.imported, package)
        if low is None or high is None:
            continue  # unlayered_modules reports it
        sideways = subpackage(arrow.importer, package, found) != subpackage(arrow.imported, package, found)
        if high > low or (high == low and sideways):
            bad.append((arrow, low, high))
    return bad


def circles(root: Path, package: str) -> list[tuple[str, ...]]:
    """Tarjan's strongly connected components of more than one module, each sorted."""
    found = modules(root, package)
    graph: dict[str, set[str]] = {name: set() for name in found}
    for arrow in arrows(root, package):
        if arrow.imported in found:
            graph[arrow.importer].add(arrow.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    result = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                result.append(tuple(sorted(component)))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(result)


def unlayered_modules(root: Path, package: str) -> list[str]:
    """Modules of the tree, and imported modules that are not in it, that match no prefix of LAYERS."""
    names = set(modules(root, package)) | {arrow.imported for arrow in arrows(root, package)}
    return sorted(name for name in names if rank(name, package) is None)


@pytest.mark.timeout(120)
def test_no_module_imports_a_higher_layer() -> None:
    bad = upward_arrows(ROOT, PACKAGE)
    assert not bad, "imports against the layer order:\n" + "\n".join(
        f"  {a.where}: {a.importer} ({low}) -> {a.imported} ({high})" for a, low, high in bad
    )


@pytest.mark.timeout(120)
def test_no_import_circles() -> None:
    found = circles(ROOT, PACKAGE)
    every = arrows(ROOT, PACKAGE)
    assert not found, "import circles:\n" + "\n".join(
        f"  {', '.join(c)}\n"
        + "".join(f"    {a.where}: {a.importer} -> {a.imported}\n" for a in every if {a.importer, a.imported} <= set(c))
        for c in found
    )


@pytest.mark.timeout(120)
def test_every_module_has_a_layer() -> None:
    missing = unlayered_modules(ROOT, PACKAGE)
    assert not missing, "\n".join(f"module {name} has no layer: add it to the table" for name in missing)


@pytest.mark.timeout(180)
def test_import_varstore_imports_no_optional_extra() -> None:
    code = f"import sys, varstore; print(sorted({{m.partition('.')[0] for m in sys.modules}} & {OPTIONAL_EXTRAS!r}))"
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[]", f"import varstore imports optional extras: {child.stdout.strip()}"


# The checker on a planted tree: each bug is found, and the allowed imports around it are not reported.
PLANTED = {
    "__init__.py": "from . import format as fmt\nfrom .shard.x import X\n",  # package pkg.format; allowed
    "__main__.py": "from pkg import cli\n",
    "_native.py": "def speedups():\n    from . import _speedups\n    return _speedups\n",  # ignored, not pkg
    "errors.py": "class E(Exception): pass\n",
    "misc.py": "",  # no layer
    "ray.py": "from pkg.engines import ray as _ray\n",
    "cli/__init__.py": "import pkg.dataset.b\nimport pkg.nowhere\n",  # pkg.nowhere: no layer
    "format/__init__.py": "from .header import Header\n",
    "format/header.py": "from . import checksum\nfrom ..errors import E\nclass Header: pass\n",
    "format/checksum.py": "",
    "format/a.py": "import os\nfrom pkg.dataset import b\n",  # 1 -> 5
    "format/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..shard.x import X\n",  # 1 -> 4
    "local/lazy.py": "def get():\n    from ..remote.io import fetch\n    return fetch\n",  # 2 -> 3
    "remote/__init__.py": "",
    "remote/io.py": "from ..local import lazy\ndef fetch(): pass\n",
    "shard/__init__.py": "",
    "shard/x.py": "from . import y\nclass X: pass\n",  # x <-> y
    "shard/y.py": "import pkg.shard.x\n",
    "dataset/__init__.py": "",
    "dataset/b.py": "from ..shard import x\n",
    "torch/__init__.py": "",
    "torch/t.py": "from .. import open_, errors\nimport pkg.engines.e\n",  # 7 -> 9, 7 -> 7 sideways
    "engines/__init__.py": "",
    "engines/e.py": "",
    "engines/ray.py": "from ..dataset import b\n",
}


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    for name, source in PLANTED.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(source)
    return tmp_path


@pytest.mark.timeout(60)
def test_imports_resolve_to_submodules_packages_and_names(planted: Path) -> None:
    found = {(a.importer, a.imported) for a in arrows(planted, "pkg")}
    assert {("pkg", "pkg.format"), ("pkg.format.header", "pkg.format.checksum"), ("pkg.torch.t", "pkg.errors")} <= found
    assert ("pkg.torch.t", "pkg") in found and ("pkg.cli", "pkg.dataset.b") in found
    assert not any(a.importer == "pkg._native" for a in arrows(planted, "pkg"))  # the C extension is ignored
    assert ("pkg.cli", "pkg") not in found and ("pkg.cli", "pkg.dataset") not in found  # no implicit __init__ arrows


@pytest.mark.timeout(60)
def test_checker_reports_exactly_the_planted_upward_arrows(planted: Path) -> None:
    assert [(a.where, a.importer, a.imported, low, high) for a, low, high in upward_arrows(planted, "pkg")] == [
        ("pkg/format/a.py:2", "pkg.format.a", "pkg.dataset.b", 1, 5),
        ("pkg/format/typed.py:3", "pkg.format.typed", "pkg.shard.x", 1, 4),
        ("pkg/local/lazy.py:2", "pkg.local.lazy", "pkg.remote.io", 2, 3),
        ("pkg/torch/t.py:1", "pkg.torch.t", "pkg", 7, 9),
        ("pkg/torch/t.py:2", "pkg.torch.t", "pkg.engines.e", 7, 7),
    ]


@pytest.mark.timeout(60)
def test_checker_reports_exactly_the_planted_circles(planted: Path) -> None:
    assert circles(planted, "pkg") == [("pkg.local.lazy", "pkg.remote.io"), ("pkg.shard.x", "pkg.shard.y")]


@pytest.mark.timeout(60)
def test_checker_reports_exactly_the_planted_unlayered_modules(planted: Path) -> None:
    assert unlayered_modules(planted, "pkg") == ["pkg.misc", "pkg.nowhere"]
