"""CRC32C (Castagnoli), the one checksum the format uses, computed in hardware where the CPU allows."""

from __future__ import annotations

import mmap
from array import array
from typing import Callable, Sequence, Union

import numpy as np
from crc32c import crc32c

from .._native import speedups

__all__ = ["Buffer", "crc32c", "crc32c_combine", "crc32c_of_range", "crc32c_of_ranges", "crc32c_of_each"]

Buffer = Union[bytes, bytearray, memoryview, mmap.mmap]

_CHUNK_BYTES = 8 << 20
_REFLECTED_POLYNOMIAL = 0x82F63B78  # CRC32C's polynomial, bit-reversed: bit 31 is x**0


def _multiply_mod_p(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC32C polynomial, both in the CRC's reflected bit order."""
    product = 0
    bit = 1 << 31
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _REFLECTED_POLYNOMIAL if b & 1 else b >> 1
    return product


def _powers_of_x() -> list[int]:
    """x**(2**k) modulo the polynomial for k = 0..63, by repeated squaring."""
    powers = [1 << 30]  # x**1
    for _ in range(63):
        powers.append(_multiply_mod_p(powers[-1], powers[-1]))
    return powers


_X_POWER_OF_TWO = _powers_of_x()


_ZEROS = memoryview(bytes(1 << 16))


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32C of ``A + B`` from ``crc1 = crc32c(A)``, ``crc2 = crc32c(B)`` and ``len2 = len(B)``, without reading either.

    crc1 is shifted over len2 zero bytes, i.e. multiplied by x**(8 * len2) modulo
    the polynomial (square-and-multiply over len2's bits); the pre- and
    post-inversions cancel, so the result is that product XOR crc2.
    """
    if len2 < 0 or len2 >= 1 << 61:
        raise ValueError(f"length {len2} is outside [0, 2**61)")
    if len2 <= len(_ZEROS):  # shifting over len2 zero bytes is linear in crc1: let the hardware CRC do it
        zeros = _ZEROS[:len2]
        return crc32c(zeros, crc1) ^ crc32c(zeros) ^ crc2
    shift = 1 << 31  # x**0
    exponent, power = 8 * len2, 0
    while exponent:
        if exponent & 1:
            shift = _multiply_mod_p(_X_POWER_OF_TWO[power], shift)
        exponent >>= 1
        power += 1
    return _multiply_mod_p(shift, crc1) ^ crc2


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


def crc32c_of_ranges(buffer: Buffer, offsets: np.ndarray) -> np.ndarray:
    """The CRC32C of each ``buffer[offsets[k]:offsets[k + 1]]`` (offsets never decreasing, within `buffer`), as uint32."""
    if speedups is not None:
        return np.frombuffer(speedups.crc32c_ranges(buffer, np.ascontiguousarray(offsets, "<u8")), np.uint32)
    bounds = np.asarray(offsets).tolist()
    with memoryview(buffer) as view:
        return np.fromiter(map(crc32c, map(view.__getitem__, map(slice, bounds, bounds[1:]))), np.uint32, len(bounds) - 1)


def crc32c_of_each(payloads: Sequence[Buffer]) -> array:
    """The CRC32C of each payload, as an ``array("I")``."""
    if speedups is not None:
        checksums = array("I")
        checksums.frombytes(speedups.crc32c_each(payloads))
        return checksums
    return array("I", map(crc32c, payloads))
