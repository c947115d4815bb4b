"""`Reader`: random access to the records of one shard through memory maps of its two files."""

from __future__ import annotations

import mmap
import os
import stat
import struct
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from . import format as fmt
from .checksum import crc32c, crc32c_of_range
from .codecs import Codec, codec_from_stored
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

    Opening reads the 64-byte header, the metadata block and the first and last
    4 KiB of the data file, whatever the record count. Reads are a bounds check
    and a slice of the map. With ``verify_reads=True`` every read also checks the
    record's CRC32C.
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
        index_path = self.index_path
        index_size = os.fstat(index_fd).st_size
        header = fmt.unpack_header(os.pread(index_fd, fmt.HEADER_SIZE, 0), index_size=index_size, path=index_path)
        preamble = os.pread(index_fd, header.offsets_start - fmt.HEADER_SIZE, fmt.HEADER_SIZE)
        if any(preamble[header.metadata_size :]):
            raise FormatError("padding after the metadata is not zero", path=index_path)
        codec_params, self.metadata = fmt.decode_metadata(preamble[: header.metadata_size], path=index_path)
        self._codec: Codec = codec_from_stored(header.codec_id, codec_params, path=index_path)
        data_size = os.fstat(data_fd).st_size
        if data_size != header.data_size:
            raise FormatError(
                f"data file is {data_size} bytes but its index expects {header.data_size}: "
                "truncated, extended, or paired with the wrong index",
                path=self.data_path,
            )
        self._index_map = _map_file(index_fd, index_size)
        self._data_map = _map_file(data_fd, data_size)
        (first,) = _OFFSET.unpack_from(self._index_map, header.offsets_start)
        (last,) = _OFFSET.unpack_from(self._index_map, header.checksums_start - fmt.OFFSET_SIZE)
        if first != 0 or last != data_size:
            raise FormatError(f"offsets run from {first} to {last}, expected 0 to {data_size}", path=index_path)
        if fmt.edge_crc32c(self._data_map, data_size) != header.data_edge_crc32c:
            raise FormatError(
                "data file does not match its index (first/last 4 KiB checksum differs): wrong or damaged data file",
                path=self.data_path,
            )
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
        try:
            self._decode: Callable[[Any, int, int], Any] | None = (
                None if self._codec.name == "bytes" else self._codec.decoder_for(self._data_map)
            )
            self._rows: np.ndarray | None = self._codec.rows(self._data_map) if self.dtype is not None else None  # type: ignore[attr-defined]
        except ValueError as error:
            raise FormatError(f"data file does not fit the {self.codec} codec: {error}", path=self.data_path) from None

    # -- description -------------------------------------------------------------------------

    @property
    def offsets(self) -> np.ndarray:
        """The N + 1 record offsets, a read-only uint64 view of the index map."""
        self._check_open()
        return self._offsets

    def record_sizes(self) -> np.ndarray:
        """Every record's payload size in bytes (computes over all N offsets)."""
        return np.diff(self.offsets).astype(np.int64)

    def as_array(self) -> np.ndarray:
        """The whole data file of an ``ndarray`` shard as one read-only array of rows (zero copy)."""
        self._check_open()
        if self.dtype is None:
            raise RecordTypeError(f"as_array needs an ndarray shard, this one is {self.codec}", path=self.path)
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
        except (ValueError, TypeError, UnicodeDecodeError) as error:
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

    def _offsets_error(self, index: int, start: int, end: int) -> CorruptRecordError:
        return CorruptRecordError(
            f"record {index} has offsets [{start}, {end}), outside the {self._data_size}-byte data file or reversed",
            path=self.index_path,
            records=[index],
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

    def _row_ranges(self, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[list[int], list[int]]:
        """Byte ranges of an ``ndarray`` shard as row ranges."""
        row_size = self._check_rows(indices, starts, ends)
        return (starts // row_size).tolist(), (ends // row_size).tolist()

    def _decode_ranges(self, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[Any]:
        rows = self._rows
        if rows is not None:
            row_starts, row_ends = self._row_ranges(indices, starts, ends)
            return [rows[start:end] for start, end in zip(row_starts, row_ends)]
        data = self._data_map
        starts, ends = starts.tolist(), ends.tolist()
        if self._decode is None:
            return [data[start:end] for start, end in zip(starts, ends)]
        decode = self._decode
        try:
            return [decode(data, start, end) for start, end in zip(starts, ends)]
        except (ValueError, TypeError, UnicodeDecodeError):
            for index, start, end in zip(indices.tolist(), starts, ends):
                try:
                    decode(data, start, end)
                except (ValueError, TypeError, UnicodeDecodeError) as error:
                    raise self._decode_error(index, error) from None
            raise

    def get_batch_flat(self, indices: Sequence[int] | np.ndarray) -> FlatBatch:
        """Records at `indices` packed into one buffer plus offsets, the form variable-length collation wants."""
        indices = self._check_indices(indices)
        starts, ends = self._checked_ranges(indices)
        lengths = (ends - starts).astype(np.int64)
        offsets = np.zeros(len(indices) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if self._rows is not None:
            self._check_rows(indices, starts, ends)
        view = memoryview(self._data_map)
        joined = bytearray().join([view[start:end] for start, end in zip(starts.tolist(), ends.tolist())])
        view.release()
        values = np.frombuffer(joined, np.uint8)  # one copy, into a writable buffer of its own
        if self.dtype is None:
            return FlatBatch(values, offsets)
        row_size = self._codec.row_size  # type: ignore[attr-defined]
        return FlatBatch(values.view(self.dtype).reshape((-1, *(self.shape or ()))), offsets // row_size)

    def _contiguous_offsets(self, start: int, stop: int) -> np.ndarray:
        """Offsets of records [start, stop), checked in one pass (and their checksums with verify_reads), prefetched."""
        self._check_open()
        offsets = self._offsets[start : stop + 1]
        if stop > start:
            steps = offsets[1:] < offsets[:-1]
            if steps.any() or offsets[-1] > self._data_size:
                position = int(steps.argmax()) if steps.any() else stop - start - 1
                raise self._offsets_error(start + position, int(offsets[position]), int(offsets[position + 1]))
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
        """
        if batch_size < 1:
            raise RecordTypeError(f"batch_size must be positive, not {batch_size}", path=self.path)
        for start in range(0, self._count, batch_size):
            stop = min(start + batch_size, self._count)
            offsets = self._contiguous_offsets(start, stop)
            base = int(offsets[0])
            relative = offsets.astype(np.int64) - base
            if self._rows is None:
                values = np.frombuffer(self._data_map, np.uint8, int(relative[-1]), base) if self._data_size else np.zeros(0, np.uint8)
                yield FlatBatch(values, relative)
                continue
            row_size = self._check_rows(np.arange(start, stop), offsets[:-1], offsets[1:])
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
        """Check every byte: the index body checksum, the offsets, then each record's checksum
        (or the whole data file's checksum when the shard has none). Raises on the first
        damaged structure, or with all damaged records listed. `progress` receives byte counts.
        """
        self._check_open()
        header = self.header
        body_crc = crc32c_of_range(self._index_map, fmt.HEADER_SIZE, header.index_size)
        if body_crc != header.body_crc32c:
            raise FormatError(
                f"index body checksum is {body_crc:#010x}, expected {header.body_crc32c:#010x}", path=self.index_path
            )
        reversed_steps = np.flatnonzero(self._offsets[1:] < self._offsets[:-1])
        if reversed_steps.size:
            bad = reversed_steps.tolist()
            raise CorruptRecordError(f"offsets go backwards at records {_describe(bad)}", path=self.index_path, records=bad)
        if self._checksums is None:
            data_crc = crc32c_of_range(self._data_map, 0, self._data_size, progress)
            if data_crc != header.data_crc32c:
                raise CorruptRecordError(
                    f"data checksum is {data_crc:#010x}, expected {header.data_crc32c:#010x}", path=self.data_path
                )
            return
        bad = self._bad_checksums(progress)
        if bad:
            raise CorruptRecordError(
                f"{len(bad)} records fail their checksum: {_describe(bad)}", path=self.data_path, records=bad
            )

    def _bad_checksums(self, progress: Callable[[int], None] | None) -> list[int]:
        view = memoryview(self._data_map)
        bad: list[int] = []
        for chunk_start in range(0, self._count, _ITERATION_CHUNK):
            chunk_stop = min(chunk_start + _ITERATION_CHUNK, self._count)
            bounds = self._offsets[chunk_start : chunk_stop + 1].tolist()
            expected = self._checksums[chunk_start:chunk_stop].tolist()  # type: ignore[index]
            for position, (start, end) in enumerate(zip(bounds, bounds[1:])):
                if crc32c(view[start:end]) != expected[position]:
                    bad.append(chunk_start + position)
            if progress is not None:
                progress(bounds[-1] - bounds[0])
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
        self._offsets = self._checksums = self._decode = self._rows = None  # type: ignore[assignment]
        for mapped in (self._index_map, self._data_map):
            if isinstance(mapped, mmap.mmap):
                try:
                    mapped.close()
                except BufferError:
                    pass  # arrays returned to the caller still view it; it closes when they are freed
