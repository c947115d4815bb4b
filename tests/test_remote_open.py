"""Opening a remote dataset costs O(1) requests whatever its shard count (spec §4.1), a reopened reader none when
the node cache holds its manifest version, and each shard is checked against its entry at its first use.
Requests are counted at moto's server."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

import varstore
from varstore.errors import DatasetReplacedError, FormatError, MissingFileError
from varstore.format.manifest import manifest_crc32c
from tests.test_remote_reader import put_object, range_header, remove_object, upload, write_local

pytest.importorskip("s3fs")
pytestmark = [pytest.mark.usefixtures("node_cache"), pytest.mark.timeout(120)]

MANIFEST_GET_RANGE = range_header(0, (64 << 20) + 1)


def requests_during(s3_server: Any, bucket: str, action: Any) -> tuple[Any, list[tuple[str, str, str | None]]]:
    """What `action()` returned, and the requests the server saw meanwhile as (method, key, range)."""
    before = len(s3_server.requests(bucket))
    result = action()
    return result, [(r.method, r.key, r.range) for r in s3_server.requests(bucket)[before:]]


def many_shard_manifest(local: Path, copies: int) -> bytes:
    """`local`'s manifest listing its first shard `copies` times under new names (only the first is uploaded):
    what a 10,000-shard dataset's open sees, without uploading 20,000 objects."""
    document = json.loads((local / "manifest.json").read_text())
    first = document["shards"][0]
    document["shards"] = [{**first, "name": f"copy-{number:06d}"} for number in range(copies)]
    document["shards"][0]["name"] = first["name"]
    document.pop("crc32c")
    document["crc32c"] = manifest_crc32c(document)
    return json.dumps(document).encode()


def test_a_ten_thousand_shard_dataset_opens_with_one_request_and_a_shard_costs_requests_at_first_use(
    s3_server: Any, tmp_path: Path
) -> None:
    records = [f"record {n:03d} " * 30 for n in range(40)]
    local = write_local(tmp_path / "local", records, shard_records=20)
    bucket = s3_server.new_bucket()
    url = upload(s3_server, local, f"s3://{bucket}/ds")
    put_object(s3_server, f"{url}/manifest.json", many_shard_manifest(local, 10_000))
    reader, opening = requests_during(s3_server, bucket, lambda: varstore.ShardedReader(url, storage_options=s3_server.storage_options))
    assert opening == [("GET", "ds/manifest.json", MANIFEST_GET_RANGE)]
    assert len(reader) == 20 * 10_000
    first, reading = requests_during(s3_server, bucket, lambda: reader[3])
    assert first == records[3]
    keys = sorted(key for _, key, _ in reading)
    assert keys == ["ds/shard-000000.data", "ds/shard-000000.index"]  # the whole shard is under 8 KiB: fetched whole
    # A listed shard whose objects are missing is refused at its first read, naming the object.
    with pytest.raises(MissingFileError, match="copy-000001.index"):
        reader[20]


def test_a_reopened_reader_costs_no_request_when_the_node_cache_holds_its_manifest(s3_server: Any, tmp_path: Path) -> None:
    records = [f"record {n:04d} " * 400 for n in range(40)]  # ~8 KiB records: data objects larger than their edges
    bucket = s3_server.new_bucket()
    url = upload(s3_server, write_local(tmp_path / "local", records, shard_records=20), f"s3://{bucket}/ds")
    # A cache that holds the manifest, indexes and edges but not the data: records are read by ranges.
    reader = varstore.ShardedReader(url, storage_options=s3_server.storage_options, cache_limit=64 << 10)
    assert reader[25] == records[25]
    state = pickle.dumps(reader)
    reopened, reopening = requests_during(s3_server, bucket, lambda: pickle.loads(state))
    assert reopening == []
    assert reopened.version == reader.version
    # The shard the first reader opened is in the node cache (index and edges): the read is one GET, its record.
    record, reading = requests_during(s3_server, bucket, lambda: reopened[30])
    assert record == records[30]
    assert [key for _, key, _ in reading] == ["ds/shard-000001.data"]


def test_a_reopened_reader_whose_manifest_left_the_cache_reads_it_and_refuses_another_version(
    s3_server: Any, tmp_path: Path, node_cache: Path
) -> None:
    bucket = s3_server.new_bucket()
    url = upload(s3_server, write_local(tmp_path / "old", ["old"] * 10, shard_records=5), f"s3://{bucket}/ds")
    reader = varstore.ShardedReader(url, storage_options=s3_server.storage_options)
    state = pickle.dumps(reader)
    for cached in node_cache.iterdir():
        cached.unlink()
    again, reopening = requests_during(s3_server, bucket, lambda: pickle.loads(state))
    assert reopening == [("GET", "ds/manifest.json", MANIFEST_GET_RANGE)] and again.version == reader.version
    upload(s3_server, write_local(tmp_path / "new", ["new"] * 10, shard_records=5), url)
    for cached in node_cache.iterdir():
        cached.unlink()
    with pytest.raises(DatasetReplacedError):
        pickle.loads(state)


def test_a_reopened_reader_is_not_fooled_by_a_cached_file_of_other_bytes(s3_server: Any, tmp_path: Path, node_cache: Path) -> None:
    """The cached manifest is trusted only if its bytes are the pinned version (a BLAKE2b digest)."""
    bucket = s3_server.new_bucket()
    url = upload(s3_server, write_local(tmp_path / "local", ["a", "b"], shard_records=1), f"s3://{bucket}/ds")
    reader = varstore.ShardedReader(url, storage_options=s3_server.storage_options)
    (cached,) = [path for path in node_cache.iterdir() if path.name.endswith("-manifest_json")]
    raw = cached.read_bytes()
    cached.chmod(0o600)
    cached.write_bytes(raw.replace(b'"records": 1', b'"records":  1', 1))  # same size, other bytes
    again, reopening = requests_during(s3_server, bucket, lambda: pickle.loads(pickle.dumps(reader)))
    assert reopening == [("GET", "ds/manifest.json", MANIFEST_GET_RANGE)]
    assert list(again) == ["a", "b"]


def test_a_shard_whose_data_object_is_another_size_is_refused_at_its_first_read_without_a_head(
    s3_server: Any, tmp_path: Path
) -> None:
    records = [f"record {n:04d} " * 400 for n in range(40)]
    local = write_local(tmp_path / "local", records, shard_records=20)
    bucket = s3_server.new_bucket()
    url = upload(s3_server, local, f"s3://{bucket}/ds")
    put_object(s3_server, f"{url}/shard-000001.data", (local / "shard-000001.data").read_bytes() + b"tail")
    reader = varstore.ShardedReader(url, storage_options=s3_server.storage_options, cache_limit=1)
    assert reader[0] == records[0]
    with pytest.raises(FormatError, match="shard-000001.data") as caught:
        reader[20]
    assert f"is {(local / 'shard-000001.data').stat().st_size + 4} bytes, not the" in str(caught.value)
    assert "HEAD" not in [r.method for r in s3_server.requests(bucket)]


def test_a_missing_index_object_is_refused_at_first_use_and_the_other_shards_read(s3_server: Any, tmp_path: Path) -> None:
    records = [f"r{n}" for n in range(30)]
    bucket = s3_server.new_bucket()
    url = upload(s3_server, write_local(tmp_path / "local", records, shard_records=10), f"s3://{bucket}/ds")
    remove_object(s3_server, f"{url}/shard-000001.index")
    reader = varstore.ShardedReader(url, storage_options=s3_server.storage_options)
    assert reader[0] == "r0" and reader[29] == "r29"
    with pytest.raises(MissingFileError, match="shard-000001.index"):
        reader[10]
