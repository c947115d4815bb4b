"""varstore.remote.filesystems: URLs to fsspec filesystems, ranged reads, transfers and their retries.

Unit behaviour runs against memory:// and small fakes (no sleeping: the backoff's sleep is injected); the
real client stack (s3fs, aiobotocore, aiohttp) runs against the session's moto server on 127.0.0.1.
"""

from __future__ import annotations

import errno
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers_fault_proxy import FaultProxy, fault_proxy  # noqa: F401 - fault_proxy is a fixture
from tests.helpers_s3 import S3Server
from varstore.errors import MissingFileError, StorageError, VarstoreError
from varstore.remote.filesystems import (
    download_file,
    is_transient,
    is_url,
    open_filesystem,
    read_range,
    read_ranges,
    upload_file,
    with_retries,
)

pytest.importorskip("fsspec")

DATA = bytes(range(256)) * 64  # 16 KiB, every byte's value tells its offset modulo 256


class SleepRecorder:
    """An injected sleep: records the delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class FakeFilesystem:
    """A filesystem over one byte string that counts requests and fails or cuts answers as told."""

    def __init__(self, data: bytes, failures: list[BaseException] | None = None, truncate_calls: int = 0) -> None:
        self.data = data
        self.failures = list(failures or [])
        self.truncate_calls = truncate_calls  # the first this many cat_ranges calls return every span one byte short
        self.calls: list[list[tuple[int, int]]] = []

    def cat_ranges(self, paths: list[str], starts: list[int], ends: list[int], on_error: str) -> list[Any]:
        assert on_error == "return"
        self.calls.append(list(zip(starts, ends)))
        if self.failures:
            return [self.failures.pop(0) for _ in paths]
        cut = 1 if len(self.calls) <= self.truncate_calls else 0
        return [self.data[start : end - cut] for start, end in zip(starts, ends)]

    def put_file(self, local_path: str, path: str) -> None:
        self.calls.append([])
        if self.failures:
            raise self.failures.pop(0)


@pytest.fixture
def memory_url() -> Iterator[str]:
    """A fresh memory:// URL holding DATA, removed afterwards (memory:// is one store per process)."""
    url = f"memory://varstore-test-{uuid.uuid4().hex}/object"
    fs, path = open_filesystem(url)
    fs.pipe_file(path, DATA)
    yield url
    fs.rm(path)


# --- URLs and filesystems ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["s3://bucket/key", "memory://x/y", "file:///tmp/data", "gs://bucket", "s3a://b/k"])
def test_urls_with_a_scheme_are_urls(path: str) -> None:
    assert is_url(path)


@pytest.mark.parametrize("path", ["/tmp/data", "data/shard", "C:/data", "C:\\data", "", "s3:/one-slash"])
def test_local_paths_and_windows_drives_are_not_urls(path: str) -> None:
    assert not is_url(path)


def test_a_path_object_is_never_a_url() -> None:
    assert not is_url(Path("s3://bucket/key"))


def test_open_filesystem_gives_the_filesystem_and_the_path_within_it(memory_url: str) -> None:
    fs, path = open_filesystem(memory_url)
    assert "memory" in fs.protocol  # a str or a tuple of names, by fsspec version
    assert path.endswith("/object")
    assert fs.cat_file(path) == DATA


def test_an_unknown_scheme_is_a_storage_error_naming_the_url() -> None:
    with pytest.raises(StorageError, match="nosuchscheme://bucket/key") as raised:
        open_filesystem("nosuchscheme://bucket/key")
    assert "nosuchscheme://" in str(raised.value)


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_missing_backend_says_which_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['s3fs'] = None\n"  # import s3fs now fails as if it were not installed
        "from varstore.errors import StorageError\n"
        "from varstore.remote.filesystems import open_filesystem\n"
        "try:\n    open_filesystem('s3://bucket/key')\n"
        "except StorageError as error:\n    print(error)\n"
    )
    result = _run_python(code)
    assert result.returncode == 0, result.stderr
    assert "s3://bucket/key" in result.stdout
    assert "pip install 'varstore[s3]'" in result.stdout


def test_import_varstore_imports_no_fsspec_and_no_backend() -> None:
    code = (
        "import sys, varstore, varstore.remote, varstore.remote.filesystems\n"
        "loaded = sorted(name for name in ('fsspec', 's3fs', 'botocore', 'aiohttp', 'moto') if name in sys.modules)\n"
        "print(loaded)\n"
    )
    result = _run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- retries -------------------------------------------------------------------------------------------


def test_transient_failures_are_retried_with_growing_bounded_delays() -> None:
    outcomes: list[BaseException | str] = [ConnectionResetError(), TimeoutError(), OSError(errno.EBUSY, "SlowDown")]
    outcomes.append("done")
    sleep = SleepRecorder()

    def action() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    assert with_retries(action, what="reading", url="s3://b/k", first_delay=0.1, sleep=sleep) == "done"
    assert len(sleep.delays) == 3
    assert all(0 <= delay <= 0.1 * 2**attempt for attempt, delay in enumerate(sleep.delays))


def test_a_failure_that_persists_is_a_storage_error_after_the_given_attempts() -> None:
    calls = []
    sleep = SleepRecorder()

    def action() -> None:
        calls.append(1)
        raise ConnectionResetError("reset by peer")

    with pytest.raises(StorageError, match="s3://b/k") as raised:
        with_retries(action, what="reading the index", url="s3://b/k", attempts=4, sleep=sleep)
    assert len(calls) == 4 and len(sleep.delays) == 3
    assert "reading the index" in str(raised.value) and "reset by peer" in str(raised.value)


@pytest.mark.parametrize(
    "error", [PermissionError("AccessDenied"), ValueError("bad bucket name"), OSError(errno.EINVAL, "x")]
)
def test_a_permanent_failure_is_not_retried(error: Exception) -> None:
    calls = []
    sleep = SleepRecorder()

    def action() -> None:
        calls.append(1)
        raise error

    with pytest.raises(StorageError, match="s3://b/k"):
        with_retries(action, what="reading", url="s3://b/k", sleep=sleep)
    assert len(calls) == 1 and sleep.delays == []


def test_a_missing_object_is_a_missing_file_error_and_not_retried() -> None:
    calls = []

    def action() -> None:
        calls.append(1)
        raise FileNotFoundError("NoSuchKey")

    with pytest.raises(MissingFileError, match="s3://b/k"):
        with_retries(action, what="reading", url="s3://b/k", sleep=SleepRecorder())
    assert len(calls) == 1


def test_backend_errors_are_classified_transient_or_permanent() -> None:
    botocore = pytest.importorskip("botocore.exceptions")
    aiohttp = pytest.importorskip("aiohttp")

    def client_error(code: str, status: int) -> Exception:
        response = {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return botocore.ClientError(response, "GetObject")

    translated = OSError(errno.EIO, "wrapped")  # s3fs wraps unknown answers so; the cause tells
    translated.__cause__ = client_error("SlowDown", 503)
    assert is_transient(client_error("SlowDown", 503))
    assert is_transient(client_error("InternalError", 500))
    assert is_transient(translated)
    assert is_transient(botocore.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    assert is_transient(aiohttp.ClientPayloadError("Response payload is not completed"))
    assert is_transient(aiohttp.ServerDisconnectedError())
    assert not is_transient(client_error("AccessDenied", 403))
    assert not is_transient(client_error("NoSuchKey", 404))
    assert not is_transient(FileNotFoundError(errno.ENOENT, "gone"))
    assert not is_transient(ValueError("bad"))
    denied_after_a_reset = PermissionError("AccessDenied")
    denied_after_a_reset.__context__ = ConnectionResetError()  # raised while handling an earlier, retried fault
    assert not is_transient(denied_after_a_reset)


# --- ranged reads --------------------------------------------------------------------------------------


@given(
    ranges=st.lists(st.tuples(st.integers(0, len(DATA)), st.integers(0, 3000)), max_size=12),
    max_gap=st.integers(0, 5000),
)
def test_read_ranges_returns_exactly_the_bytes_of_each_range(ranges: list[tuple[int, int]], max_gap: int) -> None:
    wanted = [(start, min(start + length, len(DATA))) for start, length in ranges]
    fs = FakeFilesystem(DATA)
    assert read_ranges(fs, "object", wanted, url="s3://b/k", size=len(DATA), max_gap=max_gap) == [DATA[s:e] for s, e in wanted]
    requested = fs.calls[0] if fs.calls else []
    assert sum(end - start for start, end in requested) <= len(DATA)  # each byte fetched at most once
    assert len(fs.calls) <= 1


def test_near_ranges_share_a_request_and_far_ranges_do_not() -> None:
    fs = FakeFilesystem(DATA)
    wanted = [(9000, 9100), (0, 10), (20, 30), (29, 40), (5000, 5010)]  # unsorted, one overlap, gaps 10 and 4960
    result = read_ranges(fs, "object", wanted, url="s3://b/k", size=len(DATA), max_gap=100)
    assert result == [DATA[s:e] for s, e in wanted]
    assert fs.calls == [[(0, 40), (5000, 5010), (9000, 9100)]]


def test_empty_ranges_need_no_request() -> None:
    fs = FakeFilesystem(DATA)
    assert read_ranges(fs, "object", [(7, 7), (0, 0)], url="s3://b/k", size=len(DATA)) == [b"", b""]
    assert fs.calls == []


@pytest.mark.parametrize(
    "wanted",
    [
        [(len(DATA) - 10, len(DATA) + 10)],  # partly past the end
        [(0, 10), (len(DATA) + 5, len(DATA) + 9)],  # one of several wholly past the end
        [(0, 10**30)],  # huge
        [(len(DATA) + 1, len(DATA) + 1)],  # empty, but past the end
        [(-1, 10)],
        [(10, 5)],
    ],
)
def test_a_range_outside_the_object_is_refused_before_any_request(wanted: list[tuple[int, int]]) -> None:
    fs = FakeFilesystem(DATA)
    with pytest.raises(VarstoreError, match="s3://b/k.*not within the object's 16384 bytes") as raised:
        read_ranges(fs, "object", wanted, url="s3://b/k", size=len(DATA), sleep=SleepRecorder())
    assert not isinstance(raised.value, StorageError)  # the caller's mistake, not the store's
    assert fs.calls == []


@pytest.mark.parametrize("offset", [0.5, 1.0, True, False, "3", None])
def test_a_range_offset_that_is_not_an_integer_is_refused_before_any_request(offset: object) -> None:
    fs = FakeFilesystem(DATA)
    for wanted in ([(offset, 10)], [(0, offset)]):
        with pytest.raises(VarstoreError, match="s3://b/k.*must be an integer"):
            read_ranges(fs, "object", wanted, url="s3://b/k", size=len(DATA))  # type: ignore[list-item]
    assert fs.calls == []


def test_numpy_integer_offsets_are_byte_offsets() -> None:
    numpy = pytest.importorskip("numpy")
    fs = FakeFilesystem(DATA)
    start, end = numpy.uint64(10), numpy.int64(20)
    assert read_range(fs, "object", start, end, url="s3://b/k", size=len(DATA)) == DATA[10:20]


def test_the_whole_object_is_a_valid_range() -> None:
    fs = FakeFilesystem(DATA)
    assert read_ranges(fs, "object", [(0, len(DATA)), (len(DATA), len(DATA))], url="s3://b/k", size=len(DATA)) == [
        DATA,
        b"",
    ]


def test_a_short_body_is_retried_and_only_missing_spans_are_fetched_again() -> None:
    fs = FakeFilesystem(DATA, truncate_calls=1)
    sleep = SleepRecorder()
    assert read_range(fs, "object", 100, 200, url="s3://b/k", size=len(DATA), sleep=sleep) == DATA[100:200]
    assert fs.calls == [[(100, 200)], [(100, 200)]] and len(sleep.delays) == 1


def test_a_failed_span_is_fetched_again_and_the_good_ones_are_not() -> None:
    class OneSpanFails(FakeFilesystem):
        def cat_ranges(self, paths: list[str], starts: list[int], ends: list[int], on_error: str) -> list[Any]:
            results = super().cat_ranges(paths, starts, ends, on_error)
            return [ConnectionResetError()] + results[1:] if len(self.calls) == 1 else results

    fs = OneSpanFails(DATA)
    wanted = [(0, 10), (8000, 8010)]
    assert read_ranges(fs, "object", wanted, url="s3://b/k", size=len(DATA), max_gap=0, sleep=SleepRecorder()) == [
        DATA[0:10],
        DATA[8000:8010],
    ]
    assert fs.calls == [[(0, 10), (8000, 8010)], [(0, 10)]]


def test_a_body_that_stays_short_is_a_storage_error_after_bounded_attempts() -> None:
    fs = FakeFilesystem(DATA, truncate_calls=99)
    with pytest.raises(StorageError, match="s3://b/k") as raised:
        read_range(fs, "object", 0, 50, url="s3://b/k", size=len(DATA), sleep=SleepRecorder())
    assert len(fs.calls) == 5
    assert "came back as 49 bytes" in str(raised.value)


def test_a_permanent_failure_of_one_span_is_not_retried() -> None:
    class Mixed(FakeFilesystem):
        def cat_ranges(self, paths: list[str], starts: list[int], ends: list[int], on_error: str) -> list[Any]:
            self.calls.append(list(zip(starts, ends)))
            return [ConnectionResetError(), PermissionError("AccessDenied")]

    fs = Mixed(DATA)
    with pytest.raises(StorageError, match="AccessDenied"):
        read_ranges(
            fs, "object", [(0, 10), (8000, 8010)], url="s3://b/k", size=len(DATA), max_gap=0, sleep=SleepRecorder()
        )
    assert len(fs.calls) == 1


def test_read_ranges_through_memory_filesystem(memory_url: str) -> None:
    fs, path = open_filesystem(memory_url)
    assert read_ranges(fs, path, [(3, 9), (16000, 16384)], url=memory_url, size=len(DATA)) == [DATA[3:9], DATA[16000:16384]]


def test_a_missing_memory_object_is_a_missing_file_error_naming_the_url(memory_url: str) -> None:
    missing = memory_url + "-missing"
    fs, path = open_filesystem(missing)
    with pytest.raises(MissingFileError, match=missing):
        read_range(fs, path, 0, 10, url=missing, size=len(DATA))


def test_an_upload_that_fails_transiently_is_retried() -> None:
    fs = FakeFilesystem(DATA, failures=[ConnectionResetError(), ConnectionResetError()])
    sleep = SleepRecorder()
    upload_file("local", fs, "object", url="s3://b/k", sleep=sleep)  # type: ignore[arg-type]
    assert len(fs.calls) == 3 and len(sleep.delays) == 2


# --- the real client stack against the loopback S3 server ------------------------------------------------


@pytest.fixture
def s3_object(s3_server: S3Server, tmp_path: Path) -> tuple[str, str, Any, str]:
    """(bucket, url, fs, path) of DATA uploaded to a fresh bucket through upload_file."""
    pytest.importorskip("s3fs")
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/dataset/shard.data"
    local = tmp_path / "shard.data"
    local.write_bytes(DATA)
    fs, path = open_filesystem(url, s3_server.storage_options)
    upload_file(str(local), fs, path, url=url)
    return bucket, url, fs, path


def test_s3_upload_then_download_round_trips_the_bytes(
    s3_server: S3Server, s3_object: tuple[str, str, Any, str], tmp_path: Path
) -> None:
    bucket, url, fs, path = s3_object
    assert [request.method for request in s3_server.requests(bucket, key="dataset/shard.data")] == ["PUT"]
    target = tmp_path / "downloaded"
    download_file(fs, path, str(target), url=url)
    assert target.read_bytes() == DATA
    assert len(s3_server.requests(bucket, method="GET", key="dataset/shard.data")) == 1


def test_s3_ranged_reads_equal_the_bytes_and_near_ranges_share_a_request(
    s3_server: S3Server, s3_object: tuple[str, str, Any, str]
) -> None:
    bucket, url, fs, path = s3_object
    wanted = [(10, 20), (25, 30), (5000, 5100), (12000, 12001), (16383, 16384)]
    assert read_ranges(fs, path, wanted, url=url, size=len(DATA), max_gap=100) == [DATA[s:e] for s, e in wanted]
    assert read_range(fs, path, 100, 4196, url=url, size=len(DATA)) == DATA[100:4196]
    gets = s3_server.requests(bucket, method="GET", key="dataset/shard.data")
    assert sorted(request.range for request in gets) == sorted(
        ["bytes=10-29", "bytes=5000-5099", "bytes=12000-12000", "bytes=16383-16383", "bytes=100-4195"]
    )
    assert all(request.status == 206 for request in gets)


def test_s3_missing_object_is_a_missing_file_error_naming_the_url(s3_server: S3Server, tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/no/such/object"
    fs, path = open_filesystem(url, s3_server.storage_options)
    with pytest.raises(MissingFileError, match=url):
        read_range(fs, path, 0, 10, url=url, size=len(DATA))
    with pytest.raises(MissingFileError, match=url):
        download_file(fs, path, str(tmp_path / "target"), url=url)
    assert not (tmp_path / "target").exists()


def test_s3_range_past_the_end_is_refused_before_any_request(
    s3_server: S3Server, s3_object: tuple[str, str, Any, str]
) -> None:
    bucket, url, fs, path = s3_object
    with pytest.raises(VarstoreError, match=f"{url}.*16384 bytes") as raised:
        read_range(fs, path, len(DATA) - 84, len(DATA) + 16, url=url, size=len(DATA), sleep=SleepRecorder())
    assert not isinstance(raised.value, StorageError)
    with pytest.raises(VarstoreError, match="not within"):
        read_ranges(fs, path, [(0, 10), (0, 10**12)], url=url, size=len(DATA))
    assert s3_server.requests(bucket, method="GET") == []
    assert s3_server.requests(bucket, method="HEAD") == []


# --- one retry loop: the backend's own retries are off for s3:// -------------------------------------------


@pytest.fixture
def s3_behind_proxy(
    s3_server: S3Server, fault_proxy: Callable[[str], FaultProxy]
) -> tuple[FaultProxy, str, Any, str]:
    """(proxy, url, fs, path): DATA in a fresh bucket, reached through a fault proxy in front of moto."""
    pytest.importorskip("s3fs")
    proxy = fault_proxy(s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/object"
    fs, path = open_filesystem(url, {**s3_server.storage_options, "endpoint_url": proxy.url})
    fs.pipe_file(path, DATA)
    proxy.clear_counters()
    return proxy, url, fs, path


# aiohttp resends an idempotent request once on a fresh connection when its connection breaks (RFC 9112
# 9.3.1, for pooled connections the server closed); it has no public switch, so a reset costs two requests.
@pytest.mark.parametrize(("fault", "requests_per_attempt"), [("slow_down", 1), ("server_error", 1), ("reset", 2)])
def test_s3_persistent_fault_costs_exactly_the_attempts_then_a_storage_error_naming_the_url(
    s3_behind_proxy: tuple[FaultProxy, str, Any, str], fault: str, requests_per_attempt: int
) -> None:
    proxy, url, fs, path = s3_behind_proxy
    getattr(proxy, fault)(times=None, method="GET")
    sleep = SleepRecorder()
    with pytest.raises(StorageError, match=f"{url}.*failed 5 times"):
        read_range(fs, path, 0, 100, url=url, size=len(DATA), sleep=sleep)
    assert proxy.count("GET") == 5 * requests_per_attempt and len(sleep.delays) == 4


def test_s3_transfers_under_a_persistent_slow_down_cost_exactly_the_attempts(
    s3_behind_proxy: tuple[FaultProxy, str, Any, str], tmp_path: Path
) -> None:
    proxy, url, fs, path = s3_behind_proxy
    proxy.slow_down(times=None)
    local = tmp_path / "local"
    local.write_bytes(DATA)
    with pytest.raises(StorageError, match=f"{url}.*uploading"):
        upload_file(str(local), fs, path, url=url, sleep=SleepRecorder())
    assert proxy.count("PUT") == 5
    with pytest.raises(StorageError, match=f"{url}.*downloading"):
        download_file(fs, path, str(tmp_path / "downloaded"), url=url, sleep=SleepRecorder())
    assert proxy.count("GET") == 5


def test_s3_one_slow_down_then_success_costs_two_requests(s3_behind_proxy: tuple[FaultProxy, str, Any, str]) -> None:
    proxy, url, fs, path = s3_behind_proxy
    proxy.slow_down(times=1, method="GET")
    assert read_range(fs, path, 0, 100, url=url, size=len(DATA), sleep=SleepRecorder()) == DATA[:100]
    assert [record.status for record in proxy.requests()] == [503, 206]


def test_s3_explicit_botocore_retries_are_kept_and_the_callers_options_not_changed(s3_server: S3Server) -> None:
    pytest.importorskip("s3fs")
    config = {"retries": {"total_max_attempts": 3}, "connect_timeout": 7}
    options = {**s3_server.storage_options, "config_kwargs": config}
    fs, _ = open_filesystem("s3://bucket/key", options)
    assert fs.config_kwargs == {"retries": {"total_max_attempts": 3}, "connect_timeout": 7, "max_pool_connections": 32}
    assert options["config_kwargs"] is config and config == {"retries": {"total_max_attempts": 3}, "connect_timeout": 7}


def test_s3_a_callers_connection_pool_is_kept(s3_server: S3Server) -> None:
    pytest.importorskip("s3fs")
    fs, _ = open_filesystem("s3://bucket/key", {**s3_server.storage_options, "config_kwargs": {"max_pool_connections": 3}})
    assert fs.config_kwargs["max_pool_connections"] == 3


def test_s3_filesystems_built_without_varstore_keep_their_own_retries(s3_server: S3Server) -> None:
    s3fs = pytest.importorskip("s3fs")
    fs, _ = open_filesystem("s3://bucket/key", s3_server.storage_options)
    theirs = s3fs.S3FileSystem(**s3_server.storage_options)  # fsspec's instance cache: same options, same object
    assert theirs is not fs and theirs.retries == 5 and fs.retries == 1
