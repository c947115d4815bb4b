"""`ProcessLocalReader`: datasets hold a path, and each process maps the files itself on first use.

Pickling a dataset for a ``spawn`` worker sends a few bytes, and every worker
shares the page cache instead of copying data. After a fork the reader is opened
again: the parent's maps would still be valid, but a lock a parent thread held
at the fork would never be released in the child.
"""

from __future__ import annotations

import os
from typing import Any

from .. import open as open_varstore
from ..reader import Reader
from ..sharded_reader import ShardedReader


class ProcessLocalReader:
    """The reader of `path` for the current process: opened on first use, reopened after a fork, pickled by path."""

    def __init__(self, path: str | os.PathLike[str], *, verify_reads: bool = False) -> None:
        self.path = os.fspath(path)
        self.verify_reads = verify_reads
        self._reader: Reader | ShardedReader | None = None
        self._pid = -1

    def get(self) -> Reader | ShardedReader:
        if self._reader is None or self._pid != os.getpid():
            self._reader = open_varstore(self.path, verify_reads=self.verify_reads)
            self._pid = os.getpid()
        return self._reader

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "verify_reads": self.verify_reads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], verify_reads=state["verify_reads"])  # type: ignore[misc]
