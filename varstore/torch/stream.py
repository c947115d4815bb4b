"""`RecordStream`: an iterable dataset of batches for sequential media, shuffled by blocks, exact and resumable.

The epoch order is a pure function of (seed, epoch, rank, world size) and the
settings, never of the number of DataLoader workers:

1. the records are cut into blocks of `block_size` contiguous records (a block may
   straddle two shards) and the blocks are shuffled across the whole dataset, so
   shards are visited in a random order and each block is one sequential read;
2. that sequence is cut into `world_size` contiguous, equal (to one record) parts,
   one per rank, so a rank reads about 1/world_size of the files;
3. each rank's part is cut into windows of `shuffle_window` consecutive positions
   and shuffled within each window: a bounded buffer that holds record indices (8
   bytes each), never records, which are read by index once the window's blocks
   have been prefetched into the page cache as one sequential read each.

The rank's order is dealt to workers a batch at a time: batch j goes to worker
``j % num_workers``, the same round robin in which the DataLoader collects batches,
so the loader yields the rank's order exactly. Resuming therefore only needs how
many samples the loop consumed, and works with another number of workers; at another
world size the epoch goes on from what every rank left (see `_EpochOrder`).

Over object storage the same order is read in one of two ways (`varstore.torch.prefetch`
runs both): unshuffled, whole shards are fetched into the node cache ahead of the
batches; shuffled, each worker reads its records of the next window by ranged requests,
one per block, into memory while its batches consume the current window.
"""

from __future__ import annotations

import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from torch.utils.data import IterableDataset, default_collate, get_worker_info

from ..dataset.reader import ShardedReader
from ..errors import CorruptRecordError, DatasetReplacedError, StorageError, VarstoreError
from ..shard.reader import FlatBatch
from .datasets import DamagedPolicy, Output, RecordDataset
from .distributed import rank_and_world_size
from .fingerprint import check_version, dataset_version
from .loader_state import dataset_states, is_loader_state
from .permutation import Permutation, derive_key
from .prefetch import Prefetcher, ShardPrefetcher, ShardSchedule
from .reading import AnyReader
from .resume import EpochPosition, as_int, check_resume_state

_BLOCKS_PURPOSE = 2
_WINDOW_PURPOSE = 3
# Ranged reads of one window's blocks in flight at once (a shuffled remote stream).
_BLOCK_READS_AT_ONCE = 16
_MAX_WORLD_SIZE = 1 << 20  # ranks of a saved state: far past any job, and a bound on the per-rank work of loading it

logger = logging.getLogger("varstore.torch")


def _contiguous_runs(records: np.ndarray) -> list[tuple[int, int]]:
    """Sorted distinct `records` as maximal [start, stop) ranges of consecutive indices."""
    breaks = np.flatnonzero(np.diff(records) != 1) + 1
    starts = records[np.concatenate(([0], breaks))]
    stops = records[np.concatenate((breaks - 1, [len(records) - 1]))] + 1
    return list(zip(starts.tolist(), stops.tolist()))


def _part(length: int, world_size: int, rank: int) -> tuple[int, int]:
    """(first position, count) of rank `rank`'s contiguous, equal (to one) share of `length` positions."""
    first = rank * length // world_size
    return first, (rank + 1) * length // world_size - first


def _stage_consumed(length: int, world_size: int, consumed: int) -> int:
    """Positions a stage of `length` took when each of its `world_size` ranks consumed `consumed` of its share:
    `_part`'s shares are `length // world_size` records, one more for `length % world_size` of the ranks."""
    share, longer = divmod(length, world_size)
    return (world_size - longer) * min(consumed, share) + longer * min(consumed, share + 1)


def _checked_world_size(world_size: int, whose: str) -> int:
    """`world_size` of a saved state, refused unless 1 to `_MAX_WORLD_SIZE` (the stages' maps are per rank)."""
    if not 1 <= world_size <= _MAX_WORLD_SIZE:
        raise VarstoreError(f"{whose} world_size is {world_size}; it must be at least 1 and at most {_MAX_WORLD_SIZE}")
    return world_size


class _EpochOrder:
    """One rank's epoch order, built a window at a time; only the windows the current batch spans are held.

    Each window is computed whole (a few vectorised passes over `shuffle_window`
    positions, far cheaper than permuting batch by batch) when a read first reaches
    it, and its records are handed to `prefetch` as contiguous ranges.

    After a resume at another world size the epoch goes on in stages: stage 0 is the
    order described in the module docstring, and each later stage's sequence is what
    the stage before left, its ranks' unread tails joined in rank order, cut again
    into one contiguous share per rank (no reshuffle: it is shuffled already).
    """

    def __init__(self, stream: RecordStream, prefetch: Callable[[int, int], None]) -> None:
        self.block_size = stream.block_size
        self.shuffle_window = stream.shuffle_window
        self.shuffle = stream.shuffle
        self.first, self.count = _part(stream._length, stream.world_size, stream.rank)
        self._rank = stream.rank
        self._prefetch = prefetch
        self._record_count = stream.record_count
        self._earlier = stream._earlier
        self._first_world_size = stream._earlier[0][0] if stream._earlier else stream.world_size
        self._window_key = (_WINDOW_PURPOSE, stream.seed, stream.epoch)
        blocks = math.ceil(stream.record_count / self.block_size)
        self._last_block_size = stream.record_count - (blocks - 1) * self.block_size
        self._blocks = Permutation(blocks, derive_key(_BLOCKS_PURPOSE, stream.seed, stream.epoch))
        self._short_block_start = int(self._blocks.inverse([blocks - 1])[0]) * self.block_size if blocks else 0
        self._windows: dict[int, np.ndarray] = {}

    def _in_block_order(self, positions: np.ndarray) -> np.ndarray:
        """Records at `positions` of the whole dataset's shuffled block sequence."""
        if not self.shuffle:
            return positions
        # Every block but the last holds block_size records: positions after the short block shift as if it were full.
        after_short = positions >= self._short_block_start + self._last_block_size
        padded = positions + after_short * (self.block_size - self._last_block_size)
        return self._blocks(padded // self.block_size) * self.block_size + padded % self.block_size

    def _first_stage_window(self, rank: int, window: int) -> np.ndarray:
        """The records of window `window` of rank `rank` in stage 0, in the order that rank reads them."""
        first, count = _part(self._record_count, self._first_world_size, rank)
        start = window * self.shuffle_window
        size = min(self.shuffle_window, count - start)
        records = self._in_block_order(np.arange(first + start, first + start + size, dtype=np.int64))
        if not self.shuffle:
            return records
        return records[Permutation(size, derive_key(*self._window_key, rank, window))(np.arange(size))]

    def _first_stage_records(self, positions: np.ndarray) -> np.ndarray:
        """The records at `positions` of stage 0's sequence (every rank's order, joined in rank order)."""
        world_size = self._first_world_size
        firsts = np.array([_part(self._record_count, world_size, rank)[0] for rank in range(world_size)], np.int64)
        ranks = np.searchsorted(firsts, positions, side="right") - 1
        offsets = positions - firsts[ranks]
        stride = self._record_count // self.shuffle_window + 1  # more windows than any rank has
        keys = ranks * stride + offsets // self.shuffle_window
        records = np.empty_like(positions)
        for key in np.unique(keys).tolist():
            chosen = keys == key
            rank, window = divmod(key, stride)
            records[chosen] = self._first_stage_window(rank, window)[offsets[chosen] % self.shuffle_window]
        return records

    def _earlier_positions(self, positions: np.ndarray) -> np.ndarray:
        """`positions` of the current stage's sequence as positions of stage 0's, through each stage's unread tails."""
        lengths = [self._record_count]
        for world_size, consumed in self._earlier:
            lengths.append(lengths[-1] - _stage_consumed(lengths[-1], world_size, consumed))
        for (world_size, consumed), length in zip(reversed(self._earlier), reversed(lengths[:-1])):
            parts = [_part(length, world_size, rank) for rank in range(world_size)]
            tail_starts = np.array([first + min(consumed, count) for first, count in parts], np.int64)
            tail_lengths = np.array([count - min(consumed, count) for _, count in parts], np.int64)
            joined_starts = np.concatenate(([0], np.cumsum(tail_lengths)[:-1]))
            # A rank whose tail is empty shares its joined start with the next: side="right" picks the last of them.
            tail = np.searchsorted(joined_starts, positions, side="right") - 1
            positions = tail_starts[tail] + positions - joined_starts[tail]
        return positions

    def window(self, window: int) -> np.ndarray:
        """The records of window `window`, in the order the rank reads them."""
        if not self._earlier:
            return self._first_stage_window(self._rank, window)
        start = window * self.shuffle_window
        size = min(self.shuffle_window, self.count - start)
        positions = np.arange(self.first + start, self.first + start + size, dtype=np.int64)
        return self._first_stage_records(self._earlier_positions(positions))

    def records(self, start: int, stop: int) -> np.ndarray:
        """The records at positions [start, stop) of the rank's order; calls must not go back to earlier windows."""
        first_window, last_window = start // self.shuffle_window, (stop - 1) // self.shuffle_window
        for window in [window for window in self._windows if window < first_window]:
            del self._windows[window]
        parts = []
        for window in range(first_window, last_window + 1):
            if window not in self._windows:
                self._windows[window] = self.window(window)
                for run_start, run_stop in _contiguous_runs(np.sort(self._windows[window])):
                    self._prefetch(run_start, run_stop)
            offset = window * self.shuffle_window
            parts.append(self._windows[window][max(start - offset, 0) : min(stop - offset, self.shuffle_window)])
        return np.concatenate(parts)


def _fetch_or_leave_to_ranges(fetch: Callable[[], None], shard: str) -> None:
    """`fetch()` a shard whole; if that fails with a `StorageError` (a data object that fails its CRC32C for
    one damaged record, or storage not answering), its records are read by ranges instead, each checked
    against its own CRC32C: the damaged record is raised or skipped as ``on_damaged`` says, the others
    arrive, and an outage raises from those reads."""
    try:
        fetch()
    except DatasetReplacedError:
        raise
    except StorageError as error:
        logger.warning("fetching shard %s whole failed; reading its records by ranges: %s", shard, error)


def _no_prefetch(start: int, stop: int) -> None:
    """A remote dataset's records are brought by a `Prefetcher`: whole shards, or a window's blocks."""


class _WindowRecords:
    """The records of one shuffle window that one worker reads, fetched by ranged reads: their sorted
    indices and, in that order, the records (with flat batches: each record's values)."""

    def __init__(self, indices: np.ndarray, items: list[Any]) -> None:
        self.indices = indices
        self.items = items

    def positions(self, records: np.ndarray) -> np.ndarray:
        """Where each of `records` is in `items`, or -1 for one this window does not hold."""
        positions = np.searchsorted(self.indices, records)
        found = positions < len(self.indices)
        found[found] = self.indices[positions[found]] == records[found]
        return np.where(found, positions, -1)


class _HeldRecords:
    """The records of the windows a batch spans, served through the reader calls `RecordDataset` makes."""

    def __init__(self, path: str, count: int, windows: list[_WindowRecords]) -> None:
        self.path = path
        self._count = count
        self._windows = windows

    def __len__(self) -> int:
        return self._count

    def holds(self, records: np.ndarray) -> bool:
        """Whether every one of `records` was fetched (``on_damaged="skip"`` leaves damaged blocks out)."""
        return bool(sum(int(np.count_nonzero(window.positions(records) >= 0)) for window in self._windows) == len(records))

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """The records at `indices`, in that order."""
        indices = np.asarray(indices, np.int64)
        items: list[Any] = [None] * len(indices)
        for window in self._windows:
            positions = window.positions(indices)
            for slot in np.flatnonzero(positions >= 0).tolist():
                items[slot] = window.items[positions[slot]]
        return items

    def get_batch_flat(self, indices: Sequence[int] | np.ndarray) -> FlatBatch:
        """The records at `indices` packed into one buffer plus offsets, as `Reader.get_batch_flat`."""
        values = self.get_batch(indices)
        offsets = np.zeros(len(values) + 1, np.int64)
        np.cumsum([len(value) for value in values], out=offsets[1:])
        return FlatBatch(np.concatenate(values), offsets)


class _WindowPrefetch:
    """A worker's records of each shuffle window it reads, in memory: a `Prefetcher` fetches the next window
    while the batches read the current one, and a window is dropped once the batches have passed it."""

    def __init__(self, windows: list[int], fetch: Callable[[int], _WindowRecords]) -> None:
        self._jobs = {window: number for number, window in enumerate(windows)}
        self._held: dict[int, _WindowRecords] = {}
        self._prefetcher = Prefetcher([partial(fetch, window) for window in windows], ahead=1)

    def holding(self, first: int, last: int) -> list[_WindowRecords]:
        """Windows `first` to `last` (waiting for them; raising a failed fetch's error); earlier ones are dropped."""
        for window in [window for window in self._held if window < first]:
            del self._held[window]
        for window in range(first, last + 1):
            if window not in self._held:
                self._prefetcher.wait(self._jobs[window] + 1)
                self._held[window] = self._prefetcher.take(self._jobs[window])
        return [self._held[window] for window in range(first, last + 1)]

    def close(self) -> None:
        self._prefetcher.close()


def stacked(batch: list[Any]) -> Any:
    """torch's `default_collate`, whose failure on records of different lengths says what to pass instead."""
    try:
        return default_collate(batch)
    except RuntimeError as error:
        if "equal size" not in str(error):
            raise
        raise VarstoreError(
            f"records of different lengths cannot be stacked ({error}); pass collate_fn=collate_jagged, or "
            "functools.partial(collate_padded, pad_value=...), to RecordStream"
        ) from None


class RecordStream(EpochPosition, IterableDataset):
    """Batches of records in a block-shuffled order, each record once per epoch across ranks and workers.

    Use with ``DataLoader(stream, batch_size=None, num_workers=...)``: the stream
    yields whole batches (`collate_fn` applied), read with one vectorised `get_batch`
    each. The default `collate_fn` is torch's `default_collate` (it stacks samples of
    equal shape, tuples from a `transform` included); records of different lengths
    need `collate_jagged` or `collate_padded`, which the default's error names. A
    `collate_fn` that returns the samples as they come (``ndarray`` and ``bytes``
    records) yields the `SampleBatch` that `RecordDataset` reads, and a worker hands
    it to the loop as one buffer, cut there into the same samples. Keep
    the DataLoader's default ``in_order=True`` and ``persistent_workers=False``:
    workers built once never see `set_epoch`.

    Ranks hold equal shares (to one record), so their batch counts differ by at most
    one; under DDP see `ExactlyOnceSampler` about the uneven last step. The last batch
    of a rank's epoch may be short. `transform`, `output`, `flat_batches`,
    `on_damaged`, `verify_reads` and `keep_dtype` mean what they mean for
    `RecordDataset`; a damaged record skipped leaves its batch one shorter. With
    ``output="numpy"`` keep a varstore collate function, which copies the read-only
    views (`default_collate` would hand them to torch as they are, with a warning).

    `path` may be a URL of object storage (see `varstore.open`), with `storage_options`, `cache_dir` and
    `cache_limit`; the order is the same as for a local copy. Each worker runs threads ahead of its
    batches, and a failed fetch is raised (the same exception) by the first batch that needs it;
    closing or dropping the iterator stops the threads.

    - ``shuffle=False`` (and ``shuffle=True`` when the node cache can hold the whole dataset): threads fetch
      whole shards into the node cache in the order the batches first read them, up to
      `SHARD_FETCHES_AT_ONCE` at once and at most two beyond those the batches have started on, so the next
      shards arrive while the current one is served; a shard is released after its last batch, so that the
      cache can evict it under `cache_limit`. Each data object is downloaded once per node.
    - ``shuffle=True``: a window's records come from up to ``shuffle_window / block_size`` blocks
      anywhere in the dataset, so whole shards would stay needed until the end of the epoch. Instead
      the thread reads the worker's records of the next window while its batches consume the current
      one: those of each block (two pieces for a block straddling two shards) with one ranged request
      (unless other workers' records between them exceed 64 KiB), the blocks concurrently, every record
      checked against its CRC32C. Memory is about two windows of this worker's records (three while
      a batch straddles two windows); only index files enter the node cache. Every worker's batches
      draw from every block of a window, so with W workers each reads about the whole block: W times
      the bytes of the data per epoch (records over 64 KiB are read alone, so there it is W times the
      requests instead).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        batch_size: int,
        collate_fn: Callable[[Any], Any] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        block_size: int = 256,
        shuffle_window: int = 16384,
        transform: Callable[[Any], Any] | None = None,
        output: Output = "torch",
        flat_batches: bool = False,
        on_damaged: DamagedPolicy = "raise",
        verify_reads: bool = False,
        keep_dtype: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        batch_size, block_size = as_int(batch_size, "batch_size"), as_int(block_size, "block_size")
        shuffle_window, seed = as_int(shuffle_window, "shuffle_window"), as_int(seed, "seed")
        for name, value in (("batch_size", batch_size), ("block_size", block_size), ("shuffle_window", shuffle_window)):
            if value < 1:
                raise VarstoreError(f"{name} must be at least 1, not {value}")
        self._dataset = RecordDataset(
            path, transform=transform, output=output, flat_batches=flat_batches, on_damaged=on_damaged,
            verify_reads=verify_reads, keep_dtype=keep_dtype,
            storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit,
        )
        self.path = self._dataset.path
        self.record_count = len(self._dataset)
        self.batch_size = batch_size
        self.collate_fn = collate_fn or stacked
        self.shuffle = shuffle
        self.seed = seed
        self.block_size = block_size
        self.shuffle_window = shuffle_window
        self.rank, self.world_size = rank_and_world_size(rank, world_size)
        self.dataset_version = dataset_version(self._dataset)
        self.epoch = 0
        self._start = 0  # positions of this rank's epoch order consumed before a resume
        # Stages of this epoch run at other world sizes before a resume: (world size, samples each rank consumed).
        self._earlier: list[tuple[int, int]] = []
        self._length = self.record_count  # records of the epoch the current stage deals out
        # (worker, workers, batches): the batches a worker yielded, from a StatefulDataLoader worker's state loaded,
        # and as counted by this process's latest iteration.
        self._worker_resume: tuple[int, int, int] | None = None
        self._worker_progress: tuple[int, int, int] | None = None
        self._last_worker_iteration: tuple[int, int] | None = None

    @property
    def rank_record_count(self) -> int:
        """How many records this rank reads per epoch."""
        return _part(self._length, self.world_size, self.rank)[1]

    @property
    def skipped_records(self) -> dict[str, int]:
        """Damaged records skipped in this process, per shard (see `RecordDataset`)."""
        return self._dataset.skipped_records

    @property
    def _largest_rank_record_count(self) -> int:
        return -(-self._length // self.world_size)

    def __len__(self) -> int:
        """Batches this rank yields this epoch (after a resume: those left)."""
        return math.ceil((self.rank_record_count - self._start) / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        worker = get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        if worker is not None:
            self._warn_if_repeated()
        reader = self._dataset.reader
        remote = reader.is_remote
        order = _EpochOrder(self, _no_prefetch if remote else reader.prefetch)
        skip = self._batches_done(worker_id, workers)
        self._worker_progress = (worker_id, workers, skip)
        first_batch = worker_id + skip * workers
        batch_starts = range(self._start + first_batch * self.batch_size, order.count, workers * self.batch_size)
        # Whole shards, each downloaded once per node, unless a shuffled epoch, which needs most shards until its
        # end, would hold more than the node cache may: then each window's blocks by ranged reads.
        by_windows = remote and self.shuffle and not reader.fits_in_cache
        shards = self._shard_prefetcher(reader, worker_id, workers) if remote and not by_windows else None
        windows = self._window_prefetch(reader, batch_starts, worker_id, workers) if by_windows else None
        try:
            for number, batch_start in enumerate(batch_starts):
                batch_stop = min(batch_start + self.batch_size, order.count)
                if shards is not None:
                    shards.before_batch(number)
                records = order.records(batch_start, batch_stop)
                if windows is None:
                    samples = self._dataset.__getitems__(records)
                else:
                    held = windows.holding(batch_start // self.shuffle_window, (batch_stop - 1) // self.shuffle_window)
                    samples = self._samples_from(_HeldRecords(self.path, self.record_count, held), records)
                if shards is not None:
                    shards.after_batch(number)
                batch = self.collate_fn(samples)
                self._worker_progress = (worker_id, workers, skip + number + 1)
                yield batch
        finally:
            for prefetcher in (shards, windows):
                if prefetcher is not None:
                    prefetcher.close()

    def _samples_from(self, held: _HeldRecords, records: np.ndarray) -> Any:
        """The batch's samples from the prefetched windows; a batch with records the fetch left out as damaged
        (``on_damaged="skip"``) is read by the dataset instead, which skips and counts them."""
        if not held.holds(records):
            return self._dataset.__getitems__(records)
        return self._dataset._samples_from(held, records)

    def _window_prefetch(self, reader: AnyReader, batch_starts: range, worker_id: int, workers: int) -> _WindowPrefetch:
        """A thread that reads this worker's records of each window it reads, one window ahead."""
        starts = np.asarray(batch_starts, np.int64)
        stops = np.minimum(starts + self.batch_size, self.rank_record_count)
        count = math.ceil(self.rank_record_count / self.shuffle_window)
        spans = np.zeros(count + 1, np.int64)  # +1 at a batch's first window, -1 after its last
        np.add.at(spans, starts // self.shuffle_window, 1)
        np.add.at(spans, (stops - 1) // self.shuffle_window + 1, -1)
        windows = np.flatnonzero(np.cumsum(spans[:count]) > 0).tolist()
        order = _EpochOrder(self, _no_prefetch)  # the thread's own: the batches' order holds other windows
        return _WindowPrefetch(windows, partial(self._fetch_window, reader, order, worker_id, workers))

    def _fetch_window(
        self, reader: AnyReader, order: _EpochOrder, worker_id: int, workers: int, window: int
    ) -> _WindowRecords:
        """This worker's records of `window`: those of each block (or part of a block in one shard) read with
        one `get_batch`, whose ranges merge into one request unless records of other workers' batches between
        them span more than 64 KiB; the blocks read at once (`_BLOCK_READS_AT_ONCE`), each record checked
        against its CRC32C."""
        records, _ = self._worker_part(order, window, worker_id, workers)
        records = np.sort(records)
        if isinstance(reader, ShardedReader):
            shard_starts, shard = reader.shard_starts, reader.shard
        else:
            shard_starts, shard = np.array([0, len(reader)], np.int64), lambda _: reader
        shard_of = np.searchsorted(shard_starts, records, side="right") - 1
        cuts = np.flatnonzero((np.diff(records // self.block_size) != 0) | (np.diff(shard_of) != 0)) + 1
        pieces = np.split(records, cuts) if len(records) else []
        skipping = self._dataset.on_damaged == "skip"

        def read_piece(piece: np.ndarray) -> tuple[np.ndarray, list[Any]]:
            position = int(np.searchsorted(shard_starts, piece[0], side="right")) - 1
            if skipping and isinstance(reader, ShardedReader) and not reader._shard_usable(position):
                return piece[:0], []  # a quarantined shard: the dataset skips its records
            local = piece - shard_starts[position]
            try:
                if self._dataset.flat_batches:
                    values, offsets = shard(position).get_batch_flat(local)
                    bounds = offsets.tolist()
                    return piece, [values[start:end] for start, end in zip(bounds, bounds[1:])]
                return piece, shard(position).get_batch(local)
            except CorruptRecordError:
                if not skipping:
                    raise
                return piece[:0], []  # the dataset reads this batch itself, skipping the damaged records

        threads = max(1, min(_BLOCK_READS_AT_ONCE, len(pieces)))
        with ThreadPoolExecutor(threads, thread_name_prefix="varstore-block-read") as pool:
            fetched = list(pool.map(read_piece, pieces))
        indices = np.concatenate([run_indices for run_indices, _ in fetched]) if fetched else np.zeros(0, np.int64)
        return _WindowRecords(indices, [item for _, items in fetched for item in items])

    def _worker_part(self, order: _EpochOrder, window: int, worker_id: int, workers: int) -> tuple[np.ndarray, np.ndarray]:
        """The records of `window` that this worker's batches read (after a resume's start), and the number of
        the batch, in this worker's sequence, that reads each."""
        records = order.window(window)
        positions = np.arange(window * self.shuffle_window, window * self.shuffle_window + len(records))
        batches = (positions - self._start) // self.batch_size
        skip = self._batches_done(worker_id, workers)
        mine = (positions >= self._start) & (batches % workers == worker_id) & (batches // workers >= skip)
        return records[mine], batches[mine] // workers - skip

    def _shard_prefetcher(self, reader: AnyReader, worker_id: int, workers: int) -> ShardPrefetcher:
        """The thread that fetches this worker's shards of a remote dataset whole, in the order its batches
        first read them, and releases each after its last batch."""
        if isinstance(reader, ShardedReader):
            schedule = self._shard_schedule(reader.shard_starts, worker_id, workers)
            skipping = self._dataset.on_damaged == "skip"

            def fetch(position: int) -> None:
                if not skipping or reader._shard_usable(position):  # a quarantined shard's records are skipped
                    _fetch_or_leave_to_ranges(lambda: reader.fetch_shard(position), reader.shard_paths[position])

            return ShardPrefetcher(schedule, fetch, reader.release_shard)
        schedule = self._shard_schedule(np.array([0, len(reader)], np.int64), worker_id, workers)
        return ShardPrefetcher(schedule, lambda _: _fetch_or_leave_to_ranges(reader.fetch_data, reader.path), lambda _: None)

    def _shard_schedule(self, shard_starts: np.ndarray, worker_id: int, workers: int) -> ShardSchedule:
        """The first and last of this worker's batches (numbered from 0) that read each shard, computed a
        window at a time from the epoch order, as the batches will read it."""
        shards = len(shard_starts) - 1
        first, last = np.full(shards, -1, np.int64), np.full(shards, -1, np.int64)
        order = _EpochOrder(self, _no_prefetch)
        for window in range(self._start // self.shuffle_window, math.ceil(order.count / self.shuffle_window)):
            records, batches = self._worker_part(order, window, worker_id, workers)  # batches: nondecreasing
            shard = np.searchsorted(shard_starts, records, side="right") - 1
            touched, first_seen = np.unique(shard, return_index=True)
            unset = first[touched] < 0
            first[touched[unset]] = batches[first_seen[unset]]
            touched, last_seen = np.unique(shard[::-1], return_index=True)
            last[touched] = batches[len(batches) - 1 - last_seen]
        return ShardSchedule(first, last)

    def _warn_if_repeated(self) -> None:
        current = (self.epoch, self._start)
        if self._last_worker_iteration == current:
            logger.warning(
                "RecordStream: a worker is starting epoch %d a second time from the same position; with "
                "persistent_workers=True the workers never see set_epoch or load_state_dict", self.epoch,
            )
        self._last_worker_iteration = current

    def _batches_done(self, worker_id: int, workers: int) -> int:
        """How many of its batches this worker already yielded: those of a worker's state it loaded, else none."""
        progress = self._worker_resume
        return progress[2] if progress is not None and progress[:2] == (worker_id, workers) else 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's order; a resume position loaded for another epoch is dropped."""
        if as_int(epoch, "epoch") != self.epoch:
            self._earlier, self._length = [], self.record_count
            self._worker_resume = self._worker_progress = None
        super().set_epoch(epoch)

    def _settings(self) -> dict[str, Any]:
        return {
            "kind": "RecordStream", "record_count": self.record_count, "shuffle": self.shuffle, "seed": self.seed,
            "block_size": self.block_size, "shuffle_window": self.shuffle_window,
        }

    def state_dict(self, samples_consumed: int | None = None) -> dict[str, Any]:
        """What resuming needs, given how many samples this rank's training loop consumed this epoch.

        A plain DataLoader's workers run ahead of the loop, so only the loop knows the
        count: batches x batch_size, including records the skip policy left out. Ranks
        step together, so every rank computes the same state from the same count, and
        any rank's state resumes every rank, at any world size and number of workers.

        Without a count, the state is of what this process yielded: torchdata's
        `StatefulDataLoader` takes it in each worker as the worker yields a batch, and
        resumes each worker from its own (same world size and number of workers); given
        to `load_state_dict`, the loader's whole state resumes at any of either.
        """
        state = {
            **self._settings(), "dataset_version": self.dataset_version, "epoch": self.epoch,
            "world_size": self.world_size, "earlier_stages": [list(stage) for stage in self._earlier],
        }
        if samples_consumed is None:
            worker, workers, batches = self._worker_progress or (0, 1, 0)
            if workers > 1:
                return {**state, "samples_consumed": self._start, "worker": worker, "workers": workers,
                        "worker_batches": batches, "batch_size": self.batch_size}
            samples_consumed = min(batches * self.batch_size, self.rank_record_count - self._start)
        samples_consumed = as_int(samples_consumed, "samples_consumed")
        remaining = self.rank_record_count - self._start
        whole_batches = samples_consumed % self.batch_size == 0 or samples_consumed == remaining
        if not 0 <= samples_consumed <= len(self) * self.batch_size or not whole_batches:
            raise VarstoreError(
                f"samples_consumed is {samples_consumed}: it counts whole batches of {self.batch_size} "
                f"(damaged records skipped included), at most the {len(self)} batches this rank has left this epoch"
            )
        consumed = min(self._start + samples_consumed, self._largest_rank_record_count)
        return {**state, "samples_consumed": consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue `state`'s epoch right after the samples it counts: at the same world size, the same order on;
        at another, a new stage over what every rank left. A worker's state (see `state_dict`) resumes only that
        worker, in a loader of as many workers at the same world size; a `StatefulDataLoader`'s whole
        ``state_dict()`` (any rank's) resumes this rank at any world size and number of workers."""
        if is_loader_state(state):
            state = self._rank_state(dataset_states(state))
        check_version(state, self.dataset_version, "RecordStream")
        epoch, consumed = check_resume_state(state, self._settings(), self.record_count)
        earlier = self._saved_stages(state)
        saved_world_size = _checked_world_size(as_int(state.get("world_size"), "saved world_size"), "saved")
        length = self.record_count - self._consumed_before(earlier)
        if consumed > -(-length // saved_world_size):
            raise VarstoreError(
                f"saved samples_consumed is {consumed}, more than a rank's share of the {length} records its stage "
                f"dealt to {saved_world_size} ranks"
            )
        progress = self._saved_worker_progress(state, saved_world_size)
        self.epoch, self._worker_resume, self._worker_progress = epoch, progress, progress
        if saved_world_size == self.world_size:
            self._earlier, self._length = earlier, length
            self._start = min(consumed, self.rank_record_count)  # ranks with one record fewer finished a batch earlier
        else:  # a stage that consumed nothing leaves its sequence whole: the new world size deals it out itself
            self._earlier = earlier + [(saved_world_size, consumed)] if consumed else earlier
            self._length = self.record_count - self._consumed_before(self._earlier)
            self._start = 0

    def _rank_state(self, states: list[Any]) -> dict[str, Any]:
        """The rank's state made of its loader's worker states: what they share, with the batches they yielded
        (each of `batch_size` records, the last of the rank's share maybe short) added to the count."""
        for state in states:
            if not isinstance(state, dict) or state.get("kind") != "RecordStream":
                raise VarstoreError(
                    f"the StatefulDataLoader state holds a dataset state {state!r}, not a RecordStream's"
                )
        progress = {"worker", "workers", "worker_batches", "batch_size"}
        shared = [{key: value for key, value in state.items() if key not in progress} for state in states]
        if any(state != shared[0] for state in shared):
            raise VarstoreError(f"the StatefulDataLoader's worker states disagree on where the epoch stood: {states}")
        batches = [
            (as_int(state["worker_batches"], "saved worker_batches"), as_int(state["batch_size"], "saved batch_size"))
            for state in states if "worker_batches" in state
        ]
        rank_state = shared[0]
        if batches:
            if any(count < 0 or batch_size < 1 for count, batch_size in batches):
                raise VarstoreError(f"the StatefulDataLoader's worker states count {batches} (batches, batch size): "
                                    "a count cannot be negative, nor a batch size below 1")
            world_size = _checked_world_size(as_int(rank_state.get("world_size"), "saved world_size"), "saved")
            length = self.record_count - self._consumed_before(self._saved_stages(rank_state))
            share = -(-length // world_size)
            read = sum(count * batch_size for count, batch_size in batches)
            consumed = as_int(rank_state["samples_consumed"], "saved samples_consumed") + read
            # Each worker's last batch of the share may be short: past that slack, no run saved these counts.
            if consumed > share + sum(batch_size for _, batch_size in batches):
                raise VarstoreError(f"the StatefulDataLoader's workers yielded {read} records after the saved "
                                    f"{consumed - read}, more than the rank's share of {share}")
            rank_state["samples_consumed"] = min(consumed, share)
        return rank_state

    def _consumed_before(self, stages: list[tuple[int, int]]) -> int:
        """Records the `stages` took, each from what the ones before it left."""
        length = self.record_count
        for world_size, consumed in stages:
            length -= _stage_consumed(length, world_size, consumed)
        return self.record_count - length

    def _saved_stages(self, state: dict[str, Any]) -> list[tuple[int, int]]:
        """The saved state's earlier stages, checked (a state from before stages were saved has none)."""
        stages = state.get("earlier_stages", [])
        if not isinstance(stages, list):
            raise VarstoreError(
                f"saved earlier_stages must be a list of [world_size, samples_consumed], not {stages!r}"
            )
        checked = []
        length = self.record_count
        for stage in stages:
            if not isinstance(stage, (list, tuple)) or len(stage) != 2:
                raise VarstoreError(f"a saved earlier stage must be [world_size, samples_consumed], not {stage!r}")
            world_size = _checked_world_size(as_int(stage[0], "a saved stage's world_size"), "a saved stage's")
            consumed = as_int(stage[1], "a saved stage's samples_consumed")
            if consumed < 1:
                raise VarstoreError(
                    f"a saved earlier stage needs a world_size and samples_consumed of at least 1, not {stage!r}"
                )
            if consumed > -(-length // world_size):  # no run consumes past a rank's share: the epoch would be over
                raise VarstoreError(
                    f"a saved earlier stage {stage!r} consumed more than a rank's share of the {length} records its "
                    "stage had: the state is not one a run saved"
                )
            length -= _stage_consumed(length, world_size, consumed)
            checked.append((world_size, consumed))
        return checked

    def _saved_worker_progress(self, state: dict[str, Any], saved_world_size: int) -> tuple[int, int, int] | None:
        """A worker's own progress in `state`, checked to belong to this worker of a loader like the one it ran in."""
        if "worker_batches" not in state:
            return None
        worker, workers = as_int(state.get("worker"), "saved worker"), as_int(state.get("workers"), "saved workers")
        batches = as_int(state["worker_batches"], "saved worker_batches")
        batch_size = as_int(state.get("batch_size"), "saved batch_size")
        if batches < 0:
            raise VarstoreError(f"saved worker_batches is {batches}; it cannot be negative")
        info = get_worker_info()
        here = (info.id, info.num_workers) if info is not None else None
        if (here, saved_world_size, batch_size) != ((worker, workers), self.world_size, self.batch_size):
            where = f"worker {here[0]} of {here[1]}" if here else "the main process"
            raise VarstoreError(
                f"this RecordStream state is DataLoader worker {worker}'s of {workers} at world size "
                f"{saved_world_size}, batch size {batch_size}, loaded in {where} at world size {self.world_size}, "
                f"batch size {self.batch_size}: a worker's state resumes that worker only, in a StatefulDataLoader "
                "like its own; to resume otherwise, give load_state_dict the loader's whole state_dict()"
            )
        return worker, workers, batches
