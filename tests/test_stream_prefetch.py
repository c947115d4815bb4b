"""A remote `RecordStream` keeps downloads in flight while it serves: the shards ahead of the batches are fetched
concurrently, bounded by `SHARDS_AHEAD` (GETs counted at the S3 server while the first shard's download is held);
a DataLoader worker never finalizes the filesystem its parent opened (s3fs would wait a second for the parent's
event loop); and a small batch crosses from a worker inline rather than in a shared-memory segment."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fsspec")

import varstore  # noqa: E402
from varstore.remote import filesystems  # noqa: E402
from varstore.remote.transport import FsspecTransport  # noqa: E402
from varstore.torch import RecordStream  # noqa: E402
from varstore.torch.collate import INLINE_HANDOFF_BYTES  # noqa: E402
from varstore.torch.prefetch import SHARD_FETCHES_AT_ONCE, SHARDS_AHEAD, Prefetcher  # noqa: E402

SHARD_RECORDS = 10
SHARDS = 6
JOIN_SECONDS = 60


def _write(url: str, storage_options: dict[str, Any]) -> None:
    options = {"max_shard_records": SHARD_RECORDS, "storage_options": storage_options}
    with varstore.ShardedWriter(url, "bytes", **options) as writer:
        writer.extend([bytes([index % 251]) * (100 + index) for index in range(SHARDS * SHARD_RECORDS)])


def test_prefetch_jobs_run_concurrently_up_to_the_threads_given() -> None:
    started = [threading.Event() for _ in range(3)]

    def job(number: int) -> int:
        started[number].set()
        if number == 0:  # held until the jobs after it run beside it
            assert started[1].wait(JOIN_SECONDS) and started[2].wait(JOIN_SECONDS)
        return number

    prefetcher = Prefetcher([lambda number=number: job(number) for number in range(3)], ahead=2, threads=3)
    try:
        prefetcher.wait(3)
        assert [prefetcher.take(number) for number in range(3)] == [0, 1, 2]
    finally:
        prefetcher.close()


def test_a_failed_prefetch_job_lets_the_jobs_before_it_finish_and_raises_for_itself() -> None:
    failure = OSError("planted failure of job 1")
    job_1_failed = threading.Event()

    def first() -> str:
        assert job_1_failed.wait(JOIN_SECONDS)  # still running when the job after it fails
        return "first"

    def fail() -> None:
        job_1_failed.set()
        raise failure

    prefetcher = Prefetcher([first, fail, lambda: "never run"], ahead=3, threads=2)
    try:
        prefetcher.wait(1)
        assert prefetcher.take(0) == "first"
        with pytest.raises(OSError) as raised:
            prefetcher.wait(2)
        assert raised.value is failure
    finally:
        prefetcher.close()


def test_an_in_order_remote_stream_downloads_the_shards_ahead_while_the_first_is_arriving(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/data"
    _write(url, s3_server.storage_options)
    stream = RecordStream(url, batch_size=SHARD_RECORDS, shuffle=False, collate_fn=list,
                          storage_options=s3_server.storage_options, cache_dir=str(tmp_path / "cache"))
    names = [entry.name for entry in stream._dataset.reader.manifest.shards]
    data_keys = [f"data/{name}.data" for name in names]
    others_done = threading.Semaphore(0)
    gets_while_held: list[str] = []
    download = FsspecTransport.download_file

    def held_download(self: FsspecTransport, source: str, local_path: str, *, size: int) -> None:
        if source.endswith(data_keys[0]):  # the first shard's data arrives only after the next ones did
            for _ in range(SHARD_FETCHES_AT_ONCE - 1):
                assert others_done.acquire(timeout=JOIN_SECONDS), "the shards ahead were not fetched meanwhile"
            gets_while_held.extend(request.key for request in s3_server.requests(bucket, method="GET"))
        download(self, source, local_path, size=size)
        if source.endswith(".data") and not source.endswith(data_keys[0]):
            others_done.release()

    monkeypatch.setattr(FsspecTransport, "download_file", held_download)
    batches = [[bytes(sample.numpy()) for sample in batch] for batch in stream]
    assert [record for batch in batches for record in batch] == [
        bytes([index % 251]) * (100 + index) for index in range(SHARDS * SHARD_RECORDS)
    ]
    # While shard 0 was held, shards 1 to SHARDS_AHEAD had arrived whole and none past them had been asked for.
    assert [key for key in data_keys if key in gets_while_held] == data_keys[1 : SHARDS_AHEAD + 1]
    for key in data_keys:  # each data object downloaded once, whole
        assert [request.range for request in s3_server.requests(bucket, method="GET", key=key)] == [None]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks a child")
def test_a_forked_child_keeps_the_filesystem_its_parent_opened(s3_server: Any) -> None:
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/object"
    fs, path = filesystems.open_filesystem(url, s3_server.storage_options)
    fs.pipe(path, b"data")
    assert fs.cat(path) == b"data"  # the client exists, and s3fs's finalizer with it
    parent_fs = weakref.ref(fs)
    del fs
    pid = os.fork()
    if pid == 0:  # the child: open its own, as a DataLoader worker does, and collect what it dropped
        code = 1
        try:
            child_fs, _ = filesystems.open_filesystem(url, s3_server.storage_options)
            gc.collect()
            code = 0 if child_fs is not parent_fs() and parent_fs() is not None else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child collected its parent's filesystem"


def _kept(batch: list) -> list:
    return batch


def _in_shared_mapping(address: int) -> bool:
    """Whether `address` of this process lies in a shared mapping (torch's shared-memory segments are)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, permissions = line.split()[:2]
            start, end = (int(bound, 16) for bound in span.split("-"))
            if start <= address < end:
                return permissions.endswith("s")
    raise AssertionError(f"address {address:#x} is not mapped")


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps")
@pytest.mark.parametrize("record_bytes", [INLINE_HANDOFF_BYTES // 8, 2 * INLINE_HANDOFF_BYTES // 4])
def test_a_small_batch_crosses_from_a_worker_inline_and_a_large_one_in_shared_memory(
    tmp_path: Path, record_bytes: int
) -> None:
    records = [np.full(record_bytes, index, np.uint8) for index in range(4)]
    with varstore.ShardedWriter(tmp_path / "data", "ndarray", dtype="uint8") as writer:
        writer.extend(records)
    stream = RecordStream(tmp_path / "data", batch_size=4, shuffle=False, collate_fn=_kept, keep_dtype=True)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=1, multiprocessing_context="fork",
                                         timeout=JOIN_SECONDS)
    (batch,) = list(loader)
    assert [sample.tolist() for sample in batch] == [record.tolist() for record in records]
    inline = 4 * record_bytes <= INLINE_HANDOFF_BYTES
    assert [_in_shared_mapping(sample.data_ptr()) for sample in batch] == [not inline] * 4
    batch[0][0] = 7  # writable, and its own piece
    assert batch[0][0] == 7 and batch[1][0] == 1
