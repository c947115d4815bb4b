"""varstore: variable-length record shards with O(1) memory-mapped random access.

    with varstore.Writer("docs") as writer:
        writer.append(b"payload")
    reader = varstore.open("docs")
    reader[0], reader.get_batch([0]), reader.verify()
"""

from __future__ import annotations

import os

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


def open(path: str | os.PathLike[str], *, verify_reads: bool = False) -> Reader | ShardedReader:  # noqa: A001
    """Open what a `Writer` or `ShardedWriter` wrote at `path`: a shard prefix (or either of its files) or a dataset
    (its directory, or its ``manifest.json``).

    The reader pins the version it opened: pickled (to a DataLoader worker, say) it
    reopens the same absolute path, whatever the current directory then, and raises
    `DatasetReplacedError` if the files there are no longer that version.
    """
    path = os.fspath(path)
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
