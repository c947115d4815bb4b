"""varstore: variable-length record shards with O(1) memory-mapped random access.

    with varstore.Writer("docs") as writer:
        writer.append(b"payload")
    reader = varstore.open("docs")
    reader[0], reader.get_batch([0]), reader.verify()

Operations on whole stores, each returning a result object (their modules in ``varstore.operations`` say more;
the command line is a face over them):

- `copy`: copy a dataset or shard between local paths and URLs, verified on arrival.
- `merge`: combine shards and datasets into one new dataset, hard-linking their files where possible.
- `repair`: drop the shards that fail verification from a dataset's manifest.
- `describe`: tell what a shard or dataset holds from its headers and manifest alone.
- `verify`: check every structure and checksum of a shard or dataset, listing what is damaged.
"""

from __future__ import annotations

from ._version import __version__
from .dataset.opening import open  # noqa: A004
from .dataset.reader import ShardedReader
from .dataset.writer import ShardedWriter, write_manifest
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
from .local.publish import remove_temporary_files
from .operations.copy import copy
from .operations.describe import describe
from .operations.merge import merge
from .operations.repair import repair
from .operations.verify import verify
from .shard.reader import FlatBatch, Reader
from .shard.remote_shard import RemoteShard
from .shard.writer import Writer

__all__ = [
    "__version__",
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
    "copy",
    "describe",
    "merge",
    "open",
    "remove_temporary_files",
    "repair",
    "verify",
    "write_manifest",
]
