"""The torch datasets over object storage (issue 12): the same samples as a local copy, DataLoader workers
(fork and spawn, several processes) sharing one node cache, and RecordStream's whole-shard prefetch:
downloads counted at the S3 server, eviction under a cache limit, errors and thread life."""

from __future__ import annotations

import gc
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fsspec")

import varstore  # noqa: E402
from varstore.errors import CorruptRecordError, MissingFileError
from varstore.local.locks import directory_lock_path, lock_waiting
from varstore.remote.filesystems import open_filesystem
from varstore.torch import RecordDataset, RecordStream, TokenWindowDataset
from varstore.torch.prefetch import SHARD_FETCHES_AT_ONCE, SHARDS_AHEAD, Prefetcher

# A node cache too small for any dataset here: reads stay ranged (no shard fetched whole) and a shuffled
# RecordStream reads windows by ranges, the modes of a dataset larger than the cache.
RANGES_ONLY = 1
SHARD_RECORDS = 40
SHARDS = 6
PREFETCH_THREAD = "varstore-prefetch"
JOIN_SECONDS = 120


def _record(index: int) -> bytes:
    return (f"record {index};" * (index % 7 + 1)).encode()


def _record_index(record: bytes) -> int:
    return int(record.split(b";")[0].removeprefix(b"record "))


def _tokens(index: int) -> np.ndarray:
    return (np.arange(index % 11 + 1, dtype=np.int32) + 100 * index).astype(np.int32)


def _write_bytes(location: str, **options: Any) -> None:
    with varstore.ShardedWriter(location, "bytes", max_shard_records=SHARD_RECORDS, **options) as writer:
        for index in range(SHARDS * SHARD_RECORDS):
            writer.append(_record(index))


def _write_tokens(location: str, **options: Any) -> None:
    with varstore.ShardedWriter(location, "ndarray", dtype="int32", max_shard_records=SHARD_RECORDS, **options) as writer:
        for index in range(SHARDS * SHARD_RECORDS):
            writer.append(_tokens(index))


def _same(left: Any, right: Any) -> bool:
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(_same(left[key], right[key]) for key in left)
    if isinstance(left, (list, tuple)):
        return len(left) == len(right) and all(_same(a, b) for a, b in zip(left, right))
    if isinstance(left, torch.Tensor):
        return left.dtype == right.dtype and torch.equal(left, right)
    if isinstance(left, np.ndarray):
        return left.dtype == right.dtype and np.array_equal(left, right)
    return left == right


def _prefetch_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == PREFETCH_THREAD]


def _data_keys(bucket: str, dataset: str) -> list[str]:
    return [f"{dataset}/{entry.name}.data" for entry in varstore.open(f"s3://{bucket}/{dataset}").manifest.shards]


def _whole_gets(s3_server: Any, bucket: str, key: str) -> int:
    return sum(request.range is None for request in s3_server.requests(bucket, method="GET", key=key))


def _range_length(header: str) -> int:
    first, last = header.removeprefix("bytes=").split("-")
    return int(last) - int(first) + 1


# -- the same samples as a local copy ----------------------------------------------------------------


def test_every_dataset_class_over_s3_equals_the_local_copy(s3_server: Any, tmp_path: Any) -> None:
    bucket = s3_server.new_bucket()
    remote = {"storage_options": s3_server.storage_options, "cache_dir": str(tmp_path / "cache")}
    _write_tokens(str(tmp_path / "local"))
    _write_tokens(f"s3://{bucket}/tokens", storage_options=s3_server.storage_options)
    shuffled = np.random.default_rng(0).permutation(SHARDS * SHARD_RECORDS)

    for options in ({}, {"output": "numpy"}, {"flat_batches": True}, {"on_damaged": "skip"}):
        local = RecordDataset(str(tmp_path / "local"), **options)
        over_s3 = RecordDataset(f"s3://{bucket}/tokens", **options, **remote)
        assert over_s3.path == f"s3://{bucket}/tokens"
        assert len(over_s3) == len(local)
        for batch in np.array_split(shuffled, 7):
            assert _same(over_s3.__getitems__(batch), local.__getitems__(batch)), options
        assert _same(over_s3[17], local[17])

    for options in ({}, {"document_starts": True}, {"output": "numpy"}, {"keep_dtype": True}):
        local_windows = TokenWindowDataset(str(tmp_path / "local"), 9, **options)
        windows = TokenWindowDataset(f"s3://{bucket}/tokens/manifest.json", 9, **options, **remote)
        assert len(windows) == len(local_windows) > 0
        every = np.random.default_rng(1).permutation(len(windows))
        for batch in np.array_split(every, 5):
            assert _same(windows.__getitems__(batch), local_windows.__getitems__(batch)), options

    blocks = {"shuffle": True, "block_size": 8, "shuffle_window": 64}
    for options in (blocks, {**blocks, "flat_batches": True}, {**blocks, "flat_batches": True, "output": "numpy"}, {"shuffle": False}):
        local_stream = RecordStream(str(tmp_path / "local"), batch_size=16, collate_fn=list, seed=3, **options)
        stream = RecordStream(f"s3://{bucket}/tokens", batch_size=16, collate_fn=list, seed=3, **options, **remote)
        assert _same(list(stream), list(local_stream)), options


def test_a_single_remote_shard_reads_like_the_local_shard(tmp_path: Any) -> None:
    with varstore.Writer(str(tmp_path / "shard"), "ndarray", dtype="int32") as writer:
        for index in range(50):
            writer.append(_tokens(index))
    fs, _ = open_filesystem("memory://torch-single/shard")
    for suffix in (".data", ".index"):
        fs.put_file(str(tmp_path / "shard") + suffix, "/torch-single/shard" + suffix)
    cache = {"cache_dir": str(tmp_path / "cache")}
    assert _same(
        RecordDataset("memory://torch-single/shard", **cache).__getitems__([3, 1, 40]),
        RecordDataset(str(tmp_path / "shard")).__getitems__([3, 1, 40]),
    )
    assert _same(
        TokenWindowDataset("memory://torch-single/shard", 5, **cache).__getitems__([0, 7, 20]),
        TokenWindowDataset(str(tmp_path / "shard"), 5).__getitems__([0, 7, 20]),
    )
    stream = RecordStream("memory://torch-single/shard", batch_size=8, block_size=4, shuffle_window=16, collate_fn=list, **cache)
    local_stream = RecordStream(str(tmp_path / "shard"), batch_size=8, block_size=4, shuffle_window=16, collate_fn=list)
    assert _same(list(stream), list(local_stream))


def test_datasets_pickle_a_url_as_given_with_its_options(tmp_path: Any) -> None:
    _write_bytes("memory://torch-pickle/data")
    cache_dir = tmp_path / "cache"
    os.chdir(tmp_path)  # a relative cache_dir is made absolute, a URL never is
    dataset = RecordDataset("memory://torch-pickle/data", cache_dir="cache", cache_limit=1 << 20)
    state = dataset._source.__getstate__()
    assert state["path"] == "memory://torch-pickle/data"
    assert state["cache_dir"] == str(cache_dir) and state["cache_limit"] == 1 << 20
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.reader is not dataset.reader
    assert _same(copy.__getitems__([5, 200]), dataset.__getitems__([5, 200]))
    assert copy.reader._source.location.cache.directory == str(cache_dir)


def test_a_shuffled_batch_costs_one_ranged_get_per_shard_it_touches(s3_server: Any, tmp_path: Any) -> None:
    bucket = s3_server.new_bucket()
    _write_bytes(f"s3://{bucket}/data", storage_options=s3_server.storage_options)
    dataset = RecordDataset(f"s3://{bucket}/data", storage_options=s3_server.storage_options, cache_dir=str(tmp_path / "cache"), cache_limit=RANGES_ONLY)
    keys = _data_keys(bucket, "data")
    indices = np.array([5, 201, 17, 90, 33, 215, 2])  # shards 0, 5, 0, 2, 0, 5, 0: every shard's data is < 64 KiB
    dataset.__getitems__(indices)  # opens the shards it touches (their index, and the data object's edges)
    before = {key: len(s3_server.requests(bucket, method="GET", key=key)) for key in keys}
    samples = dataset.__getitems__(indices)
    assert [bytes(sample.numpy()) for sample in samples] == [_record(index) for index in indices.tolist()]
    added = {key: s3_server.requests(bucket, method="GET", key=key)[before[key]:] for key in keys}
    assert {key: len(requests) for key, requests in added.items()} == {
        key: int(position in (0, 2, 5)) for position, key in enumerate(keys)
    }
    assert all(request.range is not None for requests in added.values() for request in requests)


# -- DataLoader workers sharing one node cache -----------------------------------------------------------

_EPOCH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from torch.utils.data import DataLoader
    from varstore.torch import RecordDataset, RecordStream

    def as_hex(batch):
        return [bytes(sample.numpy()).hex() for sample in batch]

    if __name__ == "__main__":
        url, options, cache_dir, out = sys.argv[1:]
        remote = {"storage_options": json.loads(options), "cache_dir": cache_dir}
        dataset = RecordDataset(url, **remote)
        stream = RecordStream(url, batch_size=16, block_size=8, shuffle_window=64, seed=5, collate_fn=as_hex, **remote)
        mapped = []
        for batch in DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2, collate_fn=as_hex):
            mapped += batch
        streamed = []
        for batch in DataLoader(stream, batch_size=None, num_workers=2):
            streamed += batch
        in_order = RecordStream(url, batch_size=16, shuffle=False, collate_fn=as_hex, **remote)
        sequential = [record for batch in in_order for record in batch]  # the two processes share the cache
        with open(out, "w") as result:
            json.dump({"mapped": mapped, "streamed": streamed, "sequential": sequential}, result)
    """
)


def test_two_processes_with_two_workers_each_download_each_object_once(s3_server: Any, tmp_path: Any) -> None:
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/data"
    _write_bytes(url, storage_options=s3_server.storage_options)
    script = tmp_path / "epoch.py"
    script.write_text(_EPOCH_SCRIPT)
    cache_dir = str(tmp_path / "shared-cache")
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), url, json.dumps(s3_server.storage_options), cache_dir,
             str(tmp_path / f"out-{number}.json")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for number in range(2)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=JOIN_SECONDS)
        assert process.returncode == 0, stderr.decode()

    local = str(tmp_path / "local")
    _write_bytes(local)
    expected_stream = [bytes(sample.numpy()).hex() for batch in RecordStream(
        local, batch_size=16, block_size=8, shuffle_window=64, seed=5, collate_fn=list) for sample in batch]
    every_record = sorted(_record(index).hex() for index in range(SHARDS * SHARD_RECORDS))
    for number in range(2):
        result = json.loads((tmp_path / f"out-{number}.json").read_text())
        assert sorted(result["mapped"]) == every_record
        assert result["streamed"] == expected_stream
        assert result["sequential"] == [_record(index).hex() for index in range(SHARDS * SHARD_RECORDS)]

    # Map-style reads and the shuffled stream read ranges; the unshuffled stream downloads each data object.
    manifest = varstore.open(url).manifest
    for entry in manifest.shards:
        assert _whole_gets(s3_server, bucket, f"data/{entry.name}.index") == 1, entry.name
        assert _whole_gets(s3_server, bucket, f"data/{entry.name}.data") == 1, entry.name


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_stream_workers_reopen_the_url_under_fork_and_spawn(s3_server: Any, tmp_path: Any, start_method: str) -> None:
    bucket = s3_server.new_bucket()
    _write_bytes(f"s3://{bucket}/data", storage_options=s3_server.storage_options)
    _write_bytes(str(tmp_path / "local"))
    settings = {"batch_size": 16, "block_size": 8, "shuffle_window": 64, "seed": 9, "collate_fn": list}
    stream = RecordStream(
        f"s3://{bucket}/data", storage_options=s3_server.storage_options, cache_dir=str(tmp_path / "cache"), **settings
    )
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2, multiprocessing_context=start_method, timeout=JOIN_SECONDS)
    assert _same(list(loader), list(RecordStream(str(tmp_path / "local"), **settings)))
    assert not _prefetch_threads()  # the main process never streamed: the workers' threads died with them


# -- prefetch, release and eviction ----------------------------------------------------------------------


def _cached_bytes(cache_dir: str) -> int:
    """Bytes of the objects under their final names (a final name has no '.': locks and temporaries do),
    counted under the cache-wide lock, which eviction and publishing hold: a consistent snapshot."""
    with lock_waiting(directory_lock_path(cache_dir), "the test's count", record_holder=False):
        return sum(entry.stat().st_size for entry in os.scandir(cache_dir) if entry.is_file() and "." not in entry.name)


def _mapped_cache_files(cache_dir: str) -> set[str]:
    """The files of `cache_dir` this process maps (evicted ones included: the map keeps them)."""
    with open("/proc/self/maps") as maps:
        return {line.split(None, 5)[5].strip().removesuffix(" (deleted)") for line in maps if cache_dir + os.sep in line}


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts maps in /proc/self/maps")
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_streaming_epoch_under_a_cache_limit_smaller_than_the_data(s3_server: Any, tmp_path: Any, shuffle: bool) -> None:
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/data"
    _write_bytes(url, storage_options=s3_server.storage_options)
    shard_data = max(entry.data_size for entry in varstore.open(url).manifest.shards)
    cache_dir = str(tmp_path / "cache")
    limit = int(2.5 * shard_data)
    settings = {"batch_size": 8, "shuffle": shuffle, "block_size": 40, "shuffle_window": 80, "seed": 2, "collate_fn": list}
    stream = RecordStream(url, storage_options=s3_server.storage_options, cache_dir=cache_dir, cache_limit=limit, **settings)
    records = []
    most_mapped_data = 0
    ever_cached: set[str] = set()
    for batch in stream:
        records += [bytes(sample.numpy()) for sample in batch]
        assert _cached_bytes(cache_dir) <= limit
        most_mapped_data = max(most_mapped_data, sum(path.endswith("_data") for path in _mapped_cache_files(cache_dir)))
        ever_cached |= {name for name in os.listdir(cache_dir) if "." not in name}
    _write_bytes(str(tmp_path / "local"))
    assert records == [bytes(sample.numpy()) for batch in RecordStream(str(tmp_path / "local"), **settings) for sample in batch]
    assert _cached_bytes(cache_dir) <= limit
    if shuffle:
        # A shuffled stream reads each window's blocks by ranged requests into memory: the cache holds index files,
        # data edges and the manifest only.
        assert ever_cached and all(name.endswith(("_index", "_data_edges", "-manifest_json")) for name in ever_cached), ever_cached
        assert most_mapped_data == 0
        assert not any(_whole_gets(s3_server, bucket, key) for key in _data_keys(bucket, "data"))
        return
    # Consumed shards are released: a worker holds the shards its current batch reads and those fetched ahead.
    assert most_mapped_data <= SHARDS_AHEAD + 2 < SHARDS
    for key in _data_keys(bucket, "data"):
        requests = s3_server.requests(bucket, method="GET", key=key)
        assert _whole_gets(s3_server, bucket, key) == 1, key
        assert len(requests) <= 1 + 2, key  # besides the download, only the open's reads of its first and last 4 KiB


def _block_reads(records: Any, shuffle_window: int, block_size: int) -> dict[tuple[int, int, int], list[int]]:
    """The ranged reads a shuffled stream makes for `records`, (position in the rank's order, record) pairs of
    records of a few bytes: one per (window, block, shard) the records touch, of the records it reads."""
    reads: dict[tuple[int, int, int], list[int]] = {}
    for position, record in records:
        reads.setdefault((position // shuffle_window, record // block_size, record // SHARD_RECORDS), []).append(record)
    return reads


def _span_bytes(records: list[int]) -> int:
    """Bytes from the first to the last of `records` (of one shard) in its data file."""
    return sum(len(_record(index)) for index in range(min(records), max(records) + 1))


@pytest.mark.parametrize(
    "settings, resume_after",
    [
        ({"block_size": 8, "shuffle_window": 64}, 0),  # blocks within shards and windows: one read per block
        ({"block_size": 12, "shuffle_window": 50, "rank": 1, "world_size": 2}, 2),  # blocks straddle both
    ],
)
def test_a_shuffled_remote_epoch_reads_each_block_with_one_ranged_get_and_each_byte_once(
    s3_server: Any, tmp_path: Any, settings: dict[str, int], resume_after: int
) -> None:
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/data"
    _write_bytes(url, storage_options=s3_server.storage_options)
    _write_bytes(str(tmp_path / "local"))
    settings = {**settings, "batch_size": 10, "seed": 4, "collate_fn": list}
    local = RecordStream(str(tmp_path / "local"), **settings)
    stream = RecordStream(url, storage_options=s3_server.storage_options, cache_dir=str(tmp_path / "cache"), cache_limit=RANGES_ONLY, **settings)
    if resume_after:
        state = local.state_dict(samples_consumed=resume_after * local.batch_size)
        local.load_state_dict(state)
        stream.load_state_dict(state)
    expected = [bytes(sample.numpy()) for batch in local for sample in batch]
    reader = stream._dataset.reader
    for position in range(SHARDS):
        reader.shard(position)  # open every shard first (index, data edges): what follows is the records' reads
    keys = _data_keys(bucket, "data")
    before = {key: len(s3_server.requests(bucket, method="GET", key=key)) for key in keys}

    assert [bytes(sample.numpy()) for batch in stream for sample in batch] == expected
    reads = [request for key in keys for request in s3_server.requests(bucket, method="GET", key=key)[before[key]:]]
    assert all(request.range is not None for request in reads)  # no data object is downloaded whole
    records = [_record_index(record) for record in expected]
    positions = enumerate(records, start=resume_after * local.batch_size)
    expected_reads = _block_reads(positions, settings["shuffle_window"], settings["block_size"])
    assert len(reads) == len(expected_reads)
    assert sorted(_range_length(request.range) for request in reads) == sorted(map(_span_bytes, expected_reads.values()))
    if not resume_after:  # every record of every block, once
        assert len(reads) == SHARDS * SHARD_RECORDS // 8
        assert sum(_range_length(request.range) for request in reads) == sum(len(record) for record in expected)

    # The rank's part unshuffled: each data object it reads whole, once (one GET; opening reads its edges).
    in_order = RecordStream(
        url, storage_options=s3_server.storage_options, cache_dir=str(tmp_path / "cache-in-order"), **{**settings, "shuffle": False}
    )
    first = in_order.rank * in_order.record_count // in_order.world_size
    read = {record // SHARD_RECORDS for record in range(first, first + in_order.rank_record_count)}
    assert sum(len(batch) for batch in in_order) == in_order.rank_record_count
    whole = {key: _whole_gets(s3_server, bucket, key) for key in keys}
    assert whole == {key: int(position in read) for position, key in enumerate(keys)}


def test_each_worker_of_a_shuffled_remote_stream_reads_the_span_of_its_records_in_each_block(
    s3_server: Any, tmp_path: Any
) -> None:
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/data"
    _write_bytes(url, storage_options=s3_server.storage_options)
    _write_bytes(str(tmp_path / "local"))
    settings = {"batch_size": 8, "block_size": 20, "shuffle_window": 80, "seed": 8, "collate_fn": list}
    expected = [[bytes(sample.numpy()) for sample in batch] for batch in RecordStream(str(tmp_path / "local"), **settings)]
    stream = RecordStream(url, storage_options=s3_server.storage_options, cache_dir=str(tmp_path / "cache"), cache_limit=RANGES_ONLY, **settings)
    reader = stream._dataset.reader
    for position in range(SHARDS):
        reader.shard(position)
    keys = _data_keys(bucket, "data")
    total_read = 0
    for worker in range(2):
        before = {key: len(s3_server.requests(bucket, method="GET", key=key)) for key in keys}
        with patch("varstore.torch.stream.get_worker_info", return_value=SimpleNamespace(id=worker, num_workers=2)):
            batches = [[bytes(sample.numpy()) for sample in batch] for batch in stream]
        assert batches == expected[worker::2]
        reads = [request for key in keys for request in s3_server.requests(bucket, method="GET", key=key)[before[key]:]]
        mine = [
            (number * 8 + slot, _record_index(record))
            for number, batch in enumerate(expected) if number % 2 == worker
            for slot, record in enumerate(batch)
        ]
        expected_reads = _block_reads(mine, settings["shuffle_window"], settings["block_size"])
        assert len(reads) == len(expected_reads)
        assert sorted(_range_length(request.range) for request in reads) == sorted(map(_span_bytes, expected_reads.values()))
        total_read += sum(_range_length(request.range) for request in reads)
    # Both workers' batches take records from every block of a window: each reads about the whole block.
    data_bytes = sum(len(_record(index)) for index in range(SHARDS * SHARD_RECORDS))
    assert 1.5 * data_bytes < total_read <= 2 * data_bytes


def test_the_prefetch_thread_runs_at_most_ahead_jobs_beyond_those_asked_for() -> None:
    started = [threading.Event() for _ in range(4)]

    def job(number: int) -> int:
        started[number].set()
        return number

    prefetcher = Prefetcher([lambda number=number: job(number) for number in range(4)], ahead=1)
    try:
        prefetcher.wait(1)
        assert prefetcher.take(0) == 0
        assert started[1].wait(JOIN_SECONDS)  # the next job runs while job 0's result is in use ...
        assert not started[2].wait(0.3)  # ... and no further one until it is asked for
        prefetcher.wait(2)
        assert prefetcher.take(1) == 1
        assert started[2].wait(JOIN_SECONDS)
        assert not started[3].wait(0.3)
    finally:
        prefetcher.close()
    assert not _prefetch_threads()


def test_a_failed_window_read_is_raised_by_the_first_batch_of_that_window(tmp_path: Any) -> None:
    url = "memory://torch-window-error/data"
    _write_bytes(url)
    _write_bytes(str(tmp_path / "local"))
    settings = {"batch_size": 8, "block_size": 8, "shuffle_window": 32, "seed": 6, "collate_fn": list}
    expected = [[bytes(sample.numpy()) for sample in batch] for batch in RecordStream(str(tmp_path / "local"), **settings)]
    records = [_record_index(record) for batch in expected for record in batch]
    damaged_window = min(position // 32 for position, record in enumerate(records) if record // SHARD_RECORDS == 3)
    stream = RecordStream(url, cache_dir=str(tmp_path / "cache"), cache_limit=RANGES_ONLY, **settings)
    shard_name = stream._dataset.reader.manifest.shards[3].name
    open_filesystem(url)[0].rm(f"/torch-window-error/data/{shard_name}.data")
    batches = iter(stream)
    for number in range(damaged_window * 32 // 8):
        assert [bytes(sample.numpy()) for sample in next(batches)] == expected[number]
    with pytest.raises(MissingFileError) as raised:
        next(batches)
    assert raised.value.path.endswith(f"{shard_name}.data")
    assert any(frame.name == "_run" for frame in __import__("traceback").extract_tb(raised.value.__traceback__))
    assert not _prefetch_threads()


def test_a_damaged_record_in_a_shuffled_remote_stream_is_raised_or_skipped_alone(tmp_path: Any) -> None:
    url = "memory://torch-window-damaged/data"
    with varstore.ShardedWriter(url, "bytes", max_shard_records=SHARD_RECORDS) as writer:
        for index in range(SHARDS * SHARD_RECORDS):
            writer.append(index.to_bytes(4, "little") * 250)  # 1000 bytes: the middle of a shard is past its edges
    reader = varstore.open(url)
    damaged = 2 * SHARD_RECORDS + 20
    fs, _ = open_filesystem(url)
    data_path = f"/torch-window-damaged/data/{reader.manifest.shards[2].name}.data"
    data = bytearray(fs.cat_file(data_path))
    data[int(reader.shard(2).offsets[20]) + 7] ^= 1
    fs.pipe_file(data_path, bytes(data))
    settings = {"batch_size": 16, "block_size": 8, "shuffle_window": 64, "seed": 1, "collate_fn": list}
    settings.update(cache_dir=str(tmp_path / "cache"), cache_limit=RANGES_ONLY)

    with pytest.raises(CorruptRecordError) as raised:
        list(RecordStream(url, **settings))
    assert raised.value.records == [20]
    stream = RecordStream(url, on_damaged="skip", **settings)
    records = [int.from_bytes(bytes(sample.numpy()[:4]), "little") for batch in stream for sample in batch]
    assert sorted(records) == [index for index in range(SHARDS * SHARD_RECORDS) if index != damaged]
    assert stream.skipped_records == {f"{url}/{reader.manifest.shards[2].name}": 1}
    assert not _prefetch_threads()


def test_a_failed_prefetch_is_raised_by_the_batch_that_needs_the_shard(tmp_path: Any) -> None:
    url = "memory://torch-prefetch-error/data"
    _write_bytes(url)
    stream = RecordStream(url, batch_size=SHARD_RECORDS // 2, shuffle=False, collate_fn=list, cache_dir=str(tmp_path / "cache"))
    fs, _ = open_filesystem(url)
    shard_names = [entry.name for entry in stream._dataset.reader.manifest.shards]
    fs.rm(f"/torch-prefetch-error/data/{shard_names[3]}.data")
    batches = iter(stream)
    for _ in range(3 * 2):  # shards 0, 1 and 2 read
        next(batches)
    with pytest.raises(MissingFileError) as raised:
        next(batches)
    assert raised.value.path.endswith(f"{shard_names[3]}.data")
    assert any(frame.name == "_run" for frame in __import__("traceback").extract_tb(raised.value.__traceback__))
    assert not _prefetch_threads()


@pytest.mark.parametrize("shuffle", [False, True])
def test_closing_or_dropping_the_iterator_stops_the_prefetch_thread(tmp_path: Any, shuffle: bool) -> None:
    url = f"memory://torch-prefetch-stop-{shuffle}/data"
    _write_bytes(url)
    settings = {"block_size": 8, "shuffle_window": 32}
    stream = RecordStream(url, batch_size=8, shuffle=shuffle, collate_fn=list, cache_dir=str(tmp_path / "cache"), **settings)
    batches = iter(stream)
    next(batches)
    assert len(_prefetch_threads()) == SHARD_FETCHES_AT_ONCE  # the whole-shard fetches in flight at once
    batches.close()
    assert not _prefetch_threads()

    batches = iter(stream)
    next(batches)
    assert len(_prefetch_threads()) == SHARD_FETCHES_AT_ONCE  # the whole-shard fetches in flight at once
    del batches
    gc.collect()
    assert not _prefetch_threads()

    for _ in stream:
        pass
    assert not _prefetch_threads()


def test_skipping_damaged_shards_works_over_a_url_map_style_and_streaming(tmp_path: Any) -> None:
    url = "memory://torch-skip/data"
    _write_bytes(url)
    fs, _ = open_filesystem(url)
    damaged = varstore.open(url).manifest.shards[2].name
    fs.rm(f"/torch-skip/data/{damaged}.index")
    readable = [_record(index) for index in range(SHARDS * SHARD_RECORDS) if index // SHARD_RECORDS != 2]
    cache = {"cache_dir": str(tmp_path / "cache")}

    dataset = RecordDataset(url, on_damaged="skip", **cache)
    assert [bytes(sample.numpy()) for sample in dataset.__getitems__(range(len(dataset)))] == readable
    assert dataset.skipped_records == {f"{url}/{damaged}": SHARD_RECORDS}

    stream = RecordStream(url, batch_size=16, block_size=8, shuffle_window=64, on_damaged="skip", collate_fn=list, **cache)
    assert sorted(bytes(sample.numpy()) for batch in stream for sample in batch) == sorted(readable)
    assert not _prefetch_threads()
