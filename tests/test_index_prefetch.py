"""Opening a shard reads an index of at most `PREFETCH_LIMIT` bytes into the page cache in the background (issue 15).

Observed on real files: their pages are evicted (fsync, then POSIX_FADV_DONTNEED), the
shard is opened, and the index's page-cache residency is read with `mincore` on a map
that faults nothing in. Skipped where the page cache cannot be observed or emptied
(no mincore, or a file system such as tmpfs whose pages are the file).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import varstore
from varstore.format import header as fmt
from varstore.local import mapping as shard_index
from varstore.local.mapping import PREFETCH_CHUNK, PREFETCH_LIMIT, prefetch_index

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(os, "posix_fadvise"), reason="needs Linux mincore and posix_fadvise"
)

RECORDS = 200_000  # a 2.4 MB index (offsets and checksums): hundreds of pages the open's own preads do not touch
DEADLINE = 5.0


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def resident_fraction(path: Path) -> float:
    """The fraction of `path`'s pages in the page cache, from `mincore` on a map that is never touched."""
    libc, size = _libc(), path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address == ctypes.c_void_p(-1).value:
            pytest.skip(f"mmap for mincore failed: {os.strerror(ctypes.get_errno())}")
        try:
            pages = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
            if libc.mincore(address, size, pages) != 0:
                pytest.skip(f"mincore failed: {os.strerror(ctypes.get_errno())}")
            return sum(byte & 1 for byte in pages.raw) / len(pages.raw)
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def evict(*paths: Path) -> None:
    """Drop the files' pages from the page cache, or skip where the file system keeps them."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        if resident_fraction(path) > 0.01:
            pytest.skip(f"{path} stays in the page cache after POSIX_FADV_DONTNEED (tmpfs or similar)")


def wait_until_resident(path: Path) -> float:
    """Poll `path`'s residency until it is whole or `DEADLINE` seconds pass; the last fraction seen."""
    deadline = time.monotonic() + DEADLINE
    while (fraction := resident_fraction(path)) < 1.0 and time.monotonic() < deadline:
        pass
    return fraction


def write_shard(path: Path, records: int = RECORDS) -> tuple[Path, Path]:
    """A shard of `records` one-byte records (an index of 12 bytes a record, almost no data); (index, data) paths."""
    with varstore.Writer(path, codec="bytes") as writer:
        writer.extend_flat(np.zeros(records, np.uint8), np.ones(records, np.int64))
    data, index = fmt.shard_paths(os.fspath(path))
    return Path(index), Path(data)


def test_open_reads_an_index_under_the_limit_into_the_page_cache(tmp_path: Path) -> None:
    index, data = write_shard(tmp_path / "shard")
    assert index.stat().st_size <= PREFETCH_LIMIT
    evict(index, data)
    with varstore.open(tmp_path / "shard") as reader:
        assert wait_until_resident(index) == 1.0  # no read touched the index: the open's advice brought it all
        assert reader[RECORDS - 1] == b"\0"


def test_open_leaves_an_index_over_the_limit_to_fault_in_page_by_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    large_index, large_data = write_shard(tmp_path / "large")
    small_index, small_data = write_shard(tmp_path / "small", RECORDS // 4)
    monkeypatch.setattr(shard_index, "PREFETCH_LIMIT", small_index.stat().st_size)
    evict(large_index, large_data, small_index, small_data)
    with varstore.open(tmp_path / "large"), varstore.open(tmp_path / "small"):
        # The small index, advised after the large one opened, arriving whole shows that advice would have landed.
        assert wait_until_resident(small_index) == 1.0
        assert resident_fraction(large_index) < 0.25  # only what the open's checks read with pread


def test_prefetch_index_gives_no_advice_over_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    advised: list[tuple[int, int, int, int]] = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *arguments: advised.append(arguments))
    assert not prefetch_index(-1, PREFETCH_LIMIT + 1)
    assert advised == []
    assert prefetch_index(-1, 3 * PREFETCH_CHUNK + 1)
    assert [(offset, length) for _, offset, length, _ in advised] == [
        (0, PREFETCH_CHUNK),
        (PREFETCH_CHUNK, PREFETCH_CHUNK),
        (2 * PREFETCH_CHUNK, PREFETCH_CHUNK),
        (3 * PREFETCH_CHUNK, 1),
    ]


def test_open_of_a_cached_index_gives_no_advice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The advice walks every page even when all are cached: a warm open must not pay for it (open stays O(1))."""
    if not hasattr(os, "RWF_NOWAIT"):
        pytest.skip("no RWF_NOWAIT: the page cache cannot be asked without waiting")
    index, _ = write_shard(tmp_path / "shard")
    index.read_bytes()  # every page of the index cached
    advised: list[tuple[int, int, int, int]] = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *arguments: advised.append(arguments))
    with varstore.open(tmp_path / "shard") as reader:
        assert reader[RECORDS - 1] == b"\0"
    assert advised == []


def test_open_advises_an_index_whose_last_page_was_evicted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index, _ = write_shard(tmp_path / "shard")
    index.read_bytes()
    fd = os.open(index, os.O_RDONLY)
    try:
        os.fsync(fd)
        last_page = (index.stat().st_size - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        os.posix_fadvise(fd, last_page, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if resident_fraction(index) == 1.0:
        pytest.skip(f"{index} stays in the page cache after POSIX_FADV_DONTNEED (tmpfs or similar)")
    advised: list[tuple[int, int, int, int]] = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *arguments: advised.append(arguments))
    with varstore.open(tmp_path / "shard"):
        pass
    assert sum(length for _, _, length, _ in advised) == index.stat().st_size
