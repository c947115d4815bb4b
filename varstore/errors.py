"""The exception hierarchy: every error varstore raises derives from `VarstoreError` (but `CommandError`, a request
refused in one line, which the command line and `convert` report).

Subclasses also derive from the matching built-in (IndexError, TypeError, ...)
so code written for sequences and files keeps working.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Sequence

USAGE_EXIT_CODE = 2
FAILURE_EXIT_CODE = 1


class VarstoreError(Exception):
    """Root of every error varstore raises; `path` names the file concerned, if any."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class FormatError(VarstoreError):
    """A file is not a varstore file, has an unsupported version, or its structure is invalid."""


class CorruptRecordError(VarstoreError):
    """A record fails its checksum, its offsets are invalid, or its bytes do not decode.

    `records` lists the indices of the damaged records that were found.
    """

    def __init__(self, message: str, *, path: str | None = None, records: list[int] | None = None) -> None:
        super().__init__(message, path=path)
        self.records = records or []


class MissingFileError(VarstoreError, FileNotFoundError):
    """A shard, index, data file or manifest that should exist does not."""


class ShardExistsError(VarstoreError, FileExistsError):
    """A writer would replace an existing shard or dataset and was not asked to."""


class StorageError(VarstoreError):
    """The operating system or an object store failed a read, write, fsync, rename or request (disk full, I/O
    error, a connection reset, ...)."""


class RecordTypeError(VarstoreError, TypeError):
    """A record, codec or dtype does not fit what the shard stores."""


class RecordIndexError(VarstoreError, IndexError):
    """A record index is out of range."""


class ClosedError(VarstoreError, ValueError):
    """A reader or writer was used after it was closed."""


class ConcurrentWriterError(VarstoreError):
    """Another writer (in this process or another) holds the lock on a dataset directory or shard."""


class DatasetReplacedError(VarstoreError):
    """A dataset or shard changed on disk after a reader opened it; reading on would mix two versions."""


class CommandError(Exception):
    """A request that cannot be carried out as asked (a conversion's input, a command's arguments), reported in
    one line with the exit code it deserves; the command line prints it, `varstore.conversion.convert` turns it into
    a `VarstoreError`."""

    exit_code = FAILURE_EXIT_CODE


class UsageError(CommandError):
    """An argument is wrong in a way argparse cannot see (a range, an index, an option that does not apply)."""

    exit_code = USAGE_EXIT_CODE


def require_extra(module: str, extra: str, feature: str) -> ModuleType:
    """Import an optional dependency, or say which varstore extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise CommandError(f"{feature} needs {module}: pip install 'varstore[{extra}]'") from None


def listing(items: Sequence[Any], most: int = 20) -> str:
    """``a, b, c`` or, past `most` items, ``a, b and 98 more``: how messages list what they name."""
    shown = ", ".join(map(str, items[:most]))
    return shown + (f" and {len(items) - most:,} more" if len(items) > most else "")
