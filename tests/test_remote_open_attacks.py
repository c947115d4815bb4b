"""Attacks on the O(1) open of a remote dataset (spec §4.1): with no LIST at the open, each shard's objects are
checked against their manifest entry at its first use, and what that finds wrong must be the shard's damage (a
`FormatError`, which ``on_damaged="skip"`` sets aside), never a storage fault and never accepted; the open
itself needs no room in the node cache, and a forged entry's size cannot empty it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import fsspec
import pytest

import varstore
from varstore.errors import FormatError
from varstore.format.manifest import manifest_crc32c
from tests.test_remote_reader import put_object, remove_object, upload, write_local

pytest.importorskip("s3fs")
pytestmark = [pytest.mark.usefixtures("node_cache"), pytest.mark.timeout(180)]

SMALL = [f"r{n:03d}" for n in range(30)]  # data objects of 40 bytes: fetched whole when the cache may hold them
LARGE = [f"record {n:04d} " * 400 for n in range(30)]  # data objects of 48,000 bytes: larger than both edges


def memory_url(tmp_path: Path, name: str) -> str:
    """A memory:// prefix no other test uses (memory:// is one store per process)."""
    return f"memory://open-attacks/{tmp_path.name}/{name}"


def store_dataset(store: str, s3_server: Any, tmp_path: Path, records: list[str], shard_records: int = 10) -> tuple[str, dict[str, Any] | None]:
    """`records` as a dataset in `store` ("memory" or "s3"): its URL and storage options."""
    local = write_local(tmp_path / f"local-{len(os.listdir(tmp_path))}", records, shard_records=shard_records)
    if store == "s3":
        return upload(s3_server, local, f"s3://{s3_server.new_bucket()}/ds"), s3_server.storage_options
    url = memory_url(tmp_path, "ds")
    memory = fsspec.filesystem("memory")
    for name in sorted(os.listdir(local)):
        memory.pipe(f"{url.removeprefix('memory://')}/{name}", (local / name).read_bytes())
    return url, None


def read_object_bytes(url: str, options: dict[str, Any] | None) -> bytes:
    fs, path = fsspec.core.url_to_fs(url, **(options or {}))
    return bytes(fs.cat_file(path))


def final_objects(cache: Path) -> set[str]:
    """The names of the cached objects in `cache` (not the lock and temporary files of downloads in progress)."""
    return {name for name in os.listdir(cache) if "." not in name}


def write_object(s3_server: Any, url: str, body: bytes) -> None:
    if url.startswith("s3://"):
        put_object(s3_server, url, body)
    else:
        fsspec.filesystem("memory").pipe(url.removeprefix("memory://"), body)


@pytest.mark.parametrize("store", ["memory", "s3"])
@pytest.mark.parametrize(
    "records, suffix",
    [(SMALL, "data"), (LARGE, "data"), (LARGE, "index")],
    ids=["small-data", "large-data", "index"],
)
@pytest.mark.parametrize("change", ["longer", "shorter"])
@pytest.mark.parametrize("cache_limit", [None, 1], ids=["fits", "ranges-only"])
def test_a_shard_object_of_another_size_than_its_entry_is_a_format_error_at_its_first_use(
    s3_server: Any, tmp_path: Path, store: str, records: list[str], suffix: str, change: str, cache_limit: int | None
) -> None:
    """The open's LIST used to refuse these; at first use, a data object of at most 8 KiB read by ranges on a store
    whose ranged responses do not name the size (memory://) was read without its size checked (a longer one
    served records), a shorter one was a StorageError after five reads (on s3:// through fsspec too: its ranges
    come back short, like a cut body), and an index of another size a StorageError after five downloads."""
    url, options = store_dataset(store, s3_server, tmp_path, records)
    shard_object = f"{url}/shard-000001.{suffix}"
    stored = read_object_bytes(shard_object, options)
    write_object(s3_server, shard_object, stored + b"tail" if change == "longer" else stored[:-4])
    reader = varstore.ShardedReader(url, storage_options=options, cache_limit=cache_limit)
    assert reader[0] == records[0]
    with pytest.raises(FormatError, match=f"shard-000001.{suffix}") as caught:
        reader[10]
    found = len(stored) + (4 if change == "longer" else -4)
    assert f"{found} bytes" in str(caught.value) and str(len(stored)) in str(caught.value)
    assert reader[29] == records[29]


@pytest.mark.parametrize("cache_limit", [None, 1], ids=["fits", "ranges-only"])
def test_on_damaged_skip_sets_aside_and_counts_shards_found_damaged_only_at_their_first_use(
    s3_server: Any, tmp_path: Path, cache_limit: int | None
) -> None:
    """A RecordDataset with on_damaged="skip" died with a StorageError on an index damaged at rest (it fails its
    CRC32C on every download) and, through fsspec, on a data object shorter than its entry."""
    pytest.importorskip("torch")
    from varstore.torch import RecordDataset

    records = [f"record {n:04d} " * 400 for n in range(60)]
    url, options = store_dataset("s3", s3_server, tmp_path, records)
    index = read_object_bytes(f"{url}/shard-000001.index", options)
    put_object(s3_server, f"{url}/shard-000001.index", index[:100] + bytes([index[100] ^ 1]) + index[101:])
    put_object(s3_server, f"{url}/shard-000002.data", read_object_bytes(f"{url}/shard-000002.data", options)[:-8])
    put_object(s3_server, f"{url}/shard-000003.index", index + bytes(8))
    remove_object(s3_server, f"{url}/shard-000004.data")
    dataset = RecordDataset(url, output="numpy", on_damaged="skip", storage_options=options, cache_limit=cache_limit)
    assert dataset.__getitems__(list(range(60))) == records[:10] + records[50:]
    assert dataset.skipped_records == {f"{url}/shard-00000{n}": 10 for n in (1, 2, 3, 4)}


def test_a_remote_dataset_opens_on_a_full_cache_disk_and_reads_once_there_is_room(s3_server: Any, tmp_path: Path) -> None:
    """The open keeps the manifest in the node cache for reopening processes; on a full disk it raised instead
    of opening (the open before this change wrote nothing there)."""
    import pickle

    from tests.helpers_tmpfs import fill, mounted_tmpfs

    records = [f"record {n} " * 40 for n in range(100)]
    url, options = store_dataset("s3", s3_server, tmp_path, records, shard_records=50)
    with mounted_tmpfs(256 << 10) as root:
        cache = root / "cache"
        fill(root)
        reader = varstore.ShardedReader(url, storage_options=options, cache_dir=str(cache))
        assert len(reader) == 100 and len(pickle.loads(pickle.dumps(reader))) == 100
        with pytest.raises(varstore.errors.StorageError, match="No space left"):
            reader[0]
        os.unlink(root / "filler")
        assert reader[0] == records[0] and reader[99] == records[99]
        assert pickle.loads(pickle.dumps(reader))[51] == records[51]


@pytest.mark.parametrize("store", ["memory", "s3"])
def test_a_forged_shard_size_over_the_cache_limit_evicts_nothing_from_the_node_cache(
    s3_server: Any, tmp_path: Path, store: str
) -> None:
    """An entry whose index_size is 2**62 evicted every object of every dataset on the node before the download
    that then failed (the open's LIST used to refuse the entry first)."""
    cache, limit = tmp_path / "shared-cache", 10 << 20
    good = memory_url(tmp_path, "good")
    with varstore.ShardedWriter(good, "str", max_shard_records=10) as writer:
        writer.extend(LARGE)
    assert list(varstore.ShardedReader(good, cache_dir=str(cache), cache_limit=limit)) == LARGE
    kept = final_objects(cache)
    forged, options = store_dataset(store, s3_server, tmp_path, SMALL)
    document = json.loads(read_object_bytes(f"{forged}/manifest.json", options))
    document["shards"][1]["index_size"] = 2**62
    document.pop("crc32c")
    document["crc32c"] = manifest_crc32c(document)
    write_object(s3_server, f"{forged}/manifest.json", json.dumps(document).encode())
    reader = varstore.ShardedReader(forged, storage_options=options, cache_dir=str(cache), cache_limit=limit)
    with pytest.raises(FormatError, match="shard-000001.index"):
        reader[10]
    assert kept <= final_objects(cache)


def test_a_reopened_reader_of_a_dataset_without_record_checksums_never_reads_a_replacing_data_object_as_old(
    s3_server: Any, tmp_path: Path
) -> None:
    """A worker that reopens the reader after the dataset was rewritten under the same names reads the old
    manifest from the node cache (no request), and the index and edges another process cached: with no record
    checksum to check a ranged read, it returned the new version's records as the old one's. (Before the O(1)
    open a reopened reader GOT the manifest, and refused the new version.)"""
    import pickle

    from varstore.errors import DatasetReplacedError

    old = [f"old record {n:04d} " * 400 for n in range(40)]
    new = [f"new record {n:04d} " * 400 for n in range(40)]
    old_local = write_local(tmp_path / "old", old, shard_records=20, checksums=False)
    new_local = write_local(tmp_path / "new", new, shard_records=20, checksums=False)
    assert (old_local / "shard-000001.data").stat().st_size == (new_local / "shard-000001.data").stat().st_size
    url = upload(s3_server, old_local, f"s3://{s3_server.new_bucket()}/ds")
    # The cache holds the manifest, indexes and edges, not the data: records are read by ranges.
    reader = varstore.ShardedReader(url, storage_options=s3_server.storage_options, cache_limit=64 << 10)
    assert reader[25] == old[25]
    state = pickle.dumps(reader)
    upload(s3_server, new_local, url)
    reopened = pickle.loads(state)
    try:
        assert reopened[30] == old[30]
    except DatasetReplacedError:
        pass
