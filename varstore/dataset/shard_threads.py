"""Work on a dataset's shards, several at once on threads: verification reads with ``pread`` and checksums in C
with the GIL released, so shards on other threads go on meanwhile."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

from ..errors import UsageError

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


def check_workers(workers: int) -> int:
    """`workers`, or a UsageError unless it is an int of at least 1."""
    if type(workers) is not int or workers < 1:
        raise UsageError(f"workers must be a positive integer, not {workers!r}")
    return workers


def serialised(progress: Callable[[int], object] | None) -> Callable[[int], object] | None:
    """`progress`, called by one thread at a time (its callers count into plain attributes)."""
    if progress is None:
        return None
    lock = threading.Lock()

    def advance(amount: int) -> None:
        with lock:
            progress(amount)

    return advance


def in_order(function: Callable[[_Item], _Result], items: Iterable[_Item], workers: int) -> list[_Result]:
    """`function` of each item, on `workers` threads, the results in the items' order; the first item's (in that
    order) exception is raised, once the items already started are done, and no further item starts."""
    if workers == 1:
        return [function(item) for item in items]
    pool = ThreadPoolExecutor(workers, thread_name_prefix="varstore-shards")
    try:
        return list(pool.map(function, items))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
