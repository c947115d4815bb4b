"""Threads that fetch a stream's remote data ahead of its batches: `Prefetcher`, the one thread loop, and
`ShardPrefetcher`, which uses it to bring whole shards into the node cache; and `LookAhead`, which tells a
local reader the records a sampler will yield next, so their pages are read while the training step runs.

A stream knows its batches in advance, so what it will need is a list of jobs in order of use. `Prefetcher`
runs them in order in one or more threads, at most `ahead` beyond those the stream has asked for, and keeps
each job's result until the stream takes it. After a job fails no other starts; the stream raises that error
itself (the same exception object) when it asks for that job or a later one. Closing stops the threads.

Two jobs lists use it (see `RecordStream`): whole shards in order of first use (`ShardPrefetcher`,
`SHARDS_AHEAD` ahead, `SHARD_FETCHES_AT_ONCE` downloads in flight so that the next shards arrive while the
current one is served, each released after its last batch so that the node cache can evict it under
`cache_limit`); with ``shuffle=True`` over a dataset larger than the node cache, the records of the next
shuffle window, read by ranged requests into memory (one window ahead, one thread), never into the node cache.
"""

from __future__ import annotations

import bisect
import queue
import threading
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

# How many shards the threads fetch beyond those the stream has started reading: one being downloaded
# while the stream finishes the current one, and one more to absorb an uneven download.
SHARDS_AHEAD = 2
# Shard downloads in flight at once: the one the batches wait for and those ahead of it.
SHARD_FETCHES_AT_ONCE = SHARDS_AHEAD + 1
THREAD_NAME = "varstore-prefetch"
# Pieces of indices `LookAhead` holds unadvised at most: with the sampler's piece in use, what it hands out is at
# most this many pieces ahead of what it has yielded.
PIECES_AHEAD = 2


class Prefetcher:
    """Runs `jobs` in order in `threads` threads, none beyond the first `count` that `wait(count)` asked for plus
    `ahead`.

    Call `wait(count)` before using the results of jobs [0, count) (counts never decrease), `take(number)`
    for job `number`'s result (once), and `close` to stop the threads (after the jobs in progress). Jobs start
    in order; after a job fails none starts, and `wait` raises the error of the first failed job it covers.
    """

    def __init__(self, jobs: Sequence[Callable[[], Any]], ahead: int, threads: int = 1) -> None:
        self._jobs = jobs
        self._ahead = ahead
        self._condition = threading.Condition()
        self._asked = 0  # jobs the stream has asked for
        self._started = 0  # jobs taken by a thread, all of them in order
        self._finished: set[int] = set()
        self._done = 0  # jobs finished, all of them in order
        self._results: dict[int, Any] = {}
        self._errors: dict[int, BaseException] = {}
        self._stopping = False
        count = max(1, min(threads, len(jobs)))
        self._threads = [threading.Thread(target=self._run, name=THREAD_NAME, daemon=True) for _ in range(count)]
        for thread in self._threads:
            thread.start()

    def _next_job(self) -> int | None:
        """The number of the next job to run, once the stream's asks allow it; None when there is none to run."""
        with self._condition:
            self._condition.wait_for(lambda: self._stopping or self._started < self._asked + self._ahead)
            if self._stopping or self._errors or self._started == len(self._jobs):
                return None
            self._started += 1
            return self._started - 1

    def _run(self) -> None:
        while (number := self._next_job()) is not None:
            try:
                result = self._jobs[number]()
            except BaseException as error:  # handed to the stream, which raises it
                with self._condition:
                    self._errors[number] = error
                    self._condition.notify_all()
                return
            with self._condition:
                if result is not None:  # a shard fetch returns nothing to keep
                    self._results[number] = result
                self._finished.add(number)
                while self._done in self._finished:
                    self._finished.remove(self._done)
                    self._done += 1
                self._condition.notify_all()

    def wait(self, count: int) -> None:
        """Wait until jobs [0, count) are done; raise the error a failed one of them raised."""
        with self._condition:
            if count > self._asked:
                self._asked = count
                self._condition.notify_all()
            self._condition.wait_for(lambda: self._done >= count or self._done in self._errors)
            if self._done < count:
                raise self._errors[self._done]

    def take(self, number: int) -> Any:
        """The result of job `number` (after `wait(number + 1)`), which the prefetcher no longer holds."""
        with self._condition:
            return self._results.pop(number, None)

    def close(self) -> None:
        """Stop the threads: at once if they are waiting, else after the jobs in progress."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        for thread in self._threads:
            thread.join()


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
        self._first_batches: list[int] = schedule.first_batch[by_first_use].tolist()
        self._releases: dict[int, list[int]] = {}
        for position in used.tolist():
            self._releases.setdefault(int(schedule.last_batch[position]), []).append(position)
        self._release = release
        jobs = [lambda position=position: fetch(position) for position in by_first_use.tolist()]
        self._prefetcher = Prefetcher(jobs, SHARDS_AHEAD, SHARD_FETCHES_AT_ONCE)

    def before_batch(self, batch: int) -> None:
        """Wait until every shard batch `batch` reads is fetched; raise the error a failed fetch of one of them raised."""
        self._prefetcher.wait(bisect.bisect_right(self._first_batches, batch))

    def after_batch(self, batch: int) -> None:
        """Release the shards whose last batch is `batch`."""
        for position in self._releases.pop(batch, ()):
            self._release(position)

    def close(self) -> None:
        """Stop the thread: at once if it is waiting, else after the fetch in progress."""
        self._prefetcher.close()


class LookAhead:
    """Calls `will_need(piece)` in a thread for each piece of indices `hint` is given, in order.

    `hint` waits while `PIECES_AHEAD` pieces are still unadvised, so memory stays bounded and the advice never
    falls behind by more; advice is best effort (the reader ignores what it cannot advise). `close` advises what
    is pending, then ends the thread.
    """

    def __init__(self, will_need: Callable[[np.ndarray], None]) -> None:
        self._will_need = will_need
        self._pieces: queue.Queue[np.ndarray | None] = queue.Queue(PIECES_AHEAD)
        self._thread = threading.Thread(target=self._run, name="varstore-look-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (piece := self._pieces.get()) is not None:
            self._will_need(piece)

    def hint(self, piece: np.ndarray) -> None:
        """Have the indices of `piece` advised, after every piece hinted before."""
        self._pieces.put(piece)

    def close(self) -> None:
        """Advise the pieces still pending and end the thread."""
        self._pieces.put(None)
        self._thread.join()
