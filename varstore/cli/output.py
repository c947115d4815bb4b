"""How the commands show results: sizes and counts for people, JSON for programs, progress bars on stderr."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from ..errors import CommandError, VarstoreError
from ..progress import Counter

_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_PROGRESS_DELAY_SECONDS = 0.5


@contextmanager
def writing_to_standard_output() -> Iterator[None]:
    """Name standard output in a failure to write to it (a full disk): such an OSError names no file.

    Only for blocks whose other failures name their file: a `VarstoreError` (reading a store) and a
    `BrokenPipeError` (the reader went away, handled quietly) pass unchanged. After the failure what
    is left unwritten is discarded, so that Python's flush at exit does not fail again with a traceback.
    """
    try:
        yield
    except OSError as error:
        if isinstance(error, (VarstoreError, BrokenPipeError)) or error.filename is not None:
            raise
        discard_standard_output()
        raise CommandError(f"writing to standard output failed: {error.strerror or error}") from None


def discard_standard_output() -> None:
    """Point standard output at the null device, as Python's documentation advises after a broken pipe:
    what is still buffered then goes nowhere, quietly, instead of failing again at exit."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # no stdout, or one without a descriptor (captured in tests)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, descriptor)
    finally:
        os.close(null)


def one_line(error: BaseException) -> str:
    """The error as the one line a command prints: an OSError by its file and reason, whitespace folded."""
    if isinstance(error, OSError) and not isinstance(error, VarstoreError) and error.strerror:
        message = f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    else:
        message = str(error)
    return " ".join(message.split())


def format_count(count: int) -> str:
    return f"{count:,}"


def plural(count: int, noun: str) -> str:
    """``1 shard``, ``1,000 shards``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def format_size(size: float) -> str:
    """`size` bytes in binary units: ``1 byte``, ``512 bytes``, ``1.5 MiB``."""
    unit = 0
    while size >= 1024 and unit < len(_UNITS) - 1:
        size /= 1024
        unit += 1
    return plural(int(size), "byte") if unit == 0 else f"{size:.1f} {_UNITS[unit]}"


def format_size_exactly(size: int) -> str:
    """``1.5 MiB (1,572,864 bytes)``, or just ``100 bytes``."""
    return format_size(size) if size < 1024 else f"{format_size(size)} ({size:,} bytes)"


def print_json(value: Any) -> None:
    """One strict JSON document on one line of stdout (non-finite floats must already be spelled out, §6)."""
    print(json.dumps(value, ensure_ascii=False, allow_nan=False))


def print_fields(fields: Sequence[tuple[str, str]]) -> None:
    """``name   value`` lines with the values aligned."""
    width = max((len(name) for name, _ in fields), default=0)
    for name, value in fields:
        print(f"{name:<{width}}  {value}")


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, align: str, indent: str = "") -> None:
    """Columns as wide as their widest cell, each left- or right-aligned by its letter in `align` (``l`` or ``r``)."""
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    for row in [header, *rows]:
        cells = [cell.ljust(width) if side == "l" else cell.rjust(width) for cell, width, side in zip(row, widths, align)]
        print(indent + "  ".join(cells).rstrip())


@contextmanager
def progress_bar(total: int | None, unit: str = "B", *, description: str, quiet: bool = False) -> Iterator[Counter]:
    """A `Counter` that drives a tqdm bar on stderr (a `varstore.progress.ProgressBar` once `description` and `quiet`
    are bound).

    The bar stays off with `quiet`, when stderr is not a terminal (logs, pipes),
    and for jobs that end within half a second.
    """
    if quiet or not sys.stderr.isatty():
        yield Counter()
        return
    try:
        from tqdm import tqdm
    except ImportError:
        print("varstore: progress bars need tqdm: pip install 'varstore[cli]'", file=sys.stderr)
        yield Counter()
        return
    with tqdm(
        total=total, desc=description, unit=unit, unit_scale=True, unit_divisor=1024 if unit == "B" else 1000,
        file=sys.stderr, delay=_PROGRESS_DELAY_SECONDS, leave=False,
    ) as bar:
        yield Counter(bar.update)
