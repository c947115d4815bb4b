"""A map-style epoch over a remote dataset the node cache can hold fetches each shard whole at its first read (one
GET per data object of at most 8 MiB, as MosaicML Streaming does), instead of one ranged GET per batch and shard;
later epochs and other processes of the node read the local copies. A dataset larger than the cache's limit, and a
plain `ShardedReader`, keep reading by ranges: a few reads must not download whole shards."""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import varstore
from varstore.remote.filesystems import open_filesystem

pytest.importorskip("s3fs")
torch = pytest.importorskip("torch")

from varstore.torch import RecordDataset, TokenWindowDataset

JOIN_SECONDS = 120
SHARD_RECORDS = 10


@pytest.fixture(autouse=True)
def node_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "node-cache"
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(cache))
    return cache


def uploaded(s3_server: Any, tmp_path: Path, records: list[bytes]) -> tuple[str, str, dict[str, int]]:
    """The dataset's URL, its bucket and the size of each of its data objects (by key)."""
    local_dir = tmp_path / "local"
    with varstore.ShardedWriter(local_dir, "bytes", max_shard_records=SHARD_RECORDS) as writer:
        writer.extend(records)
    bucket = s3_server.new_bucket()
    fs, path = open_filesystem(f"s3://{bucket}/ds", s3_server.storage_options)
    sizes = {}
    for name in sorted(os.listdir(local_dir)):
        fs.put_file(str(local_dir / name), f"{path}/{name}")
        if name.endswith(".data"):
            sizes[f"ds/{name}"] = (local_dir / name).stat().st_size
    return f"s3://{bucket}/ds", bucket, sizes


def shuffled_epoch(dataset: RecordDataset, workers: int) -> list[bytes]:
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=8, shuffle=True, num_workers=workers, collate_fn=list,
        multiprocessing_context="fork" if workers else None, timeout=JOIN_SECONDS if workers else 0,
    )
    return [bytes(sample.numpy()) for batch in loader for sample in batch]


def data_gets(s3_server: Any, bucket: str, since: int) -> list[Any]:
    return [r for r in s3_server.requests(bucket)[since:] if r.method == "GET" and r.key.endswith(".data")]


def whole_range(request: Any, size: int) -> bool:
    return request.range in (None, f"bytes=0-{size - 1}")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shuffled_map_style_epoch_fetches_each_shard_whole_once_and_the_next_epoch_asks_for_nothing(
    s3_server: Any, tmp_path: Path, workers: int
) -> None:
    records = [bytes([n % 251]) * (9_000 + 7 * n) for n in range(60)]
    url, bucket, sizes = uploaded(s3_server, tmp_path, records)
    dataset = RecordDataset(url, storage_options=s3_server.storage_options)
    before = len(s3_server.requests(bucket))
    assert sorted(shuffled_epoch(dataset, workers)) == sorted(records)
    gets = data_gets(s3_server, bucket, before)
    assert collections.Counter(r.key for r in gets) == collections.Counter(sizes.keys())  # one GET per data object
    assert all(whole_range(r, sizes[r.key]) for r in gets)
    again = len(s3_server.requests(bucket))
    assert sorted(shuffled_epoch(dataset, workers)) == sorted(records)
    assert [r for r in s3_server.requests(bucket)[again:] if not r.key.endswith("manifest.json")] == []


def test_token_windows_over_a_dataset_that_fits_fetch_each_shard_whole_once(s3_server: Any, tmp_path: Path) -> None:
    documents = [np.arange(n * 1_000, n * 1_000 + 9_000 + n, dtype=np.uint32) for n in range(30)]
    local_dir = tmp_path / "local"
    with varstore.ShardedWriter(local_dir, "ndarray", dtype="uint32", max_shard_records=SHARD_RECORDS) as writer:
        writer.extend(documents)
    bucket = s3_server.new_bucket()
    fs, path = open_filesystem(f"s3://{bucket}/ds", s3_server.storage_options)
    for name in sorted(os.listdir(local_dir)):
        fs.put_file(str(local_dir / name), f"{path}/{name}")
    sizes = {f"ds/{name}": (local_dir / name).stat().st_size for name in os.listdir(local_dir) if name.endswith(".data")}
    windows = TokenWindowDataset(f"s3://{bucket}/ds", 4_000, storage_options=s3_server.storage_options, output="numpy")
    local = TokenWindowDataset(str(local_dir), 4_000, output="numpy")
    before = len(s3_server.requests(bucket))
    order = np.random.default_rng(5).permutation(len(windows))
    for start in range(0, len(order), 8):
        batch = order[start:start + 8].tolist()
        assert all(np.array_equal(a, b) for a, b in zip(windows.__getitems__(batch), local.__getitems__(batch)))
    gets = data_gets(s3_server, bucket, before)
    assert collections.Counter(r.key for r in gets) == collections.Counter(sizes.keys())
    assert all(whole_range(r, sizes[r.key]) for r in gets)


def test_a_dataset_larger_than_the_cache_limit_is_read_by_ranges(s3_server: Any, tmp_path: Path) -> None:
    records = [bytes([n]) * (70_000 + n) for n in range(30)]  # records farther apart than a plan joins
    url, bucket, sizes = uploaded(s3_server, tmp_path, records)
    dataset = RecordDataset(url, storage_options=s3_server.storage_options, cache_limit=sum(sizes.values()) // 2)
    before = len(s3_server.requests(bucket))
    assert sorted(shuffled_epoch(dataset, 0)) == sorted(records)
    gets = data_gets(s3_server, bucket, before)
    assert gets and not any(whole_range(r, sizes[r.key]) for r in gets)


def test_a_plain_reader_reads_one_record_by_its_range_not_its_whole_shard(s3_server: Any, tmp_path: Path) -> None:
    records = [bytes([n]) * (70_000 + n) for n in range(30)]  # records farther apart than a plan joins
    url, bucket, sizes = uploaded(s3_server, tmp_path, records)
    with varstore.open(url, storage_options=s3_server.storage_options) as reader:
        before = len(s3_server.requests(bucket))
        assert reader[25] == records[25]
    gets = data_gets(s3_server, bucket, before)
    assert gets and not any(whole_range(r, sizes[r.key]) for r in gets)


def test_the_samplers_look_ahead_downloads_the_coming_shards_before_their_batches_read_them(
    s3_server: Any, tmp_path: Path
) -> None:
    from varstore.torch import ExactlyOnceSampler

    records = [bytes([n % 251]) * (9_000 + 7 * n) for n in range(60)]
    url, bucket, sizes = uploaded(s3_server, tmp_path, records)
    dataset = RecordDataset(url, storage_options=s3_server.storage_options)
    before = len(s3_server.requests(bucket))
    order = list(ExactlyOnceSampler(dataset, shuffle=True, seed=3))  # iterated to its end: every look-ahead done
    gets = data_gets(s3_server, bucket, before)
    assert collections.Counter(r.key for r in gets) == collections.Counter(sizes.keys())
    assert all(whole_range(r, sizes[r.key]) for r in gets)
    read = len(s3_server.requests(bucket))
    assert [bytes(sample.numpy()) for sample in dataset.__getitems__(order)] == [records[i] for i in order]
    assert s3_server.requests(bucket)[read:] == []
