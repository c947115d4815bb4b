"""A remote shard whose data object is whole in the node cache reads as a local `Reader` reads its map: the same
records as the local copy of the dataset (records, flat batches, slices, iteration), no request, and every
record's CRC32C still checked, so a cached copy damaged at rest after its verified arrival is refused naming the
record, as a read by ranges would refuse it."""

from __future__ import annotations

import glob
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import varstore
from varstore.errors import CorruptRecordError
from varstore.shard.remote_shard import RemoteShard

SHARD_RECORDS = 40
_names = itertools.count()

CODECS: dict[str, Any] = {
    "bytes": (lambda index: bytes([index % 251]) * (index % 7 * 300), {}),
    "str": (lambda index: "é" * (index % 9) + str(index), {}),
    "msgpack": (lambda index: {"id": index, "tokens": list(range(index % 5))}, {}),
    "ndarray": (lambda index: np.full((index % 4, 3), index, np.int32), {"dtype": "int32", "shape": (3,)}),
}


# compressed variants (2.x frames, 3.x blocks) of the `bytes` and `str` codecs, whose single reads have C slicers
COMPRESSED = {"bytes-zstd": ("bytes", "zstd"), "str-zstd-dict-blocks": ("str", "zstd-dict-blocks")}


def written(tmp_path: Path, codec: str, count: int = 3 * SHARD_RECORDS) -> tuple[str, Any]:
    """A dataset of `count` records of `codec` at a fresh memory:// URL and the same records on disk: (URL, local reader)."""
    codec, compression = COMPRESSED.get(codec, (codec, None))
    make, options = CODECS[codec]
    if compression is not None:
        options = {**options, "compression": compression}
    url = f"memory://cached-reads/{next(_names)}"
    local = tmp_path / f"local-{codec}"
    for target in (url, str(local)):
        with varstore.ShardedWriter(target, codec, max_shard_records=SHARD_RECORDS, overwrite=True, **options) as writer:
            writer.extend(make(index) for index in range(count))
    return url, varstore.open(str(local))


_WRITTEN: dict[str, tuple[str, Any, Any]] = {}


def written_and_cached(tmp_path_factory: pytest.TempPathFactory, codec: str) -> tuple[Any, Any]:
    """`written` once per codec, with its reader fetched whole (`whole_cached`): (remote reader, local reader)."""
    if codec not in _WRITTEN:
        tmp_path = tmp_path_factory.mktemp(codec)
        url, local = written(tmp_path, codec)
        _WRITTEN[codec] = (url, whole_cached(url, tmp_path / "cache"), local)
    return _WRITTEN[codec][1:]


def whole_cached(url: str, cache: Path) -> Any:
    """A reader of the dataset at `url` with every shard's data object fetched whole into `cache`."""
    reader = varstore.open(url, cache_dir=cache)
    for position in range(len(reader.manifest.shards)):
        reader.fetch_shard(position)
    return reader


def same(left: Any, right: Any) -> bool:
    if isinstance(left, np.ndarray) or isinstance(right, np.ndarray):
        return np.array_equal(np.asarray(left), np.asarray(right))
    if isinstance(left, (bytes, bytearray, memoryview)):
        return bytes(left) == bytes(right)
    return bool(left == right)


def refuse_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any ranged read or download from here on fails the test."""
    import varstore.remote.transport as transport

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a request was made: {args[1:2]}")

    for name in ("read_ranges", "download_file"):
        monkeypatch.setattr(transport.FsspecTransport, name, refuse)


@pytest.mark.parametrize("codec", sorted(CODECS) + sorted(COMPRESSED))
@settings(max_examples=15)
@given(picks=st.lists(st.integers(0, 3 * SHARD_RECORDS - 1), max_size=50), start=st.integers(0, 3 * SHARD_RECORDS))
def test_a_whole_cached_remote_dataset_reads_what_the_local_copy_reads_without_a_request(
    tmp_path_factory: pytest.TempPathFactory, codec: str, picks: list[int], start: int
) -> None:
    remote, local = written_and_cached(tmp_path_factory, codec)
    with pytest.MonkeyPatch.context() as monkeypatch:
        refuse_requests(monkeypatch)
        got, expected = remote.get_batch(picks), local.get_batch(picks)
        assert len(got) == len(expected) and all(same(a, b) for a, b in zip(got, expected))
        flat, expected_flat = remote.get_batch_flat(picks), local.get_batch_flat(picks)
        assert np.array_equal(flat.offsets, expected_flat.offsets) and np.array_equal(flat.values, expected_flat.values)
        got_slice, expected_slice = remote[start : start + 17], local[start : start + 17]
        assert len(got_slice) == len(expected_slice) and all(same(a, b) for a, b in zip(got_slice, expected_slice))
        shard = remote.shard(1)
        assert isinstance(shard, RemoteShard) and shard.wanted_ranges([0]) is None
        assert all(same(a, b) for a, b in zip(shard, local.shard(1)))


def cached_data_file(cache: Path, shard: str) -> Path:
    (path,) = glob.glob(str(cache / f"*-{shard}_data"))
    return Path(path)


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.parametrize("read", ["get_batch", "get_batch_flat", "item"])
def test_a_cached_copy_damaged_at_rest_after_its_arrival_is_refused_naming_the_record(tmp_path: Path, read: str) -> None:
    url, local = written(tmp_path, "bytes")
    cache = tmp_path / "cache"
    whole_cached(url, cache).close()
    record = SHARD_RECORDS + 5  # shard 1's record 5
    start = int(local.shard(1).offsets[5])
    flip_byte(cached_data_file(cache, "shard-000001"), start)
    reader = varstore.open(url, cache_dir=cache)  # another process of the node, say: it maps the cached copy
    assert reader.shard(1).wanted_ranges([5]) is None  # read from the copy, not by ranges
    untouched = [record - 1, record + 1]
    assert [bytes(value) for value in reader.get_batch(untouched)] == local.get_batch(untouched)
    with pytest.raises(CorruptRecordError, match="record 5 checksum") as caught:
        if read == "item":
            reader[record]
        else:
            getattr(reader, read)([record - 1, record])
    assert caught.value.records == [5] and "shard-000001.data" in str(caught.value)
