"""`Writer`: streams records into one shard and commits it atomically."""

from __future__ import annotations

import os
import struct
import sys
from array import array
from itertools import accumulate
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np

from ..errors import ClosedError, RecordTypeError, ShardExistsError, VarstoreError
from ..format import blocks as block_format
from ..format import compression as zstd_format
from ..format import header as fmt
from ..format.checksum import crc32c, crc32c_of_each, crc32c_of_ranges
from ..format.codecs import Codec, make_codec
from ..format.metadata import encode_metadata
from ..local.file_url import resolve_file_url
from ..local.locks import WriterLock, lock_shard
from ..local.publish import (
    make_directories,
    publish,
    refuse_in_a_forked_child,
    remove_quietly,
    storage_error,
    temporary_path,
    write_all,
)

_Self = TypeVar("_Self", bound="CommitsOnExit")
_DATA_BUFFER_BYTES = 1 << 20
_SPOOL_ENTRIES = 1 << 16
# What each buffered record takes of the buffer's room besides its bytes: bounds the records held per buffer
# to _DATA_BUFFER_BYTES / 64 however small they are (empty ones included), and so their objects' memory.
_BUFFERED_RECORD_COST = 64
_EXTEND_CHUNK = 1024  # records `extend` encodes and buffers per step
_LITTLE_ENDIAN = sys.byteorder == "little"
_BLOCK_SPOOLS = ("block_offsets", "block_records", "block_checksums")  # a 3.x index's block table, in its order


def _le_bytes(values: array) -> bytes:
    if not _LITTLE_ENDIAN:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _running_sums(sizes: Iterable[int], start: int) -> Iterator[int]:
    """`start` plus each prefix sum of `sizes`: the offsets where each of them ends, after `start`."""
    sums = accumulate(sizes, initial=start)
    next(sums)
    return sums


def refused_record(error: RecordTypeError, position: int, path: str) -> RecordTypeError:
    """The codec's refusal `error`, naming the record by its position in what is being written."""
    return RecordTypeError(f"record {position}: {error}", path=path)


def _first_refused_row(codec: Codec, rows: np.ndarray) -> int:
    """The first row of `rows` that `codec` refuses, by bisecting on prefixes: a prefix is refused once it holds
    a value that does not fit (a wrong shape or dtype is refused from row 0). Only called once all rows were refused."""
    accepted, refused = 0, len(rows)  # rows[:accepted] encode; rows[:refused] do not
    while refused - accepted > 1:
        middle = (accepted + refused) // 2
        try:
            codec.encode(rows[:middle])
        except RecordTypeError:
            refused = middle
        else:
            accepted = middle
    return accepted


def _encode_rows(codec: Codec, values: Any, lengths: np.ndarray, first_position: int, path: str) -> memoryview:
    """`values` encoded by an ndarray codec; if it refuses them, the error names the first record whose rows it refuses."""
    try:
        return codec.encode(values)  # type: ignore[return-value]
    except RecordTypeError as error:
        rows = np.asarray(values)
        record = len(lengths)
        if rows.ndim and len(rows):
            record = int(np.searchsorted(np.cumsum(lengths), _first_refused_row(codec, rows), side="right"))
        where = f"record {first_position + record}: " if record < len(lengths) else ""
        raise RecordTypeError(f"{where}{error}", path=path) from None


def flat_payloads(
    codec: Codec, values: Any, lengths: Any, first_position: int, path: str
) -> tuple[bytes | bytearray | memoryview, np.ndarray]:
    """The payload bytes of records given flat (see `Writer.extend_flat`) and the byte offset where each ends.

    Records are numbered from `first_position` and errors name the store at `path`.
    Lengths are checked without overflow: each against what the payload holds
    before any multiplication, and the running sum for wrap-around.
    """
    if codec.name not in ("bytes", "ndarray"):
        raise RecordTypeError(f"extend_flat takes bytes or ndarray records; {codec.name} records must be encoded one by one",
                              path=path)
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and (lengths.dtype.kind not in "iu" or lengths.min() < 0)):
        raise RecordTypeError("lengths must be a 1-D array of non-negative integers", path=path)
    if codec.name == "ndarray":
        payload = _encode_rows(codec, values, lengths, first_position, path)
        row_size = codec.row_size  # type: ignore[attr-defined]
    else:
        try:
            view = memoryview(values)
        except TypeError:
            raise RecordTypeError(f"extend_flat on a bytes shard takes a bytes-like object, not {type(values).__name__}", path=path) from None
        payload = view.cast("B") if view.c_contiguous else view.tobytes()  # copied, as `append` does
        row_size = 1
    if not lengths.size:
        ends = np.zeros(0, np.int64)
    else:
        longest = int(lengths.max())
        if longest > len(payload) // row_size:
            raise RecordTypeError(f"a length of {longest} exceeds the {len(payload) // row_size} rows (or bytes) that values hold", path=path)
        # Every byte length is now at most len(payload) < 2**63: the products cannot overflow, and a
        # uint64 running sum that wrapped would decrease somewhere.
        ends = np.cumsum(lengths.astype(np.uint64) * np.uint64(row_size), dtype=np.uint64)
        if np.any(ends[1:] < ends[:-1]):
            raise RecordTypeError(f"lengths cover more than 2**64 bytes but values hold {len(payload)}", path=path)
    covered = int(ends[-1]) if ends.size else 0
    if covered != len(payload):
        raise RecordTypeError(f"lengths cover {covered} bytes but values hold {len(payload)}", path=path)
    return payload, ends.astype(np.int64)


def extend_in_chunks(records: Iterable[Any], codec: Codec, append: Callable[[Any], int],
                     add_payloads: Callable[[list[bytes]], None]) -> None:
    """`append` each of `records`, in effect, with less work per record: a list or tuple is encoded a chunk at
    a time (a chunk whose encoding raises goes one by one, so the same records land and the error names the
    same record); any other iterable has each record encoded, so copied, as it is yielded (a generator may
    reuse its buffer) and stops just past a refused one, and only the payloads wait to be added a chunk at a
    time. Records the iterable gave before it raised are kept. An iterable must not append to or close the
    writer it feeds (its records would land after its appends, or not at all)."""
    if isinstance(records, (list, tuple)):
        for start in range(0, len(records), _EXTEND_CHUNK):
            chunk = records[start : start + _EXTEND_CHUNK]
            try:
                payloads = codec.encode_many(list(chunk))
            except Exception:  # a refusal, or a record's own code failing (an __array__ that raises)
                for record in chunk:
                    append(record)
                continue
            add_payloads(payloads)
        return
    encode = codec.encode
    pending: list[bytes] = []
    try:
        for record in records:
            try:
                payload = encode(record)
            except Exception:
                chunk, pending = pending, []
                add_payloads(chunk)
                append(record)  # raises, naming the record (or, should encoding succeed this time, adds it)
                continue
            pending.append(payload if payload.__class__ is bytes else bytes(payload))
            if len(pending) == _EXTEND_CHUNK:
                chunk, pending = pending, []
                add_payloads(chunk)
    finally:
        if pending:
            add_payloads(pending)


class CommitsOnExit:
    """What a writer does at the end of a ``with`` block: `close` (commit) on a clean exit, `abort` on an exception."""

    def close(self) -> Any:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class Writer(CommitsOnExit):
    """Writes one shard: ``PATH.data`` (payloads) and ``PATH.index`` (offsets, checksums, metadata).

    Memory stays constant in the number of records: offsets and checksums are
    spooled to disk. Nothing appears under the final names until `close` (or the
    end of a ``with`` block) commits; an exception in the block discards the shard.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        codec: str = "bytes",
        *,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        metadata: dict[str, Any] | None = None,
        checksums: bool = True,
        overwrite: bool = False,
        compression: str | None = None,
        compression_level: int = 3,
    ) -> None:
        self._pid = os.getpid()
        self.path = resolve_file_url(path)
        if not os.path.basename(self.path):
            raise VarstoreError("a shard path needs a file name, e.g. 'out/docs'; use ShardedWriter for a directory", path=self.path)
        self.data_path, self.index_path = fmt.shard_paths(self.path)
        self._overwrite = overwrite
        self._codec: Codec = make_codec(codec, dtype=dtype, shape=shape)
        self._encode = self._codec.encode
        self.codec = self._codec.name
        self._user = dict(metadata or {})
        self._metadata = encode_metadata(self._codec.params(), self._user)
        self._flags = fmt.FLAG_RECORD_CHECKSUMS if checksums else 0
        # Compression (§1.6): requested, then decided on the first records (`_decide`), after which the metadata,
        # dictionary and preamble are written; until then (and for good, if the choice is none) payloads are raw.
        self._requested = zstd_format.check_choice(compression)
        self._level = zstd_format.check_level(compression_level)
        self._compressing = self._requested is not None
        self._choice: zstd_format.Choice | None = None
        self._compressor: zstd_format.Compressor | None = None
        if self._compressing:
            zstd_format.zstandard()  # the missing extra is named before anything is written
        self._sizes = array("I")
        # Blocks (§1.7), once chosen: what groups the records, and the block table so far (spooled as the offsets are).
        self._packer: block_format.BlockPacker | None = None
        self._block_offsets, self._block_records, self._block_checksums = array("Q", [0]), array("Q", [0]), array("I")
        self._block_count = self._blocked_records = self._stored_size = self._decoded_size = 0
        self._temporary = {name: temporary_path(final) for name, final in
                           (("data", self.data_path), ("index", self.index_path), ("checksums", self.index_path + ".checksums"),
                            ("sizes", self.index_path + ".sizes"), *((name, f"{self.index_path}.{name}") for name in _BLOCK_SPOOLS))}
        self._fds: dict[str, int] = {}
        self._record_count = 0
        self._data_size = 0
        self._data_crc = 0
        self._body_crc = 0
        # Payloads appended since the last flush, as immutable bytes: joined, checksummed and their offsets
        # computed at the flush, by C loops (map, join) rather than Python code per record.
        self._buffered: list[bytes] = []
        self._room = _DATA_BUFFER_BYTES  # what the buffer takes before a flush (see _BUFFERED_RECORD_COST)
        self._offsets = array("Q", [0])
        self._checksums = array("I")
        self._closed = False
        self._lock: WriterLock | None = None
        try:
            make_directories(os.path.dirname(os.path.abspath(self.path)))
        except OSError as error:
            raise storage_error(error, "creating the shard's directory") from None
        self._lock = lock_shard(self.path)  # before any temporary file exists, so cleanup can tell ours apart
        try:
            if not overwrite:
                for final in (self.index_path, self.data_path):
                    if os.path.exists(final):
                        raise ShardExistsError("already exists; pass overwrite=True to replace it", path=final)
            for name in ("data", "index") + (("checksums",) if checksums else ()) + (("sizes",) if self._compressing else ()):
                self._fds[name] = os.open(self._temporary[name], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            write_all(self._fds["index"], bytes(fmt.HEADER_SIZE))
            if self._requested in ("zstd", "zstd-blocks"):  # nothing to sample
                self._decide([])
            elif self._requested is None:
                self._write_preamble(b"")
            else:
                self._room = zstd_format.SAMPLE_BYTES  # the first flush holds the sample
        except BaseException as error:  # an interrupt (Ctrl-C) too: nothing of a writer that never started is left
            self._discard()
            if isinstance(error, OSError) and not isinstance(error, VarstoreError):
                raise storage_error(error, "creating the shard's temporary files") from None
            raise

    def _write_preamble(self, dictionary: bytes) -> None:
        """The index bytes after the header: metadata, padding, the dictionary (if any) and its padding (§1.1, §1.6)."""
        preamble = self._metadata + bytes(fmt.align8(fmt.HEADER_SIZE + len(self._metadata)) - fmt.HEADER_SIZE - len(self._metadata))
        preamble += dictionary + bytes(fmt.align8(len(dictionary)) - len(dictionary))
        write_all(self._fds["index"], preamble)
        self._body_crc = crc32c(preamble)

    def _decide(self, samples: list[bytes]) -> None:
        """Choose the compression from the first records' payloads (`zstd_format.choose`) and write the preamble."""
        assert self._requested is not None
        choice = zstd_format.choose(self._requested, samples[: zstd_format.SAMPLE_RECORDS], self._level)
        self._choice = choice
        self._compressing = choice.compression != zstd_format.NONE
        if self._compressing:
            self._compressor = zstd_format.Compressor(choice.compression, choice.level, choice.dictionary)
        if choice.compression in zstd_format.BLOCKS:
            self._start_blocks()
        member = zstd_format.metadata_member(choice, self._requested)
        self._metadata = encode_metadata(self._codec.params(), self._user, member)
        self._write_preamble(choice.dictionary or b"")

    def _start_blocks(self) -> None:
        """Group the records into blocks from now on (the first records are still buffered): no record checksums
        (a 3.x shard's block checksums take their place), and the block table's spool files."""
        self._packer = block_format.BlockPacker()
        self._flags = 0
        for name in _BLOCK_SPOOLS:
            self._fds[name] = os.open(self._temporary[name], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)

    def _stored(self, payloads: list[bytes]) -> list[bytes]:
        """The payloads as stored: decided on, if not yet, then compressed (their decoded sizes noted), or raw."""
        if self._choice is None:
            self._decide(payloads)
        if not self._compressing:
            return payloads
        sizes = list(map(len, payloads))
        if max(sizes) > zstd_format.MAX_RECORD_SIZE:
            raise VarstoreError(f"a compressed shard's records are below 2**32 bytes; one is {max(sizes)}", path=self.path)
        self._sizes.extend(sizes)
        return self._compressor.compress_all(payloads)  # type: ignore[union-attr]

    def __len__(self) -> int:
        return self._record_count

    @property
    def data_size(self) -> int:
        """Payload bytes written so far."""
        return self._data_size

    def append(self, record: Any) -> int:
        """Add one record; returns its index in the shard."""
        try:
            payload = self._encode(record)
        except RecordTypeError as error:
            if self._closed:
                raise ClosedError("append to a closed writer", path=self.path) from None
            raise refused_record(error, self._record_count, self.path) from None
        size = len(payload)
        if size > self._room:  # the buffer is full, the record large, or the writer closed (room -1)
            self._add_beyond_buffer(payload, size)
            return self._record_count - 1
        # _add_payload, inlined: this is the per-record path
        self._buffered.append(payload if payload.__class__ is bytes else bytes(payload))
        self._room -= size + _BUFFERED_RECORD_COST
        self._data_size += size
        index = self._record_count
        self._record_count = index + 1
        return index

    def extend(self, records: Iterable[Any]) -> None:
        """Append every record of an iterable, as `append` would one by one, but a chunk at a time (`extend_in_chunks`)."""
        extend_in_chunks(records, self._codec, self.append, self._add_payloads)

    def _add_payloads(self, payloads: list[bytes]) -> None:
        """Append encoded payloads as `append` does, each run of those that fit the buffer's room in one step."""
        sizes = np.fromiter(map(len, payloads), np.int64, len(payloads))
        costs = np.cumsum(sizes + _BUFFERED_RECORD_COST)  # what payloads[:k + 1] take of the room
        done = 0
        while done < len(payloads):
            spent = int(costs[done - 1]) if done else 0
            fit = int(np.searchsorted(costs, spent + self._room, "right"))  # payloads[done:fit] fit the room
            if fit <= done:  # none fits (the room may be below 0): flush, or write a large one at once, or refuse (closed)
                self._add_beyond_buffer(payloads[done], int(sizes[done]))
                done += 1
                continue
            self._buffered.extend(payloads[done:fit])
            taken = int(costs[fit - 1]) - spent
            self._room -= taken
            self._data_size += taken - _BUFFERED_RECORD_COST * (fit - done)
            self._record_count += fit - done
            done = fit

    def extend_flat(self, values: Any, lengths: Any) -> None:
        """Append many records given as one flat buffer and their lengths, without a Python object per record.

        For ``ndarray`` shards `values` is an array of shape ``(sum(lengths), *shape)``
        and each length counts rows; for ``bytes`` shards `values` is bytes-like
        and each length counts bytes. The payload is written with one call.
        """
        if self._closed:
            raise ClosedError("extend_flat on a closed writer", path=self.path)
        self._add_flat(*flat_payloads(self._codec, values, lengths, self._record_count, self.path))

    def _add_flat(self, payload: bytes | bytearray | memoryview, ends: np.ndarray) -> None:
        """Append records packed back to back in `payload`, record k ending at byte `ends[k]` of it."""
        if self._compressing:  # each record becomes a frame of its own
            bounds = [0, *ends.tolist()]
            with memoryview(payload) as view:
                self._add_payloads([bytes(view[start:end]) for start, end in zip(bounds, bounds[1:])])
            return
        if self._data_size + len(payload) > fmt.MAX_DATA_SIZE:
            raise VarstoreError(f"the shard would exceed {fmt.MAX_DATA_SIZE} bytes", path=self.path)
        self._flush_data()  # the buffered records' offsets and checksums come first
        if self._flags:
            self._checksums.frombytes(crc32c_of_ranges(payload, np.concatenate(([0], ends))).tobytes())
        self._write_data(payload)
        self._offsets.frombytes((ends + self._data_size).astype(np.uint64).tobytes())
        self._data_size += len(payload)
        self._record_count += len(ends)
        self._reset_room()
        self._spool_if_full()

    def _add_payload(self, payload: bytes | bytearray | memoryview, size: int) -> None:
        """Append one record's payload of `size` bytes: buffered while the buffer has room, its offset and
        checksum computed with the buffer's others at the flush (the per-record path does least here)."""
        if size > self._room:
            self._add_beyond_buffer(payload, size)
            return
        # A bytes payload is kept as it is; any other is copied now, since its owner may change it later.
        self._buffered.append(payload if type(payload) is bytes else bytes(payload))
        self._room -= size + _BUFFERED_RECORD_COST
        self._data_size += size
        self._record_count += 1

    def _add_beyond_buffer(self, payload: bytes | bytearray | memoryview, size: int) -> None:
        """A record the buffer has no room for: flush it, then buffer the record, or write it at once if large."""
        if self._closed:
            raise ClosedError("append to a closed writer", path=self.path)
        if self._data_size + size > fmt.MAX_DATA_SIZE:
            raise VarstoreError(f"the shard would exceed {fmt.MAX_DATA_SIZE} bytes", path=self.path)
        self._flush_data()
        if size <= self._room:
            self._add_payload(payload, size)
            return
        if self._compressing:
            if self._choice is None:
                self._decide([bytes(memoryview(payload)[: zstd_format.SAMPLE_BYTES])])
            if self._packer is not None:  # into a block of its own, as any record
                self._buffered.append(bytes(payload))
                self._data_size += size
                self._record_count += 1
                self._flush_data()
                return
            payload = self._stored([bytes(payload)])[0]
            size = len(payload)
        if self._flags:
            self._checksums.append(crc32c(payload))
        self._write_data(payload)
        self._data_size += size
        self._record_count += 1
        self._offsets.append(self._data_size)
        self._reset_room()
        self._spool_if_full()

    def _spool_if_full(self) -> None:
        if len(self._offsets) >= _SPOOL_ENTRIES:
            self._spool_offsets()
        if len(self._checksums) >= _SPOOL_ENTRIES:
            self._write("checksums", _le_bytes(self._checksums))
            self._checksums = array("I")
        if len(self._sizes) >= _SPOOL_ENTRIES:
            self._write("sizes", _le_bytes(self._sizes))
            self._sizes = array("I")
        if len(self._block_checksums) >= _SPOOL_ENTRIES:
            for name, entries in zip(_BLOCK_SPOOLS, (self._block_offsets, self._block_records, self._block_checksums)):
                self._write(name, _le_bytes(entries))
            self._block_offsets, self._block_records, self._block_checksums = array("Q"), array("Q"), array("I")

    def _flush_data(self) -> None:
        """Write the buffered records, adding their offsets and checksums (one pass over the buffer)."""
        payloads = self._buffered
        if payloads and self._compressing and self._choice is None:
            self._decide(payloads)
        if payloads and self._packer is not None:
            self._flush_blocks(payloads)
        elif payloads:
            if self._compressing:
                raw_size = sum(map(len, payloads))
                payloads = self._stored(payloads)
                self._data_size += sum(map(len, payloads)) - raw_size
            data = b"".join(payloads)
            ends = accumulate(map(len, payloads), initial=self._data_size - len(data))
            next(ends)  # the offset where the buffer starts is there already
            self._offsets.extend(ends)
            if self._flags:
                self._checksums.extend(crc32c_of_each(payloads))
            self._buffered = []
            self._write_data(data)
            self._spool_if_full()
        self._reset_room()

    def _flush_blocks(self, payloads: list[bytes]) -> None:
        """Add the buffered records to blocks (§1.7): their offsets in decoded space, and the blocks they close
        compressed and written; the open block's records wait for the next flush."""
        sizes = list(map(len, payloads))
        if max(sizes) > zstd_format.MAX_RECORD_SIZE:
            raise VarstoreError(f"a compressed shard's records are below 2**32 bytes; one is {max(sizes)}", path=self.path)
        self._offsets.extend(_running_sums(sizes, self._decoded_size))
        self._decoded_size += sum(sizes)
        self._buffered = []
        self._write_blocks(self._packer.add(payloads))  # type: ignore[union-attr]

    def _write_blocks(self, blocks: list[list[bytes]]) -> None:
        """Compress each block into one frame, write the frames and add them to the block table."""
        frames = [self._compressor.compress(b"".join(block)) for block in blocks]  # type: ignore[union-attr]
        self._block_offsets.extend(_running_sums(map(len, frames), self._stored_size))
        self._block_records.extend(_running_sums(map(len, blocks), self._blocked_records))
        self._block_checksums.extend(crc32c_of_each(frames))
        self._block_count += len(blocks)
        self._blocked_records += sum(map(len, blocks))
        data = b"".join(frames)
        self._write_data(data)
        self._stored_size += len(data)
        self._data_size = self._stored_size + self._packer.pending_bytes  # type: ignore[union-attr]
        self._spool_if_full()

    def _reset_room(self) -> None:
        """The empty buffer's room: its size, or less near the shard's size limit (so `_add_payload` need not check it)."""
        self._room = min(_DATA_BUFFER_BYTES, fmt.MAX_DATA_SIZE - self._data_size)

    def _write_data(self, data: bytes | bytearray | memoryview) -> None:
        """Write payload bytes, checksumming them for the header on the way: one CRC call per buffer, not per record."""
        self._data_crc = crc32c(data, self._data_crc)
        self._write("data", data)

    def _write(self, name: str, data: bytes | bytearray | memoryview) -> None:
        try:
            write_all(self._fds[name], data)
        except OSError as error:
            self._discard()
            raise storage_error(error, f"writing the shard's {name}") from None

    def _spool_offsets(self) -> None:
        raw = _le_bytes(self._offsets)
        self._body_crc = crc32c(raw, self._body_crc)
        self._write("index", raw)
        self._offsets = array("Q")

    def close(self) -> None:
        """Commit the shard: fsync both files, rename them to their final names, fsync the directory."""
        if self._closed:
            return
        refuse_in_a_forked_child(self._pid, self.path)
        try:
            self._commit()
        except VarstoreError:
            self._discard()
            raise
        except OSError as error:
            self._discard()
            raise storage_error(error, "committing the shard") from None
        except BaseException:
            self._discard()
            raise
        self._closed = True
        self._room = -1  # append's one check then sends it to _add_beyond_buffer, which refuses

    def abort(self) -> None:
        """Discard everything written; no file is left under the final or temporary names. In a forked child
        (leaving a ``with`` block on its way out, say) this does nothing: the files are the parent's."""
        if not self._closed and self._pid == os.getpid():
            self._discard()

    def _append_spooled(self, name: str, tail: array) -> None:
        """Copy the spool file `name` and then `tail`, its entries not yet spooled, to the end of the index."""
        index_fd, spooled = self._fds["index"], os.lseek(self._fds[name], 0, os.SEEK_CUR)
        for position in range(0, spooled, _DATA_BUFFER_BYTES):
            chunk = os.pread(self._fds[name], min(_DATA_BUFFER_BYTES, spooled - position), position)
            self._body_crc = crc32c(chunk, self._body_crc)
            write_all(index_fd, chunk)
        raw = _le_bytes(tail)
        self._body_crc = crc32c(raw, self._body_crc)
        write_all(index_fd, raw)

    def _commit(self) -> None:
        self._flush_data()
        if self._requested is not None and self._choice is None:  # no record was ever flushed: an empty shard
            self._decide([])
        if self._packer is not None:
            self._write_blocks(self._packer.finish())
        data_fd, index_fd = self._fds["data"], self._fds["index"]
        os.fsync(data_fd)
        self._spool_offsets()
        if self._flags:
            self._append_spooled("checksums", self._checksums)
        if self._packer is not None:
            self._append_block_table()
        elif self._compressing:
            self._append_spooled("sizes", self._sizes)
        head = os.pread(data_fd, min(fmt.EDGE_SIZE, self._data_size), 0)
        tail_start = max(0, self._data_size - fmt.EDGE_SIZE)
        tail = os.pread(data_fd, self._data_size - tail_start, tail_start)
        choice = self._choice
        compression = choice.compression if choice else zstd_format.NONE
        dictionary = (choice.dictionary if choice else None) or b""
        header = fmt.Header(
            minor_version=self._minor_version(),
            block_count=self._block_count,
            compression=compression,
            dictionary_size=len(dictionary),
            dictionary_crc32c=crc32c(dictionary) if dictionary else 0,
            codec_id=self._codec.id,
            flags=self._flags,
            record_count=self._record_count,
            data_size=self._data_size,
            metadata_size=len(self._metadata),
            data_crc32c=self._data_crc,
            data_edge_crc32c=crc32c(tail, crc32c(head)),
            body_crc32c=self._body_crc,
        )
        os.pwrite(index_fd, header.pack(), 0)
        os.fsync(index_fd)
        self._close_fds()
        publish(
            [(self._temporary["data"], self.data_path), (self._temporary["index"], self.index_path)],
            overwrite=self._overwrite,
        )
        remove_quietly([self._temporary[name] for name in ("checksums", "sizes", *_BLOCK_SPOOLS)])
        self.header = header
        self._release_lock()

    def _append_block_table(self) -> None:
        """A 3.x index's end (§1.7): B, then block_offsets, block_records and block_checksums from their spools."""
        raw = struct.pack("<Q", self._block_count)
        self._body_crc = crc32c(raw, self._body_crc)
        write_all(self._fds["index"], raw)
        for name, tail in zip(_BLOCK_SPOOLS, (self._block_offsets, self._block_records, self._block_checksums)):
            self._append_spooled(name, tail)

    def _minor_version(self) -> int:
        """The header's minor version: 0 for a compressed shard (2.0, 3.0), 1.2 for one "auto" stored raw, else 1.1."""
        if self._choice is None:
            return fmt.MINOR_VERSION
        if self._choice.compression in zstd_format.BLOCKS:
            return fmt.BLOCKS_VERSION[1]
        return fmt.COMPRESSED_VERSION[1] if self._choice.compression else fmt.AUTO_NONE_MINOR_VERSION

    def _close_fds(self) -> None:
        while self._fds:
            _, fd = self._fds.popitem()
            try:
                os.close(fd)
            except OSError:
                pass

    def _discard(self) -> None:
        self._closed = True
        self._room = -1
        self._close_fds()
        remove_quietly(list(self._temporary.values()))
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def __del__(self) -> None:
        """A writer dropped unclosed is discarded, but only by its own process: a forked child's copy leaves the
        parent's temporary files and lock alone."""
        if getattr(self, "_pid", None) != os.getpid():
            return
        if not getattr(self, "_closed", True):
            self._discard()
        elif getattr(self, "_lock", None) is not None:
            self._release_lock()

