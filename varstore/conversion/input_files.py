"""The input files of a source that spans many files, named as WebDataset and TFRecord users name their shards: a
path or URL with brace lists and ranges (``shard-{000..009}.tar``, ``{train,val}.tfrecord``), shell globs
(``shards/*.tar``), or several of these joined by ``::`` (WebDataset's list separator); each file opened for
streaming, locally or through fsspec (`varstore.remote.filesystems`); `FilesSource`, a source of such files.

A URL is streamed in ranged reads of `URL_BLOCK_BYTES`, each retried on its own when it fails transiently (a
connection dropped mid-body, a timeout, a 5xx: `read_range`'s bounded backoff), so a fault in the middle of a
large file costs one block again, not the whole convert: one GET per block when nothing fails.

A pattern may name at most `MAX_INPUT_FILES` files, so that no pattern (``{0..999999999}``) can make convert hold a
list out of proportion to the command line.
"""

from __future__ import annotations

import glob
import io
import os
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, BinaryIO

from ..errors import CommandError, UsageError
from ..remote.filesystems import is_url, object_info, open_filesystem, read_range
from .source_base import Source, even_parts

MAX_INPUT_FILES = 1_000_000
URL_BLOCK_BYTES = 4 << 20
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")


@dataclass(frozen=True)
class InputFile:
    """One input file: its path or URL, and its size in bytes."""

    name: str
    size: int


def names_many_files(path: str) -> bool:
    """Whether `path` names its files by a pattern (braces, globs, ``::`` lists) or a URL, rather than as one path."""
    return is_url(path) or "::" in path or expand_braces(path) != [path] or glob.has_magic(path)


def expand_braces(pattern: str) -> list[str]:
    """`pattern` with each brace group expanded as braceexpand (and so WebDataset) expands it, left to right:
    ``{a,b}`` lists (nested groups inside), ``{3..11}`` ranges (``{000..009}`` zero-padded to the widest bound when
    a bound other than 0 starts with 0, ``{9..7}`` descending); a group that is neither, such as ``{x}``, stays as
    written, and unbalanced braces are refused (braceexpand's step and letter ranges are not taken: ``{a..c}`` stays
    as written)."""
    depth, start = 0, 0
    for position, character in enumerate(pattern):
        if character == "{":
            depth, start = depth + 1, position if depth == 0 else start
        elif character == "}":
            if not depth:
                raise UsageError(f"{pattern!r}: a closing brace opens no group")
            depth -= 1
            if depth == 0:
                head, tail = pattern[:start], expand_braces(pattern[position + 1 :])
                choices = _choices(pattern[start + 1 : position])
                if choices is None:
                    return [pattern[: position + 1] + rest for rest in tail]
                expanded = [chosen for choice in choices for chosen in expand_braces(choice)]
                _check_count(len(expanded) * len(tail), pattern)  # before the names are made
                return [head + chosen + rest for chosen in expanded for rest in tail]
    if depth:
        raise UsageError(f"{pattern!r}: a brace group is not closed")
    return [pattern]


def _choices(body: str) -> list[str] | None:
    """The alternatives of a brace group's `body` (between the braces), or None if it is not a list or a range."""
    parts, depth, start = [], 0, 0
    for position, character in enumerate(body):
        depth += {"{": 1, "}": -1}.get(character, 0)
        if character == "," and depth == 0:
            parts.append(body[start:position])
            start = position + 1
    if parts:
        return [*parts, body[start:]]
    match = _RANGE.match(body)
    if match is None:
        return None
    first, last = match.groups()
    padded = any(bound.startswith("0") and bound != "0" for bound in (first, last))
    width = max(len(first), len(last)) if padded else 0
    step = 1 if int(last) >= int(first) else -1
    _check_count(abs(int(last) - int(first)) + 1, body)
    return [str(number).zfill(width) for number in range(int(first), int(last) + step, step)]


def _check_count(count: int, pattern: str) -> None:
    if count > MAX_INPUT_FILES:
        raise UsageError(f"{pattern!r} names {count:,} files, more than convert takes in one pattern "
                         f"({MAX_INPUT_FILES:,})")


def input_files(spec: str, storage_options: dict[str, Any] | None) -> list[InputFile]:
    """Every file `spec` names, in the order it names them: its ``::`` parts in turn, each brace-expanded, each
    glob matched in sorted order. A glob that matches nothing, and a name that is not a file, are refused."""
    found: list[InputFile] = []
    for part in spec.split("::"):
        for name in expand_braces(part):
            found.extend(_url_files(name, storage_options) if is_url(name) else _local_files(name))
            _check_count(len(found), spec)
    return found


def _local_files(name: str) -> list[InputFile]:
    names = sorted(glob.glob(name)) if glob.has_magic(name) else [name]
    if not names:
        raise CommandError(f"{name}: no file matches this pattern")
    for path in names:
        if not os.path.isfile(path):
            raise CommandError(f"{path}: {'not a regular file' if os.path.exists(path) else 'no such file'}")
    return [InputFile(path, os.path.getsize(path)) for path in names]


def _url_files(url: str, storage_options: dict[str, Any] | None) -> list[InputFile]:
    fs, path = open_filesystem(url, storage_options)
    if not glob.has_magic(path):
        return [InputFile(url, object_info(fs, path, url=url).size)]
    matches = [(name, info) for name, info in sorted(fs.glob(path, detail=True).items()) if info.get("type") == "file"]
    if not matches:
        raise CommandError(f"{url}: no object matches this pattern")
    return [InputFile(fs.unstrip_protocol(name), int(info["size"])) for name, info in matches]


def open_input(file: InputFile, storage_options: dict[str, Any] | None) -> BinaryIO:
    """The input `file` opened for reading bytes from its start: a local file, or a URL read in retried blocks."""
    if not is_url(file.name):
        return open(file.name, "rb")
    fs, path = open_filesystem(file.name, storage_options)
    return io.BufferedReader(_RangedObject(fs, path, file), buffer_size=URL_BLOCK_BYTES)  # type: ignore[return-value]


class _RangedObject(io.RawIOBase):
    """The object at `path` of `fs` (the input `file`, whose size its listing gave) as a seekable raw stream,
    each read one ranged GET from the byte reached, retried with backoff by `read_range`."""

    def __init__(self, fs: Any, path: str, file: InputFile) -> None:
        self.fs, self.path, self.file, self.position = fs, path, file, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.file.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.file.name}: a seek to byte {base + offset}, before its start")
        self.position = base + offset
        return self.position

    def readinto(self, buffer: Any) -> int:
        end = min(self.file.size, self.position + len(buffer))
        if end <= self.position:
            return 0
        data = read_range(self.fs, self.path, self.position, end, url=self.file.name, size=self.file.size)
        buffer[: len(data)] = data
        self.position = end
        return len(data)


class FilesSource(Source):
    """A source of the files `spec` names (`input_files`), its work counted in bytes and split into parts of
    consecutive files; a subclass writes each file's records."""

    spec: str
    storage_options: dict[str, Any] | None

    @cached_property
    def files(self) -> list[InputFile]:
        """The files, listed once in the process that splits the work (a worker is handed its own)."""
        return input_files(self.spec, self.storage_options)

    @property
    def total(self) -> int:  # type: ignore[override]
        return sum(file.size for file in self.files)

    def whole(self) -> dict[str, Any]:
        return {"files": [(file.name, file.size) for file in self.files]}

    def split(self, count: int) -> list[dict[str, Any]]:
        """Parts of consecutive files."""
        files = self.whole()["files"]
        return [{"files": files[part["first"] : part["stop"]]} for part in even_parts(count, len(files))]
