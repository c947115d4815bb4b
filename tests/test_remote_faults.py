"""Faults of the remote path, met as a hostile or unlucky user meets them (issue 22 item 6, issue 23 item 7): every
transient fault is retried with backoff, a body's checksum failure included; a body longer than its range is
never held whole nor taken for data; a request that trickles meets its deadline; a missing bucket and refused
credentials say so.

Every S3 test runs against moto on 127.0.0.1 behind the fault proxy (tests/helpers_fault_proxy.py), which makes
the faults and counts the requests. No test sleeps to synchronise or expects a duration: a deadline test sets a
small deadline, trickles a body, and asserts the refusal and the retries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

import varstore
from tests.helpers_fault_proxy import FaultProxy, fault_proxy  # noqa: F401 - fault_proxy is a fixture
from varstore.errors import CorruptRecordError, FormatError, MissingFileError, StorageError
from varstore.remote import filesystems
from varstore.remote.filesystems import (
    DEFAULT_MAX_GAP,
    download_file,
    list_sizes,
    open_filesystem,
    read_object,
    read_range,
    read_ranges,
)

pytestmark = pytest.mark.usefixtures("node_cache")  # tests.helpers_s3: a node cache per test

pytest.importorskip("s3fs")

DATA = bytes(range(256)) * 800  # 200 KiB, every byte's value tells its offset modulo 256
ATTEMPTS = 5
DEADLINE = "0.5"  # seconds: the configured deadline of the trickle tests


class SleepRecorder:
    """An injected sleep: records the backoff delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def proxied(s3_server: Any, fault_proxy: Callable[[str], FaultProxy]) -> dict[str, Any]:
    """A fresh bucket holding DATA at `object`, reached through a fault proxy: the proxy, the bucket, the options
    through it, and (fs, path, url) of the object through it."""
    proxy = fault_proxy(s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    options = {**s3_server.storage_options, "endpoint_url": proxy.url}
    url = f"s3://{bucket}/object"
    direct, direct_path = open_filesystem(url, s3_server.storage_options)
    direct.pipe_file(direct_path, DATA)
    fs, path = open_filesystem(url, options)
    return {"proxy": proxy, "bucket": bucket, "options": options, "fs": fs, "path": path, "url": url, "direct": direct}


def gets(proxy: FaultProxy, path: str) -> list[Any]:
    return [record for record in proxy.requests() if record.method == "GET" and record.path == path]


def write_dataset(directory: Path, records: list[str], shard_records: int) -> Path:
    with varstore.ShardedWriter(directory, "str", max_shard_records=shard_records) as writer:
        writer.extend(records)
    return directory


def upload(fs: Any, root: str, local: Path) -> None:
    for name in sorted(os.listdir(local)):
        fs.put_file(str(local / name), f"{root}/{name}")
    fs.invalidate_cache()


@pytest.fixture
def dataset(proxied: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """A 3-shard dataset at s3://BUCKET/ds (uploaded around the proxy, with the checksums botocore stores), its
    records, and the proxy in front of it."""
    records = [f"record {n} " * 100 for n in range(60)]  # shards of ~20 KB: larger than their edges
    local = write_dataset(tmp_path / "local", records, 20)
    return {**proxied, "records": records, "local": local, "ds": f"s3://{proxied['bucket']}/ds"}


@pytest.fixture
def uploaded(dataset: dict[str, Any], s3_server: Any) -> dict[str, Any]:
    direct, root = open_filesystem(dataset["ds"], s3_server.storage_options)
    upload(direct, root, dataset["local"])
    dataset["proxy"].clear_counters()
    return dataset


# -- a body that fails botocore's own checksum check is retried ------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("operation", ["read_object", "download_file"])
def test_a_body_failing_botocores_checksum_once_is_retried(proxied: dict[str, Any], tmp_path: Path, operation: str) -> None:
    """botocore checks a whole object's stored checksum (FlexibleChecksumError): that was a permanent failure, a
    StorageError at once, though a flipped bit on the way is the most transient fault there is."""
    proxy, fs, path, url = proxied["proxy"], proxied["fs"], proxied["path"], proxied["url"]
    rule = proxy.damage(1000, times=1, method="GET")
    if operation == "read_object":
        assert read_object(fs, path, url=url, max_size=1 << 20, sleep=SleepRecorder()) == DATA
    else:
        download_file(fs, path, str(tmp_path / "downloaded"), url=url, size=len(DATA), sleep=SleepRecorder())
        assert (tmp_path / "downloaded").read_bytes() == DATA
    assert rule.fired == 1
    assert [record.fault for record in gets(proxy, f"/{proxied['bucket']}/object")] == ["damage", None]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", ["manifest at open", "index at the first read", "data at verify"])
def test_a_damaged_body_once_costs_a_retry_not_the_read(uploaded: dict[str, Any], node_cache: Path, target: str) -> None:
    proxy, bucket, url, options, records = (uploaded[key] for key in ("proxy", "bucket", "ds", "options", "records"))
    names = {"manifest at open": "manifest.json", "index at the first read": "shard-000001.index", "data at verify": "shard-000001.data"}
    name = names[target]
    path = f"/{bucket}/ds/{name}"
    if target == "manifest at open":
        proxy.damage(10, times=1, method="GET", path=path)
    reader = varstore.ShardedReader(url, storage_options=options)
    if target == "index at the first read":
        proxy.damage(10, times=1, method="GET", path=path)
    assert reader[25] == records[25]
    if target == "data at verify":
        proxy.damage(10, times=1, method="GET", path=path)
        reader.verify()
    whole = [record.fault for record in gets(proxy, path) if record.range is None or name == "manifest.json"]
    assert whole[:2] == ["damage", None]
    assert not [entry for entry in os.listdir(node_cache) if ".varstore-tmp" in entry]


@pytest.mark.timeout(60)
def test_a_record_whose_ranged_body_arrives_damaged_once_is_read_again(uploaded: dict[str, Any]) -> None:
    """A ranged GET carries no checksum botocore checks; the record's CRC32C catches the flipped bit, and the
    record is fetched again (it was raised as CorruptRecordError, and skipped under on_damaged='skip')."""
    proxy, bucket, records = uploaded["proxy"], uploaded["bucket"], uploaded["records"]
    reader = varstore.ShardedReader(uploaded["ds"], storage_options=uploaded["options"], cache_limit=1)
    assert reader[20] == records[20]  # index and edges of shard 1 cached
    path = f"/{bucket}/ds/shard-000001.data"
    before = len(gets(proxy, path))
    proxy.damage(3, times=1, method="GET", path=path)
    assert reader.get_batch([25, 26]) == [records[25], records[26]]
    assert [record.fault for record in gets(proxy, path)[before:]] == ["damage", None]


@pytest.mark.timeout(60)
def test_a_record_damaged_at_rest_is_still_refused_after_bounded_reads(uploaded: dict[str, Any], s3_server: Any) -> None:
    proxy, bucket, records = uploaded["proxy"], uploaded["bucket"], uploaded["records"]
    reader = varstore.ShardedReader(uploaded["ds"], storage_options=uploaded["options"], cache_limit=1)
    assert reader[20] == records[20]
    path = f"/{bucket}/ds/shard-000001.data"
    before = len(gets(proxy, path))
    proxy.damage(3, times=None, method="GET", path=path)
    with pytest.raises(CorruptRecordError, match="checksum") as raised:
        reader[25]
    assert raised.value.records == [5]  # the shard's own record number
    assert len(gets(proxy, path)) - before == ATTEMPTS


@pytest.mark.timeout(60)
def test_a_large_download_comes_in_blocks_and_a_retry_fetches_only_the_damaged_one(
    s3_server: Any, proxied: dict[str, Any], tmp_path: Path
) -> None:
    """Past s3fs's block size (here 64 KiB) a download is one ranged GET per block, concurrent; a block cut short
    is fetched again alone, and a block answered whole (Range ignored) is refused unread."""
    proxy, bucket, url = proxied["proxy"], proxied["bucket"], proxied["url"]
    fs, path = open_filesystem(url, {**proxied["options"], "default_block_size": 64 << 10})
    target = tmp_path / "downloaded"
    proxy.truncate(100, times=1, method="GET", path=f"/{bucket}/object")
    download_file(fs, path, str(target), url=url, size=len(DATA), sleep=SleepRecorder())
    assert target.read_bytes() == DATA
    ranges = [record.range for record in gets(proxy, f"/{bucket}/object")]
    blocks = [f"bytes={start}-{min(start + (64 << 10), len(DATA)) - 1}" for start in range(0, len(DATA), 64 << 10)]
    assert sorted(ranges) == sorted(blocks + [ranges[0]]) and len(ranges) == len(blocks) + 1
    proxy.clear_counters()
    proxy.ignore_range(times=None, method="GET")
    with pytest.raises(StorageError, match="ignored the Range header"):
        download_file(fs, path, str(target), url=url, size=len(DATA), sleep=SleepRecorder())
    assert len(gets(proxy, f"/{bucket}/object")) == ATTEMPTS * len(blocks)


@pytest.mark.timeout(60)
def test_a_download_whose_object_is_not_the_size_expected_is_refused(proxied: dict[str, Any], tmp_path: Path) -> None:
    """The caller knows the size (a manifest, an index header): a larger object is refused from its headers, not
    written to the disk whole first (a hostile server could otherwise fill it), and not asked for again: an object
    of another size is another object (a `FormatError`), no fault of the way."""
    proxy, bucket, fs, path, url = (proxied[key] for key in ("proxy", "bucket", "fs", "path", "url"))
    with pytest.raises(FormatError, match=f"the object is {len(DATA)} bytes, not the 1000 expected"):
        download_file(fs, path, str(tmp_path / "d"), url=url, size=1000, sleep=SleepRecorder())
    assert len(gets(proxy, f"/{bucket}/object")) == 1
    assert (tmp_path / "d").stat().st_size == 0


# -- a body longer than its range: never held whole, never taken for the range --------------------------------


@pytest.mark.timeout(60)
def test_a_server_that_ignores_range_never_passes_the_objects_first_bytes_for_the_range(proxied: dict[str, Any]) -> None:
    """Bytes [100, 110) asked, the whole object answered: a check that refused only short bodies returned
    bytes [0, 10)."""
    proxy, fs, path, url = proxied["proxy"], proxied["fs"], proxied["path"], proxied["url"]
    proxy.ignore_range(times=1, method="GET")
    sleep = SleepRecorder()
    assert read_range(fs, path, 100, 110, url=url, size=len(DATA), sleep=sleep) == DATA[100:110]
    assert [record.fault for record in gets(proxy, f"/{proxied['bucket']}/object")] == ["ignore_range", None]
    proxy.ignore_range(times=None, method="GET")
    with pytest.raises(StorageError, match="ignored the Range header") as raised:
        read_range(fs, path, 100, 110, url=url, size=len(DATA), sleep=sleep)
    assert url in str(raised.value) and f"failed {ATTEMPTS} times" in str(raised.value)
    assert len(gets(proxy, f"/{proxied['bucket']}/object")) == 2 + ATTEMPTS


class WholeObjectFilesystem:
    """A synchronous filesystem (as memory:// or a plain HTTP server behind fsspec) that ignores ranges."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls = 0

    def cat_ranges(self, paths: list[str], starts: list[int], ends: list[int], on_error: str) -> list[bytes]:
        self.calls += 1
        return [self.data for _ in paths]


@pytest.mark.timeout(60)
def test_a_filesystem_that_ignores_ranges_never_passes_the_objects_first_bytes_for_the_range() -> None:
    fs = WholeObjectFilesystem(DATA)
    with pytest.raises(StorageError, match=r"bytes \[100, 110\) came back as 204800 bytes"):
        read_range(fs, "object", 100, 110, url="memory://x/object", size=len(DATA), sleep=SleepRecorder())  # type: ignore[arg-type]
    assert fs.calls == ATTEMPTS


MEMORY_CHILD = """
import json, sys, tracemalloc
from varstore.errors import StorageError
from varstore.remote.filesystems import open_filesystem, read_heads, read_object, read_ranges

read, bucket, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
fs, _ = open_filesystem(f"s3://{bucket}/x", options)
paths = [f"{bucket}/object-{n}" for n in range(8)]
size = fs.size(paths[0])  # the client connects, outside the measure
tracemalloc.start()
try:
    if read == "read_heads":
        outcome = read_heads(fs, [(path, size) for path in paths], 64, url=f"s3://{bucket}", sleep=lambda _: None)
    elif read == "read_ranges":
        wanted = [(1000, 1100), (5 << 20, (5 << 20) + 64)]
        outcome = read_ranges(fs, paths[0], wanted, url=f"s3://{bucket}", size=size, sleep=lambda _: None)
    else:
        outcome = read_object(fs, paths[0], url=f"s3://{bucket}", max_size=4096, sleep=lambda _: None)
    outcome = ["bytes", [len(piece) for piece in outcome] if isinstance(outcome, list) else len(outcome)]
except StorageError as error:
    outcome = ["refused", str(error)]
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"peak": peak, "outcome": outcome}))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("read", ["read_heads", "read_ranges", "read_object"])
def test_a_server_that_ignores_range_costs_the_bytes_asked_not_the_objects(
    s3_server: Any, fault_proxy: Callable[[str], FaultProxy], read: str
) -> None:
    """8 objects of 8 MiB, 64 bytes asked of each (an open's header reads), the whole objects answered: each was
    read into memory whole (an open's peak grew by 723-758 MiB for 48 MiB objects), five times over. Now a body
    the headers say is too long is refused unread, and one is read at most a chunk past what was asked. The
    reader runs in a child process, so that its peak is not moto's (which builds each whole answer)."""
    proxy = fault_proxy(s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    direct, _ = open_filesystem(f"s3://{bucket}/x", s3_server.storage_options)
    big = os.urandom(8 << 20)
    for n in range(8):
        direct.pipe_file(f"{bucket}/object-{n}", big)
    proxy.ignore_range(times=None, method="GET")
    options = {**s3_server.storage_options, "endpoint_url": proxy.url}
    result = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, read, bucket, json.dumps(options)], capture_output=True, text=True, timeout=100
    )
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout)
    # Less than one object (8 MiB): what aiohttp buffers ahead on each of 8 connections and a chunk each. It grew
    # by 17 MiB (read_object) to 92 MiB (read_ranges) when whole bodies were read.
    assert measured["peak"] < 8 << 20, measured
    if read == "read_object":  # a manifest of at most 4096 bytes: the object is larger, and the caller sees that, no more
        assert measured["outcome"] == ["bytes", 4097]
    else:
        assert measured["outcome"][0] == "refused" and "ignored the Range header" in measured["outcome"][1]
    assert {record.fault for record in proxy.requests() if record.method == "GET"} == {"ignore_range"}


# -- merging: ranges exactly 64 KiB apart share a request ------------------------------------------------------


@pytest.mark.timeout(60)
def test_ranges_exactly_max_gap_apart_share_one_request_and_one_byte_more_does_not(
    s3_server: Any, proxied: dict[str, Any]
) -> None:
    fs, path, url, bucket = proxied["fs"], proxied["path"], proxied["url"], proxied["bucket"]
    near = [(10, 20), (20 + DEFAULT_MAX_GAP, 30 + DEFAULT_MAX_GAP)]
    far = [(10, 20), (21 + DEFAULT_MAX_GAP, 31 + DEFAULT_MAX_GAP)]
    before = len(s3_server.requests(bucket, method="GET", key="object"))
    assert read_ranges(fs, path, near, url=url, size=len(DATA)) == [DATA[start:end] for start, end in near]
    merged = s3_server.requests(bucket, method="GET", key="object")[before:]
    assert [request.range for request in merged] == [f"bytes=10-{29 + DEFAULT_MAX_GAP}"]
    assert read_ranges(fs, path, far, url=url, size=len(DATA)) == [DATA[start:end] for start, end in far]
    apart = s3_server.requests(bucket, method="GET", key="object")[before + 1 :]
    assert sorted(request.range for request in apart) == sorted(["bytes=10-19", f"bytes={21 + DEFAULT_MAX_GAP}-{30 + DEFAULT_MAX_GAP}"])


# -- the request deadline: a trickled body is cut off and retried ------------------------------------------------


def _deadline_operations(proxied: dict[str, Any], tmp_path: Path) -> dict[str, Callable[[Callable[[float], None]], Any]]:
    fs, path, url, bucket = proxied["fs"], proxied["path"], proxied["url"], proxied["bucket"]
    return {
        "read_range": lambda sleep: read_range(fs, path, 0, 64, url=url, size=len(DATA), sleep=sleep) == DATA[:64],
        "read_object": lambda sleep: read_object(fs, path, url=url, max_size=1 << 20, sleep=sleep) == DATA,
        "download_file": lambda sleep: download_file(fs, path, str(tmp_path / "d"), url=url, size=len(DATA), sleep=sleep) is None
        and (tmp_path / "d").read_bytes() == DATA,
        "download_file of unknown size": lambda sleep: download_file(fs, path, str(tmp_path / "u"), url=url, sleep=sleep) is None
        and (tmp_path / "u").read_bytes() == DATA,
        "list_sizes": lambda sleep: list_sizes(fs, bucket, url=f"s3://{bucket}", sleep=sleep) == {"object": len(DATA)},
    }


@pytest.mark.timeout(120, method="signal")  # a read with no deadline never ends: fail this test alone
@pytest.mark.parametrize("operation", ["read_range", "read_object", "download_file", "download_file of unknown size", "list_sizes"])
@pytest.mark.parametrize("backend", ["s3", "other asynchronous"])
def test_a_trickled_body_meets_the_request_deadline_and_is_retried(
    proxied: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str, backend: str
) -> None:
    """A byte every 0.2 s never trips a socket timeout; without an overall deadline the read lived as long as the
    body took (for ever, for a server that trickles for ever). With the deadline at 0.5 s: one trickled answer
    costs a retry; a server that always trickles costs exactly the attempts, then a StorageError that says so."""
    if backend != "s3":
        monkeypatch.setattr(filesystems, "_is_s3", lambda fs: False)  # the path of gs://, az://, http(s)://
    monkeypatch.setenv("VARSTORE_REQUEST_DEADLINE", DEADLINE)
    proxy = proxied["proxy"]
    action = _deadline_operations(proxied, tmp_path)[operation]
    proxied["fs"].ls(proxied["bucket"])  # the client exists (making it can take longer than this deadline)
    proxy.clear_counters()
    proxy.trickle(0.2, chunk_bytes=1, times=1, method="GET")
    sleep = SleepRecorder()
    assert action(sleep)
    assert [record.fault for record in proxy.requests() if record.method == "GET"] == ["trickle", None]
    assert len(sleep.delays) == 1
    proxy.clear_counters()
    proxy.trickle(0.2, chunk_bytes=1, times=None, method="GET")
    with pytest.raises(StorageError, match=f"failed {ATTEMPTS} times.*deadline") as raised:
        action(SleepRecorder())
    assert "VARSTORE_REQUEST_DEADLINE" in str(raised.value)
    assert [record.fault for record in proxy.requests() if record.method == "GET"] == ["trickle"] * ATTEMPTS


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
def test_a_deadline_that_is_not_a_positive_number_of_seconds_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("VARSTORE_REQUEST_DEADLINE", value)
    with pytest.raises(varstore.errors.VarstoreError, match="VARSTORE_REQUEST_DEADLINE"):
        filesystems.request_deadline()


@pytest.mark.timeout(60)
def test_the_default_deadline_is_generous_and_grows_with_the_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VARSTORE_REQUEST_DEADLINE", raising=False)
    assert filesystems.request_deadline() == 300
    assert filesystems.request_deadline(1 << 30) == 300 + 1024
    monkeypatch.setenv("VARSTORE_REQUEST_DEADLINE", "30")
    assert filesystems.request_deadline(1 << 20) == 31


# -- a missing bucket, refused credentials ------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_missing_bucket_is_named_for_the_writer_and_the_reader(s3_server: Any, fault_proxy: Callable[[str], FaultProxy]) -> None:
    """It read "uploading .../.varstore-journal: no such object" (a MissingFileError): nothing said the bucket
    was not there, nor that it must be created first. Not retried either."""
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "endpoint_url": proxy.url}
    bucket = f"{s3_server.new_bucket()}-missing"
    url = f"s3://{bucket}/ds"
    with pytest.raises(StorageError, match=f"the bucket '{bucket}' does not exist; create it first") as raised:
        with varstore.ShardedWriter(url, "str", storage_options=options) as writer:
            writer.append("x")
    assert not isinstance(raised.value, MissingFileError)
    before = proxy.count()
    with pytest.raises(StorageError, match=f"the bucket '{bucket}' does not exist") as raised:
        varstore.ShardedReader(url, storage_options=options)
    assert not isinstance(raised.value, MissingFileError)
    assert proxy.count() - before == 1  # not retried, nothing else asked


@pytest.mark.timeout(120)
def test_a_missing_bucket_is_named_by_cp(s3_server: Any, tmp_path: Path) -> None:
    local = write_dataset(tmp_path / "local", ["a", "b"], 1)
    bucket = f"{s3_server.new_bucket()}-missing"
    result = subprocess.run(
        [sys.executable, "-m", "varstore", "cp", str(local), f"s3://{bucket}/ds"],
        capture_output=True, text=True, timeout=100, env={**os.environ, "AWS_ENDPOINT_URL": s3_server.endpoint_url},
    )
    assert result.returncode == 1, result
    assert f"the bucket '{bucket}' does not exist" in result.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "code, said",
    [
        ("InvalidAccessKeyId", "the store refused the credentials \\(InvalidAccessKeyId"),
        ("SignatureDoesNotMatch", "the store refused the credentials \\(SignatureDoesNotMatch"),
        ("AccessDenied", "access denied"),
    ],
)
def test_refused_credentials_say_so_and_are_not_retried(uploaded: dict[str, Any], code: str, said: str) -> None:
    proxy = uploaded["proxy"]
    proxy.error(403, code, "refused by the fault proxy", times=None)
    with pytest.raises(StorageError, match=said) as raised:
        varstore.ShardedReader(uploaded["ds"], storage_options=uploaded["options"])
    assert f"{uploaded['ds']}/manifest.json" in str(raised.value)
    if code != "AccessDenied":
        assert "key and secret" in str(raised.value)
    assert proxy.count() == 1


# -- every transient HTTP status is retried, and a permanent one is not -----------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_each_transient_http_status_once_costs_a_retry_not_the_read(proxied: dict[str, Any], status: int) -> None:
    proxy, fs, path, url = proxied["proxy"], proxied["fs"], proxied["path"], proxied["url"]
    proxy.error(status, "TransientByStatus", times=1, method="GET")
    sleep = SleepRecorder()
    assert read_range(fs, path, 100, 110, url=url, size=len(DATA), sleep=sleep) == DATA[100:110]
    assert [record.fault for record in gets(proxy, f"/{proxied['bucket']}/object")] == ["error", None]


@pytest.mark.timeout(60)
def test_a_permanent_http_status_is_not_retried(proxied: dict[str, Any]) -> None:
    proxy, fs, path, url = proxied["proxy"], proxied["fs"], proxied["path"], proxied["url"]
    proxy.error(400, "BadRequestByStatus", times=None, method="GET")
    with pytest.raises(StorageError):
        read_range(fs, path, 100, 110, url=url, size=len(DATA), sleep=SleepRecorder())
    assert len(gets(proxy, f"/{proxied['bucket']}/object")) == 1


@pytest.mark.timeout(120)
def test_an_index_damaged_at_rest_is_downloaded_the_bounded_number_of_times_then_refused(
    dataset: dict[str, Any], s3_server: Any
) -> None:
    """The index's bytes fail the manifest's CRC32C at every download (stored damaged, with a botocore checksum of
    the damaged bytes): each of the DEFAULT_ATTEMPTS downloads is made, no more, no fewer, then the read fails."""
    direct, root = open_filesystem(dataset["ds"], s3_server.storage_options)
    upload(direct, root, dataset["local"])
    index = (dataset["local"] / "shard-000001.index").read_bytes()
    direct.pipe_file(f"{root}/shard-000001.index", index[:-1] + bytes([index[-1] ^ 1]))
    proxy = dataset["proxy"]
    proxy.clear_counters()
    reader = varstore.ShardedReader(dataset["ds"], storage_options=dataset["options"])
    with pytest.raises(varstore.VarstoreError, match=f"downloaded {ATTEMPTS} times"):
        reader[25]
    whole = [record for record in gets(proxy, f"/{dataset['bucket']}/ds/shard-000001.index") if record.range is None]
    assert len(whole) == ATTEMPTS
