"""Attacks on the newest remote paths (issue 12): the background whole-shard fetch of `RemoteShard` (process
exit, fork, close, a damaged data object reopened past max_open_shards), the node cache's notion of a dataset
that fits, a damaged data object under a stream, two remote writers of one URL, a huge planted journal object.
memory:// for speed; child processes where exit or fork is the point."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

import varstore

pytest.importorskip("fsspec")

CHILD_SECONDS = 60


def run_child(script: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """Run `script` in a fresh interpreter with the node cache at `cache`; a hang is a failure, not a stuck test."""
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script), str(cache)],
            capture_output=True, text=True, timeout=CHILD_SECONDS, cwd=os.getcwd(),
        )
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the child did not end within {CHILD_SECONDS} s; its output: {expired.stdout!r} {expired.stderr!r}")


# A dataset of 4 shards, and a download of any data object that stalls until `release` is set (a slow link).
STALLING_DATASET = """
    import sys, threading
    import varstore
    from varstore.remote.transport import FsspecTransport

    url = "memory://attacks/" + str(abs(hash(sys.argv[1])))
    with varstore.ShardedWriter(url, "bytes", max_shard_records=100, overwrite=True) as writer:
        for _ in range(400):
            writer.append(bytes(1000))
    release = threading.Event()
    real_download = FsspecTransport.download_file

    def stalling_download(transport, url, temporary, **options):
        if url.endswith(".data"):
            release.wait()
        return real_download(transport, url, temporary, **options)

    FsspecTransport.download_file = stalling_download
    reader = varstore.open(url, cache_dir=sys.argv[1])
"""


def test_process_exits_without_waiting_for_background_whole_shard_fetches(tmp_path: Path) -> None:
    """A few batches queue every shard's whole fetch; the process must end when its work does, not after the
    downloads (here they never finish)."""
    result = run_child(STALLING_DATASET + """
    assert len(reader.get_batch(list(range(0, 400, 5)))) == 80  # past a sixteenth of every shard
    print("read", flush=True)
    """, tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "read\n"


def test_forked_child_fetches_a_shard_whose_parent_fetch_was_in_flight(tmp_path: Path) -> None:
    """A DataLoader fork worker inherits shards whose whole fetch the parent's thread was running: the child
    has no such thread, so it must ask for the copy itself (it then waits for the parent's download) instead of
    reading by ranges for ever."""
    result = run_child(STALLING_DATASET + """
    import os, time
    reader.get_batch(list(range(0, 100, 5)))  # past a sixteenth of shard 0: its fetch starts, and stalls
    pid = os.fork()
    if pid == 0:
        FsspecTransport.download_file = real_download
        shard = reader.shard(0)
        shard.get_batch([1])
        deadline = time.monotonic() + 30
        while shard._data_map is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0 if shard._data_map is not None else 3)
    release.set()  # the parent's download goes on and publishes the copy the child waits for
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), flush=True)
    """, tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "child 0\n"


def _counting_downloads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Downloads into the node cache, by object name."""
    from varstore.remote.transport import FsspecTransport

    counts: Counter[str] = Counter()
    real_download = FsspecTransport.download_file

    def counting_download(transport: Any, url: str, temporary: str, **options: Any) -> None:
        counts[url.rsplit("/", 1)[-1]] += 1
        real_download(transport, url, temporary, **options)

    monkeypatch.setattr(FsspecTransport, "download_file", counting_download)
    return counts


def _epoch_until_every_shard_is_whole(reader: Any, seed: int) -> None:
    """Shuffled batches until every shard reads from its whole copy (the fetches run in the background)."""
    rng = np.random.default_rng(seed)
    deadline = time.monotonic() + CHILD_SECONDS / 2
    while not all(reader.shard(position)._data_map is not None for position in range(len(reader.manifest.shards))):
        assert time.monotonic() < deadline, "the shards were not fetched whole"
        order = rng.permutation(len(reader))[:40]
        assert reader.get_batch(order) == [bytes([index % 256]) * 500 for index in order.tolist()]


def test_a_cache_limit_of_the_data_size_alone_does_not_fit_the_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Index files, data edges and the manifest live in the node cache too: with a limit of just the data
    objects' size, shards fetched whole evicted each other and the indexes, and the readers of one node (workers)
    downloaded them again. The size of all of them fits, and then each object comes once for all readers."""
    url = "memory://attacks/fits"
    with varstore.ShardedWriter(url, "bytes", max_shard_records=100, overwrite=True) as writer:
        writer.extend(bytes([index % 256]) * 500 for index in range(800))
    shards = varstore.open(url, cache_dir=tmp_path / "peek").manifest.shards
    data_size = sum(entry.data_size for entry in shards)
    manifest_size = len(fsspec.filesystem("memory").cat_file("/attacks/fits/manifest.json"))
    edges_size = sum(2 * 4096 for entry in shards if entry.data_size > 2 * 4096)  # spec §1.2: two 4 KiB edges
    dataset_size = data_size + sum(entry.index_size for entry in shards) + edges_size + manifest_size
    assert not varstore.open(url, cache_dir=tmp_path / "data-size", cache_limit=data_size).fits_in_cache
    counts = _counting_downloads(monkeypatch)
    for worker in range(3):
        reader = varstore.open(url, cache_dir=tmp_path / "dataset-size", cache_limit=dataset_size)
        assert reader.fits_in_cache
        _epoch_until_every_shard_is_whole(reader, seed=worker)
    assert len(counts) == 2 * len(shards) and set(counts.values()) == {1}, counts


def _dataset_with_a_damaged_record(url: str) -> None:
    """400 records of 1000 bytes in 4 shards; one byte of record 105 (shard 1) flipped in place: the data object
    fails its whole CRC32C and that record its own."""
    import fsspec

    with varstore.ShardedWriter(url, "bytes", max_shard_records=100, overwrite=True) as writer:
        writer.extend(bytes([index % 256]) * 1000 for index in range(400))
    fs = fsspec.filesystem("memory")
    path = url.removeprefix("memory://") + "/shard-000001.data"
    data = bytearray(fs.cat(path))
    data[5 * 1000 + 3] ^= 0xFF
    fs.pipe(path, bytes(data))


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_stream_over_a_damaged_data_object_skips_the_damaged_record_only(tmp_path: Path, shuffle: bool) -> None:
    """A stream that fetches whole shards (the dataset fits the cache) met a data object failing its CRC32C for
    one damaged record and died with StorageError, on_damaged="skip" or not; it must read that shard by ranges
    instead, skip record 105 and yield the other 399 (or, raising, raise CorruptRecordError for it)."""
    torch_stream = pytest.importorskip("varstore.torch")
    url = f"memory://attacks/damaged-{shuffle}"
    _dataset_with_a_damaged_record(url)
    stream = torch_stream.RecordStream(
        url, batch_size=10, shuffle=shuffle, on_damaged="skip", cache_dir=tmp_path / "cache", collate_fn=list
    )
    assert sorted(bytes(record) for batch in stream for record in batch) == sorted(
        bytes([index % 256]) * 1000 for index in range(400) if index != 105
    )
    assert stream.skipped_records == {f"{url}/shard-000001": 1}
    raising = torch_stream.RecordStream(url, batch_size=10, shuffle=shuffle, cache_dir=tmp_path / "cache", collate_fn=list)
    with pytest.raises(varstore.errors.CorruptRecordError, match="record 5 checksum"):
        for _ in raising:
            pass


def test_a_writer_never_replaces_a_shard_another_writer_committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two writers of one URL whose staging directories differ (VARSTORE_CACHE_DIR), so the node's staging lock
    cannot see them: B (overwrite=True) numbers its shards after A's uploaded ones and commits; A's next shard
    has the name of B's committed one. A uploaded over it, leaving B's dataset damaged; A must stop instead."""
    url = "memory://attacks/two-writers"
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(tmp_path / "staging-a"))
    first = varstore.ShardedWriter(url, "bytes", max_shard_records=10)
    first.extend([b"a"] * 25)  # shard-000000 and shard-000001 uploaded, shard-000002 in progress
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(tmp_path / "staging-b"))
    with varstore.ShardedWriter(url, "bytes", max_shard_records=10, overwrite=True) as second:
        second.extend([b"b"] * 5)
    assert second.shard_names == ["shard-000002"]
    with pytest.raises(varstore.errors.ConcurrentWriterError, match="another writer uploaded a shard under this name"):
        first.close()
    reader = varstore.open(url, cache_dir=tmp_path / "cache")
    reader.verify()
    assert list(reader) == [b"b"] * 5


def test_a_huge_planted_journal_object_is_refused_without_being_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer opening a URL read its `.varstore-journal` (and manifest) object whole: a planted object of
    gigabytes went into memory before any size check. It reads one byte past the largest journal any writer
    writes, and refuses the object by its size. (The limits are scaled down here: a 32 MiB object, 2 MiB allowed.)"""
    import fsspec
    import tracemalloc

    import varstore.format.manifest

    monkeypatch.setattr(varstore.format.manifest, "MAX_MANIFEST_SIZE", 1 << 20)
    url = "memory://attacks/huge-journal"
    fsspec.filesystem("memory").pipe(url.removeprefix("memory://") + "/.varstore-journal", b"x" * (32 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(varstore.errors.FormatError, match="over the limit"):
            varstore.ShardedWriter(url, "bytes", overwrite=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_a_damaged_data_object_is_fetched_whole_once_per_process_not_at_every_reopen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past max_open_shards a dataset's shards are dropped and reopened; each reopen read a sixteenth by ranges
    and fetched the data object whole again, so a damaged one was downloaded, and logged, over and over (14 times
    in 3 epochs of 20 shards with 2 open). Once failed, it stays on ranges in this process; reads stay right."""
    import fsspec

    import varstore.shard.remote_shard as remote_shard
    import varstore.dataset.reader as sharded_reader

    monkeypatch.setattr(sharded_reader, "max_open_shards", lambda: 2)
    url = "memory://attacks/storm"
    with varstore.ShardedWriter(url, "bytes", max_shard_records=20, overwrite=True) as writer:
        writer.extend(bytes([index % 256]) * 3000 for index in range(400))
    path = url.removeprefix("memory://") + "/shard-000001.data"
    data = bytearray(fsspec.filesystem("memory").cat(path))
    data[10 * 3000 + 1] ^= 1  # record 30, away from the 4 KiB edges the open checks
    fsspec.filesystem("memory").pipe(path, bytes(data))
    damaged = f"{url}/shard-000001.data"
    submitted: list[str] = []
    real_submit = remote_shard._BACKGROUND.submit
    monkeypatch.setattr(remote_shard._BACKGROUND, "submit", lambda action: (submitted.append(action.__self__.data_path), real_submit(action)))
    reader = varstore.open(url, cache_dir=tmp_path / "cache")
    wanted = [index for index in range(400) if index != 30]

    def epoch(seed: int) -> None:
        order = np.random.default_rng(seed).permutation(wanted)
        for start in range(0, len(order), 16):
            batch = order[start : start + 16]
            assert reader.get_batch(batch) == [bytes([index % 256]) * 3000 for index in batch.tolist()]

    deadline = time.monotonic() + CHILD_SECONDS / 2
    seed = 0
    while not any(key[0] == damaged for key in remote_shard._WHOLE_FETCH_FAILED):
        assert time.monotonic() < deadline, "the damaged shard's whole fetch never failed"
        epoch(seed)
        seed += 1
    before = submitted.count(damaged)
    for more in range(3):
        epoch(seed + 1 + more)
    assert submitted.count(damaged) == before


def test_closing_a_shard_while_its_background_fetch_runs_leaves_no_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """close() releases the maps; a whole fetch still running then mapped the data object into the closed shard,
    which kept it (and the evicted file's disk space) for as long as the object lived."""
    import threading

    import varstore.shard.remote_shard as remote_shard

    url = "memory://attacks/close-while-fetching"
    with varstore.ShardedWriter(url, "bytes", max_shard_records=100, overwrite=True) as writer:
        writer.extend(bytes(1000) for _ in range(100))
    downloading, release, fetched = threading.Event(), threading.Event(), threading.Event()
    from varstore.remote.transport import FsspecTransport

    real_download, real_fetch = FsspecTransport.download_file, remote_shard.RemoteShard._fetch_in_background

    def held_download(transport: Any, url: str, temporary: str, **options: Any) -> None:
        if url.endswith(".data"):
            downloading.set()
            release.wait(CHILD_SECONDS)
        real_download(transport, url, temporary, **options)

    def signalled_fetch(self: Any) -> None:
        real_fetch(self)
        fetched.set()

    monkeypatch.setattr(FsspecTransport, "download_file", held_download)
    monkeypatch.setattr(remote_shard.RemoteShard, "_fetch_in_background", signalled_fetch)
    shard = varstore.open(url + "/shard-000000", cache_dir=tmp_path / "cache")
    shard.get_batch(list(range(0, 100, 5)))  # past a sixteenth: the whole fetch starts
    assert downloading.wait(CHILD_SECONDS)
    shard.close()
    release.set()
    assert fetched.wait(CHILD_SECONDS)
    assert shard._data_map is None
