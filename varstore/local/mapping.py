"""Maps and page-cache advice for shard files: a read-only map advised for random access, the background read
of a cold index into the page cache, whether a file looks cached (``mincore``, which reads nothing), and ``pread``
that refuses a short read.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os

import numpy as np

from ..errors import FormatError

# Indexes up to this size are read into the page cache at open (`prefetch_index`): ~2.8 M records with checksums.
PREFETCH_LIMIT = 32 << 20


PREFETCH_CHUNK = 128 << 10  # at most the smallest usual readahead window (read_ahead_kb = 128)


def map_file(fd: int, size: int) -> mmap.mmap | bytes:
    """A read-only map of the file open as `fd`, advised for random access (empty bytes for an empty file)."""
    if size == 0:
        return b""
    mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_RANDOM)
    return mapped


def map_data_file(fd: int, size: int) -> mmap.mmap | bytes:
    """A read-only map of a shard's data file, advised by what is cached (`looks_cached`): a warm file keeps the
    kernel's default advice, whose fault-around maps the cached neighbours of a page on its first touch (with
    MADV_RANDOM every page is a minor fault of its own, which a fresh process pays on each first touch); a cold
    one is advised MADV_RANDOM, so a random read reads its own pages and no read-ahead around them."""
    mapped = map_file(fd, size)
    if isinstance(mapped, mmap.mmap) and hasattr(mapped, "madvise") and looks_cached(fd, size):
        mapped.madvise(mmap.MADV_NORMAL)
    return mapped


def prefetch_index(fd: int, size: int) -> bool:
    """Ask the kernel to read an index of at most `PREFETCH_LIMIT` bytes into the page cache, without waiting.

    A cold random read then faults only its data page, not an index page too. The advice
    is sent in `PREFETCH_CHUNK` pieces because the kernel reads at most one readahead
    window per call. The kernel walks every page asked for even when all are cached
    (~0.2 ms for 12 MB), so `ShardIndex.open` advises only an index that `looks_cached`
    says is cold, and opening a warm shard stays O(1). Larger indexes are left to fault in
    page by page, so a reader of a few records of a huge shard does not read its whole
    index. Returns whether the advice was given.
    """
    if size > PREFETCH_LIMIT or not hasattr(os, "posix_fadvise"):
        return False
    try:
        for offset in range(0, size, PREFETCH_CHUNK):
            os.posix_fadvise(fd, offset, min(PREFETCH_CHUNK, size - offset), os.POSIX_FADV_WILLNEED)
    except OSError:  # advice the file system refuses is no reason to refuse the shard
        return False
    return True


def advise_will_need(fd: int, starts: np.ndarray, ends: np.ndarray) -> int:
    """Ask the kernel to start reading the pages holding byte ranges [starts, ends) of the file open as `fd`, and
    nothing more (``POSIX_FADV_WILLNEED`` reads exactly the range asked, with no read-ahead around it), without
    waiting: one call per run of adjacent pages, each releasing the GIL. Returns the calls made (none where the
    platform has no ``posix_fadvise``); advice the file system refuses is ignored."""
    if not hasattr(os, "posix_fadvise"):
        return 0
    nonempty = ends > starts
    order = np.argsort(starts[nonempty], kind="stable")
    first = (starts[nonempty] // mmap.PAGESIZE)[order]
    last = ((ends[nonempty] - 1) // mmap.PAGESIZE)[order]
    if not len(first):
        return 0
    new_run = np.ones(len(first), bool)
    new_run[1:] = first[1:] > np.maximum.accumulate(last)[:-1] + 1
    run_last = np.maximum.reduceat(last, np.flatnonzero(new_run))
    calls = 0
    try:
        for page, stop in zip(first[new_run].tolist(), run_last.tolist()):
            os.posix_fadvise(fd, page * mmap.PAGESIZE, (stop - page + 1) * mmap.PAGESIZE, os.POSIX_FADV_WILLNEED)
            calls += 1
    except OSError:
        pass
    return calls


def looks_cached(fd: int, size: int) -> bool:
    """Whether the pages holding the middle and last bytes of the `size`-byte file are in the page cache, as
    `mincore` tells of a map of each page that is never touched: asking starts no read (a read told not to wait
    still starts one on some kernels, so a cold file asked twice looked cached). False where that cannot be told,
    so advice is given there: no mincore, a descriptor that cannot be mapped, or (Linux reports only the pages a
    process has mapped itself then) a file this process neither owns nor may write."""
    if size <= 0:
        return True  # nothing to read
    libc = _libc()
    return libc is not None and all(_page_resident(libc, fd, offset) for offset in (size // 2, size - 1))


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library with `mmap`, `mincore` and `munmap` typed for `_page_resident`, or None where it has none."""
    if os.name != "posix":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):  # no C library to load, or one without these functions
        return None
    return libc


_MAP_FAILED = ctypes.c_void_p(-1).value


def _page_resident(libc: ctypes.CDLL, fd: int, offset: int) -> bool:
    """Whether the page of the file open as `fd` holding byte `offset` is in the page cache (False if it cannot be
    mapped: a pipe, a directory, a closed descriptor)."""
    start = offset - offset % mmap.PAGESIZE
    address = libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
    if address == _MAP_FAILED:
        return False
    try:
        vector = ctypes.create_string_buffer(1)
        return libc.mincore(address, mmap.PAGESIZE, vector) == 0 and bool(vector.raw[0] & 1)
    finally:
        libc.munmap(address, mmap.PAGESIZE)


def pread_exactly(fd: int, size: int, offset: int, path: str) -> bytes:
    """`size` bytes at `offset`, read without a map; a short read means the file shrank after its size was checked."""
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise FormatError(f"file ended at {offset + len(data)} bytes while being opened: it changed meanwhile", path=path)
    return data
