"""Opening a shard reads an index of at most `PREFETCH_LIMIT` bytes into the page cache in the background (issue 15).

Observed on real files: their pages are evicted (fsync, then POSIX_FADV_DONTNEED), the
shard is opened, and the index's page-cache residency is read with `mincore` on a map
that faults nothing in. Skipped where the page cache cannot be observed or emptied
(no mincore, or a file system such as tmpfs whose pages are the file).

No test here assumes what the page cache holds or how fast the kernel reads: each one
sets the state it starts from and checks it with `mincore` (`evict`, `cache_all`,
`cache_only_the_page_at`, `cache_all_but_the_page_at`), which the open's own probe
(`looks_cached`, a `mincore` too) finds as it was set; the advice the open gives is
recorded; and the kernel's reading of that advice is waited for with no time expected
of it, `RESIDENCY_SAFETY_NET_S` only failing clearly instead of hanging.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time
from pathlib import Path
from typing import Callable

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
PAGE = mmap.PAGESIZE
# How long to wait for the kernel to read what it was advised to before failing the test: a safety net against a
# kernel that ignores the advice, far above the milliseconds a read of 2.4 MB takes, however busy the machine.
RESIDENCY_SAFETY_NET_S = 120.0
# Attempts at setting a page-cache state before giving up: eviction can miss a page another CPU holds for a moment.
STATE_ATTEMPTS = 5
# The functions the tests' spies stand in for: the helpers that set page-cache states always call these.
_REAL_FADVISE = getattr(os, "posix_fadvise", None)
Advice = tuple[str, int, int, int]  # (path of the descriptor, offset, length, advice)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def resident_pages(path: Path) -> list[bool]:
    """Whether each page of `path` is in the page cache, from `mincore` on a map that is never touched."""
    libc, size = _libc(), path.stat().st_size
    if size == 0:
        return []
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address == ctypes.c_void_p(-1).value:
            pytest.skip(f"mmap for mincore failed: {os.strerror(ctypes.get_errno())}")
        try:
            pages = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
            if libc.mincore(address, size, pages) != 0:
                pytest.skip(f"mincore failed: {os.strerror(ctypes.get_errno())}")
            return [bool(byte & 1) for byte in pages.raw]
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def resident_fraction(path: Path) -> float:
    """The fraction of `path`'s pages in the page cache."""
    pages = resident_pages(path)
    return sum(pages) / len(pages) if pages else 1.0


def _drop(path: Path, offset: int = 0, length: int = 0) -> None:
    """POSIX_FADV_DONTNEED on [offset, offset + length) of `path` (to the end for a length of 0), after fsync."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        _REAL_FADVISE(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict(*paths: Path) -> None:
    """Drop the files' pages from the page cache, or skip where the file system keeps them."""
    for path in paths:
        for _ in range(STATE_ATTEMPTS):
            _drop(path)
            if resident_fraction(path) <= 0.01:
                break
        else:
            pytest.skip(f"{path} stays in the page cache after POSIX_FADV_DONTNEED (tmpfs or similar)")


def _describe(pages: list[bool]) -> str:
    """The resident pages as ranges, e.g. "[0-3, 585]" of 1172."""
    runs: list[str] = []
    start = None
    for number, resident in enumerate([*pages, False]):
        if resident and start is None:
            start = number
        elif not resident and start is not None:
            runs.append(str(start) if number - 1 == start else f"{start}-{number - 1}")
            start = None
    return f"[{', '.join(runs)}] of {len(pages)}"


def _read_without_read_ahead(path: Path, offset: int, length: int) -> None:
    """Read [offset, offset + length) of `path` through a descriptor advised POSIX_FADV_RANDOM: no read-ahead, so
    only the pages read come in, as pages of their own (not parts of a large folio that cannot be evicted alone)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _REAL_FADVISE(fd, 0, 0, os.POSIX_FADV_RANDOM)
        while length > 0 and (piece := os.pread(fd, min(length, 1 << 20), offset)):
            offset, length = offset + len(piece), length - len(piece)
    finally:
        os.close(fd)


def cache_only_the_page_at(path: Path, offset: int) -> None:
    """Leave the page holding byte `offset` of `path` in the page cache, and no other but what the file system's
    block size may force with it (checked with `mincore`: that page resident, the last one not unless it is that
    page, fewer than 5% of the pages in all).

    The file is evicted and that byte read without read-ahead; as a read may still bring in
    neighbours (the device's read-ahead can be 8 MiB: a whole small file), every other page is
    evicted again. Skips where the file system cannot evict (tmpfs)."""
    page, pages = offset // PAGE, []
    for _ in range(STATE_ATTEMPTS):
        evict(path)
        _read_without_read_ahead(path, offset, 1)
        if page:
            _drop(path, 0, page * PAGE)
        _drop(path, (page + 1) * PAGE, 0)
        pages = resident_pages(path)
        if pages[page] and (page == len(pages) - 1 or not pages[-1]) and sum(pages) < len(pages) / 20:
            return
    pytest.fail(f"could not leave only page {page} of {path} in the page cache: resident {_describe(pages)}")


def cache_all_but_the_page_at(path: Path, offset: int) -> None:
    """Leave every page of `path` in the page cache but the one holding byte `offset` (and what the file system's
    block size may force out with it), checked with `mincore`: that page not resident, more than 95% of them are.
    Skips where the file system cannot evict (tmpfs)."""
    page, pages = offset // PAGE, []
    for _ in range(STATE_ATTEMPTS):
        evict(path)
        _read_without_read_ahead(path, 0, path.stat().st_size)
        _drop(path, page * PAGE, PAGE)
        pages = resident_pages(path)
        if not pages[page] and sum(pages) > len(pages) * 0.95:
            return
    pytest.fail(f"could not leave every page of {path} but page {page} in the page cache: resident {_describe(pages)}")


def cache_all(path: Path) -> None:
    """Bring every page of `path` into the page cache, checked with `mincore`."""
    pages: list[bool] = []
    for _ in range(STATE_ATTEMPTS):
        path.read_bytes()
        pages = resident_pages(path)
        if all(pages):
            return
    pytest.fail(f"could not bring all of {path} into the page cache: resident {_describe(pages)}")


def _path_of(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def watch_advice(monkeypatch: pytest.MonkeyPatch, *, give: bool) -> list[Advice]:
    """Record every posix_fadvise call from now on as (path of the descriptor, offset, length, advice); give it
    too if `give`."""
    advised: list[Advice] = []

    def recording(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((_path_of(fd), offset, length, advice))
        if give:
            _REAL_FADVISE(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recording)
    return advised


def open_as_probed(
    open_shards: Callable[[], None], establish: Callable[[], object], monkeypatch: pytest.MonkeyPatch, *,
    give_advice: bool = False,
) -> list[Advice]:
    """`establish()` a page-cache state, then `open_shards()`; the advice given meanwhile (given to the
    kernel too if `give_advice`). An open that misjudges its probe's answer, or probes a page its own reads brought
    in (the bug of an index without checksums), fails the tests."""
    monkeypatch.setattr(os, "posix_fadvise", _REAL_FADVISE)
    establish()
    advised = watch_advice(monkeypatch, give=give_advice)
    try:
        open_shards()
    finally:
        monkeypatch.setattr(os, "posix_fadvise", _REAL_FADVISE)
    return advised


def advised_bytes(advised: list[Advice], path: Path) -> list[tuple[int, int]]:
    """The (offset, length) pieces of POSIX_FADV_WILLNEED advice given for `path`."""
    return [(offset, length) for name, offset, length, advice in advised
            if name == os.path.realpath(path) and advice == os.POSIX_FADV_WILLNEED]


def whole_file_in_chunks(size: int) -> list[tuple[int, int]]:
    """The advice `prefetch_index` gives for a `size`-byte index: PREFETCH_CHUNK pieces from 0 to the end."""
    return [(offset, min(PREFETCH_CHUNK, size - offset)) for offset in range(0, size, PREFETCH_CHUNK)]


def wait_until_resident(path: Path) -> None:
    """Wait until every page of `path` is in the page cache, which advice already given is bringing in.

    No time is expected of the kernel: the limit only turns a kernel that ignores the
    advice into a failure that says so (instead of a hung test)."""
    deadline = time.monotonic() + RESIDENCY_SAFETY_NET_S
    while not all(pages := resident_pages(path)):
        if time.monotonic() > deadline:
            pytest.fail(f"{path} was advised whole but is not in the page cache after {RESIDENCY_SAFETY_NET_S:g} s: "
                        f"resident {_describe(pages)}")
        time.sleep(0.01)


def write_shard(path: Path, records: int = RECORDS) -> tuple[Path, Path]:
    """A shard of `records` one-byte records (an index of 12 bytes a record, almost no data); (index, data) paths."""
    with varstore.Writer(path, codec="bytes") as writer:
        writer.extend_flat(np.zeros(records, np.uint8), np.ones(records, np.int64))
    data, index = fmt.shard_paths(os.fspath(path))
    return Path(index), Path(data)


def test_open_reads_an_index_under_the_limit_into_the_page_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index, data = write_shard(tmp_path / "shard")
    assert index.stat().st_size <= PREFETCH_LIMIT

    def open_shard() -> None:
        with varstore.open(tmp_path / "shard"):
            pass

    advised = open_as_probed(open_shard, lambda: evict(index, data), monkeypatch, give_advice=True)
    assert advised_bytes(advised, index) == whole_file_in_chunks(index.stat().st_size)
    wait_until_resident(index)  # no read touched the index: the open's advice brought it all
    with varstore.open(tmp_path / "shard") as reader:
        assert reader[RECORDS - 1] == b"\0"


def test_open_leaves_an_index_over_the_limit_to_fault_in_page_by_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    large_index, large_data = write_shard(tmp_path / "large")
    small_index, small_data = write_shard(tmp_path / "small", RECORDS // 4)
    monkeypatch.setattr(shard_index, "PREFETCH_LIMIT", small_index.stat().st_size)

    def open_both() -> None:
        with varstore.open(tmp_path / "large"), varstore.open(tmp_path / "small"):
            pass

    advised = open_as_probed(open_both, lambda: evict(large_index, large_data, small_index, small_data), monkeypatch,
                             give_advice=True)
    assert advised_bytes(advised, large_index) == []
    assert advised_bytes(advised, small_index) == whole_file_in_chunks(small_index.stat().st_size)
    # The small index, advised after the large one opened, arriving whole shows that advice would have landed.
    wait_until_resident(small_index)
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
    index, _ = write_shard(tmp_path / "shard")

    def open_and_read() -> None:
        with varstore.open(tmp_path / "shard") as reader:
            assert reader[RECORDS - 1] == b"\0"

    assert open_as_probed(open_and_read, lambda: cache_all(index), monkeypatch) == []  # every page cached


def test_open_advises_an_index_whose_last_page_was_evicted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index, _ = write_shard(tmp_path / "shard")

    def open_shard() -> None:
        with varstore.open(tmp_path / "shard"):
            pass

    advised = open_as_probed(open_shard, lambda: cache_all_but_the_page_at(index, index.stat().st_size - 1), monkeypatch)
    assert sum(length for _, _, length, _ in advised) == index.stat().st_size
