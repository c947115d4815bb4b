"""`ExactlyOnceSampler`: a distributed, shuffling, resumable sampler that never pads or drops."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sized

import numpy as np
from torch.utils.data import Sampler

from ..errors import VarstoreError
from .distributed import rank_and_world_size
from .fingerprint import check_version, dataset_version
from .loader_state import is_loader_state, sampler_state
from .permutation import BlockShuffle, Permutation, derive_key
from .prefetch import LookAhead
from .resume import EpochPosition, as_int, check_resume_state

_CHUNK = 8192
# Indices the sampler hands its data source's `will_need` at a time (see `_indices`): a few batches' worth, so the
# pages of the coming batches are read during the current training steps, and no more is held in the page cache.
LOOK_AHEAD_PIECE = 256
_SAMPLER_PURPOSE = 1
_BLOCK_SHUFFLE_PURPOSE = 5


def _block_options(shuffle: bool, block_size: Any, shuffle_window: Any) -> tuple[int | None, int | None]:
    """`(block_size, shuffle_window)` checked, the window defaulting to one block; `(None, None)` for the full
    shuffle."""
    if block_size is None:
        if shuffle_window is not None:
            raise VarstoreError(f"shuffle_window={shuffle_window!r} needs a block_size: it shuffles within blocks")
        return None, None
    if not shuffle:
        raise VarstoreError(f"block_size={block_size!r} shapes a shuffle: it needs shuffle=True")
    block_size = as_int(block_size, "block_size")
    shuffle_window = block_size if shuffle_window is None else as_int(shuffle_window, "shuffle_window")
    for name, value in (("block_size", block_size), ("shuffle_window", shuffle_window)):
        if value < 1:
            raise VarstoreError(f"{name} must be at least 1, not {value}")
    return block_size, shuffle_window


class ExactlyOnceSampler(EpochPosition, Sampler[int]):
    """Each epoch, a permutation of ``range(size)`` fixed by (seed, epoch), dealt to ranks so every index is seen once.

    Rank r takes positions r, r + world_size, r + 2 world_size, ... of the epoch
    order, so rank sizes differ by at most one: nothing is padded or dropped. Under
    DDP the ranks with one sample fewer can end the epoch a step early; wrap the
    loop in ``torch.distributed.algorithms.join.Join`` or keep the last step free
    of collectives. The permutation is computed for the indices being yielded
    (no O(size) array). Rank and world size come from the process group unless given.

    Resume: ``state_dict(samples_consumed)`` with this rank's count (batches x
    batch_size) and, after ``load_state_dict``, the same epoch continues right after
    the samples every rank consumed, with any world size. Under torchdata's
    `StatefulDataLoader`, which calls ``state_dict()`` as it hands out indices, the
    count is what the sampler's iterator has yielded. The state records the version
    of `data_source` (see `fingerprint`), and loading it on another version is refused.

    `block_size` (records) makes the shuffle one that suits object storage (`BlockShuffle`):
    blocks of `block_size` contiguous records in a random order, shuffled within windows
    of `shuffle_window` consecutive positions of the epoch order (default: one block), so on
    one rank a batch reads about batch_size / block_size contiguous runs instead of a record
    per request (with W ranks a rank's batch spans W times the positions). By default (no
    `block_size`) every position is shuffled across the whole range.
    """

    def __init__(
        self,
        data_source: Sized | int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        block_size: int | None = None,
        shuffle_window: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.size = data_source if isinstance(data_source, int) else len(data_source)
        self._will_need = getattr(data_source, "will_need", None)
        self.shuffle = shuffle
        self.seed = as_int(seed, "seed")
        self.block_size, self.shuffle_window = _block_options(shuffle, block_size, shuffle_window)
        self.rank, self.world_size = rank_and_world_size(rank, world_size)
        self.dataset_version = dataset_version(data_source)
        self.epoch = 0
        self._start = 0  # positions of the epoch order consumed before a resume, across all ranks
        self._yielded = 0  # indices the latest iterator yielded

    def _positions(self) -> range:
        return range(self._start + self.rank, self.size, self.world_size)

    def __len__(self) -> int:
        return len(self._positions())

    def __iter__(self) -> Iterator[int]:
        self._yielded = 0
        return self._indices(self._positions(), self._order(), self._will_need)

    def _pieces(self, positions: range, order: Permutation | BlockShuffle | None) -> Iterator[np.ndarray]:
        """The indices of `positions` in this epoch's order, `LOOK_AHEAD_PIECE` at a time."""
        for chunk_start in range(0, len(positions), _CHUNK):
            chunk = np.arange(chunk_start, min(chunk_start + _CHUNK, len(positions)), dtype=np.int64)
            chunk = positions.start + chunk * positions.step
            indices = order(chunk) if order is not None else chunk
            for piece_start in range(0, len(indices), LOOK_AHEAD_PIECE):
                yield indices[piece_start : piece_start + LOOK_AHEAD_PIECE]

    def _indices(
        self, positions: range, order: Permutation | BlockShuffle | None, will_need: Callable[[np.ndarray], None] | None
    ) -> Iterator[int]:
        """The indices one by one; with `will_need`, each piece is handed to it (in a `LookAhead` thread) before the
        previous piece is yielded, so at most two pieces are advised ahead of what this iterator has yielded."""
        pieces = self._pieces(positions, order)
        look_ahead = LookAhead(will_need) if will_need is not None else None
        try:
            piece = next(pieces, None)
            if look_ahead is not None and piece is not None:
                look_ahead.hint(piece)
            while piece is not None:
                following = next(pieces, None)
                if look_ahead is not None and following is not None:
                    look_ahead.hint(following)
                for index in piece.tolist():
                    self._yielded += 1
                    yield index
                piece = following
        finally:
            if look_ahead is not None:
                look_ahead.close()

    def _order(self) -> Permutation | BlockShuffle | None:
        """This epoch's order of ``range(size)`` (None: in order)."""
        if not self.shuffle:
            return None
        if self.block_size is None:
            return Permutation(self.size, derive_key(_SAMPLER_PURPOSE, self.seed, self.epoch))
        key = derive_key(_BLOCK_SHUFFLE_PURPOSE, self.seed, self.epoch)
        return BlockShuffle(self.size, self.block_size, self.shuffle_window, key)

    def _settings(self) -> dict[str, Any]:
        return {"kind": "ExactlyOnceSampler", "size": self.size, "shuffle": self.shuffle, "seed": self.seed,
                "block_size": self.block_size, "shuffle_window": self.shuffle_window}

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._yielded = 0

    def state_dict(self, samples_consumed: int | None = None) -> dict[str, Any]:
        """What resuming needs, given how many samples this rank's training loop consumed this epoch.

        A plain DataLoader runs ahead of the loop, so only the loop knows the count:
        batches x batch_size, including any record the skip policy left out (a count
        past the end, from a short last batch, means the epoch is done). Ranks step
        together, so every rank computes the same state from the same count. Without
        a count (torchdata's `StatefulDataLoader`, which snapshots the sampler as it
        dispatches each batch's indices) it is the indices the latest iterator yielded.
        """
        samples_consumed = self._yielded if samples_consumed is None else as_int(samples_consumed, "samples_consumed")
        if samples_consumed < 0:
            raise VarstoreError(f"samples_consumed is {samples_consumed}, it cannot be negative")
        consumed = min(self.size, self._start + samples_consumed * self.world_size)
        return {**self._settings(), "dataset_version": self.dataset_version, "epoch": self.epoch,
                "samples_consumed": consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue `state`'s epoch after the samples it counts, whatever the world size now; `state` may be a
        `StatefulDataLoader`'s whole ``state_dict()``, whatever its number of workers."""
        if is_loader_state(state):
            state = sampler_state(state)
        check_version(state, self.dataset_version, "ExactlyOnceSampler")
        self.epoch, self._start = check_resume_state(state, self._settings(), self.size)
        self._yielded = 0
