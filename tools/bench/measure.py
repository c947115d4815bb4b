"""How the harness times and observes: bounded timing loops, memory (RSS, PSS), disk reads, page-cache eviction."""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from typing import Any, Callable, Iterable, Sequence

REPEATS = 5
CHUNK = 64


def run_bounded(operation: Callable[[Any], Any], items: Sequence[Any], budget: float) -> tuple[int, float]:
    """(items done, seconds): `operation` over `items` in order, stopping after `budget` seconds.

    The clock is read between chunks that double from 1 to `CHUNK` items, so slow operations
    stop near the budget and fast ones are not slowed by reading it.
    """
    done, chunk, start = 0, 1, time.perf_counter()
    while done < len(items):
        for item in items[done : done + chunk]:
            operation(item)
        done = min(done + chunk, len(items))
        chunk = min(2 * chunk, CHUNK)
        if time.perf_counter() - start > budget:
            break
    return done, time.perf_counter() - start


def seconds_per_item(operation: Callable[[Any], Any], items: Sequence[Any], budget: float, repeats: int = REPEATS) -> float:
    """The best, over `repeats` bounded runs, of the mean time of `operation(item)`."""
    best = float("inf")
    for _ in range(repeats):
        done, seconds = run_bounded(operation, items, budget)
        best = min(best, seconds / done)
    return best


def timed_iteration(iterable: Iterable[Any], budget: float) -> tuple[int, float]:
    """(items taken, seconds) from an iterator until it ends or `budget` seconds pass; the first item's wait is excluded."""
    iterator = iter(iterable)
    if next(iterator, None) is None:
        return 0, 0.0
    count, start = 0, time.perf_counter()
    for count, _ in enumerate(iterator, 1):
        if count % CHUNK == 0 and time.perf_counter() - start > budget:
            break
    return count, time.perf_counter() - start


def timed_flat_scan(batches: Iterable[Any], budget: float) -> tuple[int, float]:
    """(records, seconds) over flat batches until they end or `budget` seconds pass; each batch's bytes are copied
    out once, as the one-record-at-a-time loop copies each record."""
    records, start = 0, time.perf_counter()
    for batch in batches:
        batch.values.tobytes()
        records += len(batch.offsets) - 1
        if time.perf_counter() - start > budget:
            break
    return records, time.perf_counter() - start


def timed(action: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = action()
    return result, time.perf_counter() - start


def _status_field(pid: int | str, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def rss_bytes(pid: int | str = "self") -> int:
    return _status_field(pid, "VmRSS")


def anonymous_rss_bytes(pid: int | str = "self") -> int:
    """Resident private memory (heap, arrays), without the mapped file pages that RSS also counts."""
    return _status_field(pid, "RssAnon")


def pss_bytes(pid: int | str = "self") -> int:
    """Proportional set size: each shared page counted once in total over the processes sharing it."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise KeyError("Pss")


def child_pids(pid: int) -> list[int]:
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listed:
            children += [int(child) for child in listed.read().split()]
    return children


def pss_with_children(pid: int | None = None) -> tuple[int, int]:
    """(PSS of the process and its children summed, number of processes)."""
    pid = pid or os.getpid()
    pids = [pid, *child_pids(pid)]
    return sum(pss_bytes(each) for each in pids), len(pids)


def files_under(directory: str) -> list[str]:
    return [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names]


def evict(paths: Iterable[str]) -> None:
    """Drop the files' pages from the page cache. Pages still mapped by a process stay: close readers first."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _resident_pages(path: str) -> int:
    size = os.path.getsize(path)
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), f"mmap of {path} for mincore failed")
        try:
            pages = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
            if _LIBC.mincore(address, size, pages) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(byte & 1 for byte in pages.raw)
        finally:
            _LIBC.munmap(address, size)
    finally:
        os.close(fd)


def resident_bytes(paths: Iterable[str]) -> int:
    """Bytes of the files in the page cache (`mincore` on a map that faults nothing in)."""
    return sum(_resident_pages(path) for path in paths) * mmap.PAGESIZE


def disk_bytes(directory: str) -> int:
    """Bytes of the files under `directory` (their sizes, not allocated blocks)."""
    return sum(os.path.getsize(path) for path in files_under(directory))


def warm(paths: Iterable[str]) -> None:
    """Read files once so their pages are in the page cache."""
    for path in paths:
        with open(path, "rb", buffering=0) as stream:
            while stream.read(8 << 20):
                pass
