"""Megatron-LM's indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``) as varstore datasets in place, and back.

A ``.bin`` is the sequences' tokens back to back, byte for byte the data file of a varstore ``ndarray`` shard,
so `import_megatron` hard-links it and writes only a varstore index from the ``.idx``'s sequence lengths, and
`export_megatron` hard-links a shard's data file and writes a ``.idx`` from its offsets.

The ``.idx`` layout (megatron-core's ``indexed_dataset.py``; all little-endian): the 9 bytes ``MMIDIDX\\0\\0``,
version (u64, 1), dtype code (u8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16),
sequence count S (u64), document count D (u64), S sequence lengths (i32, in tokens), S sequence pointers (i64, byte
offsets into the ``.bin``), D document indices (i64: document k is sequences ``[di[k], di[k+1])``, so di[0] = 0
and di[D-1] = S). A multimodal ``.idx`` adds S sequence modes (i8); those are refused.

Megatron's documents are recorded in the dataset's metadata as ``{"megatron": {"documents": D - 1,
"document_indices": ...}}``: the string ``"one per sequence"`` when di is 0, 1, ..., S (every document one
sequence: what Megatron's preprocessing writes without sentence splitting), else the name of a side shard in the
dataset directory, ``megatron-document-indices``, holding di as one ``<i8`` record; the metadata so stays a few
bytes, however many documents there are.
"""

from __future__ import annotations

import os
import shutil
import stat
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dataset.opening import open as open_store
from ..dataset.reader import ShardedReader
from ..dataset.writer import write_manifest
from ..errors import CommandError, FormatError, MissingFileError, RecordTypeError, StorageError
from ..format import header as fmt
from ..format.checksum import crc32c, crc32c_of_ranges
from ..format.codecs import make_codec
from ..format.metadata import encode_metadata
from ..local.destination import check_destination, make_directories, removed_if_created_and_failed
from ..local.file_url import resolve_file_url
from ..local.locks import lock_shard
from ..local.mapping import pread_exactly
from ..local.publish import (
    hard_link,
    publish,
    remove_quietly,
    storage_error,
    sync_directory,
    temporary_path,
    write_all,
)
from ..shard.reader import Reader
from ..shard.writer import Writer

__all__ = ["MegatronSummary", "export_megatron", "import_megatron"]

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
_PREAMBLE = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document count
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
CODES = {np.dtype(name): code for code, name in DTYPES.items()}
SHARD_NAME = "shard-000000"
DOCUMENTS_SHARD_NAME = "megatron-document-indices"
ONE_PER_SEQUENCE = "one per sequence"
_MAX_SEQUENCE_LENGTH = 2**31 - 1  # the .idx's sequence lengths are int32
_CRC_CHUNK_BYTES = 16 << 20  # the one pass of `checksums=True` checksums whole records, about this many bytes a step


@dataclass(frozen=True)
class MegatronIndex:
    """A checked ``.idx``: its tokens' dtype, the S + 1 byte offsets of its sequences in the ``.bin`` (uint64),
    and its document indices (int64)."""

    dtype: np.dtype
    offsets: np.ndarray
    document_indices: np.ndarray


@dataclass(frozen=True)
class MegatronSummary:
    """What `import_megatron` or `export_megatron` made: its sequences (the dataset's records) and documents, and
    whether its data is a hard link of the source's (False: a copy, the destination being on another filesystem)."""

    sequences: int
    documents: int
    linked: bool


def read_megatron_index(idx_path: str, bin_size: int) -> MegatronIndex:
    """Read and check the ``.idx`` at `idx_path` against its ``.bin`` of `bin_size` bytes: every count fits the
    file before anything is allocated, and the pointers are the lengths laid end to end, exactly covering the
    ``.bin`` (the only layout Megatron writes, and the one a varstore shard can hold). Raises `FormatError`
    naming the file and the field."""
    try:
        with open(idx_path, "rb") as file:
            idx_size = os.fstat(file.fileno()).st_size
            raw = file.read(_PREAMBLE.size)
            if len(raw) < _PREAMBLE.size:
                raise FormatError(f"is {idx_size} bytes, shorter than the {_PREAMBLE.size}-byte Megatron index header", path=idx_path)
            magic, version, code, sequences, documents = _PREAMBLE.unpack(raw)
            if magic != MAGIC:
                raise FormatError(f"magic is {magic!r}, expected {MAGIC!r}: not a Megatron index", path=idx_path)
            if version != VERSION:
                raise FormatError(f"version is {version}, expected {VERSION}", path=idx_path)
            if code not in DTYPES:
                raise FormatError(f"dtype code is {code}, expected one of {sorted(DTYPES)} ({DTYPES})", path=idx_path)
            room = idx_size - _PREAMBLE.size
            if sequences > room // 12:
                raise FormatError(f"sequence count is {sequences}, but the {idx_size}-byte file holds the lengths and "
                                  f"pointers of at most {room // 12}", path=idx_path)
            if documents > (room - 12 * sequences) // 8:
                raise FormatError(f"document count is {documents}, but after the lengths and pointers of {sequences} "
                                  f"sequences the {idx_size}-byte file holds at most {(room - 12 * sequences) // 8} "
                                  f"document indices", path=idx_path)
            expected = _PREAMBLE.size + 12 * sequences + 8 * documents
            if idx_size != expected:
                modes = " (its sequence modes: a multimodal dataset, which is not supported)" if idx_size == expected + sequences else ""
                raise FormatError(f"is {idx_size} bytes, expected {expected} for {sequences} sequences and "
                                  f"{documents} document indices{modes}", path=idx_path)
            lengths = np.fromfile(file, "<i4", sequences)
            pointers = np.fromfile(file, "<i8", sequences)
            document_indices = np.fromfile(file, "<i8", documents)
    except OSError as error:
        raise storage_error(error, f"reading {idx_path}") from None
    dtype = np.dtype(DTYPES[code])
    return MegatronIndex(dtype, _checked_offsets(lengths, pointers, dtype.itemsize, bin_size, idx_path),
                         _checked_document_indices(document_indices, sequences, idx_path))


def _checked_offsets(lengths: np.ndarray, pointers: np.ndarray, itemsize: int, bin_size: int, idx_path: str) -> np.ndarray:
    """The S + 1 byte offsets the lengths make laid end to end, after checking the pointers are exactly them."""
    negative = np.flatnonzero(lengths < 0)
    if negative.size:
        raise FormatError(f"sequence_lengths[{negative[0]}] is {lengths[negative[0]]}, a negative length", path=idx_path)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths.astype(np.int64) * itemsize, out=offsets[1:])
    # Each step adds less than 2**34, so a sum past 2**63 shows as a decrease: checked before any offset is trusted.
    wrapped = np.flatnonzero(np.diff(offsets) < 0)
    if wrapped.size:
        raise FormatError(f"sequence_lengths up to [{wrapped[0]}] add up to more than 2**63 bytes", path=idx_path)
    wrong = np.flatnonzero(pointers != offsets[:-1])
    if wrong.size:
        first = wrong[0]
        raise FormatError(f"sequence_pointers[{first}] is {pointers[first]}, expected {offsets[first]} (the byte end "
                          f"of the sequences before it: Megatron writes them back to back)", path=idx_path)
    if offsets[-1] != bin_size:
        raise FormatError(f"sequence_lengths cover {offsets[-1]} bytes ({offsets[-1] // itemsize} tokens of "
                          f"{itemsize} bytes) but the .bin is {bin_size} bytes", path=idx_path)
    return offsets.view(np.uint64)


def _checked_document_indices(document_indices: np.ndarray, sequences: int, idx_path: str) -> np.ndarray:
    """Megatron's own rule (its reader asserts di[-1] = S) and what makes documents ranges of sequences."""
    if document_indices.size == 0 or document_indices[0] != 0 or document_indices[-1] != sequences:
        found = f"from {document_indices[0]} to {document_indices[-1]}" if document_indices.size else "empty"
        raise FormatError(f"document_indices are {found}, expected from 0 to the sequence count {sequences}", path=idx_path)
    falling = np.flatnonzero(np.diff(document_indices) < 0)
    if falling.size:
        at = falling[0] + 1
        raise FormatError(f"document_indices[{at}] is {document_indices[at]}, below document_indices[{at - 1}] "
                          f"= {document_indices[at - 1]}", path=idx_path)
    return document_indices


def import_megatron(prefix: str | os.PathLike[str], destination: str | os.PathLike[str], *, checksums: bool = False,
                    data_crc: bool = False) -> MegatronSummary:
    """Make a one-shard ``ndarray`` dataset at `destination` (a new or empty directory) of the Megatron dataset
    ``PREFIX.bin`` + ``PREFIX.idx``, one record per sequence, its data file a hard link of the ``.bin`` (a copy when
    the destination is on another filesystem: `MegatronSummary.linked` says which).

    Reads the ``.idx`` and 8 KiB of the ``.bin`` (the ends, §1.2's edge checksum), and no other byte of it: the
    shard (format 1.3) says its data CRC32C is not recorded. With `data_crc`, or `checksums` (each record's
    CRC32C), the whole ``.bin`` is read once and the data CRC32C recorded too (format 1.1). Writes an index of 8
    bytes a sequence (12 with checksums).
    """
    prefix = resolve_file_url(prefix)
    bin_path, idx_path = prefix + ".bin", prefix + ".idx"
    directory = resolve_file_url(destination)
    for path in (bin_path, idx_path):
        _check_regular_file(path)
    with removed_if_created_and_failed(directory):
        make_directories(directory)
        check_destination(directory, command="import megatron", keeps_dataset=False, allow_other_files=False)
        index = read_megatron_index(idx_path, os.path.getsize(bin_path))
        document_indices = index.document_indices
        identity = len(document_indices) == len(index.offsets) and bool(
            np.array_equal(document_indices, np.arange(len(document_indices))))
        megatron = {"documents": len(document_indices) - 1,
                    "document_indices": ONE_PER_SEQUENCE if identity else DOCUMENTS_SHARD_NAME}
        written: list[str] = []  # the shards this import committed: a racing import's, refused here, are not ours
        try:
            if not identity:
                with Writer(os.path.join(directory, DOCUMENTS_SHARD_NAME), "ndarray", dtype="<i8") as side:
                    side.append(document_indices)
                written += fmt.shard_paths(os.path.join(directory, DOCUMENTS_SHARD_NAME))
            linked = _write_shard(os.path.join(directory, SHARD_NAME), bin_path, index, {"megatron": megatron}, checksums,
                                  data_crc or checksums)
            written += fmt.shard_paths(os.path.join(directory, SHARD_NAME))
            write_manifest(directory, [SHARD_NAME], metadata={"megatron": megatron})
        except BaseException:
            remove_quietly(written)
            raise
    return MegatronSummary(len(index.offsets) - 1, len(document_indices) - 1, linked)


def _write_shard(path: str, bin_path: str, index: MegatronIndex, user: dict[str, Any], checksums: bool,
                 data_crc: bool) -> bool:
    """Commit shard `path`: its data file a hard link (or a copy) of `bin_path`, its index written from
    `index.offsets` (§1.1, §1.5), its data CRC32C computed (one pass over the data) only if `data_crc`, else
    recorded as not recorded (§1.2). Returns whether the data file is a link."""
    data_path, index_path = fmt.shard_paths(path)
    temporary_data, temporary_index = temporary_path(data_path), temporary_path(index_path)
    codec = make_codec("ndarray", dtype=index.dtype, shape=[])
    metadata = encode_metadata(codec.params(), user, data_crc_recorded=data_crc)
    with lock_shard(path):
        try:
            linked = _link_or_copy(bin_path, temporary_data)
            data_size = int(index.offsets[-1])
            with open(temporary_data, "rb") as data_file:
                if os.fstat(data_file.fileno()).st_size != data_size:
                    raise FormatError(f"is {os.fstat(data_file.fileno()).st_size} bytes now, {data_size} when its "
                                      f".idx was checked: it changed during the import", path=bin_path)
                data_crc32c, record_crcs = (_data_checksums(data_file.fileno(), bin_path, index.offsets, checksums)
                                            if data_crc else (0, None))
                head = pread_exactly(data_file.fileno(), min(fmt.EDGE_SIZE, data_size), 0, bin_path)
                tail_length = min(fmt.EDGE_SIZE, data_size)
                tail = pread_exactly(data_file.fileno(), tail_length, data_size - tail_length, bin_path)
                if not linked:
                    os.fsync(data_file.fileno())
            padding = bytes(fmt.align8(fmt.HEADER_SIZE + len(metadata)) - fmt.HEADER_SIZE - len(metadata))
            body = [metadata + padding, index.offsets.astype("<u8", copy=False).data]
            if record_crcs is not None:
                body.append(record_crcs.astype("<u4", copy=False).data)
            body_crc = 0
            for part in body:
                body_crc = crc32c(part, body_crc)
            header = fmt.Header(
                codec_id=codec.id, flags=fmt.FLAG_RECORD_CHECKSUMS if checksums else 0,
                record_count=len(index.offsets) - 1, data_size=data_size, metadata_size=len(metadata),
                data_crc32c=data_crc32c, data_edge_crc32c=fmt.edge_crc32c(head, tail), body_crc32c=body_crc,
                minor_version=fmt.MINOR_VERSION if data_crc else fmt.DATA_CRC_UNRECORDED_MINOR_VERSION,
            )
            descriptor = os.open(temporary_index, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                for part in [header.pack(), *body]:
                    write_all(descriptor, part)
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            publish([(temporary_data, data_path), (temporary_index, index_path)], overwrite=False)
        except OSError as error:
            raise storage_error(error, f"writing the shard {path}") from None
        finally:
            remove_quietly([temporary_data, temporary_index])
    return linked


def _link_or_copy(source: str, target: str) -> bool:
    """Hard-link `source` as `target`, or copy it where the filesystems allow no link; True if linked."""
    if hard_link(source, target):
        return True
    shutil.copyfile(source, target)
    return False


def _data_checksums(fd: int, path: str, offsets: np.ndarray, records: bool) -> tuple[int, np.ndarray | None]:
    """The CRC32C of the whole data file and, if `records`, of each record, in one sequential pass over it."""
    data_size = int(offsets[-1])
    if data_size == 0:
        return 0, np.zeros(len(offsets) - 1, np.uint32) if records else None
    if not records:
        return _crc32c_of_span(fd, path, 0, data_size, 0), None
    record_crcs = np.empty(len(offsets) - 1, np.uint32)
    data_crc = first = 0
    while first < len(offsets) - 1:
        # Records from `first` up to the one that crosses the next chunk boundary (at least one record).
        last = max(first + 1, int(np.searchsorted(offsets, offsets[first] + _CRC_CHUNK_BYTES, "right")) - 1)
        last = min(last, len(offsets) - 1)
        start, end = int(offsets[first]), int(offsets[last])
        if end - start > _CRC_CHUNK_BYTES:  # one record larger than a chunk: read it in chunks
            record_crcs[first] = _crc32c_of_span(fd, path, start, end, 0)
            data_crc = _crc32c_of_span(fd, path, start, end, data_crc)
        else:
            chunk = pread_exactly(fd, end - start, start, path)
            record_crcs[first:last] = crc32c_of_ranges(chunk, offsets[first:last + 1] - offsets[first])
            data_crc = crc32c(chunk, data_crc)
        first = last
    return data_crc, record_crcs


def _crc32c_of_span(fd: int, path: str, start: int, end: int, crc: int) -> int:
    """CRC32C of bytes [start, end) of `fd`, continuing `crc`, read with pread in chunks: a hole of a sparse
    .bin on a full filesystem is then an OSError, not the SIGBUS a map would give."""
    for position in range(start, end, _CRC_CHUNK_BYTES):
        crc = crc32c(pread_exactly(fd, min(_CRC_CHUNK_BYTES, end - position), position, path), crc)
    return crc


def export_megatron(store: str | os.PathLike[str], prefix: str | os.PathLike[str]) -> MegatronSummary:
    """Write the Megatron dataset ``PREFIX.idx`` + ``PREFIX.bin`` of `store`: a shard, or a dataset of one shard,
    of 1-D ``ndarray`` records of a Megatron dtype (uint8, int8, int16, int32, int64, float64, float32, uint16),
    uncompressed. ``PREFIX.bin`` is a hard link of the shard's data file (a copy across filesystems); the
    documents are those its ``"megatron"`` metadata records (`import_megatron`), else one per record. A dataset of
    several shards is refused: export each shard (``DATASET/shard-000001``) to its own prefix."""
    prefix = resolve_file_url(prefix)
    bin_path, idx_path = prefix + ".bin", prefix + ".idx"
    for path in (bin_path, idx_path):
        if os.path.lexists(path):
            raise CommandError(f"{path}: already exists; export writes a new Megatron dataset")
    parent = os.path.dirname(os.path.abspath(prefix))
    if not os.path.isdir(parent):
        raise MissingFileError("does not exist: export writes PREFIX.bin and PREFIX.idx into an existing directory",
                               path=parent)
    opened = open_store(store)
    try:
        shard, metadata, directory = _one_shard(opened, str(store))
        dtype, name = shard.dtype, shard.path
        if shard.codec != "ndarray" or shard.shape != () or dtype not in CODES:
            described = f"{shard.codec} records" + (f" of {dtype} with trailing shape {list(shard.shape)}" if dtype is not None else "")
            raise CommandError(f"{name}: holds {described}; a Megatron dataset holds 1-D arrays of "
                               f"{', '.join(DTYPES.values())}")
        if shard.header.compression:
            raise CommandError(f"{name}: is compressed; a Megatron .bin holds raw tokens: write the records to an "
                               f"uncompressed shard to export them")
        offsets = np.array(shard.offsets, np.int64)
        lengths = np.diff(offsets) // dtype.itemsize
        if len(lengths) and int(lengths.max()) > _MAX_SEQUENCE_LENGTH:
            record = int(np.argmax(lengths))
            raise RecordTypeError(f"record {record} holds {int(lengths[record])} tokens; a Megatron .idx stores "
                                  f"sequence lengths as int32, at most {_MAX_SEQUENCE_LENGTH}", path=name)
        document_indices = _document_indices(metadata, directory, len(offsets) - 1, name)
        data_path = shard.data_path
    finally:
        opened.close()
    linked = _link_or_copy(data_path, bin_path)
    ours = [bin_path]  # PREFIX.idx is ours once created: another process's, appearing meanwhile, is left alone
    try:
        with open(idx_path, "xb") as file:
            ours.append(idx_path)
            file.write(_PREAMBLE.pack(MAGIC, VERSION, CODES[dtype], len(offsets) - 1, len(document_indices)))
            file.write(lengths.astype("<i4").data)
            file.write(offsets[:-1].astype("<i8").data)
            file.write(document_indices.astype("<i8").data)
            file.flush()
            os.fsync(file.fileno())
        sync_directory(os.path.dirname(os.path.abspath(idx_path)))
    except BaseException:
        remove_quietly(ours)
        raise
    return MegatronSummary(len(offsets) - 1, len(document_indices) - 1, linked)


def _check_regular_file(path: str) -> None:
    """Refuse `path` unless it is a regular file (after symbolic links), saying what it is instead."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise MissingFileError("does not exist: a Megatron dataset is PREFIX.bin and PREFIX.idx", path=path) from None
    except OSError as error:
        raise StorageError(f"cannot be read: {error.strerror or error}", path=path) from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise FormatError(f"is {kind}; a Megatron dataset is the regular files PREFIX.bin and PREFIX.idx", path=path)


def _one_shard(opened: Any, name: str) -> tuple[Reader, dict[str, Any], str]:
    """The one local shard `opened` reads, with the metadata that may name the Megatron documents' side shard and
    the directory it would be in."""
    if isinstance(opened, Reader):
        return opened, opened.metadata, os.path.dirname(opened.path)
    if not isinstance(opened, ShardedReader) or opened.is_remote:
        raise CommandError(f"{name}: export megatron writes from a local shard or dataset")
    shards = opened.shard_paths
    if len(shards) != 1:
        example = shards[1] if len(shards) > 1 else "DATASET/NAME"
        raise CommandError(f"{name}: is a dataset of {len(shards)} shards; a Megatron prefix holds one: export each "
                           f"shard (e.g. {example}) to its own prefix")
    return opened.shard(0), opened.metadata, opened.path


def _document_indices(metadata: dict[str, Any], directory: str, sequences: int, name: str) -> np.ndarray:
    """Megatron's document indices of a store of `sequences` records, from its ``"megatron"`` metadata."""
    megatron = metadata.get("megatron")
    recorded = megatron.get("document_indices", ONE_PER_SEQUENCE) if isinstance(megatron, dict) else ONE_PER_SEQUENCE
    if recorded == ONE_PER_SEQUENCE:
        return np.arange(sequences + 1, dtype=np.int64)
    if recorded != DOCUMENTS_SHARD_NAME:
        raise FormatError(f"metadata megatron.document_indices is {recorded!r}, expected {ONE_PER_SEQUENCE!r} or "
                          f"{DOCUMENTS_SHARD_NAME!r}", path=name)
    side_path = os.path.join(directory, DOCUMENTS_SHARD_NAME)
    with Reader(side_path) as side:
        if len(side) != 1 or side.dtype != np.dtype("<i8") or side.shape != ():
            raise FormatError(f"holds {len(side)} records of {side.dtype}, expected one 1-D <i8 record", path=side_path)
        document_indices = np.array(side[0])
    return _checked_document_indices(document_indices, sequences, side_path)
