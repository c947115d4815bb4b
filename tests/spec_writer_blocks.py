"""A writer of format 3.0 shards (compressed blocks, spec/FORMAT.md §1.7), written from the spec alone.

Given payloads, a codec and a block grouping (the record count of each block), it compresses each block's payloads
back to back as one zstd frame (python-zstandard, with or without a dictionary) and lays out the index as §1.7's
table says. `block_parts` stops before the layout so that a test can change any field (a damaged case) and
`assemble` then computes every header checksum from the bytes; the block checksums are `block_parts`' alone, so a
test that damages one keeps its damage. It imports nothing from varstore.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from .spec_reader import crc32c
from .spec_writer import CODEC_IDS, MAGIC, ShardBytes, canonical_json

BLOCK_COMPRESSIONS = {"zstd-blocks": 3, "zstd-dict-blocks": 4}  # §1.2's compression byte in 3.x
LEVEL = 3


@dataclass
class BlockShardParts:
    """Every field of a 3.0 shard before its layout (§1.7): what `assemble` writes, checksums of the header aside."""

    codec: int
    compression: int
    metadata: bytes
    dictionary: bytes
    offsets: list[int]  # N + 1, in decoded space
    block_offsets: list[int]  # B + 1, in the data file
    block_records: list[int]  # B + 1, each block's first record
    block_checksums: list[int]  # B, CRC32C of each stored frame
    data: bytes
    record_count: int
    block_count: int
    major_version: int = 3
    minor_version: int = 0
    flags: int = 0


def frame_of(content: bytes, dictionary: bytes) -> bytes:
    """One zstd frame of `content` declaring its size (§1.6), with the dictionary's ID when there is one."""
    import zstandard

    options = {"dict_data": zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_FULLDICT)} if dictionary else {}
    return zstandard.ZstdCompressor(level=LEVEL, write_content_size=True, write_checksum=False, **options).compress(content)


def block_parts(
    codec: str, params: dict[str, Any], payloads: list[bytes], counts: list[int], dictionary: bytes = b"", user: dict | None = None
) -> BlockShardParts:
    """The parts of the 3.0 shard of `payloads` in blocks of `counts` records each (every count at least 1, summing
    to the record count), compressed with `dictionary` (compression 4) or without (compression 3)."""
    if any(count < 1 for count in counts) or sum(counts) != len(payloads):
        raise ValueError(f"block counts {counts} do not group {len(payloads)} records, each block holding one at least")
    name = "zstd-dict-blocks" if dictionary else "zstd-blocks"
    metadata = canonical_json({"codec": params, "compression": {"name": name}, "user": user or {}})
    offsets, block_offsets, block_records, checksums, frames = [0], [0], [0], [], []
    for count in counts:
        block = payloads[block_records[-1] : block_records[-1] + count]
        for payload in block:
            offsets.append(offsets[-1] + len(payload))
        if offsets[-1] - offsets[block_records[-1]] >= 1 << 32:
            raise ValueError(f"block {len(frames)} holds 2^32 bytes or more: §1.7 bounds a block below 2^32")
        frames.append(frame_of(b"".join(block), dictionary))
        checksums.append(crc32c(frames[-1]))
        block_offsets.append(block_offsets[-1] + len(frames[-1]))
        block_records.append(block_records[-1] + count)
    return BlockShardParts(CODEC_IDS[codec], BLOCK_COMPRESSIONS[name], metadata, dictionary, offsets, block_offsets,
                           block_records, checksums, b"".join(frames), len(payloads), len(counts))


def _padded(section: bytes, start: int) -> bytes:
    """`section` placed at `start`, followed by zeros up to the next multiple of 8."""
    return section + bytes(-(start + len(section)) % 8)


def assemble(parts: BlockShardParts) -> ShardBytes:
    """The index and data files of `parts`: §1.7's layout, then `data_crc32c`, `data_edge_crc32c`, `body_crc32c`
    and `header_crc32c` computed from the bytes written."""
    body = _padded(parts.metadata, 64)
    body += _padded(parts.dictionary, 64 + len(body))
    body += struct.pack(f"<{len(parts.offsets)}Q", *parts.offsets) + struct.pack("<Q", parts.block_count)
    body += struct.pack(f"<{len(parts.block_offsets)}Q", *parts.block_offsets)
    body += struct.pack(f"<{len(parts.block_records)}Q", *parts.block_records)
    body += struct.pack(f"<{len(parts.block_checksums)}I", *parts.block_checksums)
    data = parts.data
    edge = crc32c(data[:4096] + data[len(data) - min(4096, len(data)) :])
    dictionary_fields = struct.pack("<II", len(parts.dictionary), crc32c(parts.dictionary))  # CRC32C of no bytes is 0
    header = MAGIC + struct.pack(
        "<HHBBHQQQIII8s", parts.major_version, parts.minor_version, parts.codec, parts.compression, parts.flags,
        parts.record_count, len(data), len(parts.metadata), crc32c(data), edge, crc32c(body), dictionary_fields,
    )
    return ShardBytes(header + struct.pack("<I", crc32c(header)) + body, data)


def write_block_shard(
    codec: str, params: dict[str, Any], payloads: list[bytes], counts: list[int], dictionary: bytes = b"", user: dict | None = None
) -> ShardBytes:
    """The 3.0 shard of `payloads` grouped in blocks of `counts` records (§1.7), built from the spec alone."""
    return assemble(block_parts(codec, params, payloads, counts, dictionary, user))
