"""`ShardedReader`: one global index over the shards a manifest lists, each mapped on first use."""

from __future__ import annotations

import bisect
import os
import resource
import stat
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import format as fmt
from .checksum import crc32c_of_range
from .codecs import Codec, codec_from_stored
from .errors import ClosedError, FormatError, MissingFileError, RecordIndexError, RecordTypeError
from .manifest import Manifest, ShardEntry, read_manifest
from .reader_base import ReaderBase
from .reader import FlatBatch, Reader, check_indices

_FILES_PER_SHARD = 2
_SPARE_FILE_DESCRIPTORS = 64


def _max_open_shards() -> int:
    """How many shards may stay mapped at once: each holds two file descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(8, (soft - _SPARE_FILE_DESCRIPTORS) // (2 * _FILES_PER_SHARD))


def _check_shard_file(path: str, expected_size: int) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise MissingFileError("shard file listed in the manifest is missing", path=path) from None
    if not stat.S_ISREG(info.st_mode):
        raise FormatError("shard files must be regular files inside the dataset directory, not links", path=path)
    if info.st_size != expected_size:
        raise FormatError(f"shard file is {info.st_size} bytes, the manifest says {expected_size}", path=path)


def open_listed_shard(directory: str, entry: ShardEntry, codec: Codec, *, verify_reads: bool = False) -> Reader:
    """Open the shard a manifest `entry` names, checking its files and header against the entry and the dataset's codec."""
    prefix = os.path.join(directory, entry.name)
    for path, size in zip(fmt.shard_paths(prefix), (entry.data_size, entry.index_size)):
        _check_shard_file(path, size)
    reader = Reader(prefix, verify_reads=verify_reads)
    header = reader.header
    if (
        header.record_count != entry.records
        or header.data_crc32c != entry.data_crc32c
        or header.codec_id != codec.id
        or reader._codec.params() != codec.params()
    ):
        reader.close()
        raise FormatError(
            "shard does not match the manifest (record count, data checksum or codec differ): "
            "it was replaced or belongs to another dataset",
            path=reader.index_path,
        )
    return reader


def verify_listed_shard(reader: Reader, entry: ShardEntry, progress: Callable[[int], None] | None = None) -> None:
    """Check a shard's index file against the checksum its manifest `entry` records, then every byte (`Reader.verify`)."""
    index_crc = crc32c_of_range(reader._index_map, 0, entry.index_size)
    if index_crc != entry.index_crc32c:
        raise FormatError(
            f"index file checksum is {index_crc:#010x}, the manifest says {entry.index_crc32c:#010x}",
            path=reader.index_path,
        )
    reader.verify(progress)


class ShardedReader(ReaderBase):
    """A dataset directory read as one sequence of records, with the same API as `Reader`.

    Opening reads the manifest and checks that every shard file exists with the
    size it lists; a shard is mapped, and its header checked against the
    manifest, the first time one of its records is read.
    """

    def __init__(self, directory: str | os.PathLike[str], *, verify_reads: bool = False) -> None:
        self.path = os.fspath(directory)
        self.verify_reads = verify_reads
        self._open()

    def _open(self) -> None:
        manifest = read_manifest(self.path)
        for entry in manifest.shards:
            data_path, index_path = fmt.shard_paths(os.path.join(self.path, entry.name))
            _check_shard_file(index_path, entry.index_size)
            _check_shard_file(data_path, entry.data_size)
        self._codec = codec_from_stored(manifest.codec, manifest.codec_params, path=self.path)
        self.manifest: Manifest = manifest
        self.metadata = manifest.metadata
        counts = np.array([entry.records for entry in manifest.shards], np.int64)
        self._starts = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=self._starts[1:])
        self._start_list: list[int] = self._starts.tolist()
        self._count = int(self._starts[-1])
        self._readers: OrderedDict[int, Reader] = OrderedDict()
        self._max_open = _max_open_shards()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def shard_paths(self) -> list[str]:
        """The path prefix of every shard, in dataset order."""
        return [os.path.join(self.path, entry.name) for entry in self.manifest.shards]

    @property
    def shard_starts(self) -> np.ndarray:
        """Global index of each shard's first record, plus the total count at the end."""
        return self._starts

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"ShardedReader({self.path!r}, records={self._count}, shards={len(self.manifest.shards)}, codec={self.codec!r})"

    def shard(self, position: int) -> Reader:
        """The `Reader` of shard number `position`, mapped and checked against the manifest on first use."""
        reader = self._readers.get(position)
        if reader is not None:
            return reader
        with self._lock:
            if self._closed:
                raise ClosedError("the reader is closed", path=self.path)
            reader = self._readers.get(position)
            if reader is None:
                entry = self.manifest.shards[position]
                reader = open_listed_shard(self.path, entry, self._codec, verify_reads=self.verify_reads)
                self._readers[position] = reader
                while len(self._readers) > self._max_open:
                    # Dropped, not closed: another thread may still be reading it; freeing it unmaps it.
                    self._readers.popitem(last=False)
        return reader

    def _locate(self, index: int) -> tuple[int, int]:
        count = self._count
        if index < 0:
            index += count
        if not 0 <= index < count:
            if self._closed:
                raise ClosedError("the reader is closed", path=self.path)
            raise RecordIndexError(f"record {index} is out of range for {count} records", path=self.path)
        position = bisect.bisect_right(self._start_list, index) - 1
        return position, index - self._start_list[position]

    def __getitem__(self, index: Any) -> Any:
        if index.__class__ is int:
            position, local = self._locate(index)
            return self.shard(position)[local]
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            if step == 1:
                return self._read_range(start, stop)
            return self.get_batch(range(start, stop, step))
        if isinstance(index, (bool, np.bool_)) or not hasattr(index, "__index__"):
            raise RecordTypeError(f"record indices are integers or slices, not {type(index).__name__}", path=self.path)
        return self[index.__index__()]

    def _grouped(self, indices: Any) -> tuple[np.ndarray, list[tuple[int, np.ndarray, np.ndarray]]]:
        """Split global indices by shard: (order, [(shard, positions in `indices`, local indices)])."""
        if self._closed:
            raise ClosedError("the reader is closed", path=self.path)
        resolved = check_indices(indices, self._count, self.path)
        shards = np.searchsorted(self._starts, resolved, side="right") - 1
        order = np.argsort(shards, kind="stable")
        sorted_shards = shards[order]
        boundaries = np.flatnonzero(np.diff(sorted_shards)) + 1
        groups = []
        for positions in np.split(order, boundaries) if len(order) else []:
            shard = int(shards[positions[0]])
            groups.append((shard, positions, resolved[positions] - self._starts[shard]))
        return order, groups

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """Records at `indices`, in that order, read with one vectorised batch per shard."""
        _, groups = self._grouped(indices)
        if len(groups) == 1:
            shard, _, local = groups[0]
            return self.shard(shard).get_batch(local)
        results: list[Any] = [None] * sum(len(positions) for _, positions, _ in groups)
        for shard, positions, local in groups:
            for position, record in zip(positions.tolist(), self.shard(shard).get_batch(local)):
                results[position] = record
        return results

    def get_batch_flat(self, indices: Sequence[int] | np.ndarray) -> FlatBatch:
        """Records at `indices` packed into one buffer plus offsets, as `Reader.get_batch_flat`."""
        order, groups = self._grouped(indices)
        if len(groups) == 1:
            shard, _, local = groups[0]
            return self.shard(shard).get_batch_flat(local)
        if not groups:
            return self.shard(0).get_batch_flat([]) if self.manifest.shards else FlatBatch(np.zeros(0, np.uint8), np.zeros(1, np.int64))
        parts = [self.shard(shard).get_batch_flat(local) for shard, _, local in groups]
        grouped_values = np.concatenate([part.values for part in parts])
        grouped_lengths = np.concatenate([np.diff(part.offsets) for part in parts])
        grouped_starts = np.zeros(len(grouped_lengths), np.int64)
        np.cumsum(grouped_lengths[:-1], out=grouped_starts[1:])
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        lengths = grouped_lengths[inverse]
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        rows = np.repeat(grouped_starts[inverse] - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
        return FlatBatch(grouped_values[rows], offsets)

    def _read_range(self, start: int, stop: int) -> list[Any]:
        """Records [start, stop) read shard by shard as contiguous slices, which prefetch."""
        records: list[Any] = []
        while start < stop:
            position, local = self._locate(start)
            shard_stop = min(stop, self._start_list[position + 1])
            records += self.shard(position)[local : local + shard_stop - start]
            start = shard_stop
        return records

    def prefetch(self, start: int, stop: int) -> None:
        """Ask the kernel to start reading records [start, stop) of each shard they span into the page cache."""
        start, stop, _ = slice(start, stop).indices(self._count)
        position = bisect.bisect_right(self._start_list, start) - 1
        while start < stop:
            shard_start, shard_stop = self._start_list[position], self._start_list[position + 1]
            self.shard(position).prefetch(start - shard_start, min(stop, shard_stop) - shard_start)
            start, position = shard_stop, position + 1

    def __iter__(self) -> Iterator[Any]:
        for position in range(len(self.manifest.shards)):
            yield from self.shard(position)

    def iter_flat(self, batch_size: int = 4096) -> Iterator[FlatBatch]:
        """Consecutive records as zero-copy `FlatBatch` views, shard by shard (a batch never spans two shards)."""
        for position in range(len(self.manifest.shards)):
            yield from self.shard(position).iter_flat(batch_size)

    def record_sizes(self) -> np.ndarray:
        """Every record's payload size in bytes, across all shards."""
        sizes = [self.shard(position).record_sizes() for position in range(len(self.manifest.shards))]
        return np.concatenate(sizes) if sizes else np.zeros(0, np.int64)

    def verify(self, progress: Callable[[int], None] | None = None) -> None:
        """Verify every shard: its index file against the manifest checksum, then `Reader.verify`."""
        for position, entry in enumerate(self.manifest.shards):
            verify_listed_shard(self.shard(position), entry, progress)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._count = 0
            while self._readers:
                self._readers.popitem()[1].close()
