"""`Reader`: random access to the records of one shard through memory maps of its two files.

The index, and every rule a read checks, is a `ShardIndex` (varstore/shard/index.py);
this module is the data access: mapping the data file, slicing and gathering
records, iteration and prefetch.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import stat
import struct
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from .._native import speedups
from ..errors import FormatError, MissingFileError, RecordIndexError, RecordTypeError, StorageError, VarstoreError
from ..format import header as fmt
from ..format.checksum import crc32c
from ..format.codecs import Codec
from ..local.file_url import resolve_file_url
from ..local.mapping import advise_will_need, map_data_file, pread_exactly
from .index import DECODE_ERRORS as _DECODE_ERRORS
from .index import ITERATION_CHUNK as _ITERATION_CHUNK
from .index import VERIFY_CHUNK_BYTES, ShardIndex
from .reader_base import ShardReaderBase

_PAIR = struct.Struct("<QQ")


class FlatBatch(NamedTuple):
    """Records packed back to back: record k is ``values[offsets[k]:offsets[k + 1]]``.

    For ``ndarray`` shards `values` has the shard's dtype and trailing shape and
    offsets count rows; otherwise `values` is uint8 payload bytes.
    """

    values: np.ndarray
    offsets: np.ndarray


def _open_read(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO in a shard's place must not block the open
    except FileNotFoundError:
        raise MissingFileError("no such file", path=path) from None
    except OSError as error:
        raise StorageError(f"cannot open: {error.strerror}", path=path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FormatError("not a regular file, expected a shard file", path=path)
    return fd


def _pread_whole(fd: int, path: str, offset: int, length: int) -> bytes:
    """`length` bytes at `offset`, in as many reads as it takes (Linux returns at most 2 GiB per read), or a
    FormatError if the file ends first: it shrank after the shard was opened."""
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    pieces, done = [data], len(data)
    while done < length:
        piece = os.pread(fd, length - done, offset + done)
        if not piece:
            raise FormatError(f"file ended at {offset + done} bytes, before the {offset + length} its index gives: it shrank", path=path)
        pieces.append(piece)
        done += len(piece)
    return b"".join(pieces)


def _reader_into(buffer: bytearray, fd: int, path: str) -> Callable[[int, int], Any]:
    """Reads (offset, length) of `fd` into the one `buffer`, each valid until the next (so a sequential pass stays in
    the CPU's cache and faults no fresh memory in); a read longer than `buffer` gets bytes of its own."""
    view = memoryview(buffer)

    def read(offset: int, length: int) -> Any:
        if length > len(buffer):
            return _pread_whole(fd, path, offset, length)
        target = view[:length]
        done = os.preadv(fd, [target], offset)
        if done != length:
            raise FormatError(f"file ended at {offset + done} bytes, before the {offset + length} its index gives: it shrank", path=path)
        return target

    return read


def check_indices(indices: Any, count: int, path: str) -> np.ndarray:
    """`indices` as an int64 array with negatives resolved, or an error naming the first one out of range."""
    array = np.asarray(indices)
    if array.size == 0:
        return np.zeros(0, np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise RecordTypeError(f"indices must be a 1-D sequence of integers, got {array.dtype} of shape {array.shape}", path=path)
    low, high = int(array.min()), int(array.max())
    if low < -count or high >= count:
        bad = low if low < -count else high
        raise RecordIndexError(f"record {bad} is out of range for {count} records", path=path)
    resolved = array.astype(np.int64, copy=False)
    return resolved + count * (resolved < 0) if low < 0 else resolved


class RecordBuffer(NamedTuple):
    """Bytes holding records and what turns them into records: a data file's map, or bytes fetched for a batch."""

    data: Any
    decode: Callable[[Any, int, int], Any] | None  # None for ``bytes`` records, which are the bytes themselves
    rows: np.ndarray | None  # an ``ndarray`` shard's bytes as one array of rows
    bool_bytes: np.ndarray | None  # a ``|b1`` shard's bytes, which reads check are 0 or 1 (§2.1)


def record_buffer(codec: Codec, data: Any) -> RecordBuffer:
    """`data` (whole rows, for an ``ndarray`` codec) as a `RecordBuffer` of `codec`'s records."""
    dtype = getattr(codec, "dtype", None)
    return RecordBuffer(
        data,
        None if codec.name == "bytes" else codec.decoder_for(data),
        codec.rows(data) if dtype is not None else None,  # type: ignore[attr-defined]
        np.frombuffer(data, np.uint8) if dtype is not None and dtype.kind == "b" else None,
    )


def shard_buffer(index: ShardIndex, data: Any) -> RecordBuffer:
    """`data` (a shard's data file, or bytes fetched from it) as the `RecordBuffer` reads of `index`'s records take:
    a compressed shard's frames are decompressed by `decode_records` (a 3.x shard's blocks by the index), so its
    buffer is the stored bytes alone."""
    if index.decompressor is not None or index.blocks is not None:
        return RecordBuffer(data, None, None, None)
    return record_buffer(index.codec, data)


def decompressed(
    index: ShardIndex, data: Any, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The frames at [starts, ends) of `data` (records `indices` of a compressed shard) decoded back to back in one
    call, with each record's range in the result; an ``ndarray`` record's declared size is checked to be whole rows
    before anything is decoded. Frames that fail a rule of §1.6 raise the read's CorruptRecordError."""
    sizes = index.sizes[indices].astype(np.int64)  # type: ignore[index]
    decoded_offsets = np.zeros(len(indices) + 1, np.int64)
    np.cumsum(sizes, out=decoded_offsets[1:])
    if index.dtype is not None:
        index.check_rows(indices, decoded_offsets[:-1], decoded_offsets[1:])
    try:
        decoded = index.decompressor.decompress_many(data, starts, ends, sizes)  # type: ignore[union-attr]
    except ValueError:
        for record, start, end, size in zip(indices.tolist(), starts.tolist(), ends.tolist(), sizes.tolist()):
            index.decompress(record, data, start, end, size)
        raise
    return decoded, decoded_offsets[:-1], decoded_offsets[1:]


def decode_records(index: ShardIndex, buffer: RecordBuffer, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[Any]:
    """Records at `indices`, the byte ranges [starts, ends) of `buffer`, decoded after every check a read makes
    (for a compressed shard, after decompressing the frames there in one call)."""
    if index.decompressor is not None:
        joined, starts, ends = decompressed(index, buffer.data, indices, starts, ends)
        buffer = record_buffer(index.codec, joined)
    if buffer.rows is not None:
        row_size = index.check_rows(indices, starts, ends)
        if buffer.bool_bytes is not None:
            index.check_bools(buffer.bool_bytes, indices, starts, ends)
        rows = buffer.rows
        return [rows[start:end] for start, end in zip((starts // row_size).tolist(), (ends // row_size).tolist())]
    data = buffer.data
    starts, ends = starts.tolist(), ends.tolist()
    decode = buffer.decode
    if decode is None:
        return [data[start:end] for start, end in zip(starts, ends)]
    try:
        return [decode(data, start, end) for start, end in zip(starts, ends)]
    except _DECODE_ERRORS:
        for record, start, end in zip(indices.tolist(), starts, ends):
            try:
                decode(data, start, end)
            except _DECODE_ERRORS as error:
                raise index.decode_error(record, error) from None
        raise


def decode_gathered(index: ShardIndex, indices: np.ndarray, joined: bytes, offsets: np.ndarray) -> list[Any]:
    """Records at `indices` of a 3.x shard, their decoded bytes back to back in `joined` at `offsets` (N + 1; from
    `ShardIndex.gather_from_blocks`), decoded after every check a read makes."""
    starts, ends = offsets[:-1], offsets[1:]
    if index.dtype is not None:
        index.check_rows(indices, starts, ends)
    return decode_records(index, record_buffer(index.codec, joined), indices, starts, ends)


def pack_gathered(index: ShardIndex, indices: np.ndarray, joined: bytes, offsets: np.ndarray) -> FlatBatch:
    """`decode_gathered`'s records as a `FlatBatch`, checked as `pack_flat` checks them."""
    return pack_flat(index, indices, offsets[:-1], offsets[1:], bytearray(joined))


def pack_flat(index: ShardIndex, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray, joined: bytearray) -> FlatBatch:
    """Records at `indices` (stored at [starts, ends)), already copied back to back into `joined`, as a
    `FlatBatch`, after every check a read makes (for ``msgpack``, by decoding each; a compressed shard's frames
    are decompressed first, so the batch holds the records' decoded bytes)."""
    if index.decompressor is not None:
        stored = np.zeros(len(indices) + 1, np.int64)
        np.cumsum((ends - starts).astype(np.int64), out=stored[1:])
        decoded, starts, ends = decompressed(index, joined, indices, stored[:-1], stored[1:])
        joined = bytearray(decoded)
    offsets = np.zeros(len(indices) + 1, np.int64)
    np.cumsum((ends - starts).astype(np.int64), out=offsets[1:])
    values = np.frombuffer(joined, np.uint8)
    codec = index.codec
    if index.dtype is None:
        index.check_payloads(None if codec.name == "bytes" else codec.decode, indices, joined, offsets)
        return FlatBatch(values, offsets)
    row_size = index.check_rows(indices, starts, ends)
    if index.dtype.kind == "b":
        index.check_bools(values, indices, offsets[:-1], offsets[1:])
    return FlatBatch(values.view(index.dtype).reshape((-1, *(getattr(codec, "shape", None) or ()))), offsets // row_size)


def record_slicer(index: ShardIndex, data_map: Any) -> Any:
    """The C extension's reads of `index`'s ``bytes`` and ``str`` records from `data_map` (the whole data file),
    which decline (None) whenever a record needs the Python path's checks or error; None without the extension
    and for other codecs. A compressed shard's are `FrameSlicer`'s (2.x) or `BlockSlicer`'s (3.x), which decode
    in this thread only."""
    if speedups is None or index.codec.name not in ("bytes", "str"):
        return None
    as_str = index.codec.name == "str"
    blocks, decompressor = index.blocks, index.decompressor
    if blocks is not None:
        return speedups.BlockSlicer(blocks.offsets, blocks.block_offsets, blocks.block_records, blocks.block_checksums,
                                    data_map, as_str, blocks.decompressor.dictionary_id, blocks.decompressor.thread_decompress())
    if decompressor is None:
        return speedups.RecordSlicer(index.map, index.header.offsets_start, index.count, data_map, as_str)
    return speedups.FrameSlicer(index.map, index.header.offsets_start, index.count, index.sizes, data_map, as_str,
                                decompressor.dictionary_id, decompressor.thread_decompress())


class Reader(ShardReaderBase):
    """A shard opened for reading; indexing, slicing and iteration return decoded records.

    Opening reads the 64-byte header, the metadata block, the first and last
    offsets and the first and last 4 KiB of the data file with ``pread``, never
    through the maps, whatever the record count; it keeps the codec parameters
    and parses the user metadata again only when `metadata` is read. Reads are
    a bounds check and a slice of the map. With ``verify_reads=True`` every read
    also checks the record's CRC32C.
    """

    def __init__(self, path: str | os.PathLike[str], *, verify_reads: bool = False) -> None:
        self.path = resolve_file_url(path)
        self.verify_reads = verify_reads
        self._open()

    def _open(self) -> None:
        self.data_path, self.index_path = fmt.shard_paths(self.path)
        with self._opened_files() as (index_fd, data_fd):
            self._map_files(index_fd, data_fd)
        self._closed = False

    @contextlib.contextmanager
    def _opened_files(self) -> Iterator[tuple[int, int]]:
        """The index and data files open for reading, closed afterwards; an OSError of fstat, pread or mmap
        becomes a StorageError (the storage failed, not the format)."""
        index_fd = _open_read(self.index_path)
        try:
            data_fd = _open_read(self.data_path)
            try:
                yield index_fd, data_fd
            except OSError as error:
                raise StorageError(f"reading the shard failed: {error.strerror or error}", path=self.path) from None
            finally:
                os.close(data_fd)
        finally:
            os.close(index_fd)

    def _map_files(self, index_fd: int, data_fd: int) -> None:
        """Check the shard as §1.3 says, reading with `pread` only (`ShardIndex.open`), then map both files."""
        data_path = self.data_path
        data_stat = os.fstat(data_fd)
        data_size = data_stat.st_size
        index = ShardIndex.open(
            index_fd,
            data_size,
            lambda offset, length: pread_exactly(data_fd, length, offset, data_path),
            index_path=self.index_path,
            data_path=data_path,
        )
        self._index = index
        self._index_map = index.map
        self._codec: Codec = index.codec
        self._data_map = map_data_file(data_fd, data_size)
        self.header = index.header
        self._count = index.count
        self._data_size = data_size
        self._data_file = (data_stat.st_dev, data_stat.st_ino)
        self._offsets_start = index.header.offsets_start
        self._offsets = index.offsets
        if self.verify_reads and index.checksums is None and index.blocks is None:  # every read checks a block's CRC32C
            raise FormatError("verify_reads=True but this shard was written without record checksums", path=self.index_path)
        self._decompressor = index.decompressor
        self._blocks = index.blocks
        self._buffer = shard_buffer(index, self._data_map)
        self._decode, self._rows, self._bool_bytes = self._buffer.decode, self._buffer.rows, self._buffer.bool_bytes
        self._payload_decode = None if self._codec.name == "bytes" else self._codec.decode
        self._slicer = self._record_slicer()
        self._fast_get = self._slicer and self._slicer.get
        self._fast_batch = getattr(self._slicer, "get_batch", None)  # a compressed shard's batches are decoded in one call

    def _record_slicer(self) -> Any:
        """`record_slicer` of this shard's map; None with verify_reads, whose checks are the Python path's."""
        return None if self.verify_reads else record_slicer(self._index, self._data_map)

    # -- description -------------------------------------------------------------------------

    @functools.cached_property
    def metadata(self) -> dict[str, Any]:
        """The user metadata the writer stored, parsed from the mapped index on first use and kept."""
        self._check_open()
        return self._index.metadata()

    def as_array(self) -> np.ndarray:
        """The whole data file of an ``ndarray`` shard as one read-only array of rows (zero copy; not for a compressed
        shard, whose records are decompressed copies)."""
        self._check_open()
        if self.dtype is None:
            raise RecordTypeError(f"as_array needs an ndarray shard, this one is {self.codec}", path=self.path)
        if self._decompressor is not None or self._blocks is not None:
            raise RecordTypeError("as_array views the data file in place, which a compressed shard cannot offer; "
                                  "read its records (get_batch, iter_flat) instead", path=self.path)
        if self._bool_bytes is not None and self._count:
            offsets = self._index.checked_offsets(0, self._count)
            self._index.check_bools(self._bool_bytes, np.arange(self._count), offsets[:-1], offsets[1:])
        return self._rows

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"Reader({self.path!r}, records={self._count}, codec={self.codec!r})"

    # -- single reads ------------------------------------------------------------------------

    def __getitem__(self, index: Any) -> Any:
        if self._fast_get is not None and (record := self._fast_get(index)) is not None:
            return record
        if index.__class__ is not int:
            return self._get_other(index)
        count = self._count
        if not -count <= index < count:
            raise self._index_error(index)
        if index < 0:
            index += count
        if self._blocks is not None:
            return self._index.read_in_block(index, self._data_map)
        start, end = _PAIR.unpack_from(self._index_map, self._offsets_start + 8 * index)
        if not start <= end <= self._data_size:
            raise self._index.offsets_error(index, start, end)
        if self.verify_reads:
            self._index.verify_record(index, self._data_map, start, end)
        if self._decompressor is not None:
            return self._read_frame(index, start, end)
        if self._decode is None:
            return self._data_map[start:end]
        try:
            return self._decode(self._data_map, start, end)
        except _DECODE_ERRORS as error:
            raise self._index.decode_error(index, error) from None

    def _read_frame(self, index: int, start: int, end: int) -> Any:
        """Record `index` of a compressed shard, its frame at [start, end): decompressed, then decoded (an
        ``ndarray`` codec's decode refuses a payload of partial rows or, for ``|b1``, bytes other than 0 or 1)."""
        payload = self._index.decompress(index, self._data_map, start, end, self._index.sizes.item(index))
        if self._payload_decode is None:
            return payload
        try:
            return self._payload_decode(payload, 0, len(payload))
        except _DECODE_ERRORS as error:
            raise self._index.decode_error(index, error) from None

    def _index_error(self, index: int) -> Exception:
        self._check_open()
        return RecordIndexError(f"record {index} is out of range for {self._count} records", path=self.path)

    # -- many reads --------------------------------------------------------------------------

    def _check_indices(self, indices: Any) -> np.ndarray:
        self._check_open()
        return check_indices(indices, self._count, self.path)

    def _checked_ranges(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        starts, ends = self._index.checked_ranges(indices)
        if self.verify_reads:
            for index, start, end in zip(indices.tolist(), starts.tolist(), ends.tolist()):
                self._index.verify_record(index, self._data_map, start, end)
        return starts, ends

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """Records at `indices`, in that order; offsets are gathered and checked with numpy in one pass."""
        if self._fast_batch is not None and (records := self._fast_batch(indices)) is not None:
            return records
        indices = self._check_indices(indices)
        if self._blocks is not None:
            return decode_gathered(self._index, indices, *self._index.gather_from_blocks(indices, self._data_map))
        starts, ends = self._checked_ranges(indices)
        return self._decode_ranges(indices, starts, ends)

    def _decode_ranges(self, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[Any]:
        return decode_records(self._index, self._buffer, indices, starts, ends)

    def get_batch_flat(self, indices: Sequence[int] | np.ndarray) -> FlatBatch:
        """Records at `indices` packed into one buffer plus offsets, the form variable-length collation wants.

        Every record is checked as a read checks it (for ``msgpack``, by decoding it) and returned as stored."""
        indices = self._check_indices(indices)
        if self._blocks is not None:
            return pack_gathered(self._index, indices, *self._index.gather_from_blocks(indices, self._data_map))
        starts, ends = self._checked_ranges(indices)
        with memoryview(self._data_map) as view:
            joined = bytearray().join([view[start:end] for start, end in zip(starts.tolist(), ends.tolist())])
        return pack_flat(self._index, indices, starts, ends, joined)  # one copy, into a writable buffer of its own

    def _contiguous_offsets(self, start: int, stop: int) -> np.ndarray:
        """Offsets of records [start, stop), checked in one pass (and their checksums with verify_reads), prefetched."""
        self._check_open()
        offsets = self._index.checked_offsets(start, stop)
        if stop > start:
            self._prefetch(int(offsets[0]), int(offsets[-1]))
        if self.verify_reads:
            bounds = offsets.tolist()
            for index in range(start, stop):
                self._index.verify_record(index, self._data_map, bounds[index - start], bounds[index - start + 1])
        return offsets

    def _read_range(self, start: int, stop: int) -> list[Any]:
        if self._blocks is not None:
            self._check_open()
            return self.get_batch(np.arange(start, stop))
        offsets = self._contiguous_offsets(start, stop)
        return self._decode_ranges(np.arange(start, stop), offsets[:-1], offsets[1:])

    def iter_flat(self, batch_size: int = _ITERATION_CHUNK) -> Iterator[FlatBatch]:
        """Consecutive records, `batch_size` at a time, as zero-copy `FlatBatch` views of the map.

        The sequential scan without a Python object per record: values are a
        read-only view of the data file, offsets count from the batch's start.
        Every record is checked as a read checks it (``str``: one vectorised UTF-8
        pass; ``msgpack``: each record decoded, so no faster than reading it).
        """
        self._check_open()
        if batch_size < 1:
            raise RecordTypeError(f"batch_size must be positive, not {batch_size}", path=self.path)
        for start in range(0, self._count, batch_size):
            stop = min(start + batch_size, self._count)
            if self._decompressor is not None or self._blocks is not None:  # decoded copies: no bytes to view in place
                yield self.get_batch_flat(np.arange(start, stop))
                continue
            offsets = self._contiguous_offsets(start, stop)
            base = int(offsets[0])
            relative = offsets.astype(np.int64) - base
            if self._rows is None:
                self._index.check_payloads(self._decode, np.arange(start, stop), self._data_map, offsets)
                values = np.frombuffer(self._data_map, np.uint8, int(relative[-1]), base) if self._data_size else np.zeros(0, np.uint8)
                yield FlatBatch(values, relative)
                continue
            row_size = self._index.check_rows(np.arange(start, stop), offsets[:-1], offsets[1:])
            if self._bool_bytes is not None:
                self._index.check_bools(self._bool_bytes, np.arange(start, stop), offsets[:-1], offsets[1:])
            first_row = base // row_size
            yield FlatBatch(self._rows[first_row : first_row + int(relative[-1]) // row_size], relative // row_size)

    def _prefetch(self, start: int, end: int) -> None:
        """Ask the kernel to read a range ahead: a cold file's map is MADV_RANDOM, so sequential readers say so."""
        if end > start and hasattr(self._data_map, "madvise"):
            page_start = start - start % mmap.PAGESIZE
            self._data_map.madvise(mmap.MADV_WILLNEED, page_start, end - page_start)  # type: ignore[union-attr]

    def prefetch(self, start: int, stop: int) -> None:
        """Ask the kernel to start reading records [start, stop) into the page cache; advisory, so damage is ignored."""
        self._check_open()
        start, stop, _ = slice(start, stop).indices(self._count)
        if stop > start and self._blocks is not None:
            self._prefetch(*self._blocks.stored_span(start, stop))
        elif stop > start:
            end = min(int(self._offsets[stop]), self._data_size)
            self._prefetch(min(int(self._offsets[start]), end), end)

    def will_need(self, indices: Sequence[int] | np.ndarray) -> None:
        """Ask the kernel to start reading the pages of records `indices`, and only those, into the page cache
        without waiting: for a caller that knows its coming reads (`ExactlyOnceSampler`'s look-ahead). Advisory,
        so indices out of range, damaged offsets or a data file replaced since the open give no advice and no error."""
        if self._closed:
            return
        try:
            indices = check_indices(indices, self._count, self.path)
            if self._blocks is not None:
                starts, ends = self._blocks.stored_ranges(self._blocks.locate(indices).numbers)
            else:
                starts, ends = self._index.checked_ranges(indices)
            fd = os.open(self.data_path, os.O_RDONLY | os.O_NONBLOCK)
        except (VarstoreError, OSError):
            return
        try:
            if os.fstat(fd).st_size == self._data_size:
                advise_will_need(fd, starts, ends)
        finally:
            os.close(fd)

    def __iter__(self) -> Iterator[Any]:
        self._check_open()
        for start in range(0, self._count, _ITERATION_CHUNK):
            yield from self._read_range(start, min(start + _ITERATION_CHUNK, self._count))

    # -- checking ----------------------------------------------------------------------------

    def verify(self, progress: Callable[[int], None] | None = None) -> None:
        """Check every byte and, for every record, every rule a read checks (§1.3); see `ShardIndex.verify`.

        Raises on a damaged structure at once; damaged records are all listed in one
        CorruptRecordError. `progress` receives byte counts of the data file. A shard whose data CRC32C is not
        recorded (``header.data_crc_recorded`` False, §1.2) is checked for everything else: `varstore.verify`'s
        report names it.

        Both files are opened again and read with ``pread``, not through the maps (a hole of a sparse file on a
        full filesystem faults with SIGBUS, which would kill the process). Files replaced since this reader
        opened them (or removed) are not the ones it reads: then the reader's own view is verified, through its
        maps. The data file it mapped, changed in size since (truncated in place), is refused: its map would fault.
        """
        self._check_open()
        try:
            with self._opened_files() as (index_fd, data_fd):
                head = os.pread(index_fd, fmt.HEADER_SIZE, 0)
                found = crc32c(head[: fmt.HEADER_SIZE - fmt.CHECKSUM_SIZE]) if len(head) == fmt.HEADER_SIZE else None
                data_stat = os.fstat(data_fd)
                if (data_stat.st_dev, data_stat.st_ino) == self._data_file and data_stat.st_size != self._data_size:
                    raise FormatError(
                        f"is {data_stat.st_size} bytes, but was {self._data_size} when this reader opened it: changed "
                        "in place since (truncated or extended); open the shard again",
                        path=self.data_path,
                    )
                if found == self.version and data_stat.st_size == self._data_size:
                    self._index.verify(
                        _reader_into(bytearray(VERIFY_CHUNK_BYTES), data_fd, self.data_path),
                        self._decode,
                        progress,
                        read_index=functools.partial(_pread_whole, index_fd, self.index_path),
                    )
                    return
        except MissingFileError:
            pass
        self._index.verify(self._data_map, self._decode, progress)

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Release the maps; arrays already returned stay valid until they are freed."""
        if self._closed:
            return
        self._closed = True
        self._count = 0
        if self._slicer is not None:
            self._slicer.release()  # before the maps close: it holds a view of each
        self._slicer = self._fast_get = self._fast_batch = None
        self._offsets = self._decode = self._rows = self._bool_bytes = self._buffer = self._decompressor = self._blocks = None  # type: ignore[assignment]
        self._index.close()
        if isinstance(self._data_map, mmap.mmap):
            try:
                self._data_map.close()
            except BufferError:
                pass  # arrays returned to the caller still view it; it closes when they are freed
