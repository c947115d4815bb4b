"""What the readers share: a description of their codec, their version, and pickling by path (`ReaderBase`);
for the two readers of one shard, its index and the check against a manifest entry (`ShardReaderBase`).

A reader pickles as its absolute path (fixed when it was constructed, so a later
``os.chdir`` changes nothing) plus the version it opened; unpickling in the
receiving process (a DataLoader worker, say) maps the files afresh there and
refuses, with `DatasetReplacedError`, files that are no longer that version.
(No lazy `__getattr__` hook: defining one slows every attribute access, and so
every read, by a third.)
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import ClosedError, DatasetReplacedError, FormatError, RecordTypeError
from ..format import header as fmt
from ..format.checksum import crc32c
from ..format.codecs import Codec
from ..format.header import Header
from ..format.manifest import ShardEntry, check_codec_params, check_header_against_entry
from ..remote.filesystems import is_url


class ReaderBase:
    """Base of the readers. Subclasses implement `_open` (which sets `_codec`) and `close`."""

    verify_reads: bool
    header: Header
    _closed: bool
    kind = "shard"  # what the reader opened, as errors name it
    is_remote = False  # whether it reads from object storage (a URL)
    _codec: Codec

    def _open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the reader is closed", path=self.path)

    @property
    def path(self) -> str:
        """The path or URL as it was given (errors name it so); reopening uses the absolute path fixed when it
        was set (a URL is absolute already)."""
        return self._path

    @path.setter
    def path(self, value: str) -> None:
        self._path = value
        self._absolute_path = value if is_url(value) else os.path.abspath(value)

    @property
    def version(self) -> int:
        """The identity of what was opened: a shard's header checksum (CRC32C of header bytes [0, 60), which hold the
        record count and the data and index body checksums); a dataset's is its manifest's CRC32C.

        (Not the CRC of all 64 bytes: a message followed by its own CRC32C always has the same CRC.)
        """
        return crc32c(self.header.pack()[: fmt.HEADER_SIZE - fmt.CHECKSUM_SIZE])

    @property
    def codec(self) -> str:
        """The codec name: ``bytes``, ``str``, ``ndarray`` or ``msgpack``."""
        return self._codec.name

    @property
    def dtype(self) -> np.dtype | None:
        """The element dtype of an ``ndarray`` store, else None."""
        return getattr(self._codec, "dtype", None)

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The fixed trailing shape of an ``ndarray`` store's records, else None."""
        return getattr(self._codec, "shape", None)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self._absolute_path, "verify_reads": self.verify_reads, "version": self.version}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.verify_reads = state["verify_reads"]
        self._open()
        require_version(self, state["version"])


class ShardReaderBase(ReaderBase):
    """What `Reader` and `RemoteShard` share: one shard's checked index (`_index`, a `ShardIndex`)."""

    _index: Any
    _count: int
    index_path: str

    @property
    def offsets(self) -> np.ndarray:
        """The N + 1 record offsets, a read-only uint64 view of the index."""
        self._check_open()
        return self._index.offsets

    def record_sizes(self) -> np.ndarray:
        """Every record's payload size in bytes (from the index alone: no data is read; the offsets are checked as
        reads check them)."""
        self._check_open()
        return self._index.record_sizes()

    def _get_other(self, index: Any) -> Any:
        """`self[index]` for an index that is not an int: a slice (contiguous, or a batch with a step), or an
        integer of another type; anything else is refused."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            if step == 1:
                return self._read_range(start, max(start, stop))
            return self.get_batch(range(start, stop, step))
        if isinstance(index, (bool, np.bool_)) or not hasattr(index, "__index__"):
            raise RecordTypeError(f"record indices are integers or slices, not {type(index).__name__}", path=self.path)
        return self[index.__index__()]

    def check_against_entry(self, entry: ShardEntry, codec: Codec) -> None:
        """Refuse, closing this reader, a shard that is not the one its manifest `entry` lists with `codec` (§3.1:
        header facts, then codec parameters)."""
        try:
            check_header_against_entry(self.header, entry, codec, self.index_path)
            check_codec_params(self._codec, codec, self.index_path)
        except FormatError:
            self.close()
            raise


def require_version(reader: ReaderBase, expected: int) -> None:
    """Close `reader` and raise `DatasetReplacedError` unless it opened version `expected` of its path."""
    if reader.version != expected:
        found = reader.version
        reader.close()
        raise replaced_error(reader.kind, reader.path, expected, found)


def replaced_error(kind: str, path: str, expected: int, found: int | None) -> DatasetReplacedError:
    """The error for the `kind` ("dataset" or "shard") at `path` changed after a reader opened version `expected`."""
    now = f"{found:#x}" if found is not None else "unreadable"
    return DatasetReplacedError(
        f"the {kind} was replaced after this reader opened it (opened version {expected:#x}, now {now}); "
        "open it again",
        path=path,
    )
