"""CRC32C (Castagnoli), the one checksum the format uses, computed in hardware where the CPU allows."""

from __future__ import annotations

import mmap
from typing import Callable, Union

from crc32c import crc32c

__all__ = ["Buffer", "crc32c", "crc32c_of_range"]

Buffer = Union[bytes, bytearray, memoryview, mmap.mmap]

_CHUNK_BYTES = 8 << 20


def crc32c_of_range(
    buffer: Buffer, start: int, end: int, progress: Callable[[int], None] | None = None
) -> int:
    """CRC32C of `buffer[start:end]`, read in chunks so a mapped file is never copied whole."""
    view = memoryview(buffer)
    value = 0
    for position in range(start, end, _CHUNK_BYTES):
        chunk_end = min(position + _CHUNK_BYTES, end)
        value = crc32c(view[position:chunk_end], value)
        if progress is not None:
            progress(chunk_end - position)
    return value
