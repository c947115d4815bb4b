"""`Reader`: random access to the records of one shard through memory maps of its two files."""

from __future__ import annotations

import codecs
import functools
import mmap
import os
import stat
import struct
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from . import format as fmt
from .checksum import crc32c, crc32c_of_range
from .codecs import Codec, check_bool_bytes, codec_from_stored
from .errors import (
    ClosedError,
    CorruptRecordError,
    FormatError,
    MissingFileError,
    RecordIndexError,
    RecordTypeError,
    StorageError,
)
from .reader_base import ReaderBase

_OFFSET = struct.Struct("<Q")
_PAIR = struct.Struct("<QQ")
_ITERATION_CHUNK = 4096
_MAX_LISTED_RECORDS = 20
_UTF8_PIECE = 8 << 20
_DECODE_ERRORS = (ValueError, TypeError, UnicodeDecodeError)  # what a codec's decode raises on bad bytes


class FlatBatch(NamedTuple):
    """Records packed back to back: record k is ``values[offsets[k]:offsets[k + 1]]``.

    For ``ndarray`` shards `values` has the shard's dtype and trailing shape and
    offsets count rows; otherwise `values` is uint8 payload bytes.
    """

    values: np.ndarray
    offsets: np.ndarray


def _map_file(fd: int, size: int) -> mmap.mmap | bytes:
    if size == 0:
        return b""
    mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_RANDOM)
    return mapped


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


def _pread_exactly(fd: int, size: int, offset: int, path: str) -> bytes:
    """`size` bytes at `offset`, read without a map; a short read means the file shrank after its size was checked."""
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise FormatError(f"file ended at {offset + len(data)} bytes while being opened: it changed meanwhile", path=path)
    return data


def _is_utf8(data: Any, start: int, end: int) -> bool:
    """Whether `data[start:end]` is valid UTF-8, decoded in bounded pieces so a large range is never copied whole."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with memoryview(data) as view:
        try:
            for piece in range(start, end, _UTF8_PIECE):
                decoder.decode(view[piece : min(piece + _UTF8_PIECE, end)], final=piece + _UTF8_PIECE >= end)
        except UnicodeDecodeError:
            return False
    return True


def _non_utf8_positions(buffer: Any, offsets: np.ndarray) -> list[int]:
    """Positions k of the records ``buffer[offsets[k]:offsets[k + 1]]`` that are not valid UTF-8.

    Vectorised: when the bytes from offsets[0] to offsets[-1] decode as a whole and no
    record starts on a UTF-8 continuation byte, every record is whole characters, so
    each decodes. Only a range failing that test is decoded record by record.
    """
    start, end = int(offsets[0]), int(offsets[-1])
    if start == end:
        return []
    starts = offsets[offsets < end]
    if not (np.frombuffer(buffer, np.uint8)[starts] & 0xC0 == 0x80).any() and _is_utf8(buffer, start, end):
        return []
    bounds = offsets.tolist()
    return [position for position, (first, last) in enumerate(zip(bounds, bounds[1:])) if not _is_utf8(buffer, first, last)]


def _describe(indices: list[int]) -> str:
    shown = ", ".join(map(str, indices[:_MAX_LISTED_RECORDS]))
    return shown + (f" and {len(indices) - _MAX_LISTED_RECORDS} more" if len(indices) > _MAX_LISTED_RECORDS else "")


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


class Reader(ReaderBase):
    """A shard opened for reading; indexing, slicing and iteration return decoded records.

    Opening reads the 64-byte header, the metadata block, the first and last
    offsets and the first and last 4 KiB of the data file with ``pread``, never
    through the maps, whatever the record count; it keeps the codec parameters
    and parses the user metadata again only when `metadata` is read. Reads are
    a bounds check and a slice of the map. With ``verify_reads=True`` every read
    also checks the record's CRC32C.
    """

    def __init__(self, path: str | os.PathLike[str], *, verify_reads: bool = False) -> None:
        self.path = os.fspath(path)
        self.verify_reads = verify_reads
        self._open()

    def _open(self) -> None:
        self.data_path, self.index_path = fmt.shard_paths(self.path)
        index_fd = _open_read(self.index_path)
        try:
            data_fd = _open_read(self.data_path)
            try:
                self._map_files(index_fd, data_fd)
            except OSError as error:  # fstat, pread or mmap failed: the storage, not the format
                raise StorageError(f"reading the shard failed: {error.strerror or error}", path=self.path) from None
            finally:
                os.close(data_fd)
        finally:
            os.close(index_fd)
        self._closed = False

    def _map_files(self, index_fd: int, data_fd: int) -> None:
        """Check the shard as §1.3 says, reading with `pread` only, then map both files.

        No check reads through a map: a page of a sparse file on a full tmpfs cannot
        be faulted in, and the kernel answers with SIGBUS, which kills the process.
        """
        index_path = self.index_path
        index_size = os.fstat(index_fd).st_size
        header = fmt.unpack_header(os.pread(index_fd, fmt.HEADER_SIZE, 0), index_size=index_size, path=index_path)
        preamble = _pread_exactly(index_fd, header.offsets_start - fmt.HEADER_SIZE, fmt.HEADER_SIZE, index_path)
        if any(preamble[header.metadata_size :]):
            raise FormatError("padding after the metadata is not zero", path=index_path)
        codec_params, _ = fmt.decode_metadata(preamble[: header.metadata_size], path=index_path)
        del preamble  # the user metadata is parsed again, from the map, only if `metadata` is read
        self._codec: Codec = codec_from_stored(header.codec_id, codec_params, path=index_path)
        data_size = os.fstat(data_fd).st_size
        if data_size != header.data_size:
            raise FormatError(
                f"data file is {data_size} bytes but its index expects {header.data_size}: "
                "truncated, extended, or paired with the wrong index",
                path=self.data_path,
            )
        if self.dtype is not None and data_size % self._codec.row_size:  # type: ignore[attr-defined]
            raise FormatError(
                f"data file is {data_size} bytes, not a whole number of {self._codec.row_size}-byte rows "  # type: ignore[attr-defined]
                f"(dtype {self.dtype.str}, trailing shape {list(self.shape or ())})",
                path=self.data_path,
            )
        (first,) = _OFFSET.unpack(_pread_exactly(index_fd, fmt.OFFSET_SIZE, header.offsets_start, index_path))
        (last,) = _OFFSET.unpack(_pread_exactly(index_fd, fmt.OFFSET_SIZE, header.checksums_start - fmt.OFFSET_SIZE, index_path))
        if first != 0 or last != data_size:
            raise FormatError(f"offsets run from {first} to {last}, expected 0 to {data_size}", path=index_path)
        head, tail = (_pread_exactly(data_fd, length, offset, self.data_path) for offset, length in fmt.edge_ranges(data_size))
        if fmt.edge_crc32c(head, tail) != header.data_edge_crc32c:
            raise FormatError(
                "data file does not match its index (first/last 4 KiB checksum differs): wrong or damaged data file",
                path=self.data_path,
            )
        self._index_map = _map_file(index_fd, index_size)
        self._data_map = _map_file(data_fd, data_size)
        self.header = header
        self._count = header.record_count
        self._data_size = data_size
        self._offsets_start = header.offsets_start
        self._offsets = np.frombuffer(self._index_map, "<u8", header.record_count + 1, header.offsets_start)
        self._checksums = (
            np.frombuffer(self._index_map, "<u4", header.record_count, header.checksums_start)
            if header.has_record_checksums
            else None
        )
        if self.verify_reads and self._checksums is None:
            raise FormatError("verify_reads=True but this shard was written without record checksums", path=index_path)
        self._decode: Callable[[Any, int, int], Any] | None = (
            None if self._codec.name == "bytes" else self._codec.decoder_for(self._data_map)
        )
        self._rows: np.ndarray | None = self._codec.rows(self._data_map) if self.dtype is not None else None  # type: ignore[attr-defined]
        # A |b1 shard's bytes, which reads check are 0 or 1 (§2.1); None for other shards.
        self._bool_bytes: np.ndarray | None = (
            np.frombuffer(self._data_map, np.uint8) if self.dtype is not None and self.dtype.kind == "b" else None
        )

    # -- description -------------------------------------------------------------------------

    @functools.cached_property
    def metadata(self) -> dict[str, Any]:
        """The user metadata the writer stored, parsed from the mapped index on first use and kept."""
        self._check_open()
        raw = self._index_map[fmt.HEADER_SIZE : fmt.HEADER_SIZE + self.header.metadata_size]
        return fmt.decode_metadata(raw, path=self.index_path)[1]

    @property
    def offsets(self) -> np.ndarray:
        """The N + 1 record offsets, a read-only uint64 view of the index map."""
        self._check_open()
        return self._offsets

    def record_sizes(self) -> np.ndarray:
        """Every record's payload size in bytes (computes over all N offsets, checking them as reads do)."""
        self._check_open()
        offsets = self._checked_offsets(0, self._count)
        if self._rows is not None and self._count:
            self._check_rows(np.arange(self._count), offsets[:-1], offsets[1:])
        return np.diff(offsets).astype(np.int64)

    def as_array(self) -> np.ndarray:
        """The whole data file of an ``ndarray`` shard as one read-only array of rows (zero copy)."""
        self._check_open()
        if self.dtype is None:
            raise RecordTypeError(f"as_array needs an ndarray shard, this one is {self.codec}", path=self.path)
        if self._bool_bytes is not None and self._count:
            offsets = self._checked_offsets(0, self._count)
            self._check_bools(np.arange(self._count), offsets[:-1], offsets[1:])
        return self._rows

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"Reader({self.path!r}, records={self._count}, codec={self.codec!r})"

    # -- single reads ------------------------------------------------------------------------

    def __getitem__(self, index: Any) -> Any:
        if index.__class__ is not int:
            return self._get_other(index)
        count = self._count
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise self._index_error(index)
        start, end = _PAIR.unpack_from(self._index_map, self._offsets_start + 8 * index)
        if not start <= end <= self._data_size:
            raise self._offsets_error(index, start, end)
        if self.verify_reads:
            self._verify_record(index, start, end)
        if self._decode is None:
            return self._data_map[start:end]
        try:
            return self._decode(self._data_map, start, end)
        except _DECODE_ERRORS as error:
            raise self._decode_error(index, error) from None

    def _get_other(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            if step == 1:
                return self._read_range(start, max(start, stop))
            return self.get_batch(range(start, stop, step))
        if isinstance(index, (bool, np.bool_)) or not hasattr(index, "__index__"):
            raise RecordTypeError(f"record indices are integers or slices, not {type(index).__name__}", path=self.path)
        return self[index.__index__()]

    def _index_error(self, index: int) -> Exception:
        self._check_open()
        return RecordIndexError(f"record {index} is out of range for {self._count} records", path=self.path)

    def _offsets_error(self, index: int, start: int, end: int, records: list[int] | None = None) -> CorruptRecordError:
        """Record `index` has the offsets [start, end); `records` lists every damaged one found, if more."""
        records = records or [index]
        others = f"; {len(records)} records have such offsets: {_describe(records)}" if len(records) > 1 else ""
        return CorruptRecordError(
            f"record {index} has offsets [{start}, {end}), outside the {self._data_size}-byte data file or reversed{others}",
            path=self.index_path,
            records=records,
        )

    def _decode_error(self, index: int, error: Exception) -> CorruptRecordError:
        return CorruptRecordError(
            f"record {index} does not decode as {self.codec}: {error}", path=self.data_path, records=[index]
        )

    def _verify_record(self, index: int, start: int, end: int) -> None:
        actual = crc32c(memoryview(self._data_map)[start:end])
        expected = int(self._checksums[index])  # type: ignore[index]
        if actual != expected:
            raise CorruptRecordError(
                f"record {index} checksum is {actual:#010x}, expected {expected:#010x}",
                path=self.data_path,
                records=[index],
            )

    # -- many reads --------------------------------------------------------------------------

    def _check_indices(self, indices: Any) -> np.ndarray:
        self._check_open()
        return check_indices(indices, self._count, self.path)

    def _checked_ranges(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        starts = self._offsets[indices]
        ends = self._offsets[indices + 1]
        bad = (starts > ends) | (ends > self._data_size)
        if bad.any():
            position = int(bad.argmax())
            raise self._offsets_error(int(indices[position]), int(starts[position]), int(ends[position]))
        if self.verify_reads:
            for index, start, end in zip(indices.tolist(), starts.tolist(), ends.tolist()):
                self._verify_record(index, start, end)
        return starts, ends

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """Records at `indices`, in that order; offsets are gathered and checked with numpy in one pass."""
        indices = self._check_indices(indices)
        starts, ends = self._checked_ranges(indices)
        return self._decode_ranges(indices, starts, ends)

    def _check_rows(self, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int:
        """Check in one pass that byte ranges of an ``ndarray`` shard sit on row boundaries; returns the row size."""
        row_size: int = self._codec.row_size  # type: ignore[attr-defined]
        off_rows = (starts % row_size != 0) | (ends % row_size != 0)
        if off_rows.any():
            position = int(off_rows.argmax())
            error = ValueError(f"offsets [{starts[position]}, {ends[position]}) are not on {row_size}-byte row boundaries")
            raise self._decode_error(int(indices[position]), error)
        return row_size

    def _check_bools(self, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """Refuse, naming the first, a record of a ``|b1`` shard holding a byte other than 0 or 1 (§2.1): one
        vectorised pass when the ranges are consecutive records, else a check per record."""
        data = self._bool_bytes
        assert data is not None
        if len(starts) and (starts[1:] == ends[:-1]).all():
            bad = self._codec.records_with_invalid_bools(data, np.append(starts, ends[-1:]))  # type: ignore[attr-defined]
            positions = bad[:1].tolist()
        else:
            positions = range(len(starts))
        for position in positions:
            try:
                check_bool_bytes(data[int(starts[position]) : int(ends[position])])
            except ValueError as error:
                raise self._decode_error(int(indices[position]), error) from None

    def _row_ranges(self, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[list[int], list[int]]:
        """Byte ranges of an ``ndarray`` shard as row ranges."""
        row_size = self._check_rows(indices, starts, ends)
        return (starts // row_size).tolist(), (ends // row_size).tolist()

    def _decode_ranges(self, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[Any]:
        rows = self._rows
        if rows is not None:
            row_starts, row_ends = self._row_ranges(indices, starts, ends)
            if self._bool_bytes is not None:
                self._check_bools(indices, starts, ends)
            return [rows[start:end] for start, end in zip(row_starts, row_ends)]
        data = self._data_map
        starts, ends = starts.tolist(), ends.tolist()
        if self._decode is None:
            return [data[start:end] for start, end in zip(starts, ends)]
        decode = self._decode
        try:
            return [decode(data, start, end) for start, end in zip(starts, ends)]
        except _DECODE_ERRORS:
            for index, start, end in zip(indices.tolist(), starts, ends):
                try:
                    decode(data, start, end)
                except _DECODE_ERRORS as error:
                    raise self._decode_error(index, error) from None
            raise

    def _check_payloads(self, indices: np.ndarray, buffer: Any, offsets: np.ndarray) -> None:
        """Raise what a read of record indices[k] raises if its payload ``buffer[offsets[k]:offsets[k + 1]]`` is one a
        read refuses, so flat reads hand out no record a read would not (§1.3): ``str`` payloads are checked for
        UTF-8 in one vectorised pass, ``msgpack`` payloads are decoded. (Callers check ``ndarray`` rows and |b1 bytes.)"""
        if self.codec == "str":
            suspects: Sequence[int] = _non_utf8_positions(buffer, offsets)
        elif self.codec == "msgpack":
            suspects = range(len(offsets) - 1)
        else:
            return
        if not suspects:
            return
        decode, bounds = self._decode, offsets.tolist()
        assert decode is not None
        for position in suspects:
            try:
                decode(buffer, bounds[position], bounds[position + 1])
            except _DECODE_ERRORS as error:
                raise self._decode_error(int(indices[position]), error) from None

    def get_batch_flat(self, indices: Sequence[int] | np.ndarray) -> FlatBatch:
        """Records at `indices` packed into one buffer plus offsets, the form variable-length collation wants.

        Every record is checked as a read checks it (for ``msgpack``, by decoding it) and returned as stored."""
        indices = self._check_indices(indices)
        starts, ends = self._checked_ranges(indices)
        lengths = (ends - starts).astype(np.int64)
        offsets = np.zeros(len(indices) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if self._rows is not None:
            self._check_rows(indices, starts, ends)
            if self._bool_bytes is not None:
                self._check_bools(indices, starts, ends)
        view = memoryview(self._data_map)
        joined = bytearray().join([view[start:end] for start, end in zip(starts.tolist(), ends.tolist())])
        view.release()
        values = np.frombuffer(joined, np.uint8)  # one copy, into a writable buffer of its own
        if self.dtype is None:
            self._check_payloads(indices, joined, offsets)
            return FlatBatch(values, offsets)
        row_size = self._codec.row_size  # type: ignore[attr-defined]
        return FlatBatch(values.view(self.dtype).reshape((-1, *(self.shape or ()))), offsets // row_size)

    def _checked_offsets(self, start: int, stop: int) -> np.ndarray:
        """Offsets of records [start, stop), or a CorruptRecordError listing every record among them whose offsets
        go backwards or past the end of the data file (one vectorised comparison when nothing is wrong)."""
        offsets = self._offsets[start : stop + 1]
        if stop > start and ((offsets[1:] < offsets[:-1]).any() or offsets[-1] > self._data_size):
            bad = np.flatnonzero((offsets[1:] < offsets[:-1]) | (offsets[1:] > self._data_size))
            first = int(bad[0])
            raise self._offsets_error(start + first, int(offsets[first]), int(offsets[first + 1]), (bad + start).tolist())
        return offsets

    def _contiguous_offsets(self, start: int, stop: int) -> np.ndarray:
        """Offsets of records [start, stop), checked in one pass (and their checksums with verify_reads), prefetched."""
        self._check_open()
        offsets = self._checked_offsets(start, stop)
        if stop > start:
            self._prefetch(int(offsets[0]), int(offsets[-1]))
        if self.verify_reads:
            bounds = offsets.tolist()
            for index in range(start, stop):
                self._verify_record(index, bounds[index - start], bounds[index - start + 1])
        return offsets

    def _read_range(self, start: int, stop: int) -> list[Any]:
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
            offsets = self._contiguous_offsets(start, stop)
            base = int(offsets[0])
            relative = offsets.astype(np.int64) - base
            if self._rows is None:
                self._check_payloads(np.arange(start, stop), self._data_map, offsets)
                values = np.frombuffer(self._data_map, np.uint8, int(relative[-1]), base) if self._data_size else np.zeros(0, np.uint8)
                yield FlatBatch(values, relative)
                continue
            row_size = self._check_rows(np.arange(start, stop), offsets[:-1], offsets[1:])
            if self._bool_bytes is not None:
                self._check_bools(np.arange(start, stop), offsets[:-1], offsets[1:])
            first_row = base // row_size
            yield FlatBatch(self._rows[first_row : first_row + int(relative[-1]) // row_size], relative // row_size)

    def _prefetch(self, start: int, end: int) -> None:
        """Ask the kernel to read a range ahead: maps are MADV_RANDOM, so sequential readers say so."""
        if end > start and hasattr(self._data_map, "madvise"):
            page_start = start - start % mmap.PAGESIZE
            self._data_map.madvise(mmap.MADV_WILLNEED, page_start, end - page_start)  # type: ignore[union-attr]

    def prefetch(self, start: int, stop: int) -> None:
        """Ask the kernel to start reading records [start, stop) into the page cache; advisory, so damage is ignored."""
        self._check_open()
        start, stop, _ = slice(start, stop).indices(self._count)
        if stop > start:
            end = min(int(self._offsets[stop]), self._data_size)
            self._prefetch(min(int(self._offsets[start]), end), end)

    def __iter__(self) -> Iterator[Any]:
        self._check_open()
        for start in range(0, self._count, _ITERATION_CHUNK):
            yield from self._read_range(start, min(start + _ITERATION_CHUNK, self._count))

    # -- checking ----------------------------------------------------------------------------

    def verify(self, progress: Callable[[int], None] | None = None) -> None:
        """Check every byte and, for every record, every rule a read checks (§1.3).

        In order: the index body checksum; that offsets never decrease; then, a chunk
        of records at a time, the whole data file's CRC32C (always: record checksums
        locate damage but do not vouch for the header's ``data_crc32c``), each record's
        checksum when the shard has them, and every rule of `_record_rules`. Raises on
        a damaged structure at once; damaged records are all listed in one
        CorruptRecordError. `progress` receives byte counts of the data file.
        """
        self._check_open()
        header = self.header
        body_crc = crc32c_of_range(self._index_map, fmt.HEADER_SIZE, header.index_size)
        if body_crc != header.body_crc32c:
            raise FormatError(
                f"index body checksum is {body_crc:#010x}, expected {header.body_crc32c:#010x}", path=self.index_path
            )
        self._checked_offsets(0, self._count)
        rules = self._record_rules()
        failed: dict[tuple[str, str], list[int]] = {_BAD_CHECKSUM: [], **{reason: [] for reason, _ in rules}}
        data_crc = 0
        with memoryview(self._data_map) as view:
            for chunk_start in range(0, self._count, _ITERATION_CHUNK):
                offsets = self._offsets[chunk_start : min(chunk_start + _ITERATION_CHUNK, self._count) + 1]
                data_crc = crc32c(view[int(offsets[0]) : int(offsets[-1])], data_crc)
                if self._checksums is not None:
                    failed[_BAD_CHECKSUM] += self._bad_checksums(view, chunk_start, offsets)
                for reason, find_failing in rules:
                    failed[reason] += find_failing(chunk_start, offsets)
                if progress is not None:
                    progress(int(offsets[-1] - offsets[0]))
        problems = [f"{_counted(records, *reason)}: {_describe(records)}" for reason, records in failed.items() if records]
        if data_crc != header.data_crc32c and not failed[_BAD_CHECKSUM]:  # else those records explain it
            also = ", though every record passes its own checksum" if self._checksums is not None else ""
            problems.append(
                f"data checksum is {data_crc:#010x}, expected {header.data_crc32c:#010x} (the header's data_crc32c){also}"
            )
        if problems:
            damaged = sorted(set().union(*failed.values()))
            raise CorruptRecordError("; ".join(problems), path=self.data_path, records=damaged)

    def _bad_checksums(self, view: memoryview, chunk_start: int, offsets: np.ndarray) -> list[int]:
        """Records of the chunk starting at `chunk_start` (bounded by `offsets`) whose CRC32C is not the stored one.

        One C-level map over the records computes the checksums; numpy compares them all at once.
        """
        bounds = offsets.tolist()
        count = len(bounds) - 1
        actual = np.fromiter(map(crc32c, map(view.__getitem__, map(slice, bounds, bounds[1:]))), np.uint32, count)
        wrong = np.flatnonzero(actual != self._checksums[chunk_start : chunk_start + count])  # type: ignore[index]
        return (wrong + chunk_start).tolist()

    def _record_rules(self) -> list[tuple[tuple[str, str], Callable[[int, np.ndarray], list[int]]]]:
        """The rules a read checks of a record's bytes, as (what one and many failing records do, for an error message;
        a function listing the failing records of one chunk); none for ``bytes``."""
        if self.dtype is not None:
            row_size: int = self._codec.row_size  # type: ignore[attr-defined]
            rules = [((f"is not on {row_size}-byte row boundaries", f"are not on {row_size}-byte row boundaries"), self._off_row_records)] if row_size > 1 else []
            if self._bool_bytes is not None:
                rules.append((("holds |b1 bytes other than 0 or 1", "hold |b1 bytes other than 0 or 1"), self._invalid_bool_records))
            return rules
        if self.codec == "str":
            return [(("is not valid UTF-8", "are not valid UTF-8"), self._non_utf8_records)]
        if self.codec == "msgpack":
            return [(("does not decode as msgpack", "do not decode as msgpack"), self._undecodable_records)]
        return []

    def _invalid_bool_records(self, chunk_start: int, offsets: np.ndarray) -> list[int]:
        """Records of a ``|b1`` chunk holding a byte other than 0 or 1, in one vectorised pass."""
        bad = self._codec.records_with_invalid_bools(self._bool_bytes, offsets)  # type: ignore[attr-defined]
        return (bad + chunk_start).tolist()

    def _off_row_records(self, chunk_start: int, offsets: np.ndarray) -> list[int]:
        """Records of an ``ndarray`` chunk with an offset off a row boundary (both records sharing it), vectorised."""
        off_row = np.flatnonzero(offsets % self._codec.row_size)  # type: ignore[attr-defined]
        if not off_row.size:
            return []
        records = np.union1d(off_row - 1, off_row) + chunk_start
        return records[(records >= chunk_start) & (records < chunk_start + len(offsets) - 1)].tolist()

    def _non_utf8_records(self, chunk_start: int, offsets: np.ndarray) -> list[int]:
        """Records of a ``str`` chunk that are not valid UTF-8 (one vectorised pass unless one is not)."""
        return [chunk_start + position for position in _non_utf8_positions(self._data_map, offsets)]

    def _undecodable_records(self, chunk_start: int, offsets: np.ndarray) -> list[int]:
        """Records of a chunk that the codec's decode (the one every read uses) refuses."""
        decode, data = self._decode, self._data_map
        assert decode is not None
        bounds = offsets.tolist()
        bad = []
        for position, (start, end) in enumerate(zip(bounds, bounds[1:])):
            try:
                decode(data, start, end)
            except _DECODE_ERRORS:
                bad.append(chunk_start + position)
        return bad

    # -- life cycle --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the reader is closed", path=self.path)

    def close(self) -> None:
        """Release the maps; arrays already returned stay valid until they are freed."""
        if self._closed:
            return
        self._closed = True
        self._count = 0
        self._offsets = self._checksums = self._decode = self._rows = self._bool_bytes = None  # type: ignore[assignment]
        for mapped in (self._index_map, self._data_map):
            if isinstance(mapped, mmap.mmap):
                try:
                    mapped.close()
                except BufferError:
                    pass  # arrays returned to the caller still view it; it closes when they are freed


_BAD_CHECKSUM = ("fails its checksum", "fail their checksum")


def _counted(records: list[int], one: str, many: str) -> str:
    """ "1 record fails its checksum" or "3 records fail their checksum"."""
    return f"1 record {one}" if len(records) == 1 else f"{len(records)} records {many}"
