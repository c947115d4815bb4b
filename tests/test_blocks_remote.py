"""A shard of compressed blocks (spec/FORMAT.md §1.7) read from moto's S3 on loopback: ranged reads fetch the stored
frames of the records' blocks, and only those, counted at the server; the block decoded last is not fetched again;
a dataset's batch over many shards and a whole cached copy read the same records."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import varstore
from varstore.format.checksum import crc32c
from varstore.remote.filesystems import open_filesystem

pytest.importorskip("s3fs")

RANGES_ONLY = 1  # a node cache too small for any shard: records are read by ranges, never from a whole copy


@pytest.fixture(autouse=True)
def node_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "node-cache"
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(cache))
    return cache


def _records(count: int) -> list[bytes]:
    """Incompressible records of ~1 KB: blocks of ~8 KiB stored, so blocks far apart are far apart in the object."""
    generator = np.random.default_rng(3)
    return [generator.bytes(900 + index % 200) for index in range(count)]


def _upload(s3_server: Any, local: Path, url: str) -> None:
    fs, path = open_filesystem(url, s3_server.storage_options)
    for name in sorted(os.listdir(local)):
        fs.put_file(str(local / name), f"{path}/{name}")
    fs.invalidate_cache()


def _block_table(prefix: Path) -> tuple[list[int], list[int]]:
    """(block_offsets, block_records) of a 3.x shard, read by §1.7's layout."""
    index = Path(f"{prefix}.index").read_bytes()
    count, metadata_size = struct.unpack_from("<Q", index, 16)[0], struct.unpack_from("<Q", index, 32)[0]
    offsets_start = -(-(64 + metadata_size) // 8) * 8  # no dictionary
    blocks_start = offsets_start + 8 * (count + 1)
    (blocks,) = struct.unpack_from("<Q", index, blocks_start)
    offsets = list(struct.unpack_from(f"<{blocks + 1}Q", index, blocks_start + 8))
    return offsets, list(struct.unpack_from(f"<{blocks + 1}Q", index, blocks_start + 8 + 8 * (blocks + 1)))


def _data_gets(s3_server: Any, bucket: str) -> list[tuple[int, int]]:
    """The [start, end) of every ranged GET of a data object so far."""
    spans = []
    for request in s3_server.requests(bucket, method="GET"):
        if request.key.endswith(".data") and request.range:
            first, last = request.range.removeprefix("bytes=").split("-")
            spans.append((int(first), int(last) + 1))
    return spans


def test_a_ranged_read_fetches_exactly_the_stored_frames_of_the_records_blocks(s3_server: Any, tmp_path: Path) -> None:
    records = _records(3000)
    with varstore.Writer(tmp_path / "local" / "s", "bytes", compression="zstd-blocks") as writer:
        writer.extend(records)
    offsets, first = _block_table(tmp_path / "local" / "s")
    assert len(offsets) > 100 and offsets[190] - offsets[11] > 1 << 20  # blocks 10 and 190 are far apart
    bucket = s3_server.new_bucket()
    _upload(s3_server, tmp_path / "local", f"s3://{bucket}/set")
    with varstore.open(f"s3://{bucket}/set/s", storage_options=s3_server.storage_options, cache_limit=RANGES_ONLY) as shard:
        before = len(_data_gets(s3_server, bucket))
        assert shard[first[10] + 3] == records[first[10] + 3]
        assert _data_gets(s3_server, bucket)[before:] == [(offsets[10], offsets[11])]
        assert shard[first[10]] == records[first[10]] and shard[first[11] - 1] == records[first[11] - 1]
        assert len(_data_gets(s3_server, bucket)) == before + 1  # the block decoded last serves its records
        wanted = [first[190] + 1, first[10] + 5, first[190]]
        assert shard.get_batch(wanted) == [records[i] for i in wanted]
        assert _data_gets(s3_server, bucket)[before + 1 :] == [(offsets[190], offsets[191])]
        flat = shard.get_batch_flat([first[40], first[41] - 1])
        assert bytes(flat.values) == records[first[40]] + records[first[41] - 1]
        assert _data_gets(s3_server, bucket)[before + 2 :] == [(offsets[40], offsets[41])]


def test_a_remote_dataset_of_block_shards_reads_and_verifies_as_the_local_one(s3_server: Any, tmp_path: Path) -> None:
    records = [f"row {index}: " + "word " * (index % 30) for index in range(4000)]
    with varstore.ShardedWriter(tmp_path / "local", "str", max_shard_records=1500, compression="zstd-dict-blocks") as writer:
        writer.extend(records)
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/set"
    _upload(s3_server, tmp_path / "local", url)
    order = np.random.default_rng(1).integers(0, len(records), 300)
    with varstore.open(url, storage_options=s3_server.storage_options, cache_limit=RANGES_ONLY) as dataset:
        assert dataset.get_batch(order) == [records[i] for i in order]
        assert list(dataset) == records
    with varstore.open(url, storage_options=s3_server.storage_options) as dataset:  # may fetch shards whole
        dataset.verify()
        assert dataset.get_batch(order[::-1]) == [records[i] for i in order[::-1]]


def test_a_damaged_frame_at_rest_is_refused_by_block_after_its_rereads(s3_server: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from varstore.shard import remote_shard

    monkeypatch.setattr(remote_shard, "backoff_delay", lambda attempt: 0.0)
    records = _records(400)
    with varstore.Writer(tmp_path / "local" / "s", "bytes", compression="zstd-blocks") as writer:
        writer.extend(records)
    offsets, first = _block_table(tmp_path / "local" / "s")
    data = bytearray(Path(tmp_path / "local" / "s.data").read_bytes())
    data[offsets[3] + 30] ^= 1
    Path(tmp_path / "local" / "s.data").write_bytes(bytes(data))
    index = bytearray(Path(tmp_path / "local" / "s.index").read_bytes())
    edge = min(4096, len(data))
    struct.pack_into("<II", index, 40, crc32c(bytes(data)), crc32c(bytes(data[len(data) - edge :]), crc32c(bytes(data[:edge]))))
    struct.pack_into("<I", index, 60, crc32c(bytes(index[:60])))
    Path(tmp_path / "local" / "s.index").write_bytes(bytes(index))
    bucket = s3_server.new_bucket()
    _upload(s3_server, tmp_path / "local", f"s3://{bucket}/set")
    with varstore.open(f"s3://{bucket}/set/s", storage_options=s3_server.storage_options, cache_limit=RANGES_ONLY) as shard:
        before = len(_data_gets(s3_server, bucket))
        with pytest.raises(varstore.CorruptRecordError, match=f"record {first[3]}: block 3 checksum"):
            shard[first[3]]
        assert _data_gets(s3_server, bucket)[before:] == [(offsets[3], offsets[4])] * 5  # read again: damage at rest stays
        assert shard[first[4]] == records[first[4]]
