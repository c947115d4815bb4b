"""Maps and page-cache advice for shard files: a read-only map advised for random access, the background read
of a cold index into the page cache, whether a file looks cached (reads that never wait), and ``pread`` that
refuses a short read.
"""

from __future__ import annotations

import mmap
import os

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


def looks_cached(fd: int, size: int) -> bool:
    """Whether the middle and last bytes of the `size`-byte file are in the page cache: two reads that never wait
    for the disk. False where the file system cannot tell (tmpfs answers EOPNOTSUPP), so advice is given there."""
    if size <= 0:
        return True  # nothing to read
    if not hasattr(os, "RWF_NOWAIT"):
        return False
    probe = bytearray(1)
    try:
        return all(os.preadv(fd, [probe], position, os.RWF_NOWAIT) == 1 for position in (size // 2, size - 1))
    except OSError:  # BlockingIOError: a page is not cached; EOPNOTSUPP and the like: the file system cannot tell
        return False


def pread_exactly(fd: int, size: int, offset: int, path: str) -> bytes:
    """`size` bytes at `offset`, read without a map; a short read means the file shrank after its size was checked."""
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise FormatError(f"file ended at {offset + len(data)} bytes while being opened: it changed meanwhile", path=path)
    return data
