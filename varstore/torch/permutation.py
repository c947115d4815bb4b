"""Keyed pseudo-random permutations of ``range(size)`` evaluated at any positions in O(1) memory.

Shuffling billions of samples with an explicit permutation array costs 8 bytes per
sample in every process that needs the order. A Feistel network over the smallest
even number of bits that covers `size`, with out-of-range results fed back in until
they land in range ("cycle walking"), is a bijection of ``range(size)`` that any
process can evaluate for just the positions it reads, from a 64-bit key alone.
Its statistical quality is that of a hashed shuffle: ample for ordering training
data, not meant for cryptography.

`BlockShuffle` is the order that suits object storage: contiguous blocks of records
in a keyed order, shuffled only within windows of consecutive positions, so a run of
positions touches few blocks; it too is evaluated at any position in O(1) memory.
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


def _round_keys(keys: np.ndarray) -> list[np.ndarray]:
    """The Feistel round keys of each 64-bit key in `keys` (uint64), one array per round."""
    return [_mix(keys + np.uint64((round_number * _GOLDEN) & _MASK64)) for round_number in range(_ROUNDS)]


def _check_positions(positions: np.ndarray | list[int], size: int) -> np.ndarray:
    values = np.asarray(positions, dtype=np.int64)
    if values.size and (int(values.min()) < 0 or int(values.max()) >= size):
        raise ValueError(f"positions must lie in [0, {size})")
    return values


class Permutation:
    """A bijection of ``range(size)`` chosen by `key`; call it on positions, or `inverse` on values."""

    def __init__(self, size: int, key: int) -> None:
        if size < 0:
            raise ValueError(f"a permutation needs a size of at least 0, not {size}")
        self.size = size
        self.key = key
        bits = max(2, (size - 1).bit_length())
        self._half = np.uint64((bits + 1) // 2)
        self._half_mask = np.uint64((1 << int(self._half)) - 1)
        self._round_keys = [round_key[0] for round_key in _round_keys(np.array([key & _MASK64], np.uint64))]

    def _rounds(self, values: np.ndarray, round_keys: list[np.ndarray], inverse: bool) -> np.ndarray:
        left, right = values >> self._half, values & self._half_mask
        if inverse:
            for round_key in reversed(round_keys):
                left, right = right ^ (_mix(left ^ round_key) & self._half_mask), left
        else:
            for round_key in round_keys:
                left, right = right, left ^ (_mix(right ^ round_key) & self._half_mask)
        return (left << self._half) | right

    def _apply(self, positions: np.ndarray | list[int], inverse: bool, tweaks: np.ndarray | None) -> np.ndarray:
        values = _check_positions(positions, self.size)
        round_keys = self._round_keys
        if tweaks is not None:  # the fold of one more part that derive_key makes, element by element
            tweaks = np.broadcast_to(np.asarray(tweaks, np.int64), values.shape).astype(np.uint64)
            round_keys = _round_keys(_mix(np.uint64(self.key & _MASK64) ^ (tweaks * np.uint64(_GOLDEN))))
        result = self._rounds(values.astype(np.uint64), round_keys, inverse)
        pending = np.flatnonzero(result >= np.uint64(self.size))
        while pending.size:  # cycle walking: each pass leaves fewer than 3/4 of the pending values out of range
            keys = round_keys if tweaks is None else [round_key[pending] for round_key in round_keys]
            result[pending] = self._rounds(result[pending], keys, inverse)
            pending = pending[result[pending] >= np.uint64(self.size)]
        return result.astype(np.int64)

    def __call__(self, positions: np.ndarray | list[int], tweaks: np.ndarray | None = None) -> np.ndarray:
        """The permuted value of each position, as int64.

        With `tweaks` (non-negative ints, one per position), each position goes through its own member of a
        family of permutations: if this one's key is ``derive_key(*parts)``, position i is permuted by
        ``Permutation(size, derive_key(*parts, tweaks[i]))``, all in one vectorised pass.
        """
        return self._apply(positions, False, tweaks)

    def inverse(self, values: np.ndarray | list[int]) -> np.ndarray:
        """The position each value came from: ``inverse(self(p)) == p``."""
        return self._apply(values, True, None)


class BlockShuffle:
    """A bijection of ``range(size)`` chosen by `key` whose runs of positions stay within few blocks: the records
    are cut into blocks of `block_size` contiguous indices (the last may be shorter), the blocks put in a keyed
    order, and each window of `shuffle_window` consecutive positions of that sequence permuted within itself.

    So any `n` consecutive positions hold records of at most ``ceil((n + 2 * shuffle_window - 2) / block_size)
    + 2`` blocks, while blocks come from anywhere in the range. Each window has its own permutation (its index
    is the tweak), so the whole order is computed position by position, from the key alone.
    """

    def __init__(self, size: int, block_size: int, shuffle_window: int, key: int) -> None:
        if block_size < 1 or shuffle_window < 1:
            raise ValueError(f"block_size and shuffle_window must be at least 1, not {block_size} and {shuffle_window}")
        self.size, self.block_size, self.shuffle_window = size, block_size, shuffle_window
        blocks = -(-size // block_size)
        self._blocks = Permutation(blocks, derive_key(key, 0))
        self._last_block_size = size - (blocks - 1) * block_size if blocks else 0
        # Where the last block, the one that may be short, lies in the block sequence.
        self._short_block_start = int(self._blocks.inverse([blocks - 1])[0]) * block_size if blocks else 0
        last_window = max(size - 1, 0) // shuffle_window
        self._last_window_start = last_window * shuffle_window
        self._windows = Permutation(shuffle_window, derive_key(key, 1))
        self._last_window = Permutation(size - self._last_window_start, derive_key(key, 1, last_window))

    def __call__(self, positions: np.ndarray | list[int]) -> np.ndarray:
        """The record at each position, as int64."""
        positions = _check_positions(positions, self.size)
        offsets = positions % self.shuffle_window
        window_starts = positions - offsets
        in_last = positions >= self._last_window_start
        shuffled = np.empty_like(positions)
        shuffled[~in_last] = self._windows(offsets[~in_last], tweaks=window_starts[~in_last] // self.shuffle_window)
        shuffled[in_last] = self._last_window(offsets[in_last])
        in_sequence = window_starts + shuffled
        # Every block but the last holds block_size records: positions after it shift as if it were full.
        after_short = in_sequence >= self._short_block_start + self._last_block_size
        padded = in_sequence + after_short * (self.block_size - self._last_block_size)
        return self._blocks(padded // self.block_size) * self.block_size + padded % self.block_size
