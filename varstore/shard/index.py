"""`ShardIndex`: one shard's index file, checked, and every rule a read checks of a record's offsets and bytes.

Split from `Reader` so that any way of reaching a shard's data (a memory map of
the local data file, or ranged reads of a remote one) checks it against the same
index with the same rules and errors. The index opens from a file descriptor with
``pread`` (§1.3's checks) and is then mapped, and a cold index of up to
`varstore.local.mapping.PREFETCH_LIMIT` bytes is read into the page cache in the
background; the data is never read here except the bytes a caller hands in.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import mmap
import os
import struct
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from .._native import speedups
from ..errors import CorruptRecordError, FormatError
from ..format import compression as zstd_format
from ..format import header as fmt
from ..format.checksum import crc32c, crc32c_of_ranges
from ..format.codecs import Codec, check_bool_bytes, codec_from_stored
from ..format.header import Header
from ..format.metadata import MAX_METADATA_DEPTH, decode_metadata, metadata_members, parse_strict_json
from ..local.mapping import looks_cached, map_file, pread_exactly, prefetch_index
from .blocks import BAD_BLOCK_CHECKSUM, REFUSED, ShardBlocks, check_table_ends, record_decoder

_OFFSET = struct.Struct("<Q")


_MAX_LISTED_RECORDS = 20


_UTF8_PIECE = 8 << 20


ITERATION_CHUNK = 4096  # records per chunk of iteration in `Reader`


VERIFY_CHUNK_BYTES = 1 << 20  # data a verification reads at once (more for one larger record): it stays in L2 cache


_VERIFY_RECORDS = 1 << 16  # offsets a verification reads at once


DECODE_ERRORS = (ValueError, TypeError, UnicodeDecodeError)  # what a codec's decode raises on bad bytes


class VerifyChunk(NamedTuple):
    """Consecutive records read for verification: records first, first + 1, ... at `offsets` in the data file,
    whose bytes from offsets[0] to offsets[-1] are `data` (so `relative` = offsets - offsets[0] index into it), which
    may be a buffer the next chunk's read reuses."""

    first: int
    offsets: np.ndarray
    data: Any
    checksums: np.ndarray | None  # their stored CRC32Cs, when the shard has them

    @property
    def relative(self) -> np.ndarray:
        """The offsets into `data` (computed when asked: the C extension's checks take `offsets`)."""
        return (self.offsets - self.offsets[0]).astype(np.int64)


# A rule of `ShardIndex.record_rules`: (what one and many failing records do, for an error message;
# a function of a `VerifyChunk` listing its failing records).
RecordRule = tuple[tuple[str, str], Callable[[VerifyChunk], list[int]]]


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


class ShardIndex:
    """A shard's checked header, codec, offsets and record checksums, viewed in a map of its index file.

    Built by `open`, which checks the shard as §1.3 says before anything is mapped.
    Its methods check records' offsets (and, given the data bytes, their rows, |b1
    bytes, decoding and checksums) and raise the errors a read raises.
    """

    def __init__(
        self, index_map: mmap.mmap | bytes, header: Header, codec: Codec, data_size: int, *, index_path: str, data_path: str,
        decompressor: zstd_format.Decompressor | None = None,
    ) -> None:
        self.map = index_map
        self.header = header
        self.codec = codec
        self.data_size = data_size
        self.index_path = index_path
        self.data_path = data_path
        self.count = header.record_count
        self.dtype: np.dtype | None = getattr(codec, "dtype", None)
        self.offsets: np.ndarray = np.frombuffer(index_map, "<u8", header.record_count + 1, header.offsets_start)
        self.checksums: np.ndarray | None = (
            np.frombuffer(index_map, "<u4", header.record_count, header.checksums_start) if header.has_record_checksums else None
        )
        # A compressed shard (§1.6): what decodes its frames, and each record's decoded size; a shard of compressed
        # blocks (§1.7): its block table, which decodes them, and offsets in decoded space.
        self.blocks = ShardBlocks(index_map, header, self.offsets, decompressor, data_path=data_path) if header.has_blocks else None  # type: ignore[arg-type]
        self.decompressor = None if header.has_blocks else decompressor
        self.sizes: np.ndarray | None = (
            np.frombuffer(index_map, "<u4", header.record_count, header.sizes_start) if header.compression and not header.has_blocks else None
        )

    @classmethod
    def open(
        cls, index_fd: int, data_size: int, read_data: Callable[[int, int], bytes], *, index_path: str, data_path: str
    ) -> ShardIndex:
        """Check the index open as `index_fd` against a `data_size`-byte data file, reading with `pread` only, then map it
        (and `prefetch_index` it if it was cold, so that a cold read faults in its data page only).

        `read_data(offset, length)` returns that range of the data file (for the first/last 4 KiB
        checksum). No check reads through a map: a page of a sparse file on a full tmpfs cannot
        be faulted in, and the kernel answers with SIGBUS, which kills the process.
        """
        index_size = os.fstat(index_fd).st_size
        cold = not looks_cached(index_fd, index_size)  # asked before this open's own reads cache parts of it
        header = fmt.unpack_header(os.pread(index_fd, fmt.HEADER_SIZE, 0), index_size=index_size, path=index_path)
        preamble = pread_exactly(index_fd, header.offsets_start - fmt.HEADER_SIZE, fmt.HEADER_SIZE, index_path)
        dictionary_at = header.dictionary_start - fmt.HEADER_SIZE
        dictionary = preamble[dictionary_at : dictionary_at + header.dictionary_size]
        if any(preamble[header.metadata_size : dictionary_at]) or any(preamble[dictionary_at + header.dictionary_size :]):
            raise FormatError("padding after the metadata is not zero", path=index_path)
        metadata = parse_strict_json(preamble[: header.metadata_size], MAX_METADATA_DEPTH, what="metadata", path=index_path)
        codec_params, _ = metadata_members(metadata, path=index_path)
        decompressor = _decompressor(header, metadata, dictionary, index_path) if header.compression else None
        if not fmt.data_crc_recorded(header, metadata, path=index_path):
            header = dataclasses.replace(header, data_crc_recorded=False)
        del preamble, dictionary, metadata  # the user metadata is parsed again, from the map, only if `metadata` is read
        codec = codec_from_stored(header.codec_id, codec_params, path=index_path)
        if data_size != header.data_size:
            raise FormatError(
                f"data file is {data_size} bytes but its index expects {header.data_size}: "
                "truncated, extended, or paired with the wrong index",
                path=data_path,
            )
        dtype = getattr(codec, "dtype", None)
        if dtype is not None and not header.compression and data_size % codec.row_size:  # type: ignore[attr-defined]
            raise FormatError(
                f"data file is {data_size} bytes, not a whole number of {codec.row_size}-byte rows "  # type: ignore[attr-defined]
                f"(dtype {dtype.str}, trailing shape {list(getattr(codec, 'shape', None) or ())})",
                path=data_path,
            )
        if header.has_blocks:
            check_table_ends(lambda offset, length: pread_exactly(index_fd, length, offset, index_path), header, data_size, path=index_path)
        else:
            (first,) = _OFFSET.unpack(pread_exactly(index_fd, fmt.OFFSET_SIZE, header.offsets_start, index_path))
            (last,) = _OFFSET.unpack(pread_exactly(index_fd, fmt.OFFSET_SIZE, header.checksums_start - fmt.OFFSET_SIZE, index_path))
            if first != 0 or last != data_size:
                raise FormatError(f"offsets run from {first} to {last}, expected 0 to {data_size}", path=index_path)
        head, tail = (read_data(offset, length) for offset, length in fmt.edge_ranges(data_size))
        if fmt.edge_crc32c(head, tail) != header.data_edge_crc32c:
            raise FormatError(
                "data file does not match its index (first/last 4 KiB checksum differs): wrong or damaged data file",
                path=data_path,
            )
        index_map = map_file(index_fd, index_size)
        if cold:
            prefetch_index(index_fd, index_size)
        return cls(index_map, header, codec, data_size, index_path=index_path, data_path=data_path, decompressor=decompressor)

    @functools.cached_property
    def offset_limit(self) -> int:
        """What record offsets stay within: the data file's size, or a 3.x shard's decoded space (offsets[N], which
        only the blocks' bounds check), read from the map at the first read that needs it, not at open."""
        return int(self.offsets[-1]) if self.blocks is not None else self.data_size

    def metadata(self) -> dict[str, Any]:
        """The user metadata the writer stored, parsed from the mapped index."""
        raw = self.map[fmt.HEADER_SIZE : fmt.HEADER_SIZE + self.header.metadata_size]
        return decode_metadata(raw, path=self.index_path)[1]

    def close(self) -> None:
        """Drop the views of the map and close it; arrays already returned stay valid until they are freed."""
        self.offsets = self.checksums = None  # type: ignore[assignment]
        if self.blocks is not None:
            self.blocks.close()
        if isinstance(self.map, mmap.mmap):
            try:
                self.map.close()
            except BufferError:
                pass  # arrays returned to the caller still view it; it closes when they are freed

    # -- errors ------------------------------------------------------------------------------

    def offsets_error(self, index: int, start: int, end: int, records: list[int] | None = None) -> CorruptRecordError:
        """Record `index` has the offsets [start, end); `records` lists every damaged one found, if more."""
        records = records or [index]
        others = f"; {len(records)} records have such offsets: {_describe(records)}" if len(records) > 1 else ""
        space = f"the {self.offset_limit} decoded bytes" if self.blocks is not None else f"the {self.data_size}-byte data file"
        return CorruptRecordError(
            f"record {index} has offsets [{start}, {end}), outside {space} or reversed{others}",
            path=self.index_path,
            records=records,
        )

    def decompress(self, index: int, data: Any, start: int, end: int, size: int) -> bytes:
        """Record `index`'s frame data[start:end] of a compressed shard, decoded to its declared `size` bytes (§1.6)."""
        try:
            return self.decompressor.decompress(data, start, end, size)  # type: ignore[union-attr]
        except ValueError as error:
            raise CorruptRecordError(
                f"record {index} is not a valid frame of this {zstd_format.NAMES[self.header.compression]} shard: {error}",
                path=self.data_path,
                records=[index],
            ) from None

    @functools.cached_property
    def blocks_decoder(self) -> Callable[[Any, int, int], Any]:
        """How reads of a 3.x shard decode a record from its block's decoded bytes (`record_decoder`)."""
        return record_decoder(self.codec)

    @functools.cached_property
    def block_record_faults(self) -> Callable[[Any, np.ndarray], list[int]]:
        """Positions k of the records ``block[offsets[k]:offsets[k + 1]]`` of a 3.x shard's decoded block that a
        read refuses under the codec: none for ``bytes``, one vectorised UTF-8 pass for ``str``, each decoded as a
        read decodes it otherwise."""
        if self.codec.name == "bytes":
            return _no_faults
        if self.codec.name == "str":
            return _non_utf8_positions
        return functools.partial(_undecodable_positions, self.blocks_decoder)

    def read_in_block(self, index: int, data: Any) -> Any:
        """Record `index` of a 3.x shard whose data file is `data`: its block found, checked and decoded (or taken
        from the last one decoded), then the record decoded from it (§1.7)."""
        decoded, start, end = self.blocks.read(index, data)  # type: ignore[union-attr]
        try:
            return self.blocks_decoder(decoded, start, end)
        except DECODE_ERRORS as error:
            raise self.decode_error(index, error) from None

    def gather_from_blocks(self, indices: np.ndarray, data: Any) -> tuple[bytes, np.ndarray]:
        """Records at `indices` of a 3.x shard whose data file is `data`, decoded back to back (each distinct block
        decoded once), and the N + 1 offsets of each in them."""
        blocks = self.blocks
        located, numbers, cached = blocks.plan(indices)  # type: ignore[union-attr]
        starts, ends = blocks.stored_ranges(numbers)  # type: ignore[union-attr]
        return blocks.gather(located, data, numbers, starts, ends, cached)  # type: ignore[union-attr]

    def decode_error(self, index: int, error: Exception) -> CorruptRecordError:
        return CorruptRecordError(
            f"record {index} does not decode as {self.codec.name}: {error}", path=self.data_path, records=[index]
        )

    # -- offsets -----------------------------------------------------------------------------

    def checked_offsets(self, start: int, stop: int) -> np.ndarray:
        """Offsets of records [start, stop), or a CorruptRecordError listing every record among them whose offsets
        go backwards or past the end of the data file (one vectorised comparison when nothing is wrong)."""
        return self._check_offsets(start, self.offsets[start : stop + 1])

    def _check_offsets(self, start: int, offsets: np.ndarray) -> np.ndarray:
        """`offsets`, those of records [start, start + len(offsets) - 1), or the error `checked_offsets` raises."""
        limit = self.offset_limit
        if len(offsets) > 1 and ((offsets[1:] < offsets[:-1]).any() or offsets[-1] > limit):
            bad = np.flatnonzero((offsets[1:] < offsets[:-1]) | (offsets[1:] > limit))
            first = int(bad[0])
            raise self.offsets_error(start + first, int(offsets[first]), int(offsets[first + 1]), (bad + start).tolist())
        return offsets

    def checked_ranges(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Byte ranges (starts, ends) of records at `indices`, gathered and checked with numpy in one pass."""
        starts = self.offsets[indices]
        ends = self.offsets[indices + 1]
        bad = (starts > ends) | (ends > self.offset_limit)
        if bad.any():
            position = int(bad.argmax())
            raise self.offsets_error(int(indices[position]), int(starts[position]), int(ends[position]))
        return starts, ends

    def payload_sizes(self, indices: np.ndarray) -> np.ndarray:
        """The payload sizes of records at `indices` (checked by the caller): from the offsets, or a compressed
        shard's decoded sizes (what its records are, not their frames)."""
        if self.sizes is not None:
            return self.sizes[indices].astype(np.int64)
        return (self.offsets[indices + 1] - self.offsets[indices]).astype(np.int64)

    def raw_size(self) -> int:
        """The bytes the records decode to: the data size, or a compressed shard's sum of decoded sizes (unchecked
        against its offsets: a description, not a read)."""
        if self.blocks is not None:
            return self.offset_limit
        return self.data_size if self.sizes is None else int(self.sizes.sum(dtype=np.int64))

    def record_sizes(self) -> np.ndarray:
        """Every record's payload size in bytes (computes over all N offsets, checking them as reads do); a
        compressed shard's decoded sizes, from its index."""
        offsets = self.checked_offsets(0, self.count)
        if self.sizes is not None:
            sizes = self.sizes.astype(np.int64)
            if self.dtype is not None and self.count:
                ends = np.cumsum(sizes)
                self.check_rows(np.arange(self.count), ends - sizes, ends)
            return sizes
        if self.dtype is not None and self.count:
            self.check_rows(np.arange(self.count), offsets[:-1], offsets[1:])
        return np.diff(offsets).astype(np.int64)

    # -- the rules a read checks of records at (indices, starts, ends) ---------------------------

    def verify_record(self, index: int, data: Any, start: int, end: int) -> None:
        """Refuse record `index`, the bytes ``data[start:end]``, unless they have its stored CRC32C."""
        actual = crc32c(memoryview(data)[start:end])
        expected = int(self.checksums[index])  # type: ignore[index]
        if actual != expected:
            raise CorruptRecordError(
                f"record {index} checksum is {actual:#010x}, expected {expected:#010x}",
                path=self.data_path,
                records=[index],
            )

    def check_rows(self, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int:
        """Check in one pass that byte ranges of an ``ndarray`` shard sit on row boundaries; returns the row size."""
        row_size: int = self.codec.row_size  # type: ignore[attr-defined]
        if row_size & (row_size - 1) == 0 and not ((starts | ends) & (row_size - 1)).any():
            return row_size  # a power of two, the usual row size: one pass over both
        off_rows = (starts % row_size != 0) | (ends % row_size != 0)
        if off_rows.any():
            position = int(off_rows.argmax())
            error = ValueError(f"offsets [{starts[position]}, {ends[position]}) are not on {row_size}-byte row boundaries")
            raise self.decode_error(int(indices[position]), error)
        return row_size

    def check_bools(self, data: np.ndarray, indices: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """Refuse, naming the first, a record of a ``|b1`` shard (whose bytes are the uint8 array `data`) holding a
        byte other than 0 or 1 (§2.1): one vectorised pass when the ranges are consecutive records, else a check
        per record."""
        if len(starts) and (starts[1:] == ends[:-1]).all():
            bad = self.codec.records_with_invalid_bools(data, np.append(starts, ends[-1:]))  # type: ignore[attr-defined]
            positions = bad[:1].tolist()
        else:
            positions = range(len(starts))
        for position in positions:
            try:
                check_bool_bytes(data[int(starts[position]) : int(ends[position])])
            except ValueError as error:
                raise self.decode_error(int(indices[position]), error) from None

    def check_payloads(
        self, decode: Callable[[Any, int, int], Any] | None, indices: np.ndarray, buffer: Any, offsets: np.ndarray
    ) -> None:
        """Raise what a read of record indices[k] raises if its payload ``buffer[offsets[k]:offsets[k + 1]]`` is one a
        read refuses, so flat reads hand out no record a read would not (§1.3): ``str`` payloads are checked for
        UTF-8 in one vectorised pass, ``msgpack`` payloads are decoded with `decode`. (Callers check ``ndarray``
        rows and |b1 bytes.)"""
        if self.codec.name == "str":
            suspects: Sequence[int] = _non_utf8_positions(buffer, offsets)
        elif self.codec.name == "msgpack":
            suspects = range(len(offsets) - 1)
        else:
            return
        if not suspects:
            return
        bounds = offsets.tolist()
        assert decode is not None
        for position in suspects:
            try:
                decode(buffer, bounds[position], bounds[position + 1])
            except DECODE_ERRORS as error:
                raise self.decode_error(int(indices[position]), error) from None

    # -- verify ------------------------------------------------------------------------------

    def verify(
        self,
        data: Any,
        decode: Callable[[Any, int, int], Any] | None,
        progress: Callable[[int], None] | None = None,
        *,
        read_index: Callable[[int, int], Any] | None = None,
    ) -> None:
        """Check every byte of the index and of the data file and, for every record, every rule a read checks (§1.3).

        `data` is the data file as a buffer (a map of a cached copy), or a function (offset, length) -> bytes that
        reads it; `read_index` likewise reads the index file (by default, from its map). A local shard is read
        with ``pread``, never through a map: a hole of a sparse file on a full filesystem cannot be faulted in
        (the kernel kills the process with SIGBUS), while ``pread`` returns its zeros. `decode` decodes a
        ``msgpack`` record as reads do.

        In order: the index body checksum; then, a chunk of records at a time (`VERIFY_CHUNK_BYTES`, or one
        larger record), that the offsets never decrease, the whole data file's CRC32C (always when recorded: record
        checksums locate damage but do not vouch for the header's ``data_crc32c``), each record's checksum
        when the shard has them, and every rule of `record_rules`. Raises on a damaged structure at once;
        damaged records are all listed in one CorruptRecordError. `progress` receives byte counts of the data file.
        """
        header = self.header
        read_data = data if callable(data) else _buffer_reader(data)
        read_index = read_index or _buffer_reader(self.map)
        body_crc = 0
        for start in range(fmt.HEADER_SIZE, header.index_size, VERIFY_CHUNK_BYTES):
            body_crc = crc32c(read_index(start, min(VERIFY_CHUNK_BYTES, header.index_size - start)), body_crc)
        if body_crc != header.body_crc32c:
            raise FormatError(
                f"index body checksum is {body_crc:#010x}, expected {header.body_crc32c:#010x}", path=self.index_path
            )
        disorder = None
        if self.blocks is not None:
            data_crc, failed, disorder = self.blocks.verify(read_index, read_data, self.block_record_faults, progress)
            checksum_failures = failed.get(BAD_BLOCK_CHECKSUM, []) or failed.get(REFUSED, [])
        else:
            data_crc, failed = self._verify_records(read_index, read_data, decode, progress)
            checksum_failures = failed[_BAD_CHECKSUM]
        problems = [disorder] if disorder else []
        problems += [f"{_counted(records, *reason)}: {_describe(records)}" for reason, records in failed.items() if records]
        # Not checked when not recorded (§1.2: the caller says so from the header), nor when damaged records explain it.
        if header.data_crc_recorded and data_crc != header.data_crc32c and not checksum_failures:
            also = ", though every record passes its own checksum" if header.has_record_checksums else ""
            problems.append(
                f"data checksum is {data_crc:#010x}, expected {header.data_crc32c:#010x} (the header's data_crc32c){also}"
            )
        if problems:
            damaged = sorted(set().union(*failed.values()))
            raise CorruptRecordError("; ".join(problems), path=self.data_path, records=damaged)

    def _verify_records(self, read_index: Callable[[int, int], Any], read_data: Callable[[int, int], Any],
                        decode: Callable[[Any, int, int], Any] | None, progress: Callable[[int], None] | None,
                        ) -> tuple[int, dict[tuple[str, str], list[int]]]:
        """The data file's CRC32C and the damaged records by reason, a chunk of records at a time (1.x, 2.x)."""
        rules = self.record_rules(decode)
        failed: dict[tuple[str, str], list[int]] = {_BAD_CHECKSUM: [], **{reason: [] for reason, _ in rules}}
        data_crc = 0
        for chunk in self._verify_chunks(read_index, read_data):
            data_crc, wrong = _checksummed(chunk, data_crc)
            failed[_BAD_CHECKSUM] += [chunk.first + position for position in wrong]
            for reason, find_failing in rules:
                failed[reason] += find_failing(chunk)
            if progress is not None:
                progress(len(chunk.data))
        return data_crc, failed

    def _verify_chunks(self, read_index: Callable[[int, int], Any], read_data: Callable[[int, int], Any]) -> Iterator[VerifyChunk]:
        """The records in order, as chunks of consecutive records read with `read_data`, their offsets checked
        first (read with `read_index` `_VERIFY_RECORDS` at a time, as are their checksums)."""
        header = self.header
        for block_start in range(0, self.count, _VERIFY_RECORDS):
            block_stop = min(block_start + _VERIFY_RECORDS, self.count)
            offsets = np.frombuffer(
                read_index(header.offsets_start + fmt.OFFSET_SIZE * block_start, fmt.OFFSET_SIZE * (block_stop - block_start + 1)), "<u8"
            )
            self._check_offsets(block_start, offsets)
            checksums = (
                np.frombuffer(read_index(header.checksums_start + 4 * block_start, 4 * (block_stop - block_start)), "<u4")
                if header.has_record_checksums
                else None
            )
            first = block_start
            while first < block_stop:
                position = first - block_start
                base = int(offsets[position])
                count = max(1, int(np.searchsorted(offsets[position + 1 :], np.uint64(base + VERIFY_CHUNK_BYTES), "right")))
                chunk_offsets = offsets[position : position + count + 1]
                yield VerifyChunk(
                    first,
                    chunk_offsets,
                    read_data(base, int(chunk_offsets[-1]) - base),
                    None if checksums is None else checksums[position : position + count],
                )
                first += count

    def record_rules(self, decode: Callable[[Any, int, int], Any] | None) -> list[RecordRule]:
        """The rules a read checks of a record's bytes (a ``msgpack`` one decoded by `decode`); none for ``bytes``."""
        if self.decompressor is not None:
            return [(("does not decode", "do not decode"), self._undecodable_frames)]
        if self.dtype is not None:
            row_size: int = self.codec.row_size  # type: ignore[attr-defined]
            rules: list[RecordRule] = (
                [((f"is not on {row_size}-byte row boundaries", f"are not on {row_size}-byte row boundaries"), self._off_row_records)]
                if row_size > 1
                else []
            )
            if self.dtype.kind == "b":
                rules.append((("holds |b1 bytes other than 0 or 1", "hold |b1 bytes other than 0 or 1"), self._invalid_bool_records))
            return rules
        if self.codec.name == "str":
            return [(("is not valid UTF-8", "are not valid UTF-8"), _non_utf8_records)]
        if self.codec.name == "msgpack":
            assert decode is not None
            return [(("does not decode as msgpack", "do not decode as msgpack"), functools.partial(_undecodable_records, decode))]
        return []

    def _undecodable_frames(self, chunk: VerifyChunk) -> list[int]:
        """Records of a compressed chunk whose frame breaks a rule of §1.6 or whose decoded payload a read refuses."""
        bounds = chunk.relative.tolist()
        sizes = self.sizes[chunk.first : chunk.first + len(bounds) - 1].tolist()  # type: ignore[index]
        decode, row_size = self.codec.decode, getattr(self.codec, "row_size", 1)
        bad = []
        for position, (start, end) in enumerate(zip(bounds, bounds[1:])):
            try:
                if sizes[position] % row_size:
                    raise ValueError(f"{sizes[position]} decoded bytes are not whole {row_size}-byte rows")
                payload = self.decompressor.decompress(chunk.data, start, end, sizes[position])  # type: ignore[union-attr]
                decode(payload, 0, len(payload))
            except DECODE_ERRORS:
                bad.append(chunk.first + position)
        return bad

    def _invalid_bool_records(self, chunk: VerifyChunk) -> list[int]:
        """Records of a ``|b1`` chunk holding a byte other than 0 or 1, in one vectorised pass."""
        bad = self.codec.records_with_invalid_bools(np.frombuffer(chunk.data, np.uint8), chunk.relative)  # type: ignore[attr-defined]
        return (bad + chunk.first).tolist()

    def _off_row_records(self, chunk: VerifyChunk) -> list[int]:
        """Records of an ``ndarray`` chunk with an offset off a row boundary (both records sharing it), vectorised."""
        off_row = np.flatnonzero(chunk.offsets % self.codec.row_size)  # type: ignore[attr-defined]
        if not off_row.size:
            return []
        records = np.union1d(off_row - 1, off_row) + chunk.first
        return records[(records >= chunk.first) & (records < chunk.first + len(chunk.offsets) - 1)].tolist()


def _decompressor(header: Header, metadata: dict[str, Any], dictionary: bytes, path: str) -> zstd_format.Decompressor:
    """§1.3 step 7 for a compressed shard: the "compression" member of its `metadata` (parsed) names the header's
    compression, and the dictionary has its CRC32C and is a zstd dictionary; then what decodes its frames."""
    member = metadata.get("compression")
    name = zstd_format.NAMES[header.compression]
    if not isinstance(member, dict) or member.get("name") != name:
        raise FormatError(f'the metadata\'s "compression" member must name {name!r}, the header\'s compression; found {member!r}', path=path)
    if header.compression not in zstd_format.WITH_DICTIONARY:
        return zstd_format.shared_decompressor(header.compression, None)
    actual = crc32c(dictionary)
    if actual != header.dictionary_crc32c:
        raise FormatError(f"dictionary checksum is {actual:#010x}, expected {header.dictionary_crc32c:#010x}", path=path)
    zstd_format.dictionary_id(dictionary, path=path)
    return zstd_format.shared_decompressor(header.compression, bytes(dictionary))


def _buffer_reader(buffer: Any) -> Callable[[int, int], memoryview]:
    """A function (offset, length) -> those bytes of `buffer`, viewed, not copied."""
    view = memoryview(buffer)
    return lambda offset, length: view[offset : offset + length]


def _checksummed(chunk: VerifyChunk, data_crc: int) -> tuple[int, list[int]]:
    """The data file's CRC32C continued over the chunk, and the positions in the chunk of the records that fail
    their checksum (none without checksums): in one C call where the extension is built, which lets other threads
    run meanwhile."""
    if speedups is not None:
        return speedups.verify_checksums(chunk.data, chunk.offsets, chunk.checksums, data_crc)  # type: ignore[no-any-return]
    data_crc = crc32c(chunk.data, data_crc)
    if chunk.checksums is None:
        return data_crc, []
    return data_crc, np.flatnonzero(crc32c_of_ranges(chunk.data, chunk.relative) != chunk.checksums).tolist()


def _non_utf8_records(chunk: VerifyChunk) -> list[int]:
    """Records of a ``str`` chunk that are not valid UTF-8 (one vectorised pass unless one is not)."""
    return [chunk.first + position for position in _non_utf8_positions(chunk.data, chunk.relative)]


def _undecodable_records(decode: Callable[[Any, int, int], Any], chunk: VerifyChunk) -> list[int]:
    """Records of a chunk that the codec's decode (the one every read uses) refuses."""
    return [chunk.first + position for position in _undecodable_positions(decode, chunk.data, chunk.relative)]


def _undecodable_positions(decode: Callable[[Any, int, int], Any], buffer: Any, offsets: np.ndarray) -> list[int]:
    """Positions k of the records ``buffer[offsets[k]:offsets[k + 1]]`` that `decode` refuses."""
    bounds = offsets.tolist()
    bad = []
    for position, (start, end) in enumerate(zip(bounds, bounds[1:])):
        try:
            decode(buffer, start, end)
        except DECODE_ERRORS:
            bad.append(position)
    return bad


def _no_faults(buffer: Any, offsets: np.ndarray) -> list[int]:
    """``bytes`` records: any bytes are one."""
    return []


_BAD_CHECKSUM = ("fails its checksum", "fail their checksum")


def _counted(records: list[int], one: str, many: str) -> str:
    """ "1 record fails its checksum" or "3 records fail their checksum"."""
    return f"1 record {one}" if len(records) == 1 else f"{len(records)} records {many}"
