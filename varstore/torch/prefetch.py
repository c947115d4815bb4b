"""`ShardPrefetcher`: a thread that brings whole shards of a remote dataset into the node cache ahead of a
stream, and releases each shard once the stream has read its last record.

The stream knows its batches in advance, hence for each shard the first and the last of its batches that
read it (`ShardSchedule`). The thread fetches shards in order of first use, at most `SHARDS_AHEAD` beyond
those the stream has started on; before a batch the stream waits until every shard the batch reads is
fetched, and after its last batch of a shard it releases the shard, so that the node cache's LRU eviction
can reclaim its files under `cache_limit`. A fetch that fails stops the thread; the stream raises that
error itself (the same exception object) when it reaches a batch that needs the shard.
"""

from __future__ import annotations

import bisect
import threading
from typing import Callable, NamedTuple

import numpy as np

# How many shards the thread fetches beyond those the stream has started reading: one being downloaded
# while the stream finishes the current one, and one more to absorb an uneven download.
SHARDS_AHEAD = 2


class ShardSchedule(NamedTuple):
    """For each shard of a dataset, the number of the first and the last batch of the stream that reads it
    (-1 for both if none does)."""

    first_batch: np.ndarray
    last_batch: np.ndarray


class ShardPrefetcher:
    """Runs `fetch(position)` ahead of the batches `schedule` describes, and `release(position)` after them.

    Call `before_batch(k)` before reading batch k and `after_batch(k)` once it is read, for k = 0, 1, ...
    in order; `close` stops the thread (waiting for a fetch in progress to end).
    """

    def __init__(self, schedule: ShardSchedule, fetch: Callable[[int], None], release: Callable[[int], None]) -> None:
        used = np.flatnonzero(schedule.first_batch >= 0)
        by_first_use = used[np.lexsort((used, schedule.first_batch[used]))]
        self._order: list[int] = by_first_use.tolist()
        self._first_batches: list[int] = schedule.first_batch[by_first_use].tolist()
        self._releases: dict[int, list[int]] = {}
        for position in used.tolist():
            self._releases.setdefault(int(schedule.last_batch[position]), []).append(position)
        self._fetch = fetch
        self._release = release
        self._condition = threading.Condition()
        self._started = 0  # shards of `_order` that the stream's batches so far have needed
        self._fetched = 0  # shards of `_order` fetched, all of them in that order
        self._error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="varstore-shard-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for number, position in enumerate(self._order):
            with self._condition:
                self._condition.wait_for(lambda: self._stopping or number < self._started + SHARDS_AHEAD)
                if self._stopping:
                    return
            try:
                self._fetch(position)
            except BaseException as error:  # handed to the stream, which raises it
                with self._condition:
                    self._error = error
                    self._condition.notify_all()
                return
            with self._condition:
                self._fetched = number + 1
                self._condition.notify_all()

    def before_batch(self, batch: int) -> None:
        """Wait until every shard batch `batch` reads is fetched; raise the error a failed fetch of one of them raised."""
        needed = bisect.bisect_right(self._first_batches, batch)
        with self._condition:
            if needed > self._started:
                self._started = needed
                self._condition.notify_all()
            self._condition.wait_for(lambda: self._fetched >= needed or self._error is not None)
            if self._fetched < needed:
                raise self._error  # type: ignore[misc]

    def after_batch(self, batch: int) -> None:
        """Release the shards whose last batch is `batch`."""
        for position in self._releases.pop(batch, ()):
            self._release(position)

    def close(self) -> None:
        """Stop the thread: at once if it is waiting, else after the fetch in progress."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        self._thread.join()
