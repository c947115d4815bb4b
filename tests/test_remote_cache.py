"""The node cache (varstore.remote.cache): one download per object per node however many processes and
threads ask at once, nothing unverified or half-written under a final name (kills, corrupt bodies),
LRU eviction under a byte limit that never removes an object being downloaded nor breaks a mapped
reader, hashed file names whatever the key, and a private cache directory."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import random
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from varstore.format.checksum import crc32c
from varstore.errors import StorageError, VarstoreError
from varstore.local.locks import LOCK_SUFFIX, WriterLock
from varstore.remote.cache import NodeCache, default_cache_dir, object_name
from varstore.local.publish import TEMP_MARK

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


def test_eviction_neither_waits_for_nor_spares_a_published_object_whose_lock_is_held(tmp_path: Path) -> None:
    """A held lock on an object that has a final file is a fetch that waited and is re-checking it: sparing it
    would let the cache pass its limit, and the caller of a fetch opens the path at once anyway."""
    cache_dir, counter = tmp_path / "cache", tmp_path / "downloads"
    cache = NodeCache(str(cache_dir), limit_bytes=1000)
    fetch_all(cache, "pq", counter)
    with WriterLock(str(cache_dir / letter_name("p")) + LOCK_SUFFIX, "test"):  # flock is per open file: as good as another process
        assert sorted(cache.evict(needed_bytes=10_000)) == sorted(str(cache_dir / letter_name(key)) for key in "pq")
    assert cached_keys(cache_dir, "pq") == ""


def test_objects_hit_while_eviction_runs_are_still_evicted_when_room_is_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hits refresh mtimes without a lock; eviction used to spare any object touched after it listed them,
    and publish anyway (10,000-byte objects under a 25,000-byte limit reached 40,000). Here every object is
    hit right after each listing."""
    cache_dir, counter = tmp_path / "cache", tmp_path / "downloads"
    cache = NodeCache(str(cache_dir), limit_bytes=250)
    fetch_all(cache, "ab", counter)
    list_objects = NodeCache._objects

    def list_then_hit_all(self: NodeCache) -> Any:
        listed = list_objects(self)
        for entry in os.scandir(self.directory):
            if "." not in entry.name:
                os.utime(entry.path)
        return listed

    monkeypatch.setattr(NodeCache, "_objects", list_then_hit_all)
    fetch_all(cache, "cd", counter)  # checks the limit after each fetch
    assert len(cached_keys(cache_dir, "abcd")) == 2 and cached_keys(cache_dir, "d") == "d"


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


# --- issue 12 attack findings: full disks, junk entries, overshoot, clocks, arguments, other users ----------


def test_on_a_full_disk_eviction_frees_space_and_the_next_fetch_succeeds(tmp_path: Path) -> None:
    """Every cache lock used to write its holder's pid: on a full disk that failed, so nothing could be evicted."""
    from tests.helpers_tmpfs import fill, mounted_tmpfs

    with mounted_tmpfs(1 << 20) as root:
        cache_dir, counter = root / "cache", tmp_path / "downloads"
        fetch_all(NodeCache(str(cache_dir)), "abcd", counter, size=100_000)
        fill(root)
        cache = NodeCache(str(cache_dir), limit_bytes=200_000)
        evicted = cache.evict()
        assert sorted(evicted) == sorted(str(cache_dir / letter_name(key, 100_000)) for key in "ab")
        fill(root)
        fetch_all(cache, "e", counter, size=100_000)
        assert cached_keys_of_size(cache_dir, "abcde", 100_000) == "de"


def cached_keys_of_size(cache_dir: Path, keys: str, size: int) -> str:
    return "".join(key for key in keys if (cache_dir / letter_name(key, size)).exists())


def test_a_download_that_fills_the_disk_raises_storage_error_naming_the_key_and_caches_nothing(tmp_path: Path) -> None:
    from tests.helpers_tmpfs import mounted_tmpfs

    with mounted_tmpfs(1 << 20) as root:
        cache_dir, data = root / "cache", payload(3, 2_000_000)
        with pytest.raises(StorageError, match="s3://b/big") as raised:
            NodeCache(str(cache_dir)).fetch("s3://b/big", len(data), crc32c(data),
                                            downloader("s3://b/big", data, tmp_path / "downloads"))
        assert "No space left" in str(raised.value)
        assert os.listdir(cache_dir) == []


def plant(path: str, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        os.symlink("/etc/passwd", path)
    else:
        os.mkdir(path)
        Path(path, "inside").touch()


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_junk_at_object_lock_paths_does_not_stop_fetches_of_other_keys_and_is_removed(tmp_path: Path, kind: str) -> None:
    """Junk at the lock path of a cached object, of an object never fetched and of the next object fetched: each
    is removed with the cache-wide lock held (so no fetch can be creating a real lock file there meanwhile)
    and fetches go on."""
    cache_dir, counter = tmp_path / "cache", tmp_path / "downloads"
    cache = NodeCache(str(cache_dir), limit_bytes=200)
    fetch_all(cache, "ab", counter)
    junk = [str(cache_dir / object_name(key, 100, crc32c(payload(ord(key))))) + LOCK_SUFFIX for key in "ac"]
    junk.append(str(cache_dir / object_name("never", 5, 0)) + LOCK_SUFFIX)
    for path in junk:
        plant(path, kind)
    fetch_all(cache, "cd", counter)
    assert cached_keys(cache_dir, "abcd") == "cd"
    assert not any(os.path.lexists(path) for path in junk)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_junk_at_the_cache_lock_path_is_refused_as_a_broken_cache_naming_it(tmp_path: Path, kind: str) -> None:
    cache_dir, counter = tmp_path / "cache", tmp_path / "downloads"
    cache = NodeCache(str(cache_dir), limit_bytes=200)
    plant(str(cache_dir / LOCK_SUFFIX), kind)
    with pytest.raises(StorageError, match="not a lock file") as raised:
        fetch_all(cache, "a", counter)
    assert str(cache_dir / LOCK_SUFFIX) in str(raised.value)
    with pytest.raises(StorageError, match="not a lock file"):
        cache.evict()


def test_a_directory_left_at_the_temporary_name_is_removed_and_nothing_claims_it_later(tmp_path: Path) -> None:
    cache_dir, data = tmp_path / "cache", payload(5)
    cache = NodeCache(str(cache_dir), limit_bytes=1000)

    def make_a_directory(temporary: str) -> None:
        os.mkdir(temporary)
        Path(temporary, "part").write_bytes(data)

    with pytest.raises(StorageError, match="not a regular file"):
        cache.fetch("k", len(data), crc32c(data), make_a_directory)
    assert os.listdir(cache_dir) == []
    stale = str(cache_dir / name("k", data)) + TEMP_MARK + "0123456789ab"
    plant(stale, "directory")
    assert cache.evict() == [stale]
    assert os.listdir(cache_dir) == []


def hit_until(cache_dir: Path, keys: str, limit: int, stop: Any) -> None:
    cache, counter = NodeCache(str(cache_dir), limit_bytes=limit), cache_dir.parent / "downloads"
    while not stop.is_set():
        fetch_without_checking(cache, keys, counter)


def fetch_many(cache_dir: Path, keys: str, limit: int) -> None:
    """Fetch `keys` in a shuffled order, many times over: misses, hits and evictions all the way."""
    fetch_without_checking(NodeCache(str(cache_dir), limit_bytes=limit),
                           "".join(random.Random(os.getpid()).choices(keys, k=150)), cache_dir.parent / "downloads")


def fetch_without_checking(cache: NodeCache, keys: str, counter: Path) -> None:
    for key in keys:
        data = payload(ord(key), 10_000)
        cache.fetch(key, len(data), crc32c(data), downloader(key, data, counter))


def total_cached(cache_dir: Path) -> int:
    total = 0
    for entry in os.scandir(cache_dir):
        if "." not in entry.name:
            try:
                total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                pass
    return total


def test_hits_racing_new_fetches_never_push_the_cache_past_its_limit(tmp_path: Path, spawn: Any) -> None:
    """Hits refresh mtimes without a lock; eviction used to skip any object touched since it listed them and
    publish anyway: 10,000-byte objects under a 25,000-byte limit reached 40,000."""
    cache_dir, limit = tmp_path / "cache", 25_000
    NodeCache(str(cache_dir), limit_bytes=limit)
    stop = FORK.Event()
    hitters = [spawn(hit_until, cache_dir, keys, limit, stop) for keys in ("ab", "ab", "ba")]
    fetchers = [spawn(fetch_many, cache_dir, "cdefghijklmnopqrst", limit) for _ in range(3)]
    largest = 0
    deadline = time.monotonic() + WAIT_SECONDS
    try:
        while any(fetcher.is_alive() for fetcher in fetchers) and time.monotonic() < deadline:
            largest = max(largest, total_cached(cache_dir))
    finally:
        stop.set()
    join_all(fetchers + hitters)
    assert [process.exitcode for process in fetchers + hitters] == [0] * 6
    assert largest <= limit


def test_an_object_dated_in_the_future_is_evicted_in_its_turn(tmp_path: Path) -> None:
    """A clock stepped back (or `cp -p` from elsewhere) used to pin an object as forever the newest."""
    cache_dir, counter = tmp_path / "cache", tmp_path / "downloads"
    cache = NodeCache(str(cache_dir), limit_bytes=200)
    fetch_all(cache, "a", counter)
    tomorrow = time.time_ns() + 86_400 * 10**9
    os.utime(cache_dir / letter_name("a"), ns=(tomorrow, tomorrow))
    fetch_all(cache, "bcd", counter)
    assert cached_keys(cache_dir, "abcd") == "cd"


@pytest.mark.parametrize("size, crc", [(-1, 0), (1.0, 0), (True, 0), ("1", 0), (1, -1), (1, 2**32), (1, 0.5), (1, None)])
def test_a_bad_size_or_crc_is_refused_before_anything_is_created(tmp_path: Path, size: Any, crc: Any) -> None:
    cache_dir, counter = tmp_path / "cache", tmp_path / "downloads"
    cache = NodeCache(str(cache_dir), limit_bytes=1000)
    with pytest.raises(VarstoreError, match="size|CRC32C"):
        cache.fetch("k", size, crc, downloader("k", b"x", counter))
    assert os.listdir(cache_dir) == [] and downloads(counter) == []


def test_an_object_owned_by_another_user_is_refused_as_a_shared_cache(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    cache_dir, counter, data = tmp_path / "cache", tmp_path / "downloads", payload(1)
    cache = NodeCache(str(cache_dir))
    path = cache.fetch("k", len(data), crc32c(data), downloader("k", data, counter))
    os.chown(path, 54321, 54321)
    with pytest.raises(StorageError, match="another user") as raised:
        cache.fetch("k", len(data), crc32c(data), downloader("k", data, counter))
    assert path in str(raised.value) and "shared" in str(raised.value)


def fetch_as_user(cache_dir: Path, uid: int, key: str, limit: int, results: Any) -> None:
    os.setgid(uid)
    os.setuid(uid)
    data = payload(ord(key))
    try:
        NodeCache(str(cache_dir), limit_bytes=limit).fetch(key, len(data), crc32c(data), lambda temporary: Path(temporary).write_bytes(data))
        results.put("fetched")
    except Exception as error:
        results.put(repr(error))


def test_evicting_another_users_object_from_a_shared_sticky_directory_names_the_shared_cache(tmp_path: Path, spawn: Any) -> None:
    if os.geteuid() != 0:
        pytest.skip("fetching as another user needs root")
    with tempfile.TemporaryDirectory(dir="/tmp") as shared:  # tmp_path's parents are root's alone
        cache_dir = Path(shared)
        cache_dir.chmod(0o1777)
        fetch_all(NodeCache(str(cache_dir)), "a", tmp_path / "downloads")  # root's; the other user must evict it for b
        results = FORK.Queue()
        join_all([spawn(fetch_as_user, cache_dir, 54321, "b", 100, results)])
        outcome = results.get(timeout=WAIT_SECONDS)
    assert "another user" in outcome and "shared" in outcome
