"""Sizes at the edges: a data file past 4 GiB and a record past 2 GiB (sparse files), empty records and
shards, shards at exactly the roll-over limits, and hundreds of thousands of tiny records."""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import varstore
from varstore.format import header as fmt
from varstore.format.checksum import crc32c

from .helpers_reliability import assert_store_holds, read_every_way
from varstore.format.metadata import encode_metadata

ZERO_CHUNK = bytes(64 << 20)


def crc32c_of_zeros(count: int) -> int:
    value = 0
    for start in range(0, count, len(ZERO_CHUNK)):
        value = crc32c(memoryview(ZERO_CHUNK)[: min(len(ZERO_CHUNK), count - start)], value)
    return value


def write_sparse_shard(prefix: str, hole: int, tail: bytes) -> None:
    """A uint8 ndarray shard of two records: `hole` zero bytes that occupy no disk, then `tail`.

    Built from the format module, not the Writer, so no test writes gigabytes; every checksum is real.
    """
    data_path, index_path = fmt.shard_paths(prefix)
    with open(data_path, "wb") as file:
        file.truncate(hole)
        file.seek(hole)
        file.write(tail)
    size = hole + len(tail)
    hole_crc = crc32c_of_zeros(hole)
    metadata = encode_metadata({"dtype": "|u1", "shape": []}, {"sparse": True})
    body = (metadata + bytes(fmt.align8(fmt.HEADER_SIZE + len(metadata)) - fmt.HEADER_SIZE - len(metadata))
            + struct.pack("<3Q", 0, hole, size) + struct.pack("<2I", hole_crc, crc32c(tail)))
    edges = bytes(fmt.EDGE_SIZE) + (bytes(fmt.EDGE_SIZE) + tail)[-fmt.EDGE_SIZE :]
    header = fmt.Header(codec_id=2, flags=fmt.FLAG_RECORD_CHECKSUMS, record_count=2, data_size=size,
                        metadata_size=len(metadata), data_crc32c=crc32c(tail, hole_crc),
                        data_edge_crc32c=crc32c(edges), body_crc32c=crc32c(body))
    with open(index_path, "wb") as file:
        file.write(header.pack() + body)


def test_record_past_4_gib_and_a_record_over_2_gib_read_correctly(tmp_path):
    hole = (4 << 30) + 3
    tail = b"the record after four gibibytes"
    write_sparse_shard(str(tmp_path / "big"), hole, tail)
    if os.stat(tmp_path / "big.data").st_blocks * 512 > 1 << 30:
        pytest.skip("this filesystem does not keep sparse files sparse")
    with varstore.open(tmp_path / "big", verify_reads=True) as store:
        assert store[1].tobytes() == tail  # its bytes start past 2**32, and its checksum is checked
        assert store.get_batch_flat([1]).values.tobytes() == tail
        assert [record.tobytes() for record in store[1:2]] == [tail]
        assert store.record_sizes().tolist() == [hole, len(tail)]
        assert store.offsets.tolist() == [0, hole, hole + len(tail)]
    with varstore.open(tmp_path / "big") as store:
        huge = store[0]  # a view of the map: no 4 GiB copy
        assert huge.shape == (hole,) and not huge.flags.owndata
        assert huge[0] == huge[1 << 31] == huge[(1 << 32) + 1] == huge[-1] == 0
    varstore.write_manifest(tmp_path, ["big"])
    with varstore.open(tmp_path) as dataset:
        assert dataset[1].tobytes() == tail and len(dataset[0]) == hole


EMPTY = {"bytes": b"", "str": "", "ndarray": np.zeros((0, 3), np.int32)}
FULL = {"bytes": b"x", "str": "é", "ndarray": np.ones((2, 3), np.int32)}


@pytest.mark.parametrize("codec", list(EMPTY))
@pytest.mark.parametrize("layout", ["none", "all-empty", "empty-first-and-last", "one-empty"])
def test_empty_records_and_empty_shards_read_back_every_way(tmp_path, codec, layout):
    empty, full = EMPTY[codec], FULL[codec]
    records = {"none": [], "all-empty": [empty] * 5, "empty-first-and-last": [empty, full, empty, full, empty],
               "one-empty": [empty]}[layout]
    options = {"dtype": "int32", "shape": (3,)} if codec == "ndarray" else {}
    with varstore.Writer(tmp_path / "docs", codec=codec, **options) as writer:
        writer.extend(records)
    assert_store_holds(tmp_path / "docs", records)
    with varstore.ShardedWriter(tmp_path / "data", codec=codec, max_shard_records=2, **options) as writer:
        writer.extend(records)
    assert_store_holds(tmp_path / "data", records)


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])  # a new directory per example
@given(sizes=st.lists(st.integers(0, 60), max_size=25), max_bytes=st.integers(1, 120),
       max_records=st.none() | st.integers(1, 6))
@example(sizes=[50, 50, 100, 0, 1, 120, 121], max_bytes=100, max_records=None)
@example(sizes=[1] * 12, max_bytes=4, max_records=4)
def test_shards_fill_exactly_to_their_limits_and_no_further(memory_path, sizes, max_bytes, max_records):
    records = [bytes([number % 256]) * size for number, size in enumerate(sizes)]
    directory = memory_path / "data"
    try:
        with varstore.ShardedWriter(directory, max_shard_bytes=max_bytes, max_shard_records=max_records) as writer:
            writer.extend(records)
        with varstore.open(directory) as dataset:
            assert read_every_way(dataset) == [{"$bytes": record.hex()} for record in records]
            shards = [varstore.open(path).record_sizes().tolist() for path in dataset.shard_paths]
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # up to 50 files of a page each per example, in /dev/shm
    for position, shard in enumerate(shards):
        assert shard, "no shard is empty"
        assert sum(shard) <= max_bytes or len(shard) == 1, "only a single record may exceed the byte limit"
        assert max_records is None or len(shard) <= max_records
        if position + 1 < len(shards):
            next_size = shards[position + 1][0]
            assert sum(shard) + next_size > max_bytes or len(shard) == max_records, "a shard closed early"


def test_hundreds_of_thousands_of_tiny_records_are_stored_and_indexed(memory_path):
    count = 300_000  # spools offsets and checksums to disk several times (every 65536 records)
    lengths = np.arange(count) % 3  # 0, 1 or 2 bytes each
    values = (np.arange(int(lengths.sum())) % 251).astype(np.uint8)
    with varstore.Writer(memory_path / "tiny") as writer:
        writer.extend_flat(values, lengths)
    ends = np.cumsum(lengths)
    with varstore.open(memory_path / "tiny") as store:
        store.verify()
        assert len(store) == count
        assert np.array_equal(store.record_sizes(), lengths)
        assert np.array_equal(store.offsets[1:], ends)
        for index in (0, 1, 2, 65535, 65536, 65537, 131071, count - 1):
            assert store[index] == values[ends[index] - lengths[index] : ends[index]].tobytes()
        flat = store.get_batch_flat(np.arange(count))
        assert np.array_equal(flat.values, values) and np.array_equal(np.diff(flat.offsets), lengths)
