"""Keyed pseudo-random permutations of ``range(size)`` evaluated at any positions in O(1) memory.

Shuffling billions of samples with an explicit permutation array costs 8 bytes per
sample in every process that needs the order. A Feistel network over the smallest
even number of bits that covers `size`, with out-of-range results fed back in until
they land in range ("cycle walking"), is a bijection of ``range(size)`` that any
process can evaluate for just the positions it reads, from a 64-bit key alone.
Its statistical quality is that of a hashed shuffle: ample for ordering training
data, not meant for cryptography.
"""

from __future__ import annotations

import numpy as np

_ROUNDS = 8
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def _mix(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, applied elementwise to uint64 (multiplication wraps modulo 2**64)."""
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def derive_key(*parts: int) -> int:
    """One 64-bit key from a tuple of integers such as (seed, epoch, purpose)."""
    key = np.zeros(1, np.uint64)
    for part in parts:
        key = _mix(key ^ np.uint64((part * _GOLDEN) & _MASK64))
    return int(key[0])


class Permutation:
    """A bijection of ``range(size)`` chosen by `key`; call it on positions, or `inverse` on values."""

    def __init__(self, size: int, key: int) -> None:
        if size < 0:
            raise ValueError(f"a permutation needs a size of at least 0, not {size}")
        self.size = size
        bits = max(2, (size - 1).bit_length())
        self._half = np.uint64((bits + 1) // 2)
        self._half_mask = np.uint64((1 << int(self._half)) - 1)
        round_keys = [int(_mix(np.array([(key + round_number * _GOLDEN) & _MASK64], np.uint64))[0])
                      for round_number in range(_ROUNDS)]
        self._round_keys = [np.uint64(round_key) for round_key in round_keys]

    def _rounds(self, values: np.ndarray, inverse: bool) -> np.ndarray:
        left, right = values >> self._half, values & self._half_mask
        if inverse:
            for round_key in reversed(self._round_keys):
                left, right = right ^ (_mix(left ^ round_key) & self._half_mask), left
        else:
            for round_key in self._round_keys:
                left, right = right, left ^ (_mix(right ^ round_key) & self._half_mask)
        return (left << self._half) | right

    def _apply(self, positions: np.ndarray | list[int], inverse: bool) -> np.ndarray:
        values = np.asarray(positions, dtype=np.int64)
        if values.size and (int(values.min()) < 0 or int(values.max()) >= self.size):
            raise ValueError(f"positions must lie in [0, {self.size})")
        result = self._rounds(values.astype(np.uint64), inverse)
        pending = np.flatnonzero(result >= np.uint64(self.size))
        while pending.size:  # cycle walking: each pass leaves fewer than 3/4 of the pending values out of range
            result[pending] = self._rounds(result[pending], inverse)
            pending = pending[result[pending] >= np.uint64(self.size)]
        return result.astype(np.int64)

    def __call__(self, positions: np.ndarray | list[int]) -> np.ndarray:
        """The permuted value of each position, as int64."""
        return self._apply(positions, inverse=False)

    def inverse(self, values: np.ndarray | list[int]) -> np.ndarray:
        """The position each value came from: ``inverse(self(p)) == p``."""
        return self._apply(values, inverse=True)
