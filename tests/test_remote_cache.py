"""The node cache (varstore.remote.cache): one download per object per node however many processes and
threads ask at once, nothing unverified or half-written under a final name (kills, corrupt bodies),
LRU eviction under a byte limit that never removes an object being downloaded nor breaks a mapped
reader, hashed file names whatever the key, and a private cache directory."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from varstore.checksum import crc32c
from varstore.errors import StorageError
from varstore.locking import LOCK_SUFFIX, WriterLock
from varstore.remote.cache import NodeCache, default_cache_dir, object_name
from varstore.storage import TEMP_MARK

FORK = multiprocessing.get_context("fork")
WAIT_SECONDS = 20


def payload(seed: int, size: int = 100) -> bytes:
    return bytes((seed * 31 + position * 7) % 251 for position in range(size))


def downloads(counter: Path) -> list[str]:
    """The keys downloaded so far, one line per call of a `downloader` (appended, so any process's calls count)."""
    return counter.read_text().split() if counter.exists() else []


def downloader(key: str, data: bytes, counter: Path, before_writing: Callable[[str], None] | None = None):
    """A `download` callable that records its call in `counter`, then writes `data` to the temporary path."""

    def download(temporary: str) -> None:
        with open(counter, "a") as log:
            log.write(key + "\n")
        if before_writing is not None:
            before_writing(temporary)
        Path(temporary).write_bytes(data)

    return download


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def blocked_on(lock_path: str) -> int:
    """How many flock requests are waiting for the file at `lock_path` (from /proc/locks)."""
    inode = str(os.stat(lock_path).st_ino)
    with open("/proc/locks") as table:
        return sum(1 for line in table if "->" in line.split() and line.split()[-3].rsplit(":", 1)[-1] == inode)


def name(key: str, data: bytes) -> str:
    return object_name(key, len(data), crc32c(data))


def letter_name(key: str, size: int = 100) -> str:
    """The name of the object a one-letter key stands for in the eviction tests."""
    return name(key, payload(ord(key), size))


def lock_path(cache_dir: Path, key: str, data: bytes) -> str:
    return str(cache_dir / name(key, data)) + LOCK_SUFFIX


def final_files(cache_dir: Path) -> dict[str, int]:
    """Name -> size of the objects under their final names (no lock or temporary files)."""
    return {p.name: p.stat().st_size for p in cache_dir.iterdir() if "." not in p.name}


def temporaries(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in cache_dir.iterdir() if TEMP_MARK in p.name)


@pytest.fixture
def spawn() -> Any:
    """Start a forked process running `target(*args)`; any still alive when the test ends is killed, so a
    failing test never leaves one behind (nor hangs the run's exit waiting for it)."""
    started: list[Any] = []

    def start(target: Callable[..., None], *args: Any) -> Any:
        process = FORK.Process(target=target, args=args, daemon=True)
        process.start()
        started.append(process)
        return process

    yield start
    for process in started:
        if process.is_alive():
            process.kill()
        process.join(timeout=WAIT_SECONDS)


def join_all(processes: list[Any]) -> None:
    for process in processes:
        process.join(timeout=WAIT_SECONDS)
        if process.is_alive():
            process.kill()
            process.join(timeout=WAIT_SECONDS)
            raise AssertionError("a fetching process did not finish")


# --- one download per node ---------------------------------------------------------------------------


def fetch_in_threads(cache_dir: Path, key: str, data: bytes, counter: Path, fetchers: int, start: Any, results: Any) -> None:
    """Two threads of this process fetch `key`; the one that downloads holds the body back until all the
    other `fetchers` are blocked on the object's lock, so every fetch overlaps the download. (A broken lock
    lets others download too: then fewer are left to wait, and the count of downloads fails the test.)"""

    def hold_until_all_wait(_: str) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while blocked_on(lock_path(cache_dir, key, data)) < fetchers - len(downloads(counter)) and time.monotonic() < deadline:
            time.sleep(0.005)

    def fetch_one() -> None:
        start.wait(timeout=WAIT_SECONDS)
        try:
            path = NodeCache(str(cache_dir)).fetch(key, len(data), crc32c(data),
                                                   downloader(key, data, counter, hold_until_all_wait))
            results.put(("ok", path, Path(path).read_bytes() == data))
        except Exception as error:
            results.put(("error", repr(error), False))

    threads = [threading.Thread(target=fetch_one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT_SECONDS)


def test_two_processes_of_two_threads_fetching_one_object_download_it_once(tmp_path: Path, spawn: Any) -> None:
    cache_dir, counter, key, data = tmp_path / "cache", tmp_path / "downloads", "s3://bucket/ds/shard.data", payload(1)
    NodeCache(str(cache_dir))
    start, results = FORK.Barrier(4), FORK.Queue()
    processes = [spawn(fetch_in_threads, cache_dir, key, data, counter, 4, start, results)
                 for _ in range(2)]
    outcomes = [results.get(timeout=WAIT_SECONDS) for _ in range(4)]
    join_all(processes)
    assert downloads(counter) == [key]
    assert {outcome for outcome in outcomes} == {("ok", str(cache_dir / name(key, data)), True)}
    assert temporaries(cache_dir) == []


# --- kills mid-download -------------------------------------------------------------------------------


def download_half_then_hang(cache_dir: Path, key: str, data: bytes, counter: Path, started: Any) -> None:
    """Write half the body, say so, then hang until killed."""

    def half_then_hang(temporary: str) -> None:
        with open(temporary, "wb") as partial:
            partial.write(data[: len(data) // 2])
        started.set()
        threading.Event().wait(timeout=WAIT_SECONDS * 3)

    NodeCache(str(cache_dir)).fetch(key, len(data), crc32c(data), downloader(key, data, counter, half_then_hang))


def test_a_download_killed_midway_leaves_no_final_file_and_the_next_fetch_downloads_again(tmp_path: Path, spawn: Any) -> None:
    cache_dir, counter, key, data = tmp_path / "cache", tmp_path / "downloads", "memory://ds/shard.index", payload(2)
    started = FORK.Event()
    victim = spawn(download_half_then_hang, cache_dir, key, data, counter, started)
    assert started.wait(timeout=WAIT_SECONDS)
    os.kill(victim.pid, signal.SIGKILL)
    join_all([victim])
    stale = temporaries(cache_dir)
    assert len(stale) == 1 and not (cache_dir / name(key, data)).exists()

    path = NodeCache(str(cache_dir)).fetch(key, len(data), crc32c(data), downloader(key, data, counter))
    assert Path(path).read_bytes() == data
    assert downloads(counter) == [key, key]
    assert temporaries(cache_dir) == []  # the dead download's temporary went with the new fetch


def fetch_and_report(cache_dir: Path, key: str, data: bytes, counter: Path, results: Any) -> None:
    try:
        path = NodeCache(str(cache_dir)).fetch(key, len(data), crc32c(data), downloader(key, data, counter))
        results.put(Path(path).read_bytes() == data)
    except Exception as error:
        results.put(repr(error))


def test_a_fetch_waiting_for_a_downloader_that_is_killed_downloads_it_itself(tmp_path: Path, spawn: Any) -> None:
    cache_dir, counter, key, data = tmp_path / "cache", tmp_path / "downloads", "s3://b/x.data", payload(3)
    started, results = FORK.Event(), FORK.Queue()
    victim = spawn(download_half_then_hang, cache_dir, key, data, counter, started)
    assert started.wait(timeout=WAIT_SECONDS)
    waiter = spawn(fetch_and_report, cache_dir, key, data, counter, results)
    wait_until(lambda: blocked_on(lock_path(cache_dir, key, data)) == 1, "the second fetch to wait for the lock")
    os.kill(victim.pid, signal.SIGKILL)
    assert results.get(timeout=WAIT_SECONDS) is True
    join_all([victim, waiter])
    assert downloads(counter) == [key, key]
    assert temporaries(cache_dir) == [] and os.listdir(cache_dir) == [name(key, data)]


# --- corrupt downloads ----------------------------------------------------------------------------------


def write_nothing(temporary: str) -> None:
    pass


def fail_midway(temporary: str) -> None:
    Path(temporary).write_bytes(b"part")
    raise StorageError("connection reset", path="s3://b/k")


@pytest.mark.parametrize(
    "download, expected_message",
    [
        (lambda temporary: Path(temporary).write_bytes(payload(4)[:-1]), "downloaded 99 bytes; expected 100 bytes with CRC32C"),
        (lambda temporary: Path(temporary).write_bytes(payload(5)), "expected CRC32C"),
        (write_nothing, "wrote no file"),
        (fail_midway, "connection reset"),
    ],
    ids=["short", "wrong-crc", "no-file", "download-raises"],
)
def test_a_download_failing_its_size_or_crc_caches_nothing_and_names_the_key(
    tmp_path: Path, download: Callable[[str], None], expected_message: str
) -> None:
    cache_dir, key, data = tmp_path / "cache", "s3://b/k", payload(4)
    cache = NodeCache(str(cache_dir))
    with pytest.raises(StorageError, match=expected_message) as raised:
        cache.fetch(key, len(data), crc32c(data), download)
    assert "s3://b/k" in str(raised.value)
    if "CRC32C" in expected_message:
        assert f"{crc32c(data):#010x}" in str(raised.value)
    assert os.listdir(cache_dir) == []  # no final file, no temporary, no lock file
    path = cache.fetch(key, len(data), crc32c(data), lambda temporary: Path(temporary).write_bytes(data))
    assert Path(path).read_bytes() == data


def test_a_cached_file_of_the_wrong_size_is_downloaded_again(tmp_path: Path) -> None:
    cache_dir, counter, key, data = tmp_path / "cache", tmp_path / "downloads", "s3://b/k", payload(6)
    cache = NodeCache(str(cache_dir))
    path = cache.fetch(key, len(data), crc32c(data), downloader(key, data, counter))
    Path(path).write_bytes(data[:10])  # truncated behind the cache's back
    assert cache.fetch(key, len(data), crc32c(data), downloader(key, data, counter)) == path
    assert Path(path).read_bytes() == data and downloads(counter) == [key, key]


def test_an_object_replaced_under_the_same_key_is_not_served_from_the_cache(tmp_path: Path) -> None:
    """A rewritten dataset keeps its URLs: a new CRC32C for a key (same size) is a new object."""
    cache_dir, counter, key, old, new = tmp_path / "cache", tmp_path / "downloads", "s3://b/k", payload(9), payload(10)
    cache = NodeCache(str(cache_dir))
    cache.fetch(key, len(old), crc32c(old), downloader(key, old, counter))
    path = cache.fetch(key, len(new), crc32c(new), downloader(key, new, counter))
    assert Path(path).read_bytes() == new and downloads(counter) == [key, key]


# --- eviction --------------------------------------------------------------------------------------------


def fetch_all(cache: NodeCache, keys: str, counter: Path, size: int = 100) -> None:
    for key in keys:
        data = payload(ord(key), size)
        cache.fetch(key, size, crc32c(data), downloader(key, data, counter))
        assert cache.limit_bytes is None or sum(final_files(Path(cache.directory)).values()) <= max(cache.limit_bytes, size)


def cached_keys(cache_dir: Path, keys: str) -> str:
    return "".join(key for key in keys if (cache_dir / letter_name(key, 400 if key.isupper() else 100)).exists())


def test_eviction_keeps_the_limit_and_removes_the_least_recently_fetched_first(tmp_path: Path) -> None:
    cache_dir, counter = tmp_path / "cache", tmp_path / "downloads"
    cache = NodeCache(str(cache_dir), limit_bytes=300)
    fetch_all(cache, "abc", counter)
    fetch_all(cache, "a", counter)  # a hit: a becomes the most recently used
    fetch_all(cache, "d", counter)
    assert cached_keys(cache_dir, "abcd") == "acd"
    fetch_all(cache, "e", counter)
    assert cached_keys(cache_dir, "abcde") == "ade"
    assert downloads(counter) == list("abcde")


def test_an_object_larger_than_the_limit_is_kept_alone_and_goes_first(tmp_path: Path) -> None:
    cache_dir, counter = tmp_path / "cache", tmp_path / "downloads"
    cache = NodeCache(str(cache_dir), limit_bytes=250)
    fetch_all(cache, "ab", counter)
    fetch_all(cache, "B", counter, size=400)
    assert cached_keys(cache_dir, "abB") == "B"
    fetch_all(cache, "c", counter)
    assert cached_keys(cache_dir, "abBc") == "c"


def test_a_mapped_object_stays_readable_after_it_is_evicted(tmp_path: Path) -> None:
    cache_dir, counter = tmp_path / "cache", tmp_path / "downloads"
    cache = NodeCache(str(cache_dir), limit_bytes=100)
    data = payload(ord("a"))
    path = cache.fetch("a", 100, crc32c(data), downloader("a", data, counter))
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        fetch_all(cache, "b", counter)
        assert not os.path.exists(path)
        assert mapped[:] == data


def hold_download(cache_dir: Path, key: str, data: bytes, counter: Path, limit: int, started: Any, finish: Any, results: Any) -> None:
    """Fetch `key`, holding the download (body half written) until `finish` is set."""

    def half_then_wait(temporary: str) -> None:
        with open(temporary, "wb") as partial:
            partial.write(data[: len(data) // 2])
        started.set()
        finish.wait(timeout=WAIT_SECONDS)

    try:
        path = NodeCache(str(cache_dir), limit_bytes=limit).fetch(
            key, len(data), crc32c(data), downloader(key, data, counter, half_then_wait))
        results.put(Path(path).read_bytes() == data)
    except Exception as error:
        results.put(repr(error))


def test_eviction_in_another_process_spares_a_download_in_progress(tmp_path: Path, spawn: Any) -> None:
    cache_dir, counter, data = tmp_path / "cache", tmp_path / "downloads", payload(ord("x"))
    cache = NodeCache(str(cache_dir), limit_bytes=1000)
    fetch_all(cache, "pq", counter)
    started, finish, results = FORK.Event(), FORK.Event(), FORK.Queue()
    downloading = spawn(hold_download, cache_dir, "x", data, counter, 1000, started, finish, results)
    try:
        assert started.wait(timeout=WAIT_SECONDS)
        in_progress = temporaries(cache_dir)
        evicted = cache.evict(needed_bytes=10_000)
        assert sorted(evicted) == sorted(str(cache_dir / letter_name(key)) for key in "pq")
        assert temporaries(cache_dir) == in_progress
    finally:
        finish.set()
    assert results.get(timeout=WAIT_SECONDS) is True
    join_all([downloading])
    assert cached_keys(cache_dir, "pqx") == "x"


def test_eviction_skips_an_object_whose_lock_is_held(tmp_path: Path) -> None:
    cache_dir, counter = tmp_path / "cache", tmp_path / "downloads"
    cache = NodeCache(str(cache_dir), limit_bytes=1000)
    fetch_all(cache, "pq", counter)
    with WriterLock(str(cache_dir / letter_name("p")) + LOCK_SUFFIX, "test"):  # flock is per open file: as good as another process
        assert cache.evict(needed_bytes=10_000) == [str(cache_dir / letter_name("q"))]
    assert cached_keys(cache_dir, "pq") == "p"


def test_downloads_finishing_together_do_not_overshoot_the_limit(tmp_path: Path, spawn: Any) -> None:
    """x's download starts in an empty cache; y and z fill it meanwhile. When x lands, room is made again."""
    cache_dir, counter, data = tmp_path / "cache", tmp_path / "downloads", payload(ord("x"))
    cache = NodeCache(str(cache_dir), limit_bytes=250)
    started, finish, results = FORK.Event(), FORK.Event(), FORK.Queue()
    downloading = spawn(hold_download, cache_dir, "x", data, counter, 250, started, finish, results)
    try:
        assert started.wait(timeout=WAIT_SECONDS)
        fetch_all(cache, "yz", counter)
    finally:
        finish.set()
    assert results.get(timeout=WAIT_SECONDS) is True
    join_all([downloading])
    assert sum(final_files(cache_dir).values()) <= 250
    assert cached_keys(cache_dir, "xyz") == "xz"


def test_eviction_removes_the_temporaries_of_dead_downloads(tmp_path: Path, spawn: Any) -> None:
    cache_dir, counter, data = tmp_path / "cache", tmp_path / "downloads", payload(7)
    started = FORK.Event()
    victim = spawn(download_half_then_hang, cache_dir, "dead", data, counter, started)
    assert started.wait(timeout=WAIT_SECONDS)
    os.kill(victim.pid, signal.SIGKILL)
    join_all([victim])
    stale = temporaries(cache_dir)
    assert len(stale) == 1
    Path(lock_path(cache_dir, "killed before its download began", data)).touch()
    assert NodeCache(str(cache_dir)).evict() == [str(cache_dir / stale[0])]
    assert os.listdir(cache_dir) == []  # the lock files of dead holders went too


# --- names and places -------------------------------------------------------------------------------------

HOSTILE_KEYS = ["../../etc/passwd", "/etc/passwd", "", ".", "..", "a/..", "x/.varstore-lock", "y.varstore-tmp-0011",
                "nul\x00byte", "s3://b/" + "z" * 5000, "ü/ß\udc80", "s3://b/shard-00000.data"]


def test_hostile_keys_get_distinct_hashed_names_inside_the_cache(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache = NodeCache(str(cache_dir))
    names = [object_name(key, 100, 0) for key in HOSTILE_KEYS]
    assert len(set(names)) == len(names)
    for file_name in names:
        assert "/" not in file_name and "." not in file_name and file_name[:32].isalnum() and len(file_name) <= 32 + 1 + 40
    assert names[-1].endswith("-shard-00000_data")
    data = payload(8)
    path = cache.fetch("../../etc/passwd", len(data), crc32c(data), lambda temporary: Path(temporary).write_bytes(data))
    assert os.path.dirname(path) == str(cache_dir)
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["cache", name("../../etc/passwd", data)])


def test_default_cache_dir_prefers_varstore_cache_dir_then_xdg_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(tmp_path / "chosen"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "chosen")
    monkeypatch.setenv("VARSTORE_CACHE_DIR", "")
    assert default_cache_dir() == str(tmp_path / "xdg" / "varstore")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # the XDG spec: a relative path is ignored
    assert default_cache_dir() == str(tmp_path / "home" / ".cache" / "varstore")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == str(tmp_path / "home" / ".cache" / "varstore")


def test_a_new_cache_directory_is_private_and_an_existing_one_keeps_its_mode(tmp_path: Path) -> None:
    created = tmp_path / "home" / ".cache" / "varstore"
    NodeCache(str(created))
    assert created.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o775)
    NodeCache(str(shared))
    assert shared.stat().st_mode & 0o777 == 0o775
