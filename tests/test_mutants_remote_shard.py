"""`RemoteShard`'s behaviour that the mutation probe found unpinned (issue 23): which requests a small shard's open,
a whole fetch and a scan make, the row check of a ranged array read, a data object of the wrong size refused after
one download, and a closed or misused shard's refusals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import varstore
from tests.test_reader_damage import forge_shard
from tests.test_remote_reader import edge_requests, range_header, upload, write_local
from varstore.format import header as fmt
from varstore.remote.filesystems import open_filesystem
from varstore.remote.transport import FsspecTransport
from varstore.shard import remote_shard

pytestmark = pytest.mark.usefixtures("node_cache")


def upload_shard(s3_server: Any, prefix: Path, url: str) -> str:
    """Copy the local shard `prefix` (its .data and .index files) to the shard URL `url` and return `url`."""
    fs, path = open_filesystem(url, s3_server.storage_options)
    for suffix in (fmt.DATA_SUFFIX, fmt.INDEX_SUFFIX):
        fs.put_file(f"{prefix}{suffix}", f"{path}{suffix}")
    fs.invalidate_cache()
    return url


def data_gets(s3_server: Any, bucket: str, action: Callable[[], Any]) -> list[str | None]:
    """The Range headers of the GETs of any data object that `action` makes (None: the whole object)."""
    before = len(s3_server.requests(bucket))
    action()
    return [request.range for request in s3_server.requests(bucket)[before:]
            if request.method == "GET" and request.key.endswith(fmt.DATA_SUFFIX)]


def shard_of_size(s3_server: Any, tmp_path: Path, data_size: int) -> tuple[str, str, list[bytes]]:
    """A shard at s3:// whose data object is `data_size` bytes of four records: (bucket, URL, records)."""
    quarter = data_size // 4
    records = [bytes([n]) * quarter for n in range(3)] + [b"z" * (data_size - 3 * quarter)]
    with varstore.Writer(tmp_path / "shard") as writer:
        writer.extend(records)
    assert (tmp_path / "shard.data").stat().st_size == data_size
    bucket = s3_server.new_bucket()
    return bucket, upload_shard(s3_server, tmp_path / "shard", f"s3://{bucket}/shard"), records


def test_a_data_object_of_exactly_two_edges_is_fetched_whole_by_one_get_at_open_and_read_without_requests(
        s3_server: Any, tmp_path: Path) -> None:
    bucket, url, records = shard_of_size(s3_server, tmp_path, 2 * fmt.EDGE_SIZE)
    opened: list[Any] = []
    assert data_gets(s3_server, bucket, lambda: opened.append(varstore.open(url, storage_options=s3_server.storage_options))) == [None]
    read: list[Any] = []
    assert data_gets(s3_server, bucket, lambda: read.extend(opened[0][index] for index in range(4))) == []
    assert read == records


def test_a_data_object_one_byte_over_two_edges_has_only_its_edges_read_at_open(s3_server: Any, tmp_path: Path) -> None:
    data_size = 2 * fmt.EDGE_SIZE + 1
    bucket, url, _ = shard_of_size(s3_server, tmp_path, data_size)
    gets = data_gets(s3_server, bucket, lambda: varstore.open(url, storage_options=s3_server.storage_options))
    assert sorted(gets) == sorted(range_header(*span) for span in edge_requests(data_size))  # never a GET of it whole


def test_fetching_a_shard_not_yet_opened_costs_one_get_of_its_data_whole_and_no_ranged_read(
        s3_server: Any, tmp_path: Path) -> None:
    """`fetch_shard` opens the shard with its data object fetched first: the open's edge checks read that copy."""
    records = [f"record {index} " * 60 for index in range(60)]  # shards of about 12 KB: larger than their edges
    url = upload(s3_server, write_local(tmp_path / "local", records, shard_records=20), f"s3://{s3_server.new_bucket()}/ds")
    reader = varstore.open(url, storage_options=s3_server.storage_options)
    assert reader.manifest.shards[1].data_size > 2 * fmt.EDGE_SIZE
    assert data_gets(s3_server, url.split("/")[2], lambda: reader.fetch_shard(1)) == [None]
    assert data_gets(s3_server, url.split("/")[2], lambda: reader.get_batch(range(20, 40))) == []
    assert reader.get_batch(range(20, 40)) == records[20:40]


@pytest.mark.parametrize("reads", ["iteration", "slice"])
def test_a_scan_fetches_the_longest_runs_of_records_that_fit_a_scan_request(
        s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads: str) -> None:
    """Records of 300 bytes with scan requests of 1000 bytes: three records a request, the last one the rest."""
    monkeypatch.setattr(remote_shard, "_SCAN_BYTES", 1000)
    records = [bytes([index]) * 300 for index in range(10)]
    with varstore.Writer(tmp_path / "shard") as writer:
        writer.extend(records)
    bucket = s3_server.new_bucket()
    url = upload_shard(s3_server, tmp_path / "shard", f"s3://{bucket}/shard")
    shard = varstore.open(url, storage_options=s3_server.storage_options, cache_limit=1)  # reads stay ranged
    read: list[Any] = []
    scan = {"iteration": lambda: read.extend(shard), "slice": lambda: read.extend(shard[0:10])}[reads]
    assert data_gets(s3_server, bucket, scan) == [range_header(start, min(start + 900, 3000)) for start in range(0, 3000, 900)]
    assert read == records


def test_an_array_record_off_its_row_boundaries_in_the_data_object_is_refused_by_a_ranged_read_as_by_a_local_one(
        s3_server: Any, tmp_path: Path) -> None:
    """Record 1 is [1, 3) of a <u2 shard: two bytes, one row's worth, but starting mid-row (forged offsets with
    every checksum consistent). The remote read gets only its bytes, which alone would decode as one row."""
    prefix = forge_shard(tmp_path / "rows", "ndarray", bytes(range(8)), [0, 1, 3, 8], checksums=True,
                         params={"dtype": "<u2", "shape": []})
    with pytest.raises(varstore.CorruptRecordError, match="row boundaries") as local:
        varstore.open(prefix)[1]
    assert local.value.records == [1]
    url = upload_shard(s3_server, Path(prefix), f"s3://{s3_server.new_bucket()}/rows")
    shard = varstore.open(url, storage_options=s3_server.storage_options, cache_limit=1)
    for read in (lambda: shard[1], lambda: shard.get_batch([1])):
        with pytest.raises(varstore.CorruptRecordError, match="not on 2-byte row boundaries") as remote:
            read()
        assert remote.value.records == [1]


@pytest.fixture
def memory_shard(tmp_path: Path) -> tuple[varstore.RemoteShard, list[bytes]]:
    """A shard of five records at memory://, opened, and its records."""
    records = [b"one", b"two", b"three", b"four", b"five"]
    with varstore.Writer(tmp_path / "shard") as writer:
        writer.extend(records)
    fs, _ = open_filesystem("memory://mutants")
    url = f"memory://mutants/{tmp_path.name}/shard"
    for suffix in (fmt.DATA_SUFFIX, fmt.INDEX_SUFFIX):
        fs.put_file(f"{tmp_path / 'shard'}{suffix}", f"/mutants/{tmp_path.name}/shard{suffix}")
    shard = varstore.open(url)
    assert isinstance(shard, varstore.RemoteShard)
    return shard, records


def test_iter_flat_in_batches_of_one_returns_each_record_alone(memory_shard: tuple[Any, list[bytes]]) -> None:
    shard, records = memory_shard
    batches = list(shard.iter_flat(1))
    assert [len(batch.offsets) - 1 for batch in batches] == [1] * len(records)
    assert [bytes(batch.values) for batch in batches] == records


@pytest.mark.parametrize("batch_size", [0, -1])
def test_iter_flat_of_a_batch_size_below_one_is_refused_naming_it(memory_shard: tuple[Any, list[bytes]], batch_size: int) -> None:
    shard, _ = memory_shard
    with pytest.raises(varstore.RecordTypeError, match=f"batch_size must be positive, not {batch_size}"):
        next(shard.iter_flat(batch_size))


def test_a_closed_remote_shard_has_no_records_and_refuses_flat_iteration(memory_shard: tuple[Any, list[bytes]], tmp_path: Path) -> None:
    """As a closed local `Reader`: its length is 0, and a read is a `ClosedError`, never an empty result."""
    shard, _ = memory_shard
    with varstore.Writer(tmp_path / "local") as writer:
        writer.extend([b"one"])
    local = varstore.open(tmp_path / "local")
    local.close()
    shard.close()
    assert len(shard) == len(local) == 0
    with pytest.raises(varstore.ClosedError):
        next(shard.iter_flat(2))
    with pytest.raises(varstore.ClosedError):
        next(local.iter_flat(2))


def test_a_data_object_of_another_size_than_its_entry_is_refused_as_damaged_after_one_download(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a transport whose downloads do not check the object's size (memory://), the first download that fails
    asks the size with a HEAD: another size is damage at rest, a `FormatError` at once, never downloaded again."""
    records = [f"record {index}" for index in range(30)]
    local = write_local(tmp_path / "local", records, shard_records=10)
    fs, _ = open_filesystem("memory://mutants")
    root = f"/mutants/{tmp_path.name}/ds"
    fs.put(str(local), root, recursive=True)
    reader = varstore.open(f"memory:/{root}")
    entry = reader.manifest.shards[1]
    fs.pipe_file(f"{root}/{entry.name}{fmt.DATA_SUFFIX}", (local / f"{entry.name}{fmt.DATA_SUFFIX}").read_bytes() + b"!")
    downloads: list[str] = []
    real_download = FsspecTransport.download_file

    def counted_download(transport: FsspecTransport, url: str, local_path: str, *, size: int) -> None:
        downloads.append(url)
        real_download(transport, url, local_path, size=size)

    monkeypatch.setattr(FsspecTransport, "download_file", counted_download)
    with pytest.raises(varstore.FormatError, match=f"shard object is {entry.data_size + 1} bytes, the manifest says {entry.data_size}"):
        reader.fetch_shard(1)
    assert downloads.count(f"memory:/{root}/{entry.name}{fmt.DATA_SUFFIX}") == 1
    assert reader.get_batch([0, 29]) == [records[0], records[29]]  # the other shards read on
