"""The obstore transport (varstore/remote/obstore_transport.py) against moto's S3 on loopback behind the fault
proxy (tests/helpers_fault_proxy.py), which makes the faults and counts the requests: which URLs and options it
takes (only when VARSTORE_TRANSPORT=obstore asks for it), exact ranges and parts, every transient fault retried and counted at the server, the deadline, bounded
bodies, a missing object or bucket, refused credentials, an object of another size, fork safety and a dataset
read end to end. The rules it shares with fsspec's transport are asserted of both.

No test sleeps to synchronise or expects a duration: a deadline test sets a small deadline and trickles a body.
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
from varstore.errors import FormatError, MissingFileError, StorageError, VarstoreError
from varstore.remote import obstore_transport
from varstore.remote.filesystems import DEFAULT_MAX_GAP, open_filesystem
from varstore.remote.location import RemoteLocation
from varstore.remote.obstore_transport import ObstoreTransport
from varstore.remote.transport import FsspecTransport

pytestmark = pytest.mark.usefixtures("node_cache")  # tests.helpers_s3: a node cache per test

pytest.importorskip("obstore")
pytest.importorskip("s3fs")

DATA = bytes(range(256)) * 800  # 200 KiB, every byte's value tells its offset modulo 256
ATTEMPTS = 5
TRANSPORTS = ["obstore", "fsspec"]


def make_transport(kind: str, root: str, options: dict[str, Any]) -> Any:
    fsspec_transport = FsspecTransport(root, options)
    return ObstoreTransport(root, options, fsspec_transport) if kind == "obstore" else fsspec_transport


@pytest.fixture
def proxied(s3_server: Any, fault_proxy: Callable[[str], FaultProxy]) -> dict[str, Any]:
    """A fresh bucket holding DATA at `object`, reached through a fault proxy: the proxy, the bucket, the options
    through it, the object's URL and its path at the server."""
    proxy = fault_proxy(s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    direct, path = open_filesystem(f"s3://{bucket}/object", s3_server.storage_options)
    direct.pipe_file(path, DATA)
    options = {**s3_server.storage_options, "endpoint_url": proxy.url}
    return {"proxy": proxy, "bucket": bucket, "options": options, "root": f"s3://{bucket}", "url": f"s3://{bucket}/object",
            "path": f"/{bucket}/object"}


def requests_of(proxy: FaultProxy, path: str, method: str = "GET") -> list[Any]:
    return [record for record in proxy.requests() if record.method == method and record.path == path]


# -- which transport reads ---------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value, expected", [(None, "fsspec"), ("fsspec", "fsspec"), ("obstore", "obstore")])
def test_fsspec_reads_unless_varstore_transport_asks_for_obstore(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, value: str | None, expected: str
) -> None:
    if value is not None:
        monkeypatch.setenv("VARSTORE_TRANSPORT", value)
    assert RemoteLocation("s3://bucket/ds", storage_options=s3_server.storage_options).transport().name == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "url, extra, variables, refused",
    [
        ("s3://bucket/ds", {}, {}, None),
        ("s3a://bucket/ds", {}, {}, None),
        ("s3://bucket/ds", {"client_kwargs": {"region_name": "eu-west-1"}}, {}, None),
        ("memory://bucket/ds", {}, {}, "obstore serves s3:// here, not memory://"),
        ("s3://bucket/ds", {"config_kwargs": {"max_pool_connections": 50}}, {}, "the storage option config_kwargs="),
        ("s3://bucket/ds", {"profile": "training"}, {}, "the storage option profile='training' has no obstore equivalent"),
        ("s3://bucket/ds", {"client_kwargs": {"verify": False}}, {}, "the storage option client_kwargs="),
        ("s3://bucket/ds", {"anon": "yes"}, {}, "the storage option anon='yes'"),
        ("s3://bucket/ds", {}, {"AWS_PROFILE": "training"}, "the environment sets AWS_PROFILE"),
        ("s3://bucket/ds", {}, {"AWS_CA_BUNDLE": "/etc/ca.pem"}, "the environment sets AWS_CA_BUNDLE"),
    ],
)
def test_obstore_reads_only_where_every_option_and_setting_translates(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, url: str, extra: dict[str, Any], variables: dict[str, str],
    refused: str | None,
) -> None:
    """Asked for where it cannot read as fsspec would, obstore is an error that says why, never an option dropped."""
    monkeypatch.setenv("VARSTORE_TRANSPORT", "obstore")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    options = {**s3_server.storage_options, **extra}
    if refused is None:
        assert RemoteLocation(url, storage_options=options).transport().name == "obstore"
        return
    with pytest.raises(VarstoreError, match="VARSTORE_TRANSPORT=obstore, but obstore cannot read here") as raised:
        RemoteLocation(url, storage_options=options)
    assert refused in str(raised.value)


@pytest.mark.timeout(60)
def test_an_aws_file_botocore_would_read_keeps_obstore_out(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """botocore reads credentials, regions and endpoints from ~/.aws/config and ~/.aws/credentials; obstore reads
    neither, so where one exists obstore could not read as fsspec does."""
    assert obstore_transport.refusal("s3://bucket/ds", s3_server.storage_options) is None
    config = tmp_path / "config"
    config.write_text("[default]\nregion = eu-west-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    assert str(config) in str(obstore_transport.refusal("s3://bucket/ds", s3_server.storage_options))


@pytest.mark.timeout(60)
def test_no_region_nor_endpoint_keeps_obstore_out(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore follows a bucket's redirect to its region; obstore would fail every request of another region."""
    for name in ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    options = {"key": "testing", "secret": "testing"}
    assert "no region nor endpoint" in str(obstore_transport.refusal("s3://bucket/ds", options))
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert obstore_transport.refusal("s3://bucket/ds", options) is None


@pytest.mark.timeout(60)
def test_an_unknown_transport_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VARSTORE_TRANSPORT", "obstor")
    with pytest.raises(VarstoreError, match="VARSTORE_TRANSPORT must be one of fsspec, obstore"):
        RemoteLocation("s3://bucket/ds")


@pytest.mark.timeout(60)
def test_s3fs_options_become_the_s3_store_config() -> None:
    options = {"endpoint_url": "http://127.0.0.1:9000", "key": "K", "secret": "S", "token": "T", "anon": False,
               "client_kwargs": {"region_name": "eu-west-1"}}
    translated = obstore_transport._store_options(options, {})
    assert {name: value for name, value in translated.items() if name not in ("client_options", "retry_config")} == {
        "access_key_id": "K", "secret_access_key": "S", "session_token": "T", "skip_signature": False,
        "endpoint": "http://127.0.0.1:9000", "aws_endpoint_url_s3": "http://127.0.0.1:9000", "region": "eu-west-1",
    }
    assert translated["client_options"]["allow_http"] is True
    assert translated["retry_config"] == {"max_retries": 0}
    secure = obstore_transport._store_options({"client_kwargs": {"endpoint_url": "https://minio:9000"}}, {})
    assert secure["endpoint"] == "https://minio:9000" and secure["client_options"]["allow_http"] is False
    from_environment = obstore_transport._store_options({}, {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    assert from_environment["client_options"]["allow_http"] is True


# -- exact ranges, merged and cut into parts ----------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_each_range_comes_back_exactly_and_near_ranges_share_a_request(proxied: dict[str, Any], kind: str) -> None:
    transport = make_transport(kind, proxied["root"], proxied["options"])
    proxy, path = proxied["proxy"], proxied["path"]
    near = [(10, 20), (20 + DEFAULT_MAX_GAP, 30 + DEFAULT_MAX_GAP), (15, 18), (40, 40)]
    assert transport.read_ranges(proxied["url"], near, size=len(DATA)) == [DATA[start:end] for start, end in near]
    assert [record.range for record in requests_of(proxy, path)] == [f"bytes=10-{29 + DEFAULT_MAX_GAP}"]
    proxy.clear_counters()
    far = [(10, 20), (21 + DEFAULT_MAX_GAP, 31 + DEFAULT_MAX_GAP)]
    assert transport.read_ranges(proxied["url"], far, size=len(DATA)) == [DATA[start:end] for start, end in far]
    assert sorted(record.range for record in requests_of(proxy, path)) == sorted(
        ["bytes=10-19", f"bytes={21 + DEFAULT_MAX_GAP}-{30 + DEFAULT_MAX_GAP}"]
    )
    with pytest.raises(VarstoreError, match=r"byte range \[0, 204801\) is not within the object's 204800 bytes"):
        transport.read_ranges(proxied["url"], [(0, len(DATA) + 1)], size=len(DATA))


@pytest.mark.timeout(60)
def test_a_span_longer_than_a_part_is_cut_into_parts(proxied: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(obstore_transport, "PART_BYTES", 64 << 10)
    transport = make_transport("obstore", proxied["root"], proxied["options"])
    assert transport.read_ranges(proxied["url"], [(1, len(DATA) - 1)], size=len(DATA)) == [DATA[1:-1]]
    parts = [(start, min(start + (64 << 10), len(DATA) - 1)) for start in range(1, len(DATA) - 1, 64 << 10)]
    expected = [f"bytes={start}-{end - 1}" for start, end in parts]
    assert sorted(record.range for record in requests_of(proxied["proxy"], proxied["path"])) == sorted(expected)


@pytest.mark.timeout(60)
def test_a_small_download_is_one_get_of_the_whole_object(proxied: dict[str, Any], tmp_path: Path) -> None:
    transport = make_transport("obstore", proxied["root"], proxied["options"])
    transport.download_file(proxied["url"], str(tmp_path / "d"), size=len(DATA))
    assert (tmp_path / "d").read_bytes() == DATA
    assert [record.range for record in requests_of(proxied["proxy"], proxied["path"])] == [None]


@pytest.mark.timeout(60)
def test_a_large_download_comes_in_parts_and_a_retry_fetches_only_the_one_cut_short(
    proxied: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(obstore_transport, "PART_BYTES", 64 << 10)
    proxy, path = proxied["proxy"], proxied["path"]
    transport = make_transport("obstore", proxied["root"], proxied["options"])
    proxy.truncate(100, times=1, method="GET", path=path)
    transport.download_file(proxied["url"], str(tmp_path / "d"), size=len(DATA))
    assert (tmp_path / "d").read_bytes() == DATA
    records = requests_of(proxy, path)
    parts = [f"bytes={start}-{min(start + (64 << 10), len(DATA)) - 1}" for start in range(0, len(DATA), 64 << 10)]
    (cut,) = [record.range for record in records if record.fault == "truncate"]
    assert sorted(record.range for record in records) == sorted([*parts, cut])


# -- faults: retried, counted at the server ------------------------------------------------------------------------


FAULTS: dict[str, Callable[[FaultProxy, int | None, str], Any]] = {
    "503 SlowDown": lambda proxy, times, path: proxy.slow_down(times=times, method="GET", path=path),
    "500 InternalError": lambda proxy, times, path: proxy.server_error(times=times, method="GET", path=path),
    "429": lambda proxy, times, path: proxy.error(429, "TooManyRequests", times=times, method="GET", path=path),
    "reset": lambda proxy, times, path: proxy.reset(times=times, method="GET", path=path),
    "body cut short": lambda proxy, times, path: proxy.truncate(5, times=times, method="GET", path=path),
    "Range ignored": lambda proxy, times, path: proxy.ignore_range(times=times, method="GET", path=path),
}


def _read(kind: str, operation: str, proxied: dict[str, Any], tmp_path: Path) -> bool:
    transport = make_transport(kind, proxied["root"], proxied["options"])
    if operation == "read_ranges":
        return transport.read_ranges(proxied["url"], [(100, 110), (1 << 17, 3 << 16)], size=len(DATA)) == [
            DATA[100:110], DATA[1 << 17 : 3 << 16]
        ]
    transport.download_file(proxied["url"], str(tmp_path / "d"), size=len(DATA))
    return (tmp_path / "d").read_bytes() == DATA


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "fault, operation",
    [(fault, operation) for fault in sorted(FAULTS) for operation in ("read_ranges", "download_file")
     if (fault, operation) != ("Range ignored", "download_file")],  # a small download asks for no range
)
def test_each_transient_fault_costs_a_retry_and_a_persistent_one_exactly_the_attempts(
    proxied: dict[str, Any], tmp_path: Path, fault: str, operation: str
) -> None:
    proxy, path = proxied["proxy"], proxied["path"]
    FAULTS[fault](proxy, 1, path)
    assert _read("obstore", operation, proxied, tmp_path)
    faults = [record.fault for record in requests_of(proxy, path)]
    # Two spans, the faulted one asked again; or one GET, again.
    assert len(faults) == (3 if operation == "read_ranges" else 2) and faults.count(None) == len(faults) - 1
    proxy.clear_rules()
    proxy.clear_counters()
    FAULTS[fault](proxy, None, path)
    with pytest.raises(StorageError, match=f"failed {ATTEMPTS} times") as raised:
        _read("obstore", operation, proxied, tmp_path)
    assert proxied["url"] in str(raised.value)
    assert len(requests_of(proxy, path)) == ATTEMPTS * (2 if operation == "read_ranges" else 1)


@pytest.mark.timeout(60)
def test_a_refused_connection_is_retried_then_a_storage_error(s3_server: Any) -> None:
    options = {**s3_server.storage_options, "endpoint_url": "http://127.0.0.1:1"}
    transport = make_transport("obstore", "s3://bucket", options)
    with pytest.raises(StorageError, match=f"failed {ATTEMPTS} times, the last with: ConnectionError"):
        transport.read_ranges("s3://bucket/object", [(0, 10)], size=100)


@pytest.mark.timeout(120, method="signal")  # a read with no deadline never ends: fail this test alone
@pytest.mark.parametrize("operation", ["read_ranges", "download_file", "object_info"])
def test_a_trickled_answer_meets_the_request_deadline_and_is_retried(
    proxied: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    """A byte every 0.2 s never trips a socket timeout; with the deadline at 0.5 s one trickled answer costs a
    retry, and a server that always trickles costs exactly the attempts, then a StorageError that says so."""
    monkeypatch.setenv("VARSTORE_REQUEST_DEADLINE", "0.5")
    proxy, path = proxied["proxy"], proxied["path"]
    transport = make_transport("obstore", proxied["root"], proxied["options"])
    method = "HEAD" if operation == "object_info" else "GET"

    def read() -> bool:
        if operation == "read_ranges":
            return transport.read_ranges(proxied["url"], [(0, 64)], size=len(DATA)) == [DATA[:64]]
        if operation == "download_file":
            transport.download_file(proxied["url"], str(tmp_path / "d"), size=len(DATA))
            return (tmp_path / "d").read_bytes() == DATA
        return transport.object_info(proxied["url"]).size == len(DATA)

    assert read()  # the client exists (making it can take longer than this deadline)
    proxy.clear_counters()
    slow = (lambda times: proxy.delay(2.0, times=times, method=method, path=path)) if method == "HEAD" else (
        lambda times: proxy.trickle(0.2, chunk_bytes=1, times=times, method=method, path=path)
    )
    slow(1)
    assert read()
    assert len(requests_of(proxy, path, method)) == 2
    proxy.clear_rules()
    proxy.clear_counters()
    slow(None)
    with pytest.raises(StorageError, match=f"failed {ATTEMPTS} times.*VARSTORE_REQUEST_DEADLINE"):
        read()
    assert len(requests_of(proxy, path, method)) == ATTEMPTS


# -- bounded bodies: a server that ignores Range --------------------------------------------------------------------


MEMORY_CHILD = """
import json, os, resource, sys
from varstore.errors import StorageError
from varstore.remote.obstore_transport import ObstoreTransport
from varstore.remote.transport import FsspecTransport

operation, root, options, size = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
transport = ObstoreTransport(root, options, FsspecTransport(root, options))
transport.object_info(root + "/big")  # the client connects, outside the measure
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    if operation == "read_ranges":
        transport.read_ranges(root + "/big", [(1000, 1100), (5 << 20, (5 << 20) + 64)], size=size)
    else:
        transport.download_file(root + "/big", sys.argv[5], size=size)
    outcome = "read"
except StorageError as error:
    outcome = str(error)
print(json.dumps({"grown": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024, "outcome": outcome}))
sys.stdout.flush()
os._exit(0)  # not through the interpreter's teardown, where obstore's runtime may abort the process (SIGABRT)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("operation", ["read_ranges", "download_file"])
def test_a_server_that_ignores_range_never_makes_the_reader_hold_the_object(
    s3_server: Any, fault_proxy: Callable[[str], FaultProxy], tmp_path: Path, operation: str
) -> None:
    """64 MiB answered, five times, to ranged GETs of 100 bytes, 64 bytes or 8 MiB parts: the reader refuses each
    answer before its body (a 200 to a ranged GET), so its peak grows by far less than one object. The reader runs
    in a child process, so that its peak is not moto's."""
    proxy = fault_proxy(s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    direct, _ = open_filesystem(f"s3://{bucket}/big", s3_server.storage_options)
    size = 64 << 20
    direct.pipe_file(f"{bucket}/big", os.urandom(size))
    proxy.ignore_range(times=None, method="GET")
    options = {**s3_server.storage_options, "endpoint_url": proxy.url}
    result = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, operation, f"s3://{bucket}", json.dumps(options), str(size), str(tmp_path / "d")],
        capture_output=True, text=True, timeout=100,
    )
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout)
    assert "ignored the Range header" in measured["outcome"] and f"failed {ATTEMPTS} times" in measured["outcome"]
    assert measured["grown"] < 16 << 20, measured
    assert {record.fault for record in proxy.requests() if record.method == "GET"} == {"ignore_range"}


# -- missing objects and buckets, refused credentials, another size --------------------------------------------------


def _operations(transport: Any, url: str, tmp_path: Path) -> dict[str, Callable[[], Any]]:
    return {
        "read_ranges": lambda: transport.read_ranges(url, [(0, 10)], size=len(DATA)),
        "download_file": lambda: transport.download_file(url, str(tmp_path / "d"), size=len(DATA)),
        "object_info": lambda: transport.object_info(url),
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("operation", ["read_ranges", "download_file", "object_info"])
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_missing_object_is_a_missing_file_error_not_retried(proxied: dict[str, Any], tmp_path: Path, kind: str, operation: str) -> None:
    transport = make_transport(kind, proxied["root"], proxied["options"])
    url = f"{proxied['root']}/absent"
    with pytest.raises(MissingFileError, match="no such object") as raised:
        _operations(transport, url, tmp_path)[operation]()
    assert url in str(raised.value)
    if kind == "obstore":  # one request; a HEAD's 404 has no body, so one GET asks what is missing
        asked = [record.method for record in proxied["proxy"].requests()]
        assert asked == (["HEAD", "GET"] if operation == "object_info" else ["GET"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("operation", ["read_ranges", "download_file", "object_info"])
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_missing_bucket_is_named_not_retried(proxied: dict[str, Any], tmp_path: Path, kind: str, operation: str) -> None:
    bucket = f"{proxied['bucket']}-missing"
    transport = make_transport(kind, f"s3://{bucket}", proxied["options"])
    with pytest.raises(StorageError, match=f"the bucket '{bucket}' does not exist; create it first") as raised:
        _operations(transport, f"s3://{bucket}/object", tmp_path)[operation]()
    assert not isinstance(raised.value, MissingFileError)
    if kind == "obstore":
        assert len(proxied["proxy"].requests()) == (2 if operation == "object_info" else 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("operation", ["read_ranges", "download_file", "object_info"])
@pytest.mark.parametrize(
    "code, said",
    [
        ("InvalidAccessKeyId", "the store refused the credentials \\(InvalidAccessKeyId: refused by the fault proxy\\)"),
        ("SignatureDoesNotMatch", "the store refused the credentials \\(SignatureDoesNotMatch"),
        ("AccessDenied", "access denied \\(refused by the fault proxy\\)"),
    ],
)
def test_refused_credentials_say_so_and_are_not_retried(
    proxied: dict[str, Any], tmp_path: Path, code: str, said: str, operation: str
) -> None:
    proxy = proxied["proxy"]
    transport = make_transport("obstore", proxied["root"], proxied["options"])
    proxy.error(403, code, "refused by the fault proxy", times=None)
    with pytest.raises(StorageError, match=said) as raised:
        _operations(transport, proxied["url"], tmp_path)[operation]()
    assert proxied["url"] in str(raised.value)
    assert len(proxy.requests()) == (2 if operation == "object_info" else 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("operation", ["read_ranges", "download_file"])
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_an_object_of_another_size_is_a_format_error_at_once(proxied: dict[str, Any], tmp_path: Path, kind: str, operation: str) -> None:
    """The caller knows the size (a manifest, an index header); the store's answer says the object's: an object of
    another size is not the one described, and asking again cannot change that."""
    transport = make_transport(kind, proxied["root"], proxied["options"])
    assert transport.checks_object_size
    wrong = len(DATA) + 1
    read = {
        "read_ranges": lambda: transport.read_ranges(proxied["url"], [(0, 10)], size=wrong),
        "download_file": lambda: transport.download_file(proxied["url"], str(tmp_path / "d"), size=wrong),
    }[operation]
    with pytest.raises(FormatError, match=f"the object is {len(DATA)} bytes, not the {wrong} expected"):
        read()
    assert len(requests_of(proxied["proxy"], proxied["path"])) == 1
    if operation == "download_file":
        assert (tmp_path / "d").stat().st_size == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_object_info_gives_the_size_and_the_same_tag_on_both_transports(proxied: dict[str, Any], kind: str) -> None:
    """The tag names the content in the node cache: both transports give the same one, so that processes reading
    through either share cached copies."""
    stored = make_transport(kind, proxied["root"], proxied["options"]).object_info(proxied["url"])
    assert stored.size == len(DATA)
    fs, path = open_filesystem(proxied["url"], proxied["options"])
    assert stored.tag == f"ETag={fs.info(path)['ETag']}"


# -- fork safety -----------------------------------------------------------------------------------------------------


FORK_CHILD = """
import json, os, sys
from varstore.remote import obstore_transport
from varstore.remote.obstore_transport import ObstoreTransport
from varstore.remote.transport import FsspecTransport

root, options, size, parent_reads_first = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
transport = ObstoreTransport(root, options, FsspecTransport(root, options))
read = lambda: transport.read_ranges(root + "/object", [(300, 310)], size=size)[0] == bytes(range(44, 54))
if parent_reads_first:
    assert read()
reading, writing = os.pipe()
child = os.fork()
if child == 0:
    try:
        os.write(writing, json.dumps({"read": read(), "client": transport.client_name()}).encode())
    finally:
        os._exit(0)
os.close(writing)
answer = json.loads(os.read(reading, 4096))
os.waitpid(child, 0)
print(json.dumps({"child": answer, "parent": {"read": read(), "client": transport.client_name()}}))
sys.stdout.flush()
os._exit(0)  # not through the interpreter's teardown, where obstore's runtime may abort the process (SIGABRT)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("parent_reads_first", [False, True])
def test_a_forked_child_reads_through_a_client_of_its_own(proxied: dict[str, Any], parent_reads_first: bool) -> None:
    """obstore's runtime does not survive fork: a child of a process that read through obstore reads through
    fsspec (through obstore it hung, even with a new client); a child of one that has not reads through an
    obstore client it builds. A fresh interpreter, so that this test process's own reads do not count."""
    result = subprocess.run(
        [sys.executable, "-c", FORK_CHILD, proxied["root"], json.dumps(proxied["options"]), str(len(DATA)),
         "1" if parent_reads_first else "0"],
        capture_output=True, text=True, timeout=100,
    )
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout)
    child_client = "fsspec" if parent_reads_first else "obstore"
    assert measured == {"child": {"read": True, "client": child_client}, "parent": {"read": True, "client": "obstore"}}
    assert len(requests_of(proxied["proxy"], proxied["path"])) == (3 if parent_reads_first else 2)


# -- end to end -------------------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_dataset_opened_by_url_reads_through_obstore_as_written(
    proxied: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VARSTORE_TRANSPORT", "obstore")
    records = [f"record {n} " * (n % 40 + 1) for n in range(300)]
    url = f"{proxied['root']}/ds"
    with varstore.ShardedWriter(url, "str", max_shard_records=70, storage_options=proxied["options"]) as writer:
        writer.extend(records)
    served: list[str] = []
    for name in ("_read_part", "_download_part"):
        original = getattr(obstore_transport, name)
        monkeypatch.setattr(obstore_transport, name, lambda *args, _original=original, _name=name, **kwargs: (
            served.append(_name), _original(*args, **kwargs))[1])
    reader = varstore.open(url, storage_options=proxied["options"], cache_limit=1)  # records by ranged reads
    assert reader.get_batch(list(range(0, 300, 7))) == records[::7]
    assert [reader[position] for position in (0, 69, 70, 299)] == [records[0], records[69], records[70], records[299]]
    assert {"_read_part", "_download_part"} <= set(served)  # the index files downloaded, the records read by range
    assert list(varstore.open(url, storage_options=proxied["options"])) == records
