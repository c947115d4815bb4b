"""Real corpora found on this machine, as lists of byte records, for the compression benchmark.

Nothing is generated: the standard library's ``.py`` files (documents, ~8 KB), man pages (roff source of
``/usr/share/man``), installed packages' metadata as JSON Lines (~1 KB), the standard library's docstrings as
~300 B JSON rows, uint16 tokens of the standard library's text, and the PNG/JPEG images shipped on the machine.
Each corpus is collected in sorted path order and capped at a byte budget, so a run on the same machine sees
the same records. The tokenizer is a word-level one built here (no BPE model is installed): runs of word
characters, single punctuation marks and runs of whitespace, numbered by frequency, the 65,535th and rarer
pieces sharing one id.
"""

from __future__ import annotations

import ast
import collections
import email.parser
import glob
import gzip
import json
import os
import re
import sysconfig
from collections.abc import Callable

import numpy as np

MB = 1 << 20
_TOKEN = re.compile(r"\w+|[^\w\s]|\s+")
_DOCSTRING_BYTES = 300


def _stdlib_files() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    files = glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
    return sorted(path for path in files if "site-packages" not in path)


def _capped(records: list[bytes], budget: int) -> list[bytes]:
    kept, total = [], 0
    for record in records:
        if total + len(record) > budget:
            break
        kept.append(record)
        total += len(record)
    return kept


def _read(path: str) -> bytes:
    with open(path, "rb") as stream:
        return stream.read()


def documents(budget: int = 24 * MB) -> list[bytes]:
    """The standard library's ``.py`` files, whole."""
    return _capped([_read(path) for path in _stdlib_files()], budget)


def manpages(budget: int = 16 * MB) -> list[bytes]:
    """The English man pages' roff source, decompressed."""
    paths = sorted(glob.glob("/usr/share/man/man*/*.gz"))
    records: list[bytes] = []
    for path in paths:
        try:
            records.append(gzip.decompress(_read(path)))
        except (OSError, EOFError):
            continue  # a page that is not gzip after all (rare) is left out
        if sum(map(len, records)) > budget:
            break
    return _capped(records, budget)


def _dpkg_packages() -> list[dict[str, str]]:
    try:
        text = _read("/var/lib/dpkg/status").decode("utf-8", "replace")
    except OSError:
        return []
    packages = []
    for paragraph in text.split("\n\n"):
        fields: dict[str, str] = {}
        name = None
        for line in paragraph.splitlines():
            if line[:1] in (" ", "\t") and name:
                fields[name] += "\n" + line.strip()
            elif ":" in line:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
        if fields:
            packages.append(fields)
    return packages


def metadata(budget: int = 8 * MB) -> list[bytes]:
    """Package metadata as JSON Lines: every dpkg package's status paragraph, then every installed Python
    distribution's METADATA headers (its long description left out), one JSON object per record."""
    rows: list[dict[str, str]] = _dpkg_packages()
    parser = email.parser.HeaderParser()
    for path in sorted(glob.glob("/root/.pyenv/versions/*/lib/python*/site-packages/*.dist-info/METADATA")
                       + glob.glob("/work/main/.venv*/lib/python*/site-packages/*.dist-info/METADATA")):
        message = parser.parsestr(_read(path).decode("utf-8", "replace"))
        rows.append({key: str(value) for key, value in message.items()})
    return _capped([json.dumps(row, sort_keys=True).encode() for row in rows], budget)


def docstrings(budget: int = 12 * MB) -> list[bytes]:
    """The standard library's module, class and function docstrings as JSON rows (file, line, name, a function's
    signature, the docstring cut to 300 characters)."""
    rows: list[bytes] = []
    root = sysconfig.get_paths()["stdlib"]
    for path in _stdlib_files():
        try:
            tree = ast.parse(_read(path))
        except (SyntaxError, ValueError):
            continue  # test data files that are not Python 3.11
        module = os.path.splitext(os.path.basename(path))[0]
        relative = os.path.relpath(path, root)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    row = {"path": relative, "line": getattr(node, "lineno", 0), "name": getattr(node, "name", module)}
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        row["signature"] = ast.unparse(node.args)
                    rows.append(json.dumps({**row, "doc": doc[:_DOCSTRING_BYTES]}).encode())
        if sum(map(len, rows)) > budget:
            break
    return _capped(rows, budget)


def tokens(budget: int = 16 * MB) -> list[bytes]:
    """The documents as uint16 token ids (the module docstring's word-level tokenizer), one record per file."""
    texts = [document.decode("utf-8", "replace") for document in documents(budget)]
    pieces = [_TOKEN.findall(text) for text in texts]
    counts = collections.Counter(piece for document in pieces for piece in document)
    vocabulary = {piece: number for number, (piece, _) in enumerate(counts.most_common(65535))}
    rare = 65535
    records = [np.array([vocabulary.get(piece, rare) for piece in document], np.uint16).tobytes() for document in pieces]
    return _capped(records, budget)


def images(budget: int = 16 * MB) -> list[bytes]:
    """The PNG and JPEG files under /usr/share and the Python installations, whole."""
    paths: list[str] = []
    for pattern in ("/usr/share/**/*.png", "/usr/share/**/*.jpg", "/usr/share/**/*.jpeg",
                    "/root/.pyenv/versions/*/lib/**/*.png", "/root/.pyenv/versions/*/lib/**/*.jpg"):
        paths += glob.glob(pattern, recursive=True)
    return _capped([_read(path) for path in sorted(set(paths)) if os.path.isfile(path)], budget)


CORPORA: dict[str, Callable[[], list[bytes]]] = {
    "documents": documents,
    "manpages": manpages,
    "metadata": metadata,
    "docstrings": docstrings,
    "tokens": tokens,
    "images": images,
}
