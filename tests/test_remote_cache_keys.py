"""The node cache cannot be fooled into serving other bytes: what names a cached object.

A size and a CRC32C do not identify an index file. Its header ends with the CRC32C of its first 60 bytes, and
the CRC32C of any message followed by its own CRC32C is a constant, so two index files that differ only in
their header (same metadata and offsets, `checksums=False`, records of equal size but other bytes) have the
same size and the same CRC32C. Keyed by (URL, size, CRC32C), a dataset rewritten under the same shard names
(`varstore cp NEW s3://.../ds --overwrite` keeps them) was served the old index: refused as damaged, or worse.
The cache now names a shard's objects by the dataset's version, the manifest entry, the store's ETags and the
index header (`RemoteDatasetSource`), and a lone shard's by its objects' ETags and its header (`RemoteShard`).

Also here: a download longer than expected is refused (right bytes followed by junk must not pass), and a
descriptor from the cache stays readable when the file is evicted at once (a tiny limit, busy readers).
Every S3 test runs against moto on 127.0.0.1 behind the fault proxy, which counts the requests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest

import varstore
from tests.helpers_fault_proxy import FaultProxy, fault_proxy  # noqa: F401 - fault_proxy is a fixture
from varstore.errors import StorageError
from varstore.format import header as fmt
from varstore.format.checksum import crc32c
from varstore.remote.cache import NodeCache, object_name
from varstore.remote.filesystems import open_filesystem

pytestmark = pytest.mark.usefixtures("node_cache")  # tests.helpers_s3: a node cache per test

SHARD_RECORDS = 10
RECORDS = 20
# Holds both versions of every object the readers cache (index files, data objects, manifests).
CACHE_LIMIT = 1 << 20


def colliding_datasets(directory: Path) -> tuple[Path, Path, list[bytes], list[bytes]]:
    """Two local datasets, "old" and "new", with the same shard names whose index files have equal sizes and
    equal CRC32Cs but other bytes (their headers' data CRC32Cs differ): (old, new, old records, new records)."""
    made = []
    for name, fill in (("old", b"o"), ("new", b"n")):
        records = [fill * 100 for _ in range(RECORDS)]
        with varstore.ShardedWriter(directory / name, "bytes", max_shard_records=SHARD_RECORDS, checksums=False) as writer:
            writer.extend(records)
        made.append((directory / name, records))
    (old, old_records), (new, new_records) = made
    return old, new, old_records, new_records


def upload(fs: Any, root: str, local: Path) -> None:
    for name in sorted(os.listdir(local)):
        fs.put_file(str(local / name), f"{root}/{name}")
    fs.invalidate_cache()


def remove_all(fs: Any, root: str) -> None:
    for name in fs.ls(root, detail=False, refresh=True):
        fs.rm_file(name)
    fs.invalidate_cache()


def index_downloads(proxy: FaultProxy, bucket: str, shard: str) -> int:
    """Whole GETs (no Range) of a shard's index object: its downloads into a node cache."""
    path = f"/{bucket}/ds/{shard}.index"
    return sum(1 for record in proxy.requests() if record.method == "GET" and record.path == path and record.range is None)


@pytest.fixture
def behind_proxy(s3_server: Any, fault_proxy: Callable[[str], FaultProxy]) -> dict[str, Any]:
    proxy = fault_proxy(s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    options = {**s3_server.storage_options, "endpoint_url": proxy.url}
    fs, root = open_filesystem(f"s3://{bucket}/ds", s3_server.storage_options)  # set-up goes around the proxy
    return {"proxy": proxy, "bucket": bucket, "url": f"s3://{bucket}/ds", "options": options, "fs": fs, "root": root}


@pytest.mark.timeout(60)
def test_two_index_files_differing_only_in_their_header_share_size_and_crc32c(tmp_path: Path) -> None:
    """The premise: why (URL, size, CRC32C) is no cache key."""
    old, new, _, _ = colliding_datasets(tmp_path)
    for name in ("shard-000000", "shard-000001"):
        old_index, new_index = (old / f"{name}.index").read_bytes(), (new / f"{name}.index").read_bytes()
        assert old_index != new_index and old_index[fmt.HEADER_SIZE :] == new_index[fmt.HEADER_SIZE :]
        assert len(old_index) == len(new_index) and crc32c(old_index) == crc32c(new_index)
        assert crc32c(old_index[: fmt.HEADER_SIZE]) == crc32c(new_index[: fmt.HEADER_SIZE])  # the CRC32C residue
    old_manifest, new_manifest = varstore.open(str(old)).manifest, varstore.open(str(new)).manifest
    for old_entry, new_entry in zip(old_manifest.shards, new_manifest.shards):
        assert (old_entry.name, old_entry.index_size, old_entry.index_crc32c) == (
            new_entry.name, new_entry.index_size, new_entry.index_crc32c
        )
        assert old_entry.data_crc32c != new_entry.data_crc32c


@pytest.mark.timeout(120)
def test_a_dataset_rewritten_under_the_same_shard_names_is_read_as_the_new_one(
    behind_proxy: dict[str, Any], tmp_path: Path, node_cache: Path
) -> None:
    """What `varstore cp NEW URL --overwrite` does (remove the old dataset, copy the new one byte for byte under
    the same names), seen by a node whose cache holds the old index files: it reads the new records (it was
    served the old index and refused the valid new dataset as damaged)."""
    proxy, bucket, url, options, fs, root = (behind_proxy[key] for key in ("proxy", "bucket", "url", "options", "fs", "root"))
    old, new, old_records, new_records = colliding_datasets(tmp_path)
    upload(fs, root, old)
    reader = varstore.open(url, storage_options=options, cache_limit=CACHE_LIMIT)
    assert list(reader) == old_records
    assert [index_downloads(proxy, bucket, f"shard-00000{n}") for n in (0, 1)] == [1, 1]

    remove_all(fs, root)
    upload(fs, root, new)
    rewritten = varstore.open(url, storage_options=options, cache_limit=CACHE_LIMIT)
    assert list(rewritten) == new_records
    assert rewritten.get_batch([0, 19]) == [new_records[0], new_records[19]]
    # Each new index was downloaded (not served from the old file), once: the cache still works.
    assert [index_downloads(proxy, bucket, f"shard-00000{n}") for n in (0, 1)] == [2, 2]
    again = varstore.open(url, storage_options=options, cache_limit=CACHE_LIMIT)
    assert list(again) == new_records
    assert [index_downloads(proxy, bucket, f"shard-00000{n}") for n in (0, 1)] == [2, 2]
    cached = sorted(name for name in os.listdir(node_cache) if name.endswith("-shard-000000_index"))
    assert len(cached) == 2  # the old and the new index, under different names
    again.verify()  # what cp runs on what it copied: every byte, against the new manifest


@pytest.mark.timeout(120)
def test_a_loader_skipping_damage_drops_nothing_of_a_dataset_rewritten_under_the_same_names(
    behind_proxy: dict[str, Any], tmp_path: Path
) -> None:
    """A node that read the old version, training with on_damaged='skip': the new shards were set aside as damaged
    (the old index disagrees with the new manifest) and their records dropped."""
    torch_datasets = pytest.importorskip("varstore.torch")
    url, options, fs, root = (behind_proxy[key] for key in ("url", "options", "fs", "root"))
    old, new, old_records, new_records = colliding_datasets(tmp_path)
    upload(fs, root, old)
    assert list(varstore.open(url, storage_options=options, cache_limit=CACHE_LIMIT)) == old_records
    remove_all(fs, root)
    upload(fs, root, new)
    samples = torch_datasets.RecordDataset(url, on_damaged="skip", storage_options=options, cache_limit=CACHE_LIMIT)
    assert len(samples) == RECORDS
    assert [bytes(sample.numpy()) for sample in samples.__getitems__(list(range(RECORDS)))] == new_records
    assert samples.skipped_records == {}


@pytest.mark.timeout(120)
def test_a_lone_shard_rewritten_with_a_colliding_index_is_read_as_the_new_one(
    behind_proxy: dict[str, Any], tmp_path: Path
) -> None:
    """A shard opened alone has no manifest: its objects' ETags (from the HEADs its open makes) and its header
    name its content."""
    proxy, bucket, url, options, fs, root = (behind_proxy[key] for key in ("proxy", "bucket", "url", "options", "fs", "root"))
    old, new, old_records, new_records = colliding_datasets(tmp_path)
    upload(fs, root, old)
    shard = varstore.open(f"{url}/shard-000000", storage_options=options, cache_limit=CACHE_LIMIT)
    assert list(shard) == old_records[:SHARD_RECORDS]
    for suffix in (".data", ".index"):
        fs.put_file(str(new / f"shard-000000{suffix}"), f"{root}/shard-000000{suffix}")
    fs.invalidate_cache()
    rewritten = varstore.open(f"{url}/shard-000000", storage_options=options, cache_limit=CACHE_LIMIT)
    assert list(rewritten) == new_records[:SHARD_RECORDS]
    assert index_downloads(proxy, bucket, "shard-000000") == 2


@pytest.mark.timeout(60)
def test_objects_differing_only_in_their_identity_are_different_files(tmp_path: Path) -> None:
    cache = NodeCache(str(tmp_path / "cache"))
    data = b"A" * 64 + b"body"
    downloads: list[str] = []

    def download(temporary: str) -> None:
        downloads.append(temporary)
        Path(temporary).write_bytes(data)

    key, size, crc = "s3://b/k", len(data), crc32c(data)
    assert object_name(key, size, crc, "version 1") != object_name(key, size, crc, "version 2")
    assert object_name(key, size, crc) == object_name(key, size, crc, "")  # unchanged without one
    one = cache.fetch(key, size, crc, download, identity="version 1")
    assert cache.fetch(key, size, crc, download, identity="version 1") == one and len(downloads) == 1
    two = cache.fetch(key, size, crc, download, identity="version 2")
    assert two != one and len(downloads) == 2
    assert cache.cached(key, size, crc, identity="version 1") == one
    assert cache.cached(key, size, crc, identity="version 3") is None
    with pytest.raises(StorageError):  # the CRC32C is still checked on arrival
        cache.fetch(key, size, crc ^ 1, download, identity="version 1")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["fetch", "open"])
def test_a_download_longer_than_expected_is_refused_and_nothing_is_cached(tmp_path: Path, how: str) -> None:
    """The right bytes followed by junk: a CRC32C over the first `size` bytes would pass them."""
    cache_dir = tmp_path / "cache"
    cache = NodeCache(str(cache_dir))
    data = bytes(range(200))
    get = getattr(cache, how)
    with pytest.raises(StorageError, match="downloaded 205 bytes; expected 200 bytes") as raised:
        get("s3://b/k", len(data), crc32c(data), lambda temporary: Path(temporary).write_bytes(data + b"junk!"))
    assert isinstance(raised.value, StorageError) and "s3://b/k" in str(raised.value)
    assert os.listdir(cache_dir) == []
    assert cache.cached("s3://b/k", len(data), crc32c(data)) is None
    result = get("s3://b/k", len(data), crc32c(data), lambda temporary: Path(temporary).write_bytes(data))
    if how == "open":
        with os.fdopen(result, "rb") as file:
            assert file.read() == data
    else:
        assert Path(result).read_bytes() == data


@pytest.mark.timeout(60)
def test_a_descriptor_from_the_cache_reads_the_object_though_it_is_evicted_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a tiny limit, with other readers fetching, a file is evicted as soon as it is published: the reader
    that downloaded it was refused ("evicted 3 times before it could be opened"). `open`'s descriptor is taken
    before the file is published; here every publish is followed by an eviction of everything."""
    url = "memory://cache-keys/evicted-at-once"
    records = [bytes([n]) * 300 for n in range(40)]
    with varstore.ShardedWriter(url, "bytes", max_shard_records=10, overwrite=True) as writer:
        writer.extend(records)
    real_publish = NodeCache._publish

    def publish_then_evict_everything(self: NodeCache, temporary: str, final: str, size: int) -> None:
        real_publish(self, temporary, final, size)
        self.evict((self.limit_bytes or 0) + 1)

    monkeypatch.setattr(NodeCache, "_publish", publish_then_evict_everything)
    reader = varstore.open(url, cache_dir=str(tmp_path / "cache"), cache_limit=1)
    assert list(reader) == records
    assert reader.get_batch([39, 0, 17]) == [records[39], records[0], records[17]]
    reader.verify()
