"""`RemoteShard`: a shard in object storage read with the API of `Reader`, without downloading its data.

Its index file is fetched whole into the node cache (once per node, verified against its CRC32C) and
mapped, so offsets cost nothing; records come by ranged reads of the data object, the ranges of a batch
merged and fetched concurrently. Every record read from the network is checked against its stored CRC32C
(when the shard has them, as varstore writes by default), because an object can be replaced under a reader
and a network can lie. `fetch_data` brings the whole data object into the cache (streaming, `verify`);
reads then decode straight from the local map, as `Reader` does, each record's CRC32C still checked
(`_CachedData`). When the node cache can hold the whole dataset, a shard read by ranges past a sixteenth
of its bytes is fetched whole in the background (`fetch_whole_after`), so a training run downloads each
byte about once per node while a few reads never download a shard.

The cache names both objects by what identifies this shard's content (`identity`: for a shard of a dataset,
the dataset's version and the shard's manifest entry; for any shard, the store's tags of its two objects,
ETags say, and its index header), never by URL, size and CRC32C alone, which two different index files can
share.

Faults: besides what `varstore.remote.filesystems` retries, a download failing its size or CRC32C check and a
record read by ranges failing its CRC32C are fetched again (up to 5 attempts, with backoff), unless the
dataset was replaced meanwhile: a body damaged on the way is not damage at rest. What is damage at rest is the
shard's `FormatError` (which ``on_damaged="skip"`` sets aside), never a storage fault: an object of another size
than its entry's (asked with a HEAD where a failed read or download cannot tell), an index failing its CRC32C
on every attempt.

Request cost, nothing cached: a shard of a dataset opens at its first read with one GET of its index and one
or two of its data object's first and last 4 KiB (whose responses name the object's size on s3://; elsewhere
one HEAD more), or, for a data object of at most 8 KiB when the cache may hold the dataset, one GET of it
whole; none when another process of the node opened it (the node cache holds the index and the edges; of a
shard without record checksums, the edges' GET is made at every open: `_data_edges`). A
shard opened alone costs two HEADs and a GET of its header more. A read of one record is one GET of its
bytes; a batch is one GET per span of records within 64 KiB of each other (at most 8 MiB each), all at once,
and a `ShardedReader`'s batch plans the spans of all its shards together (`wanted_ranges`, `records_from`).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import queue
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import (
    ClosedError,
    CorruptRecordError,
    FormatError,
    MissingFileError,
    RecordTypeError,
    StorageError,
    VarstoreError,
)
from ..format import header as fmt
from ..format.checksum import crc32c, crc32c_of_each
from ..format.metadata import DATA_CRC_MEMBER, MAX_METADATA_DEPTH, parse_strict_json
from ..local.mapping import map_file, pread_exactly
from ..remote.cache import DamagedDownloadError
from ..remote.filesystems import DEFAULT_ATTEMPTS, backoff_delay
from ..remote.location import RemoteLocation
from ..remote.read_plan import ObjectRanges
from .index import ShardIndex
from .reader import FlatBatch, check_indices, decode_gathered, decode_records, pack_flat, pack_gathered, record_slicer, shard_buffer
from .reader_base import ShardReaderBase, replaced_error

# A scan (iteration, slices) fetches records in requests of about this many bytes.
_SCAN_BYTES = 8 << 20
_FETCH_WHOLE_FRACTION = 16  # a shard read by ranges past 1/16 of its bytes is fetched whole (see fetch_whole_after)
_BACKGROUND_FETCHES = 2  # data objects fetched whole at once in the background, per process
_log = logging.getLogger("varstore.remote")

# Called when an object is missing or unreadable or a record fails its checksum: raises `DatasetReplacedError`
# if the dataset holding the shard was replaced meanwhile (else returns, and the read's own error stands).
ReplacedCheck = Callable[[], None]


class RemoteShard(ShardReaderBase):
    """A shard at a URL (its prefix: the objects are URL.data and URL.index), read by ranged requests.

    ``varstore.open(url)`` returns one for a single shard; a remote `ShardedReader` opens one per shard.
    It pickles as its URL, options and version, and reopens in the receiving process.
    """

    is_remote = True

    def __init__(
        self,
        url: str,
        *,
        verify_reads: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        self.path = url
        self.verify_reads = verify_reads
        self._location = RemoteLocation(url, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
        self._replaced_check: ReplacedCheck = _while_opening
        self._open()
        self._replaced_check = self._raise_if_header_changed

    @classmethod
    def open_listed(
        cls,
        location: RemoteLocation,
        *,
        sizes: tuple[int, int],
        index_crc32c: int,
        verify_reads: bool,
        replaced_check: ReplacedCheck,
        fetch_whole_after: int | None,
        data_crc32c: int,
        identity: str,
        whole: bool = False,
    ) -> RemoteShard:
        """The shard at `location` whose (data, index) sizes, index and data CRC32Cs a manifest lists: no
        request for what the manifest already says. `fetch_whole_after`: see `_note_ranged_read`. `identity`
        names its content in the node cache (the dataset's version, the manifest entry, the store's tags and
        the header the open read: `RemoteDatasetSource`). With `whole` the data object is fetched whole first,
        and the open's checks read the local copy."""
        shard = cls.__new__(cls)
        shard.path = location.url
        shard.verify_reads = verify_reads
        shard._location = location
        shard._replaced_check = replaced_check
        shard._fetch_whole_after = fetch_whole_after
        shard._identity = identity
        shard._open_parts(*sizes, index_crc32c, data_crc32c, whole)
        return shard

    # -- opening -----------------------------------------------------------------------------

    def _open(self) -> None:
        transport = self._location.transport()
        data_url, index_url = self.path + fmt.DATA_SUFFIX, self.path + fmt.INDEX_SUFFIX
        data, index = transport.object_info(data_url), transport.object_info(index_url)
        data_size, index_size = data.size, index.size
        head = transport.read_ranges(index_url, [(0, min(fmt.HEADER_SIZE, index_size))], size=index_size)[0]
        header = fmt.unpack_header(head, index_size=index_size, path=index_url)
        # No manifest: what the store says of each object (ETag, ...) and the whole header name this content.
        self._identity = f"shard; data [{data.tag}]; index [{index.tag}]; header {head.hex()}"
        self._fetch_whole_after = fetch_whole_after(data_size, data_size + index_size, self._location.cache.limit_bytes)
        self._open_parts(data_size, index_size, fmt.index_crc32c(header), header.data_crc32c, False)

    def _open_parts(self, data_size: int, index_size: int, index_crc32c: int, data_crc32c: int, whole: bool) -> None:
        """Fetch the index (through the cache, verified against `index_crc32c`), check it as §1.3 says against
        the data object's `data_size` and its first and last 4 KiB, and map it. The data object is read from
        a local copy if `whole` (fetched now) or if the node cache holds one already and may (a shard opened
        again after a reader dropped it, or by another process of the node)."""
        self.data_path, self.index_path = self.path + fmt.DATA_SUFFIX, self.path + fmt.INDEX_SUFFIX
        self._data_map: mmap.mmap | bytes | None = None
        self._cached: _CachedData | None = None
        self._ranged_bytes = 0
        self._whole_requested_by: int | None = os.getpid()  # not while opening: the open's own edge reads are not the reader's
        self._data_size = data_size
        fd = self._fetch_index(index_size, index_crc32c)
        try:
            header = fmt.unpack_header(pread_exactly(fd, fmt.HEADER_SIZE, 0, self.index_path), index_size=index_size, path=self.index_path)
            _refuse_unrecorded_data_crc(fd, header, self.index_path)
            if whole:
                self._map_whole_data(data_crc32c)
            elif self._fetch_whole_after is not None:
                self._map_cached_data(data_crc32c)
            edges = self._data_edges(data_size, data_crc32c, header.data_edge_crc32c, header.has_record_checksums)
            edge_bytes = dict(zip(fmt.edge_ranges(data_size), edges))
            index = ShardIndex.open(
                fd, data_size, lambda offset, length: edge_bytes[(offset, length)],
                index_path=self.index_path, data_path=self.data_path,
            )
        finally:
            os.close(fd)
        if self.verify_reads and index.checksums is None and index.blocks is None:  # a block's CRC32C is always checked
            raise FormatError("verify_reads=True but this shard was written without record checksums", path=self.index_path)
        self._index = index
        if self._data_map is not None:
            self._cached = _CachedData(index, self._data_map, self.data_path)
        self._index_map = index.map
        self._codec = index.codec
        self.header = index.header
        self._count = index.count
        self._closed = False
        self._whole_requested_by, self._ranged_bytes = None, 0

    def _data_edges(self, data_size: int, data_crc32c: int, edge_crc32c: int, record_checksums: bool) -> list[bytes]:
        """The data object's two edges (§1.3 step 10), from the local copy, else through the node cache (so that
        another process of this node opens the shard without a request): a data object of at most two edges'
        size is fetched whole (its edges are all of it) if the cache may hold the dataset, else read; a larger
        one's edges are kept as one small object under the shard's identity, fetched with a check of the object's
        size. Edges that do not match `edge_crc32c` are not cached: they are read again, and the open's check
        judges them.

        Without `record_checksums` the edges are read from the object at every open, never from the cache:
        nothing else ties a ranged read of that shard to its index, so a data object replaced under the same
        name (`varstore cp --overwrite` keeps names) would be read as this shard's by a process that reopened
        the dataset from the node cache (no request) after another process cached the old edges."""
        ranges = [(offset, offset + length) for offset, length in fmt.edge_ranges(data_size)]
        small = data_size <= 2 * fmt.EDGE_SIZE
        if self._data_map is None and small and self._fetch_whole_after is not None:
            with contextlib.suppress(DamagedDownloadError):  # the open's checks say what is wrong with it
                self._map_whole_data(data_crc32c)
        if self._data_map is not None:
            return self._read_data(ranges, data_size)
        if small or not record_checksums:
            return self._read_edges(ranges, data_size)

        def download(temporary: str) -> None:
            pieces = self._read_edges(ranges, data_size)
            with open(temporary, "wb") as file:
                file.write(b"".join(pieces))

        length = sum(end - start for start, end in ranges)
        try:
            fd = self._location.cache.open(self.data_path + "#edges", length, edge_crc32c, download, identity=self._identity)
        except DamagedDownloadError:
            return self._read_data(ranges, data_size)
        try:
            joined = pread_exactly(fd, length, 0, self.data_path)
        finally:
            os.close(fd)
        first = ranges[0][1] - ranges[0][0]
        return [joined[:first], joined[first:]]

    def _read_edges(self, ranges: list[tuple[int, int]], data_size: int) -> list[bytes]:
        """The data object's edges by ranged reads, with §1.3 step 8's check that it is `data_size` bytes
        (`_check_data_size`). A read that fails is judged by the object's size as well (one HEAD): ranges of a
        shorter object come back short, which a transport may retry as a cut body and call a storage fault, so
        that a damaged shard would pass for an outage (and ``on_damaged="skip"`` would not set it aside)."""
        self._check_data_size(data_size)
        try:
            return self._read_data(ranges, data_size)
        except StorageError:
            self._refuse_other_size(self.data_path, data_size)
            raise

    def _check_data_size(self, data_size: int) -> None:
        """Raise `FormatError` unless the data object is `data_size` bytes: no request where the transport's
        ranged reads check the object's size already (the edges are read next), else one HEAD."""
        transport = self._location.transport()
        if transport.checks_object_size:
            return
        try:
            found = transport.object_info(self.data_path).size
        except (MissingFileError, StorageError):
            self._replaced_check()
            raise
        if found != data_size:
            self._replaced_check()
            raise FormatError(f"shard object is {found} bytes, the manifest says {data_size}", path=self.data_path)

    def _refuse_other_size(self, url: str, size: int) -> None:
        """After a read or download of the object `url` failed: raise `FormatError` if a HEAD says it is not `size`
        bytes (retrying cannot help that; `DatasetReplacedError` if the dataset was replaced meanwhile). If the
        HEAD fails too, or the size is right, return: the failure's own error stands."""
        try:
            found = self._location.transport().object_info(url).size
        except (MissingFileError, StorageError):
            return
        if found != size:
            self._replaced_check()
            raise FormatError(f"shard object is {found} bytes, the manifest says {size}", path=url)

    # -- description -------------------------------------------------------------------------

    @property
    def metadata(self) -> dict[str, Any]:
        """The user metadata the writer stored, parsed from the cached index."""
        self._check_open()
        return self._index.metadata()

    @property
    def fits_in_cache(self) -> bool:
        """Whether the node cache's limit leaves room for the whole data object (always, with no limit)."""
        return self._fetch_whole_after is not None

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"RemoteShard({self.path!r}, records={self._count}, codec={self.codec!r})"

    # -- reads -------------------------------------------------------------------------------

    def __getitem__(self, index: Any) -> Any:
        if index.__class__ is int:
            return self.get_batch([index])[0]
        return self._get_other(index)

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """Records at `indices`, in that order: their byte ranges planned into as few requests as the gaps
        allow (`read_plan`), fetched at once, each record checked against its CRC32C."""
        return self.records_from(indices, None)

    def get_batch_flat(self, indices: Sequence[int] | np.ndarray) -> FlatBatch:
        """Records at `indices` packed into one buffer plus offsets, as `Reader.get_batch_flat`."""
        return self.records_from(indices, None, flat=True)

    def wanted_ranges(self, indices: Sequence[int] | np.ndarray) -> ObjectRanges | None:
        """The data object's byte ranges of the records at `indices`, in that order, or None if a local copy of it
        serves them: what a batch over many shards plans and fetches at once (`ShardedReader`) before handing
        each shard its pieces (`records_from`)."""
        indices = self._check_indices(indices)
        if self._data_map is not None:
            return None
        if self._index.blocks is not None:
            return ObjectRanges(self.data_path, self._data_size, self._block_ranges(np.unique(self._index.blocks.locate(indices).numbers)))
        starts, ends = self._index.checked_ranges(indices)
        return ObjectRanges(self.data_path, self._data_size, list(zip(starts.tolist(), ends.tolist())))

    def records_from(self, indices: Sequence[int] | np.ndarray, pieces: list[bytes] | None, *, flat: bool = False) -> Any:
        """`get_batch(indices)` (or `get_batch_flat`, if `flat`) built of `pieces`, the bytes of
        `wanted_ranges(indices)` that the caller fetched; with None, fetched here. Each record is checked against
        its CRC32C as always."""
        indices = self._check_indices(indices)
        cached = self._cached
        if pieces is None and cached is not None:
            return cached.get_batch_flat(indices) if flat else cached.get_batch(indices)
        if self._index.blocks is not None:
            joined, offsets = self._from_blocks(indices, pieces)
            return (pack_gathered if flat else decode_gathered)(self._index, indices, joined, offsets)
        starts, ends, joined = self._gather(indices, pieces)
        if flat:
            return pack_flat(self._index, indices, starts, ends, joined)
        offsets = _offsets_of(starts, ends)
        if self._index.dtype is not None and self._index.decompressor is None:
            self._index.check_rows(indices, starts, ends)  # where they lay in the data file, not in `joined`
        return decode_records(self._index, shard_buffer(self._index, bytes(joined)), indices, offsets[:-1], offsets[1:])

    def _read_range(self, start: int, stop: int) -> list[Any]:
        records: list[Any] = []
        for chunk_start, chunk_stop in self._scan_chunks(start, stop):
            records += self.get_batch(np.arange(chunk_start, chunk_stop))
        return records

    def __iter__(self) -> Iterator[Any]:
        for start, stop in self._scan_chunks(0, self._count):
            yield from self.get_batch(np.arange(start, stop))

    def iter_flat(self, batch_size: int = 4096) -> Iterator[FlatBatch]:
        """Consecutive records, `batch_size` at a time, as `FlatBatch` copies (one request per batch)."""
        self._check_open()
        if batch_size < 1:
            raise RecordTypeError(f"batch_size must be positive, not {batch_size}", path=self.path)
        for start in range(0, self._count, batch_size):
            yield self.get_batch_flat(np.arange(start, min(start + batch_size, self._count)))

    def prefetch(self, start: int, stop: int) -> None:
        """Nothing: a remote shard's records arrive when read; `fetch_data` brings the whole data object."""
        self._check_open()

    def _scan_chunks(self, start: int, stop: int) -> Iterator[tuple[int, int]]:
        """Records [start, stop) in runs of at most `_SCAN_BYTES` (or one record, if larger), one request each."""
        self._check_open()
        offsets = self._index.checked_offsets(start, stop)
        position, count = 0, stop - start
        while position < count:
            end = int(np.searchsorted(offsets, offsets[position] + _SCAN_BYTES, side="right")) - 1
            end = min(max(end, position + 1), count)
            yield start + position, start + end
            position = end

    def _check_indices(self, indices: Any) -> np.ndarray:
        self._check_open()
        return check_indices(indices, self._count, self.path)

    def _gather(self, indices: np.ndarray, pieces: list[bytes] | None) -> tuple[np.ndarray, np.ndarray, bytearray]:
        """Byte ranges of the records at `indices` and their bytes (`pieces` if the caller fetched them, else read
        now) joined back to back, each checked against its record CRC32C. Records read by ranges that fail it are
        read again (only those), with backoff, up to `DEFAULT_ATTEMPTS` reads in all: a body damaged on the way
        heals, damage at rest stays and is raised."""
        starts, ends = self._index.checked_ranges(indices)
        ranges = list(zip(starts.tolist(), ends.tolist()))
        if pieces is None:
            ranged = self._data_map is None
            pieces = self._read_data(ranges, self._data_size)
        else:
            ranged = True
            self._note_ranged_read(sum(len(piece) for piece in pieces))
        checksums = self._index.checksums
        if checksums is not None:
            expected = checksums[indices]
            actual = np.fromiter(map(crc32c, pieces), np.uint32, len(pieces))
            wrong = np.flatnonzero(actual != expected)
            attempt = 1
            while wrong.size:
                self._replaced_check()
                if not ranged or attempt == DEFAULT_ATTEMPTS:  # a verified local copy does not heal by reading again
                    raise _checksum_error(self.data_path, indices, wrong, actual, expected, attempt)
                time.sleep(backoff_delay(attempt))
                attempt += 1
                ranged = self._data_map is None
                again = self._read_data([ranges[position] for position in wrong.tolist()], self._data_size)
                for position, piece in zip(wrong.tolist(), again):
                    pieces[position] = piece
                    actual[position] = crc32c(piece)
                wrong = wrong[actual[wrong] != expected[wrong]]
        return starts, ends, bytearray().join(pieces)

    def _block_ranges(self, numbers: np.ndarray) -> list[tuple[int, int]]:
        """The stored byte ranges of blocks `numbers` (found by `ShardBlocks.locate`) in the data object."""
        starts, ends = self._index.blocks.stored_ranges(numbers)
        return list(zip(starts.tolist(), ends.tolist()))

    def _from_blocks(self, indices: np.ndarray, pieces: list[bytes] | None) -> tuple[bytes, np.ndarray]:
        """Records at `indices` of a 3.x shard, decoded back to back, and the offsets of each (§1.7): a ranged read
        fetches the stored frames of their distinct blocks, not the records' ranges; without `pieces` (the frames
        of `wanted_ranges`, fetched by the caller) the block decoded last is not fetched again. Frames failing their
        CRC32C are read again as `_gather` reads records again; one failing on every attempt is refused by name."""
        blocks = self._index.blocks
        located, numbers, cached = blocks.plan(indices)
        if pieces is not None:  # wanted_ranges' frames: every distinct block, whatever was decoded since
            numbers, cached = np.unique(located.numbers), (-1, b"")
        ranges = self._block_ranges(numbers)
        if pieces is None:
            ranged = self._data_map is None
            pieces = self._read_data(ranges, self._data_size)
        else:
            ranged = True
            self._note_ranged_read(sum(len(piece) for piece in pieces))
        pieces = self._frames_checked(pieces, ranges, blocks.block_checksums[numbers], ranged)
        ends = np.cumsum([len(piece) for piece in pieces], dtype=np.int64)
        return blocks.gather(located, b"".join(pieces), numbers, ends - np.array([len(piece) for piece in pieces], np.int64), ends, cached)

    def _frames_checked(self, pieces: list[bytes], ranges: list[tuple[int, int]], expected: np.ndarray, ranged: bool) -> list[bytes]:
        """`pieces`, the frames at `ranges`, with those that fail their `expected` CRC32C read again, with backoff,
        up to `DEFAULT_ATTEMPTS` reads in all (a read by ranges only): the block's own check (`ShardBlocks.gather`)
        then refuses what still fails, as damage at rest."""
        wrong = np.flatnonzero(np.fromiter(map(crc32c, pieces), np.uint32, len(pieces)) != expected)
        attempt = 1
        while wrong.size and ranged and attempt < DEFAULT_ATTEMPTS:
            self._replaced_check()
            time.sleep(backoff_delay(attempt))
            attempt += 1
            again = self._read_data([ranges[position] for position in wrong.tolist()], self._data_size)
            for position, piece in zip(wrong.tolist(), again):
                pieces[position] = piece
            wrong = np.array([position for position in wrong.tolist() if crc32c(pieces[position]) != expected[position]], np.int64)
        if wrong.size:
            self._replaced_check()
        return pieces

    def _read_data(self, ranges: list[tuple[int, int]], size: int) -> list[bytes]:
        """Bytes of each range of the data object: from the cached copy if `fetch_data` brought one, else by
        ranged requests."""
        data_map = self._data_map
        if data_map is not None:
            return [data_map[start:end] for start, end in ranges]
        try:
            pieces = self._location.transport().read_ranges(self.data_path, ranges, size=size)
        except (MissingFileError, StorageError, FormatError):  # a replacing dataset's objects fail ranges as well
            self._replaced_check()
            raise
        self._note_ranged_read(sum(len(piece) for piece in pieces))
        return pieces

    def _note_ranged_read(self, size: int) -> None:
        """Count bytes read by ranges; past `_fetch_whole_after` of them (set only when the node cache can hold
        the whole dataset), fetch the data object whole in the background, once per process (a child forked
        while its parent's fetch ran has no thread doing it): a shuffled epoch then reads each shard by ranges
        only until its copy arrives, and a few reads never download a shard."""
        self._ranged_bytes += size
        pid = os.getpid()
        if self._fetch_whole_after is not None and self._whole_requested_by != pid and self._ranged_bytes >= self._fetch_whole_after:
            self._whole_requested_by = pid
            if self._whole_data_key() not in _WHOLE_FETCH_FAILED:
                _BACKGROUND.submit(self._fetch_in_background)

    def _fetch_in_background(self) -> None:
        """`fetch_data`, off the reading thread: a failure leaves the reads on ranges, is logged, and is not tried
        again in this process (a shard reopened after its reader was dropped would download a damaged object
        whole, and log it, every time)."""
        try:
            self.fetch_data()
        except ClosedError:
            pass  # the reader was closed meanwhile: nobody needs the copy
        except VarstoreError as error:
            _WHOLE_FETCH_FAILED.add(self._whole_data_key())
            _log.warning("fetching the data object whole failed; this process reads it by ranges: %s", error)
        except Exception:  # nobody would see it otherwise
            _WHOLE_FETCH_FAILED.add(self._whole_data_key())
            _log.exception("fetching the data object whole failed; this process reads it by ranges: %s", self.data_path)

    def _whole_data_key(self) -> tuple[str, int, str]:
        return self.data_path, self.header.data_crc32c, self._identity

    # -- whole data --------------------------------------------------------------------------

    def fetch_data(self) -> None:
        """Bring the whole data object into the node cache (verified against the header's data CRC32C) and
        read it through a map from now on. Thread-safe; a second call does nothing."""
        self._check_open()
        if self._data_map is None:
            self._map_whole_data(self.header.data_crc32c)

    def _map_whole_data(self, data_crc32c: int) -> None:
        fd = self._fetch_and_open(self.data_path, self._data_size, data_crc32c)
        try:
            data_map = map_file(fd, self._data_size)
        finally:
            os.close(fd)
        if hasattr(self, "_index"):  # not while opening: `_open_parts` makes the reads of the copy once the index is open
            self._cached = _CachedData(self._index, data_map, self.data_path)
        self._data_map = data_map
        if getattr(self, "_closed", False):  # closed while a background fetch ran: close() did not see this map
            self._release_data_map()

    def _map_cached_data(self, data_crc32c: int) -> None:
        """Map the node cache's copy of the data object, if it has one (no request either way)."""
        local = self._location.cache.cached(self.data_path, self._data_size, data_crc32c, identity=self._identity)
        if local is None:
            return
        try:
            fd = os.open(local, os.O_RDONLY)
        except FileNotFoundError:
            return  # evicted meanwhile: read by ranges
        except OSError as error:
            raise StorageError(f"cannot open the cached copy: {error.strerror or error}", path=local) from None
        try:
            self._data_map = map_file(fd, self._data_size)
        finally:
            os.close(fd)

    def _fetch_index(self, index_size: int, index_crc32c: int) -> int:
        """`_fetch_and_open` of the index file. One that arrives with another CRC32C on every attempt is damaged at
        rest (or not this shard's): a `FormatError`, the shard's verdict (``on_damaged="skip"`` sets it aside),
        not a storage fault."""
        try:
            return self._fetch_and_open(self.index_path, index_size, index_crc32c)
        except DamagedDownloadError as error:
            raise FormatError(str(error).removeprefix(f"{error.path}: "), path=self.index_path) from error

    def _fetch_and_open(self, url: str, size: int, crc32c: int) -> int:
        """A descriptor of the node cache's copy of the object at `url`, downloaded (never more than `size` bytes
        read, on s3://) if no process on this node has it, and opened before any eviction can remove it (however
        small the cache limit and however many readers share it). A download failing its size or CRC32C is
        fetched again, with backoff, up to `DEFAULT_ATTEMPTS` times in all, unless the dataset was replaced
        meanwhile (`_replaced_check` raises) or the object is not `size` bytes (a `FormatError`: on a transport
        whose downloads do not check the size, the first failure asks it with a HEAD)."""
        transport = self._location.transport()
        attempt = 1
        while True:
            try:
                return self._location.cache.open(
                    url, size, crc32c, lambda temporary: transport.download_file(url, temporary, size=size),
                    identity=self._identity,
                )
            except DamagedDownloadError as error:
                self._replaced_check()
                if attempt == 1 and not transport.checks_object_size:
                    self._refuse_other_size(url, size)
                if attempt == DEFAULT_ATTEMPTS:
                    message = str(error).removeprefix(f"{error.path}: ")
                    raise DamagedDownloadError(f"{message} (downloaded {attempt} times)", path=url) from error
                time.sleep(backoff_delay(attempt))
                attempt += 1
            except (MissingFileError, StorageError, FormatError):
                self._replaced_check()
                raise

    def verify(self, progress: Callable[[int], None] | None = None) -> None:
        """Fetch the whole data object (`fetch_data`), then check every byte and every rule a read checks, as
        `Reader.verify` does."""
        self.fetch_data()
        buffer = shard_buffer(self._index, self._data_map)
        self._index.verify(self._data_map, buffer.decode, progress)

    def _raise_if_header_changed(self) -> None:
        """A shard opened alone, whose read failed: raise `DatasetReplacedError` if its index header is no longer
        the one this reader opened (one HEAD and one 64-byte GET). If storage does not answer, the read's own
        error stands."""
        transport, index_url = self._location.transport(), self.path + fmt.INDEX_SUFFIX
        try:
            size = transport.object_info(index_url).size
            head = transport.read_ranges(index_url, [(0, min(fmt.HEADER_SIZE, size))], size=size)[0]
        except MissingFileError:
            head = b""
        except StorageError:
            return
        found = crc32c(head[: fmt.HEADER_SIZE - fmt.CHECKSUM_SIZE]) if len(head) == fmt.HEADER_SIZE else None
        if found != self.version:
            raise replaced_error(self.kind, self.path, self.version, found)

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Release the maps; arrays already returned stay valid until they are freed."""
        if self._closed:
            return
        self._closed = True
        self._count = 0
        self._index.close()
        self._release_data_map()

    def _release_data_map(self) -> None:
        cached, self._cached = self._cached, None
        if cached is not None:
            cached.release()  # before the map closes: its slicer holds a view of it
        data_map, self._data_map = self._data_map, None
        if isinstance(data_map, mmap.mmap):
            try:
                data_map.close()
            except BufferError:
                pass  # arrays returned to the caller still view it; it closes when they are freed

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "location": self._location.state()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._location = RemoteLocation.from_state(state["location"])
        self._replaced_check = _while_opening
        super().__setstate__(state)
        self._replaced_check = self._raise_if_header_changed


class _CachedData:
    """The data object whole in the node cache, read as `Reader` reads its map: ranges checked, records decoded
    straight from the map (by the C slicer where `Reader` uses it), no copy per record. Each record's CRC32C is
    checked first, from the map: the copy was verified whole on arrival, and this catches one damaged at rest
    since (a shared node cache outlives many readers) as a read by ranges would, naming the record."""

    def __init__(self, index: ShardIndex, data_map: mmap.mmap | bytes, data_path: str) -> None:
        self._index = index
        self._map = data_map
        self._data_path = data_path
        self._buffer = shard_buffer(index, data_map)
        slicer = record_slicer(index, data_map)
        if slicer is not None and not hasattr(slicer, "get_batch"):  # a compressed shard's: single reads only
            slicer.release()
            slicer = None
        self._slicer = slicer

    def _checked_ranges(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
        """(starts, ends) of the records at `indices`, checked against the index and their CRC32Cs, and both as lists."""
        starts, ends = self._index.checked_ranges(indices)
        start_list, end_list = starts.tolist(), ends.tolist()
        checksums = self._index.checksums
        if checksums is not None:
            expected = checksums[indices]
            with memoryview(self._map) as view:
                actual = np.frombuffer(crc32c_of_each([view[start:end] for start, end in zip(start_list, end_list)]), np.uint32)
            wrong = np.flatnonzero(actual != expected)
            if wrong.size:
                raise _checksum_error(self._data_path, indices, wrong, actual, expected, 1)
        return starts, ends, start_list, end_list

    def get_batch(self, indices: np.ndarray) -> list[Any]:
        if self._index.blocks is not None:  # each block's CRC32C is checked, from the map, as the index reads it
            return decode_gathered(self._index, indices, *self._index.gather_from_blocks(indices, self._map))
        starts, ends, _, _ = self._checked_ranges(indices)
        if self._slicer is not None and (records := self._slicer.get_batch(indices)) is not None:
            return records
        return decode_records(self._index, self._buffer, indices, starts, ends)

    def get_batch_flat(self, indices: np.ndarray) -> FlatBatch:
        if self._index.blocks is not None:
            return pack_gathered(self._index, indices, *self._index.gather_from_blocks(indices, self._map))
        starts, ends, start_list, end_list = self._checked_ranges(indices)
        with memoryview(self._map) as view:
            joined = bytearray().join([view[start:end] for start, end in zip(start_list, end_list)])
        return pack_flat(self._index, indices, starts, ends, joined)

    def release(self) -> None:
        if self._slicer is not None:
            self._slicer.release()
        self._slicer = None


def _checksum_error(
    data_path: str, indices: np.ndarray, wrong: np.ndarray, actual: np.ndarray, expected: np.ndarray, attempts: int
) -> CorruptRecordError:
    """The error for the records at positions `wrong` of `indices`, whose bytes had CRC32Cs `actual`, not `expected`."""
    position = int(wrong[0])
    return CorruptRecordError(
        f"record {int(indices[position])} checksum is {int(actual[position]):#010x}, expected "
        f"{int(expected[position]):#010x}: the object changed or arrived damaged"
        + (f" (read {attempts} times)" if attempts > 1 else ""),
        path=data_path,
        records=indices[wrong].tolist(),
    )


def _refuse_unrecorded_data_crc(fd: int, header: fmt.Header, index_path: str) -> None:
    """A shard whose data CRC32C is not recorded (§1.2, §4.1) is refused before its data is fetched: every download
    of a data object is checked by that CRC. Its metadata is parsed here only if it names the member."""
    if header.major_version != fmt.MAJOR_VERSION:
        return
    raw = pread_exactly(fd, header.metadata_size, fmt.HEADER_SIZE, index_path)
    if DATA_CRC_MEMBER.encode() in raw and not fmt.data_crc_recorded(
            header, parse_strict_json(raw, MAX_METADATA_DEPTH, what="metadata", path=index_path), path=index_path):
        raise FormatError("its data CRC32C is not recorded (a Megatron import without --data-crc), and object storage "
                          "checks every download of a data object by it: import it again with --data-crc", path=index_path)


def fetch_whole_after(data_size: int, dataset_size: int, cache_limit: int | None) -> int | None:
    """After how many bytes of ranged reads a shard of `data_size` bytes is fetched whole: a sixteenth of it, when
    the node cache can hold all `dataset_size` bytes of the dataset (its data and index objects); else never
    (None), since a shuffled epoch over a dataset larger than the cache would evict and fetch shards again and again."""
    if cache_limit is not None and dataset_size > cache_limit:
        return None
    return data_size // _FETCH_WHOLE_FRACTION


class _BackgroundFetches:
    """This process's threads fetching data objects whole (`_note_ranged_read`). They are daemons: a process
    exits without waiting for the downloads queued or running (a whole dataset, once every shard passed its
    sixteenth); one cut short leaves only a temporary file, as a kill does. Made again in a forked child."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] | None = None
        self._lock = threading.Lock()

    def submit(self, action: Callable[[], None]) -> None:
        with self._lock:
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                for number in range(_BACKGROUND_FETCHES):
                    threading.Thread(target=_run_jobs, args=(self._jobs,), name=f"varstore-fetch-{number}", daemon=True).start()
            self._jobs.put(action)

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's threads are not here, and its lock may have been held at the fork."""
        self._jobs = None
        self._lock = threading.Lock()


def _run_jobs(jobs: queue.SimpleQueue[Callable[[], None]]) -> None:
    while True:
        jobs.get()()  # `_fetch_in_background`, which raises nothing


_BACKGROUND = _BackgroundFetches()
# Data objects (URL, data CRC32C) whose background whole fetch failed in this process: not fetched whole again.
_WHOLE_FETCH_FAILED: set[tuple[str, int]] = set()
os.register_at_fork(after_in_child=_BACKGROUND.forget_after_fork)


def _while_opening() -> None:
    """A shard opened alone has no version to compare with until it is open: its open errors stand."""


def _offsets_of(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum((ends - starts).astype(np.int64), out=offsets[1:])
    return offsets

