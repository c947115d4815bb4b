"""`ProcessLocalReader`: datasets hold a path or URL, and each process opens the reader itself on first use.

Pickling a dataset for a ``spawn`` worker sends a few bytes, and every worker
shares the page cache (and, for a URL, the node cache) instead of copying data.
After a fork the reader is opened again: the parent's maps would still be valid,
but a lock a parent thread held at the fork would never be released in the child,
and an object-storage client's sockets and event loop do not survive a fork at all.
A URL's reader is reopened from the parent's reader's state, as unpickling does (its
version pinned: no request when the node cache holds that manifest), not opened
afresh by URL (two requests, and the manifest parsed again, in every worker).

A local path is made absolute at construction; a URL is kept as given, with its
`storage_options`, `cache_dir` and `cache_limit`, so that workers reach the same
objects through the same node cache. The version opened first (in the main
process, when the dataset is built) travels with it: a worker that finds another
version there raises `DatasetReplacedError` instead of reading it, so one epoch
never mixes two versions of a dataset.
"""

from __future__ import annotations

import os
from typing import Any

from ..dataset.opening import open as open_varstore
from ..dataset.reader import ShardedReader
from ..errors import MissingFileError
from ..format.header import DATA_SUFFIX, INDEX_SUFFIX
from ..format.manifest import MANIFEST_NAME
from ..remote.filesystems import is_url
from ..shard.reader import Reader
from ..shard.reader_base import require_version
from ..shard.remote_shard import RemoteShard

AnyReader = Reader | ShardedReader | RemoteShard


class ProcessLocalReader:
    """The reader of `path` for the current process: opened on first use, reopened after a fork, pickled by
    path (or URL and its options) and version.

    With ``quarantine=True`` a dataset opens even when some shards are damaged;
    they are set aside (see `ShardedReader._open_quarantining`). With ``whole_shards=True``
    a remote dataset's shards are fetched whole at their first read (`ShardedReader.read_shards_whole`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify_reads: bool = False,
        quarantine: bool = False,
        whole_shards: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        path = os.fspath(path)
        self.path = path if is_url(path) else os.path.abspath(path)
        self.verify_reads = verify_reads
        self.quarantine = quarantine
        self.whole_shards = whole_shards
        self.remote_options: dict[str, Any] = {
            "storage_options": storage_options,
            "cache_dir": os.path.abspath(os.fspath(cache_dir)) if cache_dir is not None else None,
            "cache_limit": cache_limit,
        }
        self.version: int | None = None
        self._reader: AnyReader | None = None
        self._pid = -1

    def get(self) -> AnyReader:
        if self._reader is None or self._pid != os.getpid():
            reader = self._open()
            if self.version is None:
                self.version = reader.version
            require_version(reader, self.version)
            if self.whole_shards and isinstance(reader, ShardedReader):
                reader.read_shards_whole()
            self._reader, self._pid = reader, os.getpid()
        return self._reader

    def _open(self) -> AnyReader:
        if self._reader is not None and is_url(self.path):  # a forked child: the parent's reader, reopened
            reopened = type(self._reader).__new__(type(self._reader))
            reopened.__setstate__(self._reader.__getstate__())
            return reopened
        if self.quarantine and is_url(self.path):
            return self._open_url_quarantining()
        if self.quarantine and os.path.isdir(self.path):
            return ShardedReader._open_quarantining(self.path, verify_reads=self.verify_reads)
        return open_varstore(self.path, verify_reads=self.verify_reads, **self.remote_options)

    def _open_url_quarantining(self) -> AnyReader:
        """A dataset at the URL, quarantining its damaged shards; a single shard (no manifest there) as it is."""
        dataset_url = self.path.rstrip("/").removesuffix("/" + MANIFEST_NAME)
        if not dataset_url.endswith((INDEX_SUFFIX, DATA_SUFFIX)):
            try:
                return ShardedReader._open_quarantining(dataset_url, verify_reads=self.verify_reads, **self.remote_options)
            except MissingFileError:
                pass  # no manifest: a shard prefix, opened below
        return open_varstore(self.path, verify_reads=self.verify_reads, **self.remote_options)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": self.path, "verify_reads": self.verify_reads, "quarantine": self.quarantine, "version": self.version,
            "whole_shards": self.whole_shards,
            **self.remote_options,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        remote = {name: state[name] for name in ("storage_options", "cache_dir", "cache_limit")}
        self.__init__(  # type: ignore[misc]
            state["path"], verify_reads=state["verify_reads"], quarantine=state["quarantine"],
            whole_shards=state["whole_shards"], **remote,
        )
        self.version = state["version"]
