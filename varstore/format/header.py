"""The header of a shard's index file (§1.2), the layout of its sections (§1.1) and the shard's file names (§1.5).

A shard is two files. ``NAME.data`` holds the record payloads back to back and
nothing else. ``NAME.index`` describes them::

    [0, 64)                   header (fields below, little-endian)
    [64, 64 + M)              metadata: a UTF-8 JSON object, M = metadata_size bytes
    zero bytes up to the next multiple of 8: offsets_start
    [offsets_start, +8(N+1))  N + 1 uint64 offsets; record i is data[offsets[i]:offsets[i+1]]
    [.., +4N)                 N uint32 CRC32C record checksums, present when flag bit 0 is set

Format 2.0 (a compressed shard, §1.6) puts the dictionary (D bytes) between the metadata's padding and the
offsets, padded to 8 again, and ends with N uint32 decoded sizes; its header's byte 13 is the compression
and its last reserved 8 bytes hold D and the dictionary's CRC32C. Format 3.0 (compressed blocks, §1.7) has
2.0's header fields and dictionary, no record checksums, offsets in decoded space, and ends with the block table
(`varstore.format.blocks`).

Header fields, in order: magic (8 bytes), major version (u16), minor version
(u16), codec (u8), reserved (u8, zero), flags (u16), record count N (u64), data
size (u64), metadata size M (u64), CRC32C of the whole data file (u32; 0 when
the metadata says it is not recorded, format 1.3), CRC32C of its first and last
4096 bytes (u32), CRC32C of index bytes [64, end) (u32), 8 reserved zero bytes,
CRC32C of header bytes [0, 60) (u32).

``spec/FORMAT.md`` is the normative text; this package is its executable form.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ..errors import FormatError
from . import blocks as block_format
from . import compression as zstd_format
from .checksum import Buffer, crc32c, crc32c_combine
from .metadata import DATA_CRC_MEMBER, DATA_CRC_UNRECORDED, MAX_METADATA_SIZE

MAGIC = b"\x89VSI\r\n\x1a\n"


MAJOR_VERSION = 1  # of an uncompressed shard; a compressed one is COMPRESSED_VERSION


MINOR_VERSION = 1


AUTO_NONE_MINOR_VERSION = 2  # 1.2: an uncompressed shard whose metadata records what "auto" measured (§1.6)


DATA_CRC_UNRECORDED_MINOR_VERSION = 3  # 1.3: an uncompressed shard whose data_crc32c is not recorded (§1.2)



COMPRESSED_VERSION = (2, 0)


BLOCKS_VERSION = (3, 0)  # a shard of compressed blocks (§1.7)


HEADER_SIZE = 64


OFFSET_SIZE = 8


CHECKSUM_SIZE = 4


FLAG_RECORD_CHECKSUMS = 1


KNOWN_FLAGS = FLAG_RECORD_CHECKSUMS


MAX_DATA_SIZE = (1 << 63) - 1


EDGE_SIZE = 4096


DATA_SUFFIX = ".data"


INDEX_SUFFIX = ".index"


def shard_paths(prefix: str) -> tuple[str, str]:
    """The (data, index) file paths of the shard named `prefix`."""
    return prefix + DATA_SUFFIX, prefix + INDEX_SUFFIX


_HEADER = struct.Struct("<8sHHBBHQQQIII8sI")


assert _HEADER.size == HEADER_SIZE


@dataclass(frozen=True)
class Header:
    """The fixed-size fields at the start of an index file."""

    codec_id: int
    flags: int
    record_count: int
    data_size: int
    metadata_size: int
    data_crc32c: int
    data_edge_crc32c: int
    body_crc32c: int
    minor_version: int = MINOR_VERSION
    compression: int = zstd_format.NONE
    dictionary_size: int = 0
    dictionary_crc32c: int = 0
    # Not a header byte: False when the metadata says `data_crc32c` is not recorded (§1.2), set at open.
    data_crc_recorded: bool = True
    # Not a header byte: a 3.x shard's B, the one its index size allows (`unpack_header`); its stored B is
    # checked against it at open.
    block_count: int = 0

    @property
    def major_version(self) -> int:
        if self.compression in zstd_format.BLOCKS:
            return BLOCKS_VERSION[0]
        return COMPRESSED_VERSION[0] if self.compression else MAJOR_VERSION

    @property
    def has_blocks(self) -> bool:
        return self.compression in zstd_format.BLOCKS

    @property
    def version(self) -> tuple[int, int]:
        return self.major_version, self.minor_version

    @property
    def has_record_checksums(self) -> bool:
        return bool(self.flags & FLAG_RECORD_CHECKSUMS)

    @property
    def dictionary_start(self) -> int:
        return align8(HEADER_SIZE + self.metadata_size)

    @property
    def offsets_start(self) -> int:
        return align8(self.dictionary_start + self.dictionary_size)

    @property
    def checksums_start(self) -> int:
        return self.offsets_start + OFFSET_SIZE * (self.record_count + 1)

    @property
    def sizes_start(self) -> int:
        """Where a compressed shard's decoded record sizes start (after the checksums, if any)."""
        return self.checksums_start + (CHECKSUM_SIZE * self.record_count if self.has_record_checksums else 0)

    @property
    def blocks_start(self) -> int:
        """Where a 3.x shard's block table starts: right after its offsets (it has no record checksums)."""
        return self.checksums_start

    @property
    def index_size(self) -> int:
        """The exact size the index file must have."""
        if self.has_blocks:
            return self.blocks_start + block_format.table_size(self.block_count)
        return self.sizes_start + (zstd_format.SIZE_BYTES * self.record_count if self.compression else 0)

    def pack(self) -> bytes:
        without_crc = _HEADER.pack(
            MAGIC,
            self.major_version,
            self.minor_version,
            self.codec_id,
            self.compression,
            self.flags,
            self.record_count,
            self.data_size,
            self.metadata_size,
            self.data_crc32c,
            self.data_edge_crc32c,
            self.body_crc32c,
            struct.pack("<II", self.dictionary_size, self.dictionary_crc32c),
            0,
        )
        return without_crc[:60] + struct.pack("<I", crc32c(without_crc[:60]))


def align8(position: int) -> int:
    return (position + 7) & ~7


def unpack_header(raw: bytes, *, index_size: int, path: str) -> Header:
    """Parse and validate a header against the size of the index file it came from.

    Every check a reader must make before trusting any other byte of the file
    is here, in the order the spec lists them.
    """
    if len(raw) < HEADER_SIZE:
        raise FormatError(f"index file is {len(raw)} bytes, shorter than the {HEADER_SIZE}-byte header", path=path)
    (magic, major, minor, codec_id, reserved_byte, flags, record_count, data_size, metadata_size,
     data_crc, edge_crc, body_crc, reserved, header_crc) = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise FormatError(f"not a varstore index: magic is {magic!r}, expected {MAGIC!r}", path=path)
    if major not in (MAJOR_VERSION, COMPRESSED_VERSION[0], BLOCKS_VERSION[0]):
        raise FormatError(
            f"format version {major}.{minor} is not supported; this reader reads {MAJOR_VERSION}.x, "
            f"{COMPRESSED_VERSION[0]}.x and {BLOCKS_VERSION[0]}.x",
            path=path,
        )
    actual_crc = crc32c(raw[:60])
    if header_crc != actual_crc:
        raise FormatError(f"header checksum is {header_crc:#010x}, computed {actual_crc:#010x}: the header is damaged", path=path)
    dictionary_size, dictionary_crc = struct.unpack("<II", reserved)
    compression = reserved_byte
    if major == MAJOR_VERSION and (reserved_byte != 0 or reserved != bytes(8)):
        raise FormatError("reserved header bytes are not zero", path=path)
    if flags & ~KNOWN_FLAGS:
        raise FormatError(f"unknown flags {flags:#06x}; this reader knows {KNOWN_FLAGS:#06x}", path=path)
    if major != MAJOR_VERSION:
        _check_compression_fields(major, compression, dictionary_size, dictionary_crc, path)
    if major == BLOCKS_VERSION[0] and flags:
        raise FormatError(f"flags are {flags:#06x}; a 3.x shard has none (its block checksums take the record "
                          "checksums' place)", path=path)
    if metadata_size > MAX_METADATA_SIZE:
        raise FormatError(f"metadata size {metadata_size} exceeds the limit of {MAX_METADATA_SIZE} bytes", path=path)
    if data_size > MAX_DATA_SIZE:
        raise FormatError(f"data size {data_size} exceeds the limit of {MAX_DATA_SIZE} bytes", path=path)
    offsets_start = align8(align8(HEADER_SIZE + metadata_size) + dictionary_size)
    if index_size < offsets_start + OFFSET_SIZE:
        raise FormatError(
            f"index file is {index_size} bytes, smaller than offsets_start + 8 = {offsets_start + OFFSET_SIZE} "
            f"(the header, {metadata_size} bytes of metadata, padding and one offset)",
            path=path,
        )
    blocks = major == BLOCKS_VERSION[0]
    per_record = OFFSET_SIZE + (CHECKSUM_SIZE if flags & FLAG_RECORD_CHECKSUMS else 0) + (zstd_format.SIZE_BYTES if compression and not blocks else 0)
    fixed = OFFSET_SIZE + (block_format.table_size(0) if blocks else 0)  # the last offset, and an empty block table
    if record_count > (index_size - offsets_start - fixed) // per_record:
        raise FormatError(
            f"header claims {record_count} records but the {index_size}-byte index file cannot hold them", path=path
        )
    block_count = _block_count(index_size - offsets_start - OFFSET_SIZE * (record_count + 1), record_count, path) if blocks else 0
    header = Header(codec_id, flags, record_count, data_size, metadata_size, data_crc, edge_crc, body_crc, minor,
                    compression, dictionary_size, dictionary_crc, block_count=block_count)
    if header.index_size != index_size:
        raise FormatError(
            f"index file is {index_size} bytes, expected {header.index_size} for {record_count} records", path=path
        )
    return header


def _check_compression_fields(major: int, compression: int, dictionary_size: int, dictionary_crc: int, path: str) -> None:
    """§1.3 step 4 for a 2.x or 3.x header: the compression is one of its major version's (2.x: 1 zstd, 2
    zstd-dict; 3.x: 3 zstd-blocks, 4 zstd-dict-blocks), and the dictionary fields are zero without a dictionary,
    its size within [8, MAX_DICTIONARY_SIZE] with one."""
    known = zstd_format.BLOCKS if major == BLOCKS_VERSION[0] else zstd_format.PER_RECORD
    if compression not in known:
        spelled = " or ".join(f"{number} ({zstd_format.NAMES[number]})" for number in known)
        raise FormatError(f"compression {compression} is unknown; a {major}.x shard is compressed with {spelled}", path=path)
    with_dictionary = compression in zstd_format.WITH_DICTIONARY
    if not with_dictionary and (dictionary_size or dictionary_crc):
        raise FormatError(f"a {zstd_format.NAMES[compression]} shard without a dictionary has a dictionary size or checksum", path=path)
    if with_dictionary and not 8 <= dictionary_size <= zstd_format.MAX_DICTIONARY_SIZE:
        raise FormatError(
            f"dictionary size {dictionary_size} is outside [8, {zstd_format.MAX_DICTIONARY_SIZE}]", path=path
        )


def _block_count(table_bytes: int, record_count: int, path: str) -> int:
    """§1.3 step 6 for a 3.x index (§1.7): the B whose block table fills the `table_bytes` after the offsets, at
    most N (a stored B other than this one is refused at open, where it is read)."""
    block_count = block_format.block_count_for(table_bytes)
    if block_count is None or block_count > record_count:
        raise FormatError(
            f"the {table_bytes} bytes after the offsets are no block table of at most {record_count} blocks "
            f"({block_format.table_size(0)} + 20 B bytes for B blocks)", path=path)
    return block_count


def data_crc_recorded(header: Header, metadata: dict[str, Any], *, path: str) -> bool:
    """§1.3 step 7's check of the metadata's ``"data_crc32c"`` member (§1.2) of a shard with `header`: absent (or
    in a 2.x shard, where it is not defined and ignored), the header's data_crc32c is recorded; present, it
    must be ``"not recorded"`` and the header's field 0. Returns whether the data CRC32C is recorded."""
    if header.major_version != MAJOR_VERSION or DATA_CRC_MEMBER not in metadata:
        return True
    member = metadata[DATA_CRC_MEMBER]
    if member != DATA_CRC_UNRECORDED:
        raise FormatError(f'the metadata\'s "{DATA_CRC_MEMBER}" member is {member!r}; its one value is '
                          f'{DATA_CRC_UNRECORDED!r}', path=path)
    if header.data_crc32c != 0:
        raise FormatError(f"the header's data_crc32c is {header.data_crc32c:#010x} but the metadata says it is "
                          f"{DATA_CRC_UNRECORDED}: it must then be 0", path=path)
    return False


def index_crc32c(header: Header) -> int:
    """CRC32C of a whole index file, from its header alone: the header's own CRC combined with the body CRC it
    records (§3.1), so a manifest's ``index_crc32c`` is checked without reading the index."""
    return crc32c_combine(crc32c(header.pack()), header.body_crc32c, header.index_size - HEADER_SIZE)


def edge_crc32c(head: Buffer, tail: Buffer) -> int:
    """CRC32C of the data file's first min(EDGE_SIZE, size) bytes followed by its last min(EDGE_SIZE, size) bytes.

    Cheap enough to check at open, it catches a data file paired with the wrong index.
    """
    return crc32c(tail, crc32c(head))


def edge_ranges(size: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (offset, length) of the two byte ranges of a `size`-byte data file that `edge_crc32c` covers."""
    length = min(EDGE_SIZE, size)
    return (0, length), (size - length, length)
