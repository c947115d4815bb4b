"""`ShardedReader`: one global index over the shards a manifest lists, each opened on first use, read from a
source (`dataset_source` picks it: `local_source` for a directory, `remote_source` for a URL).

A reader pins the dataset version it opened (a BLAKE2b-128 digest of the
manifest's bytes). A local source checks each listed shard at the open and again
when it is first used, a remote one at first use only (an open costs O(1)
requests); here a failed check is told apart: when the
stored manifest has changed meanwhile, the dataset was replaced under the reader,
which raises `DatasetReplacedError` rather than read another version; otherwise
the shard is damaged (and, for ``on_damaged="skip"``, set aside).
"""

from __future__ import annotations

import bisect
import logging
import os
import resource
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import (
    ClosedError, DatasetReplacedError, FormatError, RecordIndexError, RecordTypeError, StorageError, VarstoreError,
)
from ..format.codecs import Codec, codec_from_stored
from ..format.manifest import Manifest
from ..local.file_url import resolve_file_url
from ..remote.filesystems import is_url
from ..remote.location import RemoteLocation
from ..shard.reader import FlatBatch, Reader, check_indices
from ..shard.reader_base import ReaderBase, replaced_error
from ..shard.remote_shard import RemoteShard
from .local_source import _SHARD_ERRORS, LocalDatasetSource, verify_listed_shard
from .remote_source import ManifestStamp, RemoteDatasetSource
from .shard_threads import check_workers, in_order, serialised

_FILES_PER_SHARD = 2
_log = logging.getLogger("varstore")


_SPARE_FILE_DESCRIPTORS = 64


_MIN_OPEN_SHARDS = 8


_MAX_CONCURRENT_SHARDS = 16  # a remote batch reads this many shards at once, at most


_OPEN_ATTEMPTS = 3  # a fresh open that races an overwrite reads the new manifest and tries again, this often


def max_open_shards() -> int:
    """How many shards may stay mapped at once: sized from the current soft RLIMIT_NOFILE, which is never changed.

    A shard needs its two file descriptors while it is being mapped; the limit
    keeps room for twice that per cached shard plus a spare 64, and at least 8 shards.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(_MIN_OPEN_SHARDS, (soft - _SPARE_FILE_DESCRIPTORS) // (2 * _FILES_PER_SHARD))


def dataset_source(
    path: str,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
) -> LocalDatasetSource | RemoteDatasetSource:
    """Where a `ShardedReader` of `path` reads from: object storage for a URL, else the local directory."""
    if is_url(path):
        location = RemoteLocation(path, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
        return RemoteDatasetSource(location)
    if storage_options is not None or cache_dir is not None or cache_limit is not None:
        raise VarstoreError("storage_options, cache_dir and cache_limit apply to URLs, not to a local path", path=path)
    return LocalDatasetSource(path)


class ShardedReader(ReaderBase):
    """A dataset (a local directory or a URL) read as one sequence of records, with the same API as `Reader`.

    Opening reads the manifest and has the source check the shards it lists against
    their entries (`check_listed`: every one, empty ones included, for a local
    directory; none for a URL, where that is a request per shard); a shard is
    opened, and checked against its entry, the first time one of its records is read.
    A reopened (unpickled) reader of a URL reads its pinned manifest from the node
    cache when it is there: no request.
    Shards already mapped keep serving the version this reader opened after the
    dataset is replaced; a shard first needed after that raises
    `DatasetReplacedError`, never records of the new version.
    """

    kind = "dataset"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        verify_reads: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        self.path = resolve_file_url(directory)
        self.verify_reads = verify_reads
        self._quarantine: dict[int, str] | None = None
        self._stamp: ManifestStamp | None = None
        self._source = dataset_source(self.path, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
        self.is_remote = self._source.is_remote
        self._open()

    @classmethod
    def _open_quarantining(cls, directory: str | os.PathLike[str], *, verify_reads: bool = False, **remote: Any) -> ShardedReader:
        """Open like the constructor, but set aside shards that cannot be opened or fail their manifest checks
        (listed in `_quarantine`, position -> reason) instead of failing; for ``on_damaged="skip"``."""
        reader = cls.__new__(cls)
        reader.path = resolve_file_url(directory)
        reader.verify_reads = verify_reads
        reader._quarantine = {}
        reader._stamp = None
        reader._source = dataset_source(reader.path, **remote)
        reader.is_remote = reader._source.is_remote
        reader._open()
        return reader

    def _open(self) -> None:
        manifest, self._codec, damaged = self._read_consistent_manifest()
        if damaged and self._quarantine is None:
            raise next(iter(damaged.values()))
        self.manifest: Manifest = manifest
        self._version = manifest.version
        self.metadata = manifest.metadata
        if self._quarantine is not None:
            self._quarantine = {position: str(error) for position, error in damaged.items()}
        counts = np.array([entry.records for entry in manifest.shards], np.int64)
        self._starts = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=self._starts[1:])
        self._start_list: list[int] = self._starts.tolist()
        self._count = int(self._starts[-1])
        self._readers: OrderedDict[int, Reader | RemoteShard] = OrderedDict()
        self._max_open = max_open_shards()
        self._lock = threading.Lock()
        self._opening: dict[int, threading.Lock] = {}
        self._whole_at_first_read = False
        self._closed = False

    def _read_consistent_manifest(self) -> tuple[Manifest, Codec, dict[int, VarstoreError]]:
        """The manifest, its codec and the shards that fail their checks against it (the source's `check_listed`),
        read again while an overwrite changes it."""
        for attempt in range(_OPEN_ATTEMPTS):
            manifest = self._source.open_manifest(self._stamp if attempt == 0 else None)
            codec = codec_from_stored(manifest.codec, manifest.codec_params, path=self.path)
            damaged = self._source.check_listed(manifest, codec)
            if not damaged or self._version_on_disk() == manifest.version:
                return manifest, codec, damaged
        raise DatasetReplacedError(
            f"the dataset changed {_OPEN_ATTEMPTS} times while it was being opened; open it again", path=self.path
        )

    def _version_on_disk(self) -> int | None:
        """The version of the manifest now stored, or None if it cannot be read."""
        try:
            return self._source.read_manifest().version
        except VarstoreError:
            return None

    def _raise_if_replaced(self) -> None:
        """Raise `DatasetReplacedError` if the stored manifest is no longer the version this reader opened."""
        found = self._version_on_disk()
        if found != self._version:
            raise replaced_error(self.kind, self.path, self._version, found)

    @property
    def version(self) -> int:
        """The version this reader opened: BLAKE2b-128 of its manifest's bytes."""
        return self._version

    def __getstate__(self) -> dict[str, Any]:
        stamp = self._source.stamp
        return {
            **super().__getstate__(),
            "quarantining": self._quarantine is not None,
            "remote": self._source.state(),
            "manifest": None if stamp is None else [stamp.version, stamp.size, stamp.crc32c],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Reopen in this process; a remote dataset's pinned version comes from the node cache when it holds it."""
        self._quarantine = {} if state["quarantining"] else None
        self._stamp = None if state["manifest"] is None else ManifestStamp(*state["manifest"])
        self._source = dataset_source(state["path"], **(state["remote"] or {}))
        self.is_remote = self._source.is_remote
        super().__setstate__(state)

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

    def shard(self, position: int, *, whole: bool = False) -> Reader | RemoteShard:
        """The `Reader` of shard number `position`, mapped and checked against the manifest on first use (for a
        remote dataset, with `whole`, fetched whole into the node cache if this opens it)."""
        reader = self._readers.get(position)
        if reader is not None:
            return reader
        shards = len(self.manifest.shards)
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or not 0 <= position < shards:
            raise RecordIndexError(f"shard {position!r} is out of range for {shards} shards", path=self.path)
        with self._lock:
            opening = self._opening.setdefault(position, threading.Lock())
        with opening:  # one lock per shard: shards open at once (a remote open waits on the network)
            if self._closed:
                raise ClosedError("the reader is closed", path=self.path)
            reader = self._readers.get(position)
            if reader is None:
                if whole or not self._whole_at_first_read:
                    reader = self._open_shard(position, whole)
                else:
                    reader = self._open_whole_or_by_ranges(position)
                with self._lock:
                    if self._closed:  # closed while this shard opened
                        reader.close()
                        raise ClosedError("the reader is closed", path=self.path)
                    self._readers[position] = reader
                    while len(self._readers) > self._max_open:
                        # Dropped, not closed: another thread may still be reading it; freeing it unmaps it.
                        self._readers.popitem(last=False)
        return reader

    def _open_whole_or_by_ranges(self, position: int) -> Reader | RemoteShard:
        """Shard `position` fetched whole (`read_shards_whole`), or, if its data object cannot be (damaged at rest on
        every attempt, no room left on the cache's filesystem), read by ranges as any reader reads it: each record
        is checked then, and a damaged one raised or skipped by the caller's policy."""
        try:
            return self._open_shard(position, True)
        except StorageError as error:
            _log.warning("shard %s could not be fetched whole, so it is read by ranges: %s", self.shard_paths[position], error)
            return self._open_shard(position, False)

    def _open_shard(self, position: int, whole: bool) -> Reader:
        """Map shard `position`; failing, tell a dataset replaced since the open from a damaged one (quarantined if asked)."""
        if self._quarantine is not None and position in self._quarantine:
            raise FormatError(f"shard is set aside as damaged: {self._quarantine[position]}", path=self.shard_paths[position])
        try:
            return self._source.open_shard(
                self.manifest,
                self.manifest.shards[position],
                self._codec,
                verify_reads=self.verify_reads,
                replaced_check=self._raise_if_replaced,
                whole=whole,
            )
        except _SHARD_ERRORS as error:
            found = self._version_on_disk()
            if found != self._version:
                raise replaced_error(self.kind, self.path, self._version, found) from error
            if self._quarantine is not None:
                self._quarantine[position] = str(error)
            raise

    def fetch_shard(self, position: int) -> None:
        """Bring shard `position` whole into the node cache (a remote dataset; nothing for a local one): its
        reads then use the local copy. Thread-safe, for a prefetching thread ahead of a stream."""
        self._source.fetch_shard(self.shard(position, whole=True))

    def read_shards_whole(self) -> None:
        """From now on, fetch each shard whole into the node cache when it opens, if the dataset is remote and the
        cache can hold all of it (else nothing): for a reader that will read every shard, as a map-style epoch
        does. A shuffled epoch then costs one request per 8 MiB of data, not one per batch's record of each shard,
        and later epochs read the local copies."""
        self._whole_at_first_read = self.is_remote and self.fits_in_cache

    @property
    def fits_in_cache(self) -> bool:
        """Whether the node cache can hold every shard's data at once (always for a local dataset or no limit)."""
        return self._source.fits_in_cache(self.manifest)

    def release_shard(self, position: int) -> None:
        """Forget shard `position`'s open reader (its maps close once no record returned from them is alive),
        so that the node cache can reclaim its files: what a stream does with a shard it has consumed."""
        with self._lock:
            self._readers.pop(position, None)

    def _shard_usable(self, position: int) -> bool:
        """For a quarantining reader: map shard `position` if it is not set aside already, and say whether it is usable."""
        if self._quarantine is None or position in self._readers:
            return True
        try:
            self.shard(position)
        except DatasetReplacedError:
            raise
        except _SHARD_ERRORS:
            return False
        return True

    def _locate(self, index: int) -> tuple[int, int]:
        count = self._count
        asked = index
        if index < 0:
            index += count
        if not 0 <= index < count:
            if self._closed:
                raise ClosedError("the reader is closed", path=self.path)
            raise RecordIndexError(f"record {asked} is out of range for {count} records", path=self.path)
        position = bisect.bisect_right(self._start_list, index) - 1
        return position, index - self._start_list[position]

    def __getitem__(self, index: Any) -> Any:
        if index.__class__ is int:
            position, local = self._locate(index)
            return self.shard(position)[local]
        if isinstance(index, slice):
            if self._closed:
                raise ClosedError("the reader is closed", path=self.path)
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

    def will_need(self, indices: Sequence[int] | np.ndarray) -> None:
        """Prepare the shards holding `indices`: `Reader.will_need` of each local one (opening it if it is not open);
        a remote dataset's are opened at once, which fetches them whole when `read_shards_whole` applies (the
        sampler's look-ahead thus downloads the coming batches' shards during the current steps). Advisory, so a
        shard that cannot open is skipped: its read raises."""
        try:
            _, groups = self._grouped(indices)
        except VarstoreError:
            return
        if self._source.is_remote:
            self._open_at_once([position for position, _, _ in groups], skip_errors=True)
            return
        for position, _, local in groups:
            try:
                shard = self.shard(position)
            except VarstoreError:
                continue
            if isinstance(shard, Reader):
                shard.will_need(local)

    def _open_at_once(self, positions: list[int], *, skip_errors: bool = False) -> None:
        """Open the shards at `positions` not open yet, a thread each (a remote open waits on the network)."""
        closed = [position for position in positions if position not in self._readers]
        if not closed:
            return

        def open_shard(position: int) -> None:
            try:
                self.shard(position)
            except VarstoreError:
                if not skip_errors:
                    raise

        if len(closed) == 1:
            open_shard(closed[0])
            return
        with ThreadPoolExecutor(max_workers=min(len(closed), _MAX_CONCURRENT_SHARDS)) as pool:
            list(pool.map(open_shard, closed))

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """Records at `indices`, in that order, read with one vectorised batch per shard."""
        _, groups = self._grouped(indices)
        if len(groups) == 1:
            shard, _, local = groups[0]
            return self.shard(shard).get_batch(local)
        results: list[Any] = [None] * sum(len(positions) for _, positions, _ in groups)
        for (_, positions, _), records in zip(groups, self._per_shard(groups, "get_batch")):
            for position, record in zip(positions.tolist(), records):
                results[position] = record
        return results

    def _per_shard(self, groups: list[tuple[int, np.ndarray, np.ndarray]], method: str) -> list[Any]:
        """`method` (``get_batch`` or ``get_batch_flat``) of each group's shard on its local indices, in order: one
        shard after another for a local dataset. For a remote one, the shards not yet open are opened at once (a
        thread each), then the byte ranges of all of them are planned and fetched together (`read_plan`), so that a
        batch touching k shards costs one round trip and as few requests as its ranges allow, not k batches'."""
        if not self._source.is_remote or len(groups) < 2:
            return [getattr(self.shard(shard), method)(local) for shard, _, local in groups]
        self._open_at_once([shard for shard, _, _ in groups])
        shards = [self.shard(shard) for shard, _, _ in groups]
        wanted = [shard.wanted_ranges(local) for shard, (_, _, local) in zip(shards, groups)]
        fetched = iter(self._source.read_batch([ranges for ranges in wanted if ranges is not None], self._raise_if_replaced))
        flat = method == "get_batch_flat"
        return [
            shard.records_from(local, None if ranges is None else next(fetched), flat=flat)
            for shard, (_, _, local), ranges in zip(shards, groups, wanted)
        ]

    def get_batch_flat(self, indices: Sequence[int] | np.ndarray) -> FlatBatch:
        """Records at `indices` packed into one buffer plus offsets, as `Reader.get_batch_flat`."""
        order, groups = self._grouped(indices)
        if len(groups) == 1:
            shard, _, local = groups[0]
            return self.shard(shard).get_batch_flat(local)
        if not groups:
            return self.shard(0).get_batch_flat([]) if self.manifest.shards else FlatBatch(np.zeros(0, np.uint8), np.zeros(1, np.int64))
        parts = self._per_shard(groups, "get_batch_flat")
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
            if self._shard_usable(position):
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

    def verify(self, progress: Callable[[int], None] | None = None, *, workers: int = 1) -> None:
        """Verify every shard: its index file against the manifest checksum, then `Reader.verify`; `workers` shards at
        once (on threads), raising the first damaged shard's error in the manifest's order."""
        check_workers(workers)
        advance = serialised(progress) if workers > 1 else progress
        in_order(lambda position: verify_listed_shard(self.shard(position), self.manifest.shards[position], advance),
                 range(len(self.manifest.shards)), workers)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._count = 0
            while self._readers:
                self._readers.popitem()[1].close()
