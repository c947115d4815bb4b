"""`looks_cached` asks the page cache without reading: a read told not to wait (``preadv2`` with ``RWF_NOWAIT``)
still starts readahead on some kernels, so an evicted index asked about looked cached soon after (5 of 5 quiet
opens). Each state is set with the `mincore` helpers of test_index_prefetch and checked before it is asked about;
whether the probe started a read is told by the bytes this process had read from storage (``/proc/self/io``),
which a read counts when it is submitted, not when it lands."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from varstore.local.mapping import looks_cached

from .test_index_prefetch import cache_all, cache_all_but_the_page_at, evict, resident_pages

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(os, "posix_fadvise"), reason="needs Linux mincore and posix_fadvise"
)

SIZE = 2_400_000  # about 586 pages, the size of an index of 200,000 records with checksums


def bytes_read_from_storage() -> int | None:
    """What this process has had read from storage so far (``read_bytes``), or None where the kernel does not count it."""
    try:
        with open("/proc/self/io") as counters:
            return int(dict(line.split(": ") for line in counters.read().splitlines())["read_bytes"])
    except (OSError, KeyError):
        return None


def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "shard.index"
    path.write_bytes(os.urandom(SIZE))
    return path


def test_an_evicted_file_looks_cold_however_often_asked_and_cached_once_read(tmp_path: Path) -> None:
    path = a_file(tmp_path)
    evict(path)
    read_before = bytes_read_from_storage()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert looks_cached(fd, SIZE) is False
        assert looks_cached(fd, SIZE) is False
        if read_before is not None:
            assert bytes_read_from_storage() == read_before, "asking started a read from storage"
        assert not any(resident_pages(path)), "asking brought pages into the page cache"
        cache_all(path)
        assert looks_cached(fd, SIZE) is True
    finally:
        os.close(fd)


def test_a_file_cached_but_for_its_last_page_looks_cold_and_stays_so(tmp_path: Path) -> None:
    path = a_file(tmp_path)
    cache_all_but_the_page_at(path, SIZE - 1)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert looks_cached(fd, SIZE) is False
        assert looks_cached(fd, SIZE) is False
        assert not resident_pages(path)[-1]
    finally:
        os.close(fd)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_file_in_memory_looks_cached(memory_path: Path) -> None:
    """On tmpfs the pages are the file: its index needs no advice (the read that never waits was refused there)."""
    path = a_file(memory_path)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert looks_cached(fd, SIZE) is True
    finally:
        os.close(fd)
