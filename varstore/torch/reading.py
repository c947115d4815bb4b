"""`ProcessLocalReader`: datasets hold a path, and each process maps the files itself on first use.

Pickling a dataset for a ``spawn`` worker sends a few bytes, and every worker
shares the page cache instead of copying data. After a fork the reader is opened
again: the parent's maps would still be valid, but a lock a parent thread held
at the fork would never be released in the child.

The path is made absolute at construction, and the version opened first (in the
main process, when the dataset is built) travels with it: a worker that finds
other files under the path raises `DatasetReplacedError` instead of reading
them, so one epoch never mixes two versions of a dataset.
"""

from __future__ import annotations

import os
from typing import Any

from .. import open as open_varstore
from ..reader import Reader
from ..reader_base import require_version
from ..sharded_reader import ShardedReader


class ProcessLocalReader:
    """The reader of `path` for the current process: opened on first use, reopened after a fork, pickled by path and version.

    With ``quarantine=True`` a dataset directory opens even when some shards are
    damaged; they are set aside (see `ShardedReader._open_quarantining`).
    """

    def __init__(self, path: str | os.PathLike[str], *, verify_reads: bool = False, quarantine: bool = False) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.verify_reads = verify_reads
        self.quarantine = quarantine
        self.version: int | None = None
        self._reader: Reader | ShardedReader | None = None
        self._pid = -1

    def get(self) -> Reader | ShardedReader:
        if self._reader is None or self._pid != os.getpid():
            reader = self._open()
            if self.version is None:
                self.version = reader.version
            require_version(reader, self.version)
            self._reader, self._pid = reader, os.getpid()
        return self._reader

    def _open(self) -> Reader | ShardedReader:
        if self.quarantine and os.path.isdir(self.path):
            return ShardedReader._open_quarantining(self.path, verify_reads=self.verify_reads)
        return open_varstore(self.path, verify_reads=self.verify_reads)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "verify_reads": self.verify_reads, "quarantine": self.quarantine, "version": self.version}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], verify_reads=state["verify_reads"], quarantine=state["quarantine"])  # type: ignore[misc]
        self.version = state["version"]
