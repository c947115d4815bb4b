"""`ShardBlocks`: a 3.x shard's block table (spec/FORMAT.md §1.7), checked, and every rule a read checks of a
block: finding the block of a record, its bounds, its CRC32C and frame, decoding it once for the records it holds.

A `ShardIndex` of a 3.x shard holds one; its readers (`Reader`, `RemoteShard`) hand it the stored frames (a map of
the data file, or bytes fetched for a batch) and get the records' decoded bytes back. It keeps the last block it
decoded, so that reads of consecutive records decode each block once.
"""

from __future__ import annotations

import mmap
import struct
from typing import Any, Callable, NamedTuple

import numpy as np

from ..errors import CorruptRecordError, FormatError
from ..format import blocks as block_format
from ..format import compression as zstd_format
from ..format.checksum import crc32c, crc32c_of_each
from ..format.codecs import Codec, check_bool_bytes
from ..format.header import Header

_ENTRY = struct.Struct("<Q")
_VERIFY_BLOCKS = 1 << 16  # table entries a verification reads at once
_VERIFY_BYTES = 1 << 20  # stored bytes a verification decodes at once (more for one larger block)


def check_table_ends(read_index: Callable[[int, int], bytes], header: Header, data_size: int, *, path: str) -> None:
    """§1.3 steps 6 and 9 for a 3.x index, reading (offset, length) of it with `read_index`: the stored B is at
    most N and is the B of the index's size, then the offsets and the block table start at 0 and end at the data
    size and at N."""
    blocks_start, count = header.blocks_start, header.record_count
    (stored,) = _ENTRY.unpack(read_index(blocks_start, block_format.ENTRY_SIZE))
    if stored > count:
        raise FormatError(f"the block table holds {stored} blocks, more than the shard's {count} records", path=path)
    if stored != header.block_count:
        raise FormatError(f"index file is {header.index_size} bytes, the size for {header.block_count} blocks, but "
                          f"its block table holds {stored}", path=path)
    offsets_at = blocks_start + block_format.ENTRY_SIZE
    records_at = offsets_at + block_format.ENTRY_SIZE * (stored + 1)
    first_offset, last_offset, first_record, last_record = (
        _ENTRY.unpack(read_index(at, block_format.ENTRY_SIZE))[0]
        for at in (offsets_at, records_at - block_format.ENTRY_SIZE, records_at, records_at + block_format.ENTRY_SIZE * stored)
    )
    (first,) = _ENTRY.unpack(read_index(header.offsets_start, block_format.ENTRY_SIZE))
    if first != 0:
        raise FormatError(f"offsets start at {first}, expected 0", path=path)
    if first_offset != 0 or last_offset != data_size:
        raise FormatError(f"block offsets run from {first_offset} to {last_offset}, expected 0 to {data_size}", path=path)
    if first_record != 0 or last_record != count:
        raise FormatError(f"block records run from {first_record} to {last_record}, expected 0 to {count}", path=path)


class _Block(NamedTuple):
    """A checked block: its number, its stored frame [start, end) in the data file, the decoded offset of its first
    record and its block size."""

    number: int
    start: int
    end: int
    base: int
    size: int


class Located(NamedTuple):
    """Records of a batch, each in its checked block: `numbers[k]` holds record indices[k], whose decoded bytes are
    [starts[k], ends[k]) of that block's."""

    indices: np.ndarray
    numbers: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


class ShardBlocks:
    """The block table of a 3.x shard, viewed in its index map, and what decodes its blocks."""

    def __init__(self, index_map: mmap.mmap | bytes, header: Header, offsets: np.ndarray,
                 decompressor: zstd_format.Decompressor, *, data_path: str) -> None:
        count = header.block_count
        offsets_at = header.blocks_start + block_format.ENTRY_SIZE
        records_at = offsets_at + block_format.ENTRY_SIZE * (count + 1)
        self.count = count
        self.block_offsets = np.frombuffer(index_map, "<u8", count + 1, offsets_at)
        self.block_records = np.frombuffer(index_map, "<u8", count + 1, records_at)
        self.block_checksums = np.frombuffer(index_map, "<u4", count, records_at + block_format.ENTRY_SIZE * (count + 1))
        self._record_offsets_at, self._offsets_at, self._records_at = header.offsets_start, offsets_at, records_at
        self._checksums_at = records_at + block_format.ENTRY_SIZE * (count + 1)
        self.offsets = offsets
        self.record_count = header.record_count
        self.data_size = header.data_size
        self.decompressor = decompressor
        self.data_path = data_path
        self._last: tuple[int, bytes] = (-1, b"")  # the block decoded last and its bytes, replaced as one tuple

    def close(self) -> None:
        self.block_offsets = self.block_records = self.block_checksums = self.offsets = None  # type: ignore[assignment]
        self._last = (-1, b"")

    # -- errors ------------------------------------------------------------------------------

    def _error(self, records: list[int], block: int, what: str) -> CorruptRecordError:
        """Records `records` (of one block) refused because block `block` breaks a rule of §1.7, `what`."""
        shown = f"record {records[0]}" if len(records) == 1 else f"records {records[0]} (and {len(records) - 1} more of the batch)"
        return CorruptRecordError(f"{shown}: block {block} {what}", path=self.data_path, records=records)

    # -- finding blocks ------------------------------------------------------------------------

    def block_of(self, index: int) -> _Block:
        """The block of record `index` (0 <= index < N), found by the spec's bisect and checked (§1.7)."""
        number = int(np.searchsorted(self.block_records, np.uint64(index), "right")) - 1  # one key: bisect_right exactly
        return self._check_block(index, number)

    def _check_block(self, index: int, number: int) -> _Block:
        """Block `number` as record `index`'s: refused unless it brackets the record and its offsets, sizes and
        bounds are sound."""
        if not 0 <= number < self.count:
            raise self._error([index], number, f"is no block of the {self.count} (the block table is out of order)")
        first, last = int(self.block_records[number]), int(self.block_records[number + 1])
        if not first <= index < last or last > self.record_count:
            raise self._error([index], number, f"holds records [{first}, {last}), which do not hold record {index} "
                                               f"within the {self.record_count} records")
        start, end = int(self.block_offsets[number]), int(self.block_offsets[number + 1])
        if not start <= end <= self.data_size:
            raise self._error([index], number, f"has stored offsets [{start}, {end}), outside the {self.data_size}-byte "
                                               "data file or reversed")
        base, top = int(self.offsets[first]), int(self.offsets[last])
        record_start, record_end = int(self.offsets[index]), int(self.offsets[index + 1])
        if not base <= record_start <= record_end <= top:
            raise self._error([index], number, f"decodes to [{base}, {top}), which does not hold the record's offsets "
                                               f"[{record_start}, {record_end}) in order")
        if top - base > block_format.MAX_BLOCK_SIZE:
            raise self._error([index], number, f"is {top - base} bytes decoded, more than {block_format.MAX_BLOCK_SIZE}")
        return _Block(number, start, end, base, top - base)

    def locate(self, indices: np.ndarray) -> Located:
        """Each record's block and its decoded range within it, every read's checks made with numpy in one pass;
        the first record failing one is refused by `_check_block`, whose error says why."""
        numbers = block_format.bisect_right_many(self.block_records, indices) - 1
        valid = (numbers >= 0) & (numbers < self.count)
        safe = np.where(valid, numbers, 0)
        first, last = self.block_records[safe], self.block_records[safe + 1]
        keys = indices.astype(np.uint64)
        valid &= (first <= keys) & (keys < last) & (last <= self.record_count)
        stored = self.block_offsets[safe], self.block_offsets[safe + 1]
        valid &= (stored[0] <= stored[1]) & (stored[1] <= self.data_size)
        bases = self.offsets[np.where(valid, first, 0).astype(np.int64)]
        tops = self.offsets[np.where(valid, last, 0).astype(np.int64)]
        starts, ends = self.offsets[indices], self.offsets[indices + 1]
        valid &= (bases <= starts) & (starts <= ends) & (ends <= tops) & (tops - bases <= block_format.MAX_BLOCK_SIZE)
        if not valid.all():
            position = int(np.argmin(valid))
            self._check_block(int(indices[position]), int(numbers[position]))
        return Located(indices, numbers, (starts - bases).astype(np.int64), (ends - bases).astype(np.int64))

    def plan(self, indices: np.ndarray) -> tuple[Located, np.ndarray, tuple[int, bytes]]:
        """What a batch of records at `indices` needs: each located, the distinct blocks whose frames must be read
        (sorted), and the last decoded block, which serves its records without being read again."""
        located = self.locate(indices)
        cached = self._last
        numbers = np.unique(located.numbers)
        return located, numbers[numbers != cached[0]], cached

    def read(self, index: int, data: Any) -> tuple[bytes, int, int]:
        """Record `index` (0 <= index < N): its block's decoded bytes, from the frames in `data` (the data file), and
        where the record lies in them."""
        block = self.block_of(index)
        decoded = self.decode(block.number, data, block.start, block.end, block.size, [index])
        return decoded, int(self.offsets[index]) - block.base, int(self.offsets[index + 1]) - block.base

    def stored_span(self, start: int, stop: int) -> tuple[int, int]:
        """The stored bytes, [first, end) of the data file, of the blocks that records [start, stop) name (not
        checked: for advice to the kernel)."""
        records = self.block_records
        first = max(0, min(int(np.searchsorted(records, np.uint64(start), "right")) - 1, self.count))
        last = max(first, min(int(np.searchsorted(records, np.uint64(max(start, stop - 1)), "right")), self.count))
        return min(int(self.block_offsets[first]), self.data_size), min(int(self.block_offsets[last]), self.data_size)

    def stored_ranges(self, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The stored frames' byte ranges (starts, ends) in the data file of blocks `numbers` (found by `locate`)."""
        return self.block_offsets[numbers].astype(np.int64), self.block_offsets[numbers + 1].astype(np.int64)

    def block_sizes(self, numbers: np.ndarray) -> np.ndarray:
        """block_size(b) of each of `numbers` (found by `locate`)."""
        return (self.offsets[self.block_records[numbers + 1].astype(np.int64)]
                - self.offsets[self.block_records[numbers].astype(np.int64)]).astype(np.int64)

    # -- decoding ------------------------------------------------------------------------------

    def decode(self, number: int, data: Any, start: int, end: int, size: int, records: list[int]) -> bytes:
        """Block `number`'s frame data[start:end], checked against its CRC32C and §1.6's rules of a frame of its
        block size `size`, decoded (and kept as the last decoded block); `records` are those whose read needs it."""
        last = self._last
        if last[0] == number:
            return last[1]
        expected = int(self.block_checksums[number])
        actual = crc32c(memoryview(data)[start:end])
        if actual != expected:
            raise self._error(records, number, f"checksum is {actual:#010x}, expected {expected:#010x}")
        try:
            decoded = self.decompressor.decompress(data, start, end, size)
        except ValueError as error:
            raise self._error(records, number, f"is not a valid frame of {size} bytes of this "
                                               f"{zstd_format.NAMES[self.decompressor.compression]} shard: {error}") from None
        self._last = (number, decoded)
        return decoded

    def gather(self, located: Located, data: Any, numbers: np.ndarray, starts: np.ndarray, ends: np.ndarray,
               cached: tuple[int, bytes]) -> tuple[bytes, np.ndarray]:
        """The located records' decoded bytes back to back, and the N + 1 offsets of each in them. Their blocks'
        frames are data[starts[k]:ends[k]] for the distinct blocks `numbers`, but for the `cached` block (from
        `plan`, taken before the frames were fetched); each frame is checked against its CRC32C, then all
        are decoded in one call (a failing one is named by `decode`). The block of the last record is kept."""
        sizes = self.block_sizes(numbers)
        decoded = self._decode_frames(located, data, numbers, starts, ends, sizes)
        bases = np.zeros(len(numbers) + 1, np.int64)
        np.cumsum(sizes, out=bases[1:])
        buffer = decoded
        if cached[0] >= 0 and (located.numbers == cached[0]).any():
            numbers, sizes, buffer = np.append(numbers, cached[0]), np.append(sizes, len(cached[1])), decoded + cached[1]
        else:
            bases = bases[:-1]
        order = np.argsort(numbers, kind="stable")
        held = order[np.searchsorted(numbers[order], located.numbers)]
        at = bases[held]
        if len(held):
            last = int(held[-1])
            if int(numbers[last]) != self._last[0]:
                self._last = (int(numbers[last]), buffer[int(bases[last]) : int(bases[last] + sizes[last])])
        return _joined_ranges(buffer, at + located.starts, at + located.ends)

    def _decode_frames(self, located: Located, data: Any, numbers: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                       sizes: np.ndarray) -> bytes:
        """Blocks `numbers`, their frames data[starts[k]:ends[k]], checked and decoded back to back in one call."""
        with memoryview(data) as view:
            actual = np.frombuffer(crc32c_of_each([view[start:end] for start, end in zip(starts.tolist(), ends.tolist())]), np.uint32)
        wrong = np.flatnonzero(actual != self.block_checksums[numbers])
        if wrong.size:
            self._refuse_frame(located, data, numbers, starts, ends, int(wrong[0]))
        try:
            return self.decompressor.decompress_many(data, starts, ends, sizes)
        except ValueError:
            for position in range(len(numbers)):
                self._refuse_frame(located, data, numbers, starts, ends, position)
            raise

    def _refuse_frame(self, located: Located, data: Any, numbers: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                      position: int) -> None:
        """Raise `decode`'s error for block numbers[position] (whose frame is data[starts:ends] at that position),
        naming the batch's records it holds; return if the frame passes."""
        number = int(numbers[position])
        records = located.indices[located.numbers == number].tolist()
        self._last = (-1, b"")
        self.decode(number, data, int(starts[position]), int(ends[position]), int(self.block_sizes(numbers[position : position + 1])[0]), records)

    # -- verification --------------------------------------------------------------------------

    def verify(self, read_index: Callable[[int, int], Any], read_data: Callable[[int, int], Any],
               faults: Callable[[Any, np.ndarray], list[int]], progress: Callable[[int], None] | None,
               ) -> tuple[int, dict[tuple[str, str], list[int]], str | None]:
        """Full verification's checks of the offsets, the block table and every block (§1.7), reading (offset,
        length) of the index and data files with `read_index` and `read_data` (the caller checked the index
        body): that `offsets` and `block_offsets` never decrease and `block_records` increase strictly; then, a
        run of blocks at a time, each block's size, checksum and frame, and its records under `faults` (the
        positions of those a read refuses, given a block's decoded bytes and their offsets in it). Returns the CRC32C of the stored bytes, the
        damaged records by reason and what is out of order, if anything: then the damaged records are those a
        read refuses, each record read as a read reads it."""
        failed: dict[tuple[str, str], list[int]] = {BAD_BLOCK_CHECKSUM: [], BAD_FRAME: [], BAD_RECORD: []}
        disorder = self._disorder(read_index)
        if disorder is not None:
            failed = {REFUSED: self._records_a_read_refuses(read_data, faults)}
            return self._data_crc(read_data, progress), failed, disorder
        data_crc = 0
        for first in range(0, self.count, _VERIFY_BLOCKS):
            table = self._read_table(read_index, first, min(first + _VERIFY_BLOCKS, self.count))
            run = 0
            while run < len(table.checksums):
                limit = int(table.offsets[run]) + _VERIFY_BYTES
                run_stop = min(len(table.checksums), run + max(1, int(np.searchsorted(table.offsets[run + 1 :], np.uint64(limit), "right"))))
                base = int(table.offsets[run])
                stored = read_data(base, int(table.offsets[run_stop]) - base)
                data_crc = crc32c(stored, data_crc)
                self._verify_run(read_index, table, run, run_stop, stored, faults, failed)
                if progress is not None:
                    progress(len(stored))
                run = run_stop
        return data_crc, failed, None

    def _read_table(self, read_index: Callable[[int, int], Any], first: int, stop: int) -> _TableChunk:
        """Entries [first, stop] of block_offsets and block_records and [first, stop) of the checksums."""
        entry, count = block_format.ENTRY_SIZE, stop - first + 1
        return _TableChunk(
            np.frombuffer(read_index(self._offsets_at + entry * first, entry * count), "<u8"),
            np.frombuffer(read_index(self._records_at + entry * first, entry * count), "<u8"),
            np.frombuffer(read_index(self._checksums_at + block_format.CHECKSUM_SIZE * first, block_format.CHECKSUM_SIZE * (count - 1)), "<u4"),
        )

    def _disorder(self, read_index: Callable[[int, int], Any]) -> str | None:
        """What is out of order, read `_VERIFY_BLOCKS` entries at a time: offsets that decrease, block_offsets that
        decrease or block_records that do not increase strictly; None when nothing is."""
        entry = block_format.ENTRY_SIZE
        for first in range(0, self.record_count, _VERIFY_BLOCKS):
            stop = min(first + _VERIFY_BLOCKS, self.record_count)
            offsets = np.frombuffer(read_index(self._record_offsets_at + entry * first, entry * (stop - first + 1)), "<u8")
            if (offsets[1:] < offsets[:-1]).any():
                return f"the offsets decrease after record {first + int(np.argmax(offsets[1:] < offsets[:-1]))}"
        for first in range(0, self.count, _VERIFY_BLOCKS):
            table = self._read_table(read_index, first, min(first + _VERIFY_BLOCKS, self.count))
            if (table.offsets[1:] < table.offsets[:-1]).any():
                return f"the block offsets decrease after block {first + int(np.argmax(table.offsets[1:] < table.offsets[:-1]))}"
            if (table.records[1:] <= table.records[:-1]).any():
                return f"the blocks' first records do not increase after block {first + int(np.argmax(table.records[1:] <= table.records[:-1]))}"
        return None

    def _records_a_read_refuses(self, read_data: Callable[[int, int], Any], faults: Callable[[Any, np.ndarray], list[int]]) -> list[int]:
        """Every record a read refuses, each read as a read reads it (its block found by the spec's bisect): for a
        shard whose offsets or block table are out of order, where no block can be taken to hold its records."""
        refused, damaged = [], -1  # damaged: the block whose frame a read refused last, refused again without a check
        for index in range(self.record_count):
            try:
                block = self.block_of(index)
                if block.number == damaged:
                    refused.append(index)
                    continue
                last = self._last  # one read of the tuple: another thread may replace it
                if last[0] == block.number:
                    decoded = last[1]
                else:
                    damaged, length = block.number, block.end - block.start
                    decoded = self.decode(block.number, read_data(block.start, length), 0, length, block.size, [index])
                    damaged = -1
            except CorruptRecordError:
                refused.append(index)
                continue
            if faults(decoded, self.offsets[index : index + 2].astype(np.int64) - block.base):
                refused.append(index)
        return refused

    def _data_crc(self, read_data: Callable[[int, int], Any], progress: Callable[[int], None] | None) -> int:
        """The CRC32C of the whole data file, read `_VERIFY_BYTES` at a time."""
        data_crc = 0
        for start in range(0, self.data_size, _VERIFY_BYTES):
            stored = read_data(start, min(_VERIFY_BYTES, self.data_size - start))
            data_crc = crc32c(stored, data_crc)
            if progress is not None:
                progress(len(stored))
        return data_crc

    def _verify_run(self, read_index: Callable[[int, int], Any], table: _TableChunk, run: int, stop: int, stored: Any,
                    faults: Callable[[Any, np.ndarray], list[int]], failed: dict[tuple[str, str], list[int]]) -> None:
        """Blocks [run, stop) of `table`, whose frames are `stored` (from the run's first stored offset): sizes,
        checksums, frames and records, the damaged records added to `failed`."""
        first_record, stop_record = int(table.records[run]), int(table.records[stop])
        entry = block_format.ENTRY_SIZE
        offsets = np.frombuffer(read_index(self._record_offsets_at + entry * first_record, entry * (stop_record - first_record + 1)), "<u8")
        records = table.records[run : stop + 1].astype(np.int64)
        bounds = offsets[records - first_record].astype(np.int64)
        sizes = np.diff(bounds)
        base = int(table.offsets[run])
        starts, ends = (table.offsets[run:stop].astype(np.int64) - base), (table.offsets[run + 1 : stop + 1].astype(np.int64) - base)
        with memoryview(stored) as view:
            actual = np.frombuffer(crc32c_of_each([view[start:end] for start, end in zip(starts.tolist(), ends.tolist())]), np.uint32)
        for position in range(stop - run):
            held = list(range(int(records[position]), int(records[position + 1])))
            if actual[position] != table.checksums[run + position]:
                failed[BAD_BLOCK_CHECKSUM] += held
                continue
            size = int(sizes[position])
            try:
                if size > block_format.MAX_BLOCK_SIZE:
                    raise ValueError(f"{size} decoded bytes")
                block = self.decompressor.decompress(stored, int(starts[position]), int(ends[position]), size)
            except ValueError:
                failed[BAD_FRAME] += held
                continue
            relative = offsets[held[0] - first_record : held[-1] - first_record + 2].astype(np.int64) - int(bounds[position])
            failed[BAD_RECORD] += [held[0] + fault for fault in faults(block, relative)]


class _TableChunk(NamedTuple):
    """Entries of the block table read for verification: consecutive blocks' stored `offsets` and first `records`
    (one entry more each: where the last block ends) and their `checksums`."""

    offsets: np.ndarray
    records: np.ndarray
    checksums: np.ndarray


def record_decoder(codec: Codec) -> Callable[[Any, int, int], Any]:
    """How a read decodes a record from its block's decoded bytes (§1.7: a record of the codec, §2): ``ndarray``
    records are whole rows (not necessarily aligned in the block) and ``|b1`` bytes 0 or 1."""
    dtype = getattr(codec, "dtype", None)
    if dtype is None:
        return codec.decode
    row_size, shape = codec.row_size, tuple(getattr(codec, "shape", None) or ())  # type: ignore[attr-defined]

    def decode(buffer: Any, start: int, end: int) -> np.ndarray:
        if (end - start) % row_size:
            raise ValueError(f"{end - start} bytes are not whole {row_size}-byte rows")
        payload = np.frombuffer(buffer, np.uint8, end - start, start)
        if dtype.kind == "b":
            check_bool_bytes(payload)
        return payload.view(dtype).reshape((-1, *shape))

    return decode


BAD_BLOCK_CHECKSUM = ("is in a block that fails its checksum", "are in blocks that fail their checksum")
BAD_FRAME = ("is in a block whose frame is damaged", "are in blocks whose frames are damaged")
BAD_RECORD = ("does not decode under its codec", "do not decode under their codec")
REFUSED = ("is refused by a read", "are refused by a read")


def _joined_ranges(buffer: bytes, starts: np.ndarray, ends: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The ranges [starts[k], ends[k]) of `buffer` copied back to back, and the N + 1 offsets of each in the copy."""
    offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(ends - starts, out=offsets[1:])
    with memoryview(buffer) as view:
        joined = b"".join([view[start:end] for start, end in zip(starts.tolist(), ends.tolist())])
    return joined, offsets
