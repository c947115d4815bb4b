"""The remote reader (`varstore.open(url)`: RemoteDatasetSource, RemoteShard) against moto's S3 on loopback:
every API equals the local dataset for every codec; the request cost of opening, a first read, a random
read and a batch, counted at the server; faults injected by a proxy (retried, or a StorageError naming the
URL with nothing wrong cached); readers killed mid-download; datasets replaced under a reader and forged
objects."""

from __future__ import annotations

import glob
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import varstore
from varstore.format import header as fmt
from varstore.errors import (
    CorruptRecordError,
    DatasetReplacedError,
    FormatError,
    MissingFileError,
    StorageError,
    VarstoreError,
)
from varstore.remote.filesystems import DEFAULT_MAX_GAP, open_filesystem
from tests.helpers_fault_proxy import FaultProxy, fault_proxy  # noqa: F401 - fault_proxy is a fixture

pytest.importorskip("s3fs")

# A node cache too small for any dataset here: records are always read by ranges, never from a copy of a
# whole shard (what these tests are about: a copy would serve the old version, rightly, without an error).
RANGES_ONLY = 1
DEADLINE_SECONDS = 30.0


@pytest.fixture(autouse=True)
def node_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The readers' cache under the test's own directory, never the user's."""
    cache = tmp_path / "node-cache"
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(cache))
    return cache


def write_local(directory: Path, records: list[Any], codec: str = "str", *, shard_records: int, **options: Any) -> Path:
    with varstore.ShardedWriter(directory, codec, max_shard_records=shard_records, **options) as writer:
        writer.extend(records)
    return directory


def upload(s3_server: Any, local: Path, url: str) -> str:
    """Copy the dataset directory `local` to `url` (every file, the manifest among them) and return `url`."""
    fs, path = open_filesystem(url, s3_server.storage_options)
    for name in sorted(os.listdir(local)):
        fs.put_file(str(local / name), f"{path}/{name}")
    fs.invalidate_cache()
    return url


def put_object(s3_server: Any, url: str, body: bytes) -> None:
    fs, path = open_filesystem(url, s3_server.storage_options)
    fs.pipe_file(path, body)
    fs.invalidate_cache()


def remove_object(s3_server: Any, url: str) -> None:
    fs, path = open_filesystem(url, s3_server.storage_options)
    fs.rm(path)
    fs.invalidate_cache()


def unsigned_manifest(local: Path) -> dict[str, Any]:
    """The manifest of `local` without its own CRC32C, which is optional: so a test may forge any field."""
    document = json.loads((local / "manifest.json").read_text())
    document.pop("crc32c", None)
    return document


def assert_same(remote: Any, local: Any) -> None:
    """Records (or lists of records) equal, numpy arrays by value, dtype and shape."""
    if isinstance(local, np.ndarray):
        assert isinstance(remote, np.ndarray) and remote.dtype == local.dtype and remote.shape == local.shape
        np.testing.assert_array_equal(remote, local)
    elif isinstance(local, (list, tuple)):
        assert type(remote) is type(local) and len(remote) == len(local)
        for got, expected in zip(remote, local):
            assert_same(got, expected)
    elif isinstance(local, dict):
        assert isinstance(remote, dict) and remote.keys() == local.keys()
        for key in local:
            assert_same(remote[key], local[key])
    else:
        assert type(remote) is type(local) and remote == local


def assert_flat_same(remote: varstore.FlatBatch, local: varstore.FlatBatch) -> None:
    assert_same(remote.values, local.values)
    np.testing.assert_array_equal(remote.offsets, local.offsets)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# -- (1) round trips: every API of the remote reader equals the local one ---------------------------------

CODECS = [
    ("bytes", {}, lambda n: bytes(range(n % 256)) * (n % 3)),
    ("str", {}, lambda n: "h\u00e9llo \u65e5\u672c " * (n % 5)),
    ("ndarray", {"dtype": "|b1", "shape": (3,)}, lambda n: (np.arange(3 * (n % 4)).reshape(-1, 3) % (n % 3 + 2)) == 0),
    ("ndarray", {"dtype": "<f4", "shape": (2, 2)}, lambda n: np.arange(4 * (n % 3), dtype="<f4").reshape(-1, 2, 2) + n),
    ("msgpack", {}, lambda n: {"n": n, "tokens": list(range(n % 7)), "text": "x" * (n % 4), "raw": b"\x00" * (n % 2)}),
]


@pytest.mark.parametrize("codec, options, make", CODECS, ids=["bytes", "str", "ndarray-b1", "ndarray-f4-2x2", "msgpack"])
def test_every_api_of_every_codec_read_through_s3_equals_the_local_dataset(
    s3_server: Any, tmp_path: Path, node_cache: Path, codec: str, options: dict[str, Any], make: Callable[[int], Any]
) -> None:
    records = [make(n) for n in range(23)]
    local_dir = write_local(tmp_path / "local", records, codec, shard_records=5, metadata={"made": codec}, **options)
    url = upload(s3_server, local_dir, f"s3://{s3_server.new_bucket()}/data/set")
    local = varstore.open(str(local_dir))
    remote = varstore.open(url, storage_options=s3_server.storage_options)
    assert isinstance(remote, varstore.ShardedReader) and remote.is_remote and not local.is_remote
    assert len(remote) == len(local) == 23
    assert remote.version == local.version
    assert remote.metadata == local.metadata == {"made": codec}
    assert (remote.codec, remote.dtype, remote.shape) == (local.codec, local.dtype, local.shape)
    for index in [0, 4, 5, 22, -1, -23, -6]:
        assert_same(remote[index], local[index])
    for cut in [slice(None), slice(3, 17), slice(None, None, 3), slice(20, 2, -4), slice(-5, None), slice(7, 7), slice(4, 13, 2)]:
        assert_same(remote[cut], local[cut])
    batch = [22, 0, 5, 5, -1, 13, 4]
    assert_same(remote.get_batch(batch), local.get_batch(batch))
    assert_same(remote.get_batch(np.array([], np.int64)), local.get_batch(np.array([], np.int64)))
    assert_flat_same(remote.get_batch_flat(batch), local.get_batch_flat(batch))
    assert_flat_same(remote.get_batch_flat([6, 7, 8]), local.get_batch_flat([6, 7, 8]))
    assert_same(list(remote), list(local))
    remote_flat, local_flat = list(remote.iter_flat(3)), list(local.iter_flat(3))
    assert len(remote_flat) == len(local_flat)
    for got, expected in zip(remote_flat, local_flat):
        assert_flat_same(got, expected)
    np.testing.assert_array_equal(remote.record_sizes(), local.record_sizes())
    remote.verify()
    revived = pickle.loads(pickle.dumps(remote))
    assert revived.version == local.version and revived.is_remote
    assert_same(revived.get_batch(batch), local.get_batch(batch))
    shard = varstore.open(f"{url}/{local.manifest.shards[1].name}", storage_options=s3_server.storage_options)
    assert isinstance(shard, varstore.RemoteShard)
    assert_same(list(shard), local[5:10])
    assert_same(pickle.loads(pickle.dumps(shard))[-1], local[9])
    shard.verify()


@pytest.fixture(scope="module")
def str_dataset(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """A remote and a local reader of the same 300 records in 7 shards, for the property test."""
    root = tmp_path_factory.mktemp("str-dataset")
    records = [f"record {n} " + "y" * (n * 37 % 500) for n in range(300)]
    local_dir = write_local(root / "local", records, shard_records=45)
    url = upload(s3_server, local_dir, f"s3://{s3_server.new_bucket()}/set")
    remote = varstore.open(url, storage_options=s3_server.storage_options, cache_dir=str(root / "cache"))
    return remote, varstore.open(str(local_dir))


@settings(max_examples=15)
@given(st.lists(st.integers(-300, 299), max_size=40))
def test_random_batches_read_through_s3_equal_the_local_dataset(str_dataset: tuple[Any, Any], indices: list[int]) -> None:
    remote, local = str_dataset
    assert remote.get_batch(indices) == local.get_batch(indices)
    assert_flat_same(remote.get_batch_flat(indices), local.get_batch_flat(indices))
    if indices:
        assert remote[indices[0]] == local[indices[0]]


# -- (2) request cost, counted at the server --------------------------------------------------------------


def merged_spans(ranges: list[tuple[int, int]], max_gap: int = DEFAULT_MAX_GAP) -> list[tuple[int, int]]:
    """The requests a batch should cost: non-empty ranges sorted, joined when the hole between them is at most `max_gap`."""
    spans: list[list[int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if spans and start - spans[-1][1] <= max_gap:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    return [(start, end) for start, end in spans]


def edge_requests(data_size: int) -> list[tuple[int, int]]:
    """The GETs of a data object's first and last 4 KiB at a shard's first read (one if they lie close)."""
    length = min(fmt.EDGE_SIZE, data_size)
    return merged_spans([(0, length), (data_size - length, data_size)])


def range_header(start: int, end: int) -> str:
    return f"bytes={start}-{end - 1}"


def test_request_cost_of_open_first_read_random_read_and_batch(s3_server: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    sizes = rng.integers(200, 6000, size=4 * 700)
    records = [bytes([n % 251]) * int(size) for n, size in enumerate(sizes)]
    local_dir = write_local(tmp_path / "local", records, "bytes", shard_records=700)
    local = varstore.open(str(local_dir))
    shards = len(local.manifest.shards)
    assert shards == 4
    bucket = s3_server.new_bucket()
    url = upload(s3_server, local_dir, f"s3://{bucket}/ds")

    def requests_during(action: Callable[[], Any]) -> list[Any]:
        before = len(s3_server.requests(bucket))
        action()
        return s3_server.requests(bucket)[before:]

    opened: list[Any] = []
    opening = requests_during(lambda: opened.append(varstore.ShardedReader(url, storage_options=s3_server.storage_options)))
    reader = opened[0]
    assert [(r.method, r.key, r.range) for r in opening] == [("GET", "ds/manifest.json", range_header(0, (64 << 20) + 1))]
    # one GET of the manifest, whatever the shard count: each shard is checked at its first use (spec §4.1)
    via_open = requests_during(lambda: varstore.open(url, storage_options=s3_server.storage_options))
    assert len(via_open) == 2  # varstore.open first asks whether a manifest is there
    assert (opening[0].method, opening[0].key, opening[0].range) in [(r.method, r.key, r.range) for r in via_open]

    shard = local.shard(2)
    entry = local.manifest.shards[2]
    offsets = shard.offsets.astype(np.int64)
    first = requests_during(lambda: reader[int(local.shard_starts[2]) + 10])
    expected_first = [("GET", f"ds/{entry.name}.index", None)]
    expected_first += [("GET", f"ds/{entry.name}.data", range_header(*span)) for span in edge_requests(entry.data_size)]
    expected_first += [("GET", f"ds/{entry.name}.data", range_header(int(offsets[10]), int(offsets[11])))]
    seen = [(r.method, r.key, r.range) for r in first]
    assert len(seen) == len(expected_first) and seen[0] == expected_first[0] and seen[-1] == expected_first[-1]
    assert sorted(seen[1:-1]) == sorted(expected_first[1:-1])  # the edge GETs run concurrently

    random_read = requests_during(lambda: reader[int(local.shard_starts[2]) + 500])
    assert [(r.method, r.key, r.range) for r in random_read] == [
        ("GET", f"ds/{entry.name}.data", range_header(int(offsets[500]), int(offsets[501])))
    ]

    batch = rng.choice(700, size=64, replace=False)
    batch_requests = requests_during(lambda: reader.get_batch(batch + int(local.shard_starts[2])))
    spans = merged_spans([(int(offsets[i]), int(offsets[i + 1])) for i in batch])
    assert sorted(r.range for r in batch_requests) == sorted(range_header(*span) for span in spans)
    assert all(r.method == "GET" and r.key == f"ds/{entry.name}.data" for r in batch_requests)
    assert reader.get_batch(batch + int(local.shard_starts[2])) == local.get_batch(batch + int(local.shard_starts[2]))
    costs = dict(
        open_requests=len(opening),
        first_read_requests=len(first),
        index_bytes=entry.index_size,
        edge_bytes=sum(end - start for start, end in edge_requests(entry.data_size)),
        batch_requests=len(batch_requests),
        batch_bytes=sum(end - start for start, end in spans),
        batch_payload=int(sum(offsets[i + 1] - offsets[i] for i in batch)),
    )
    print("request costs (pytest -s shows them):", costs)


# -- (3) faults through the proxy ---------------------------------------------------------------------------

FAULTS: dict[str, Callable[[FaultProxy, Any, str], Any]] = {
    "reset": lambda proxy, times, path: proxy.reset(times=times, method="GET", path=path),
    "slow_down": lambda proxy, times, path: proxy.slow_down(times=times, method="GET", path=path),
    "server_error": lambda proxy, times, path: proxy.server_error(times=times, method="GET", path=path),
    "truncate": lambda proxy, times, path: proxy.truncate(10, times=times, method="GET", path=path),
}


@pytest.fixture
def faulty_dataset(s3_server: Any, tmp_path: Path, fault_proxy: Callable[[str], FaultProxy]) -> dict[str, Any]:
    """A 3-shard dataset behind a fault proxy: its URL, the proxy, the options that go through it, the local copy."""
    records = [f"record {n} " * 100 for n in range(60)]  # shards of ~20 KB: larger than their edges, read by ranges
    local_dir = write_local(tmp_path / "local", records, shard_records=20)
    bucket = s3_server.new_bucket()
    url = upload(s3_server, local_dir, f"s3://{bucket}/ds")
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "endpoint_url": proxy.url}
    return {"url": url, "bucket": bucket, "proxy": proxy, "options": options, "local": varstore.open(str(local_dir)), "dir": local_dir}


def cached_files(cache: Path, tail: str) -> list[Path]:
    return [Path(path) for path in glob.glob(str(cache / f"*-{tail}"))]


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("target", ["index", "record", "manifest"])
def test_transient_fault_is_retried_and_a_persistent_one_is_a_storage_error_that_caches_nothing_wrong(
    faulty_dataset: dict[str, Any], node_cache: Path, fault: str, target: str
) -> None:
    url, proxy, options, local = faulty_dataset["url"], faulty_dataset["proxy"], faulty_dataset["options"], faulty_dataset["local"]
    bucket = faulty_dataset["bucket"]
    object_name = {"index": "shard-000001.index", "record": "shard-000001.data", "manifest": "manifest.json"}[target]
    path = f"/{bucket}/ds/{object_name}"

    def faulted_read(times: int | None) -> list[Any]:
        """Open a reader, then read while the next `times` GETs of the target fail (the open's header reads
        of an index object pass: the fault meets the index's own download, or a record's ranged GET)."""
        if target == "manifest":
            FAULTS[fault](proxy, times, path)
            return varstore.ShardedReader(url, storage_options=options, cache_dir=str(cache)).get_batch([0, 25, 59])
        reader = varstore.ShardedReader(url, storage_options=options, cache_dir=str(cache))
        if target == "record":
            reader[20]  # index and edges of shard 1 cached: the fault meets a record GET
        FAULTS[fault](proxy, times, path)
        return reader.get_batch([0, 25, 59])

    cache = node_cache / "transient"
    before = proxy.count("GET", path)
    assert faulted_read(2) == local.get_batch([0, 25, 59])
    assert proxy.count("GET", path) - before >= 3  # two faulted, then served
    proxy.clear_rules()

    cache = node_cache / "persistent"
    with pytest.raises(StorageError) as caught:
        faulted_read(None)
    assert f"{url}/{object_name}" in str(caught.value)
    proxy.clear_rules()
    reader = varstore.ShardedReader(url, storage_options=options, cache_dir=str(cache))
    assert reader.get_batch([0, 25, 59]) == local.get_batch([0, 25, 59])
    (index,) = cached_files(cache, "shard-000001_index")
    assert index.read_bytes() == (faulty_dataset["dir"] / "shard-000001.index").read_bytes()
    assert not [name for name in os.listdir(cache) if ".varstore-tmp" in name]


@pytest.mark.parametrize("target", ["index", "record"])
def test_storage_that_stops_answering_is_a_storage_error_not_a_replaced_dataset(
    faulty_dataset: dict[str, Any], target: str
) -> None:
    """A failed read asks whether the dataset was replaced; when the manifest cannot be fetched either (every GET
    answered 503), that is an outage, not a replacement."""
    url, proxy = faulty_dataset["url"], faulty_dataset["proxy"]
    reader = varstore.ShardedReader(url, storage_options=faulty_dataset["options"])
    assert reader[0] == faulty_dataset["local"][0]
    proxy.slow_down(times=None, method="GET")
    object_url = f"{url}/shard-000001.index" if target == "index" else f"{url}/shard-000000.data"
    with pytest.raises(StorageError) as caught:
        reader[25] if target == "index" else reader[1]
    assert not isinstance(caught.value, DatasetReplacedError)
    assert object_url in str(caught.value)


# -- (4) a reader killed mid-download -------------------------------------------------------------------------

READER_CHILD = """
import json, sys, varstore
url, options = sys.argv[1], json.loads(sys.argv[2])
reader = varstore.ShardedReader(url, storage_options=options)
if sys.argv[3] == "data":
    reader[0]
print("ready", flush=True)
sys.stdin.readline()
reader.fetch_shard(0) if sys.argv[3] == "data" else reader[0]
print("done", flush=True)
"""


@pytest.mark.parametrize("held", ["index", "data"])
def test_reader_killed_while_downloading_leaves_no_final_file_and_the_next_reader_succeeds(
    faulty_dataset: dict[str, Any], node_cache: Path, held: str
) -> None:
    url, proxy, options, local = faulty_dataset["url"], faulty_dataset["proxy"], faulty_dataset["options"], faulty_dataset["local"]
    path = f"/{faulty_dataset['bucket']}/ds/shard-000000.{held}"
    child = subprocess.Popen(
        [sys.executable, "-c", READER_CHILD, url, json.dumps(options), held],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "VARSTORE_CACHE_DIR": str(node_cache)},
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n"
        before = proxy.count("GET", path)
        proxy.delay(DEADLINE_SECONDS, times=1, method="GET", path=path)
        child.stdin.write("go\n")
        child.stdin.flush()
        wait_until(lambda: proxy.count("GET", path) > before, f"the child's GET of {path}")
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=DEADLINE_SECONDS) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=DEADLINE_SECONDS)
    tail = f"shard-000000_{held}"
    assert cached_files(node_cache, tail) == []  # at most a temporary and a lock, never the final name
    proxy.clear_rules()
    reader = varstore.ShardedReader(url, storage_options=options)
    assert reader[:20] == local[:20]
    reader.fetch_shard(0)
    (cached,) = cached_files(node_cache, tail)
    assert cached.read_bytes() == (faulty_dataset["dir"] / f"shard-000000.{held}").read_bytes()


# -- (5) replaced and hostile datasets -------------------------------------------------------------------------


@pytest.fixture
def old_and_new(s3_server: Any, tmp_path: Path) -> dict[str, Any]:
    """Two local datasets with the same shard names: old records long, new ones short (smaller objects)."""
    old = write_local(tmp_path / "old", [f"old record {n:04d} " * 3 for n in range(60)], shard_records=20)
    new = write_local(tmp_path / "new", [f"n{n}" for n in range(60)], shard_records=20)
    return {"old": old, "new": new, "url": f"s3://{s3_server.new_bucket()}/ds", "options": s3_server.storage_options}


def test_dataset_overwritten_under_an_open_reader_is_replaced_never_new_records_as_old(
    s3_server: Any, old_and_new: dict[str, Any]
) -> None:
    """The same shard names, shorter records: each read below, by a reader opened on the old version, either
    raises DatasetReplacedError or (none here can) returns old records."""
    url = upload(s3_server, old_and_new["old"], old_and_new["url"])
    old = varstore.open(str(old_and_new["old"]))
    readers = [varstore.open(url, storage_options=old_and_new["options"], cache_limit=RANGES_ONLY) for _ in range(6)]
    for reader in readers:
        assert reader[0] == old[0]
    upload(s3_server, old_and_new["new"], url)
    actions: list[Callable[[Any], Any]] = [
        lambda reader: reader[19],  # an opened shard, past the end of the new, shorter data object
        lambda reader: reader[30],  # a shard not opened yet
        lambda reader: reader.get_batch([1, 2, 45]),
        lambda reader: list(reader),
        lambda reader: reader.verify(),
        lambda reader: pickle.loads(pickle.dumps(reader))[0],
    ]
    for reader, action in zip(readers, actions):
        with pytest.raises(DatasetReplacedError):
            action(reader)


def test_old_objects_deleted_under_an_open_reader_give_dataset_replaced(s3_server: Any, old_and_new: dict[str, Any]) -> None:
    url = upload(s3_server, old_and_new["old"], old_and_new["url"])
    reader = varstore.open(url, storage_options=old_and_new["options"], cache_limit=RANGES_ONLY)
    assert reader[0] == varstore.open(str(old_and_new["old"]))[0]
    for name in os.listdir(old_and_new["old"]):
        remove_object(s3_server, f"{url}/{name}")
    upload(s3_server, write_local(old_and_new["old"].parent / "other", ["x"] * 7, shard_records=7), url)
    for action in (lambda: reader[1], lambda: reader[45]):
        with pytest.raises(DatasetReplacedError):
            action()


def test_overwrite_by_varstores_writer_without_record_checksums_never_gives_an_open_reader_new_records(
    s3_server: Any,
) -> None:
    """Without record checksums nothing checks a ranged read, so the guarantee rests on the remote writer: an
    overwrite writes new shard names and deletes the old objects only after its manifest lands."""
    url = f"s3://{s3_server.new_bucket()}/ds"
    options = s3_server.storage_options
    old = [f"old {n:04d}" for n in range(40)]
    with varstore.ShardedWriter(url, "str", max_shard_records=20, checksums=False, storage_options=options) as writer:
        writer.extend(old)
    reader = varstore.open(url, storage_options=options)
    assert reader[0] == old[0]
    with varstore.ShardedWriter(
        url, "str", max_shard_records=20, checksums=False, overwrite=True, storage_options=options
    ) as writer:
        writer.extend(f"new {n:04d}" for n in range(40))
    for index in (1, 19, 20, 39):
        try:
            assert reader[index] == old[index]
        except DatasetReplacedError:
            pass


def test_full_cache_disk_is_a_storage_error_naming_the_object_and_caches_nothing(s3_server: Any, tmp_path: Path) -> None:
    from tests.helpers_tmpfs import fill, mounted_tmpfs

    records = [f"record {n} " * 40 for n in range(100)]
    local = write_local(tmp_path / "local", records, shard_records=50)
    url = upload(s3_server, local, f"s3://{s3_server.new_bucket()}/ds")
    with mounted_tmpfs(256 << 10) as root:
        cache = root / "cache"
        reader = varstore.open(url, storage_options=s3_server.storage_options, cache_dir=str(cache))
        fill(root)
        with pytest.raises(StorageError, match="No space left") as caught:
            reader[0]
        assert f"{url}/shard-000000.index" in str(caught.value)
        assert [name for name in os.listdir(cache) if not name.endswith((".lock", "-manifest_json"))] == []
        os.unlink(root / "filler")
        assert reader[0] == records[0] and reader.get_batch([99, 3]) == [records[99], records[3]]
        (index,) = cached_files(cache, "shard-000000_index")
        assert index.read_bytes() == (local / "shard-000000.index").read_bytes()


def test_record_object_rewritten_in_place_with_the_same_size_is_caught_by_record_checksums(
    s3_server: Any, tmp_path: Path
) -> None:
    old = write_local(tmp_path / "old", [f"old {n:04d}" for n in range(40)], shard_records=20)
    new = write_local(tmp_path / "new", [f"new {n:04d}" for n in range(40)], shard_records=20)
    assert (old / "shard-000000.data").stat().st_size == (new / "shard-000000.data").stat().st_size
    url = upload(s3_server, old, f"s3://{s3_server.new_bucket()}/ds")
    reader = varstore.open(url, storage_options=s3_server.storage_options, cache_limit=RANGES_ONLY)
    shard = varstore.open(f"{url}/shard-000000", storage_options=s3_server.storage_options, cache_limit=RANGES_ONLY)
    assert reader[0] == shard[0] == "old 0000"
    put_object(s3_server, f"{url}/shard-000000.data", (new / "shard-000000.data").read_bytes())
    for read in (lambda: reader[1], lambda: reader.get_batch([2, 3]), lambda: shard[1], lambda: shard.get_batch_flat([4])):
        with pytest.raises(CorruptRecordError, match="checksum"):
            read()


@pytest.mark.parametrize(
    "forgery, error",
    [
        ("data size 2**62", FormatError),
        ("index size 2**62", FormatError),
        ("records 2**62", FormatError),
        ("missing data object", MissingFileError),
        ("missing index object", MissingFileError),
        ("manifest over 64 MiB", FormatError),
        ("manifest.json is a directory", MissingFileError),
        ("index object of 10 bytes", FormatError),
        ("index listed as 10 bytes", FormatError),
        ("empty manifest", FormatError),
        ("shard alone with an index of 10 bytes", FormatError),
    ],
)
def test_forged_dataset_is_a_clear_error_without_a_huge_allocation_or_a_hang(
    s3_server: Any, tmp_path: Path, forgery: str, error: type[VarstoreError]
) -> None:
    local = write_local(tmp_path / "local", [f"r{n}" for n in range(30)], shard_records=10)
    url = upload(s3_server, local, f"s3://{s3_server.new_bucket()}/ds")
    manifest = unsigned_manifest(local)
    second = manifest["shards"][1]
    if forgery.startswith("data size"):
        second["data_size"] = 2**62
    elif forgery.startswith("index size"):
        second["index_size"] = 2**62
    elif forgery.startswith("records"):
        second["records"] = 2**62
    elif forgery == "missing data object":
        remove_object(s3_server, f"{url}/shard-000001.data")
    elif forgery == "missing index object":
        remove_object(s3_server, f"{url}/shard-000001.index")
    elif forgery == "manifest over 64 MiB":
        put_object(s3_server, f"{url}/manifest.json", b" " * ((64 << 20) + 1))
    elif forgery == "manifest.json is a directory":
        remove_object(s3_server, f"{url}/manifest.json")
        put_object(s3_server, f"{url}/manifest.json/inner", json.dumps(manifest).encode())
    elif forgery == "index object of 10 bytes":
        put_object(s3_server, f"{url}/shard-000001.index", b"x" * 10)
    elif forgery == "index listed as 10 bytes":
        second["index_size"] = 10
        put_object(s3_server, f"{url}/shard-000001.index", b"x" * 10)
    elif forgery == "empty manifest":
        put_object(s3_server, f"{url}/manifest.json", b"")
    elif forgery == "shard alone with an index of 10 bytes":
        put_object(s3_server, f"{url}/shard-000001.index", b"x" * 10)
        url = f"{url}/shard-000001"
    if forgery.endswith("2**62") or forgery == "index listed as 10 bytes":
        put_object(s3_server, f"{url}/manifest.json", json.dumps(manifest).encode())
    tracemalloc.start()
    try:
        with pytest.raises(error) as caught:
            reader = varstore.open(url, storage_options=s3_server.storage_options)
            for start in reader.shard_starts[:-1] if isinstance(reader, varstore.ShardedReader) else [0]:
                reader[int(start)]  # each shard is checked against its entry at its first read
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert url in str(caught.value)
    assert peak < (32 << 20) + (3 * (64 << 20) if forgery == "manifest over 64 MiB" else 0)  # a client; the body read


# -- (6) refusals and imports ----------------------------------------------------------------------------------


def test_storage_options_for_a_local_path_are_refused(tmp_path: Path) -> None:
    local = write_local(tmp_path / "local", ["a"], shard_records=1)
    for options in ({"storage_options": {}}, {"cache_dir": str(tmp_path)}, {"cache_limit": 10}):
        with pytest.raises(VarstoreError, match="apply to URLs"):
            varstore.open(str(local), **options)
        with pytest.raises(VarstoreError, match="apply to URLs"):
            varstore.ShardedReader(str(local), **options)


def test_import_varstore_does_not_import_fsspec() -> None:
    code = "import sys, varstore; print(sorted(m for m in sys.modules if m.split('.')[0] in ('fsspec', 's3fs', 'botocore', 'aiohttp')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=DEADLINE_SECONDS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def _whole_data_gets(s3_server: Any, bucket: str) -> dict[str, int]:
    """GETs without a Range header of each data object: downloads of the whole object."""
    counts: dict[str, int] = {}
    for request in s3_server.requests(bucket, method="GET"):
        if request.key.endswith(fmt.DATA_SUFFIX) and request.range is None:
            counts[request.key] = counts.get(request.key, 0) + 1
    return counts


def _shuffled_epoch(reader: Any, batch: int = 16, seed: int = 0) -> list[Any]:
    order = np.random.default_rng(seed).permutation(len(reader))
    return [record for start in range(0, len(order), batch) for record in reader.get_batch(order[start : start + batch])]


def test_a_shuffled_epoch_fetches_each_shard_whole_once_when_the_cache_can_hold_the_dataset(s3_server, tmp_path):
    """Past a sixteenth of a shard read by ranges, its data object comes whole into the node cache, once, in the
    background; the records are right throughout."""
    records = [f"{index:05d}" * 40 for index in range(400)]
    url = upload(s3_server, write_local(tmp_path / "local", records, shard_records=100), f"s3://{s3_server.new_bucket()}/ds")
    bucket = url.split("/")[2]
    reader = varstore.open(url, storage_options=s3_server.storage_options, cache_dir=tmp_path / "cache")
    assert _shuffled_epoch(reader) == [records[index] for index in np.random.default_rng(0).permutation(400)]
    wait_until(lambda: len(_whole_data_gets(s3_server, bucket)) == 4, "every shard fetched whole")
    assert _shuffled_epoch(reader, seed=1) == [records[index] for index in np.random.default_rng(1).permutation(400)]
    assert set(_whole_data_gets(s3_server, bucket).values()) == {1}


def test_reads_stay_ranged_when_the_dataset_is_larger_than_the_cache_limit_and_a_few_reads_fetch_no_shard(s3_server, tmp_path):
    records = [f"{index:05d}" * 40 for index in range(400)]
    url = upload(s3_server, write_local(tmp_path / "local", records, shard_records=100), f"s3://{s3_server.new_bucket()}/ds")
    bucket = url.split("/")[2]
    data_size = sum(len(record.encode()) for record in records)
    small = varstore.open(url, storage_options=s3_server.storage_options, cache_dir=tmp_path / "small", cache_limit=data_size - 1)
    assert not small.fits_in_cache
    assert _shuffled_epoch(small) == [records[index] for index in np.random.default_rng(0).permutation(400)]
    roomy = varstore.open(url, storage_options=s3_server.storage_options, cache_dir=tmp_path / "roomy")
    assert roomy.fits_in_cache and roomy.get_batch([3, 250, 399]) == [records[3], records[250], records[399]]
    assert _whole_data_gets(s3_server, bucket) == {}


def test_the_shards_a_batch_touches_first_open_at_once(tmp_path, monkeypatch):
    """Opening a remote shard waits on the network (its index): the shards of a first batch open together,
    not one after another under one lock. Proven with a barrier every open must reach before any finishes."""
    local = write_local(tmp_path / "local", [f"record {index}" for index in range(30)], shard_records=10)
    fs, _ = open_filesystem("memory://opening/ds")
    fs.put(str(local), "/opening/ds", recursive=True)
    remote = varstore.open("memory://opening/ds")
    barrier = threading.Barrier(3, timeout=10)
    real_open_listed = varstore.RemoteShard.open_listed.__func__

    def open_listed_at_the_barrier(cls: Any, *args: Any, **options: Any) -> Any:
        barrier.wait()
        return real_open_listed(cls, *args, **options)

    monkeypatch.setattr(varstore.RemoteShard, "open_listed", classmethod(open_listed_at_the_barrier))
    assert remote.get_batch([25, 3, 14]) == ["record 25", "record 3", "record 14"]


def test_a_reader_of_a_node_whose_cache_holds_a_shard_reads_that_copy_without_a_request(s3_server, tmp_path):
    """Once a shard is in the node cache (fetched whole by another reader of the node, or before this reader
    dropped and reopened it), opening it reads the copy: no ranged GET of its data, not even the open's edges."""
    records = [f"{index:05d}" * 40 for index in range(400)]
    url = upload(s3_server, write_local(tmp_path / "local", records, shard_records=100), f"s3://{s3_server.new_bucket()}/ds")
    bucket = url.split("/")[2]
    first = varstore.open(url, storage_options=s3_server.storage_options, cache_dir=tmp_path / "cache")
    first.verify()  # every data object whole into the node cache
    before = len(s3_server.requests(bucket, method="GET"))
    second = varstore.open(url, storage_options=s3_server.storage_options, cache_dir=tmp_path / "cache")
    opened = len(s3_server.requests(bucket, method="GET"))
    assert second.get_batch([399, 0, 250]) == [records[399], records[0], records[250]]
    assert list(second) == records
    assert len(s3_server.requests(bucket, method="GET")) == opened  # the reads: no request at all
    assert opened - before == 1 + 1  # the open: whether a manifest is there, and the manifest


def test_iterating_a_remote_shard_reads_a_record_larger_than_a_scan_request_whole(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan fetches runs of records of at most `_SCAN_BYTES`, or one record if it is larger: every record comes
    back once, in order (a run that could hold no record would never advance)."""
    from varstore.shard import remote_shard

    monkeypatch.setattr(remote_shard, "_SCAN_BYTES", 1000)
    records = ["a" * 10, "b" * 5000, "c" * 10, "d" * 999, "e" * 1001, "f"]
    url = upload(s3_server, write_local(tmp_path / "local", records, shard_records=len(records)), f"s3://{s3_server.new_bucket()}/ds")
    reader = varstore.ShardedReader(url, storage_options=s3_server.storage_options, cache_limit=1)
    assert list(reader) == records
    assert reader[0:6] == records
