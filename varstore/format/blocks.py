"""Compressed blocks (format 3.0, spec/FORMAT.md §1.7): the block table's layout, how a writer groups records into
blocks, and the spec's search for the block of a record, with no file I/O.

After a 3.x index's N + 1 offsets (of the records in decoded space) come B (u64), B + 1 ``block_offsets`` (u64, of
the stored frames), B + 1 ``block_records`` (u64, each block's first record) and B ``block_checksums`` (u32,
CRC32C of each stored frame). Block b is one zstd frame that decodes to records block_records[b] to
block_records[b + 1] - 1 back to back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

# A writer closes a block when it reaches this many decoded bytes (§1.7, "Writers"). Measured on tools/bench's
# corpora with a dictionary (stored ÷ one zstd-3 frame of the corpus; warm random read; load 2.4-3): docstrings of
# ~225 B 1.29 / 1.24 / 1.20 at 4 / 8 / 16 KiB, reads 5.9 / 11.4 / 21.2 µs; metadata rows of ~1.1 KB 1.44 / 1.38 /
# 1.35, 5.5 / 8.7 / 14.9 µs. 8 KiB keeps both within the size goal's 1.5x of MDS's shards at half 16 KiB's reads.
BLOCK_TARGET = 8 << 10
ENTRY_SIZE = 8  # B and each entry of block_offsets and block_records: u64
CHECKSUM_SIZE = 4  # each block checksum: u32
MAX_BLOCK_SIZE = (1 << 32) - 1  # a block's decoded bytes, at most


def table_size(block_count: int) -> int:
    """The bytes of a block table of `block_count` blocks: B, block_offsets, block_records, block_checksums."""
    return ENTRY_SIZE + 2 * ENTRY_SIZE * (block_count + 1) + CHECKSUM_SIZE * block_count


def block_count_for(table_bytes: int) -> int | None:
    """The B whose block table is exactly `table_bytes` long (what follows a 3.x index's offsets), or None."""
    rest = table_bytes - table_size(0)
    per_block = 2 * ENTRY_SIZE + CHECKSUM_SIZE
    if rest < 0 or rest % per_block:
        return None
    return rest // per_block


class BlockPacker:
    """Groups payloads into blocks as varstore's writer does (§1.7): a block closes when it reaches
    `BLOCK_TARGET` decoded bytes, and before a payload that would take a non-empty block past that, so that a
    payload of `BLOCK_TARGET` bytes or more is alone in its block."""

    def __init__(self) -> None:
        self.pending: list[bytes] = []  # the open block's payloads
        self.pending_bytes = 0

    def add(self, payloads: Iterable[bytes]) -> list[list[bytes]]:
        """Add `payloads`; returns the blocks they closed, each the list of its payloads."""
        closed = []
        for payload in payloads:
            size = len(payload)
            if self.pending and self.pending_bytes + size > BLOCK_TARGET:
                closed.append(self._close())
            self.pending.append(payload)
            self.pending_bytes += size
            if self.pending_bytes >= BLOCK_TARGET:
                closed.append(self._close())
        return closed

    def finish(self) -> list[list[bytes]]:
        """The open block, if any payload waits in it, closed."""
        return [self._close()] if self.pending else []

    def _close(self) -> list[bytes]:
        block, self.pending, self.pending_bytes = self.pending, [], 0
        return block


def blocks_of(payloads: Sequence[bytes]) -> list[bytes]:
    """Each block's decoded bytes (its payloads joined) for `payloads` grouped as a writer groups them."""
    packer = BlockPacker()
    return [b"".join(block) for block in packer.add(payloads) + packer.finish()]


def bisect_right_many(table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Python's ``bisect_right(table, key)`` for each of `keys`, over all of `table`, step for step as §1.7 spells
    it out: a damaged table need not be sorted, and every reader must find the same block. (numpy's searchsorted
    reuses one key's bounds for the next, which finds other positions in an unsorted table.)"""
    keys = np.asarray(keys, np.uint64)
    low = np.zeros(len(keys), np.int64)
    high = np.full(len(keys), len(table), np.int64)
    while True:
        active = low < high
        if not active.any():
            return low
        middle = (low + high) // 2
        below = keys < table[np.minimum(middle, len(table) - 1)]
        high = np.where(active & below, middle, high)
        low = np.where(active & ~below, middle + 1, low)
