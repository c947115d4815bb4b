"""varstore: variable-length record shards with O(1) memory-mapped random access.

    with varstore.Writer("docs") as writer:
        writer.append(b"payload")
    reader = varstore.open("docs")
    reader[0], reader.get_batch([0]), reader.verify()
"""

from __future__ import annotations

import os
from typing import Any

from .errors import (
    ClosedError,
    ConcurrentWriterError,
    CorruptRecordError,
    DatasetReplacedError,
    FormatError,
    MissingFileError,
    RecordIndexError,
    RecordTypeError,
    ShardExistsError,
    StorageError,
    VarstoreError,
)
from .format import DATA_SUFFIX, INDEX_SUFFIX
from .manifest import MANIFEST_NAME
from .reader import FlatBatch, Reader
from .remote.filesystems import is_url
from .remote_dataset import open_url
from .remote_shard import RemoteShard
from .sharded_reader import ShardedReader
from .sharded_writer import ShardedWriter, write_manifest
from .storage import remove_temporary_files
from .writer import Writer

__version__ = "0.1.0"

__all__ = [
    "ClosedError",
    "ConcurrentWriterError",
    "CorruptRecordError",
    "DatasetReplacedError",
    "FlatBatch",
    "FormatError",
    "MissingFileError",
    "Reader",
    "RecordIndexError",
    "RecordTypeError",
    "RemoteShard",
    "ShardExistsError",
    "ShardedReader",
    "ShardedWriter",
    "StorageError",
    "VarstoreError",
    "Writer",
    "open",
    "remove_temporary_files",
    "write_manifest",
]


def open(  # noqa: A001
    path: str | os.PathLike[str],
    *,
    verify_reads: bool = False,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
) -> Reader | ShardedReader | RemoteShard:
    """Open what a `Writer` or `ShardedWriter` wrote at `path`: a shard prefix (or either of its files) or a dataset
    (its directory, or its ``manifest.json``).

    `path` may be a URL of object storage (``s3://bucket/dataset``, ``memory://...``, any fsspec URL):
    `storage_options` go to its filesystem (for S3, s3fs's ``endpoint_url``, ``key``, ``secret``...), and what is
    fetched whole (index files; data files a stream or `verify` needs) is kept in the node cache at `cache_dir`
    (default `varstore.remote.cache.default_cache_dir()`), at most `cache_limit` bytes of it.

    The reader pins the version it opened: pickled (to a DataLoader worker, say) it
    reopens the same absolute path or URL, whatever the current directory then, and raises
    `DatasetReplacedError` if the files there are no longer that version.
    """
    path = os.fspath(path)
    if is_url(path):
        return open_url(path, verify_reads=verify_reads, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
    if storage_options is not None or cache_dir is not None or cache_limit is not None:
        raise VarstoreError("storage_options, cache_dir and cache_limit apply to URLs, not to a local path", path=path)
    if os.path.basename(path) == MANIFEST_NAME and os.path.isfile(path):
        return ShardedReader(os.path.dirname(path) or ".", verify_reads=verify_reads)
    if os.path.isdir(path):
        return ShardedReader(path, verify_reads=verify_reads)
    if not os.path.exists(path + INDEX_SUFFIX):
        for suffix in (INDEX_SUFFIX, DATA_SUFFIX):
            if path.endswith(suffix) and os.path.exists(path):
                return Reader(path[: -len(suffix)], verify_reads=verify_reads)
        raise MissingFileError(
            f"no varstore shard or dataset here: looked for {path}{INDEX_SUFFIX} and {os.path.join(path, MANIFEST_NAME)}",
            path=path,
        )
    return Reader(path, verify_reads=verify_reads)
