"""`SkippedRecords`: how many records ``on_damaged="skip"`` left out, per shard, summed over every DataLoader worker.

The counts live in one shared-memory int64 array with a lock, created in the
main process from the ``spawn`` context (a file-backed mapping and a named
semaphore), which fork workers inherit and spawn or forkserver workers receive
while they are started. So after an epoch the main process sees what all its
workers skipped. Only counts are shared: nothing read from disk is pickled.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import get_spawning_popen
from typing import Any


class SkippedRecords:
    """Skipped-record counts for the shards `shard_names` (in dataset order), shared with the processes started after it."""

    def __init__(self, shard_names: list[str], counts: list[int] | None = None) -> None:
        self.shard_names = shard_names
        self._counts = multiprocessing.get_context("spawn").Array("q", counts or max(1, len(shard_names)))

    def add(self, position: int, count: int) -> bool:
        """Count `count` more records of shard `position` as skipped; True if they are its first (time to warn)."""
        with self._counts.get_lock():
            first = self._counts[position] == 0
            self._counts[position] += count
        return first

    def as_dict(self) -> dict[str, int]:
        """``{shard path: records skipped}`` for every shard with skipped records."""
        with self._counts.get_lock():
            counts = self._counts[:]
        return {name: count for name, count in zip(self.shard_names, counts) if count}

    def __getstate__(self) -> dict[str, Any]:
        if get_spawning_popen() is not None:  # a worker being started: it shares the counts
            return {"shard_names": self.shard_names, "shared": self._counts}
        with self._counts.get_lock():  # any other copy (pickle, deepcopy) counts on its own from here
            return {"shard_names": self.shard_names, "counts": self._counts[:]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "shared" in state:
            self.shard_names, self._counts = state["shard_names"], state["shared"]
        else:
            self.__init__(state["shard_names"], state["counts"])  # type: ignore[misc]
