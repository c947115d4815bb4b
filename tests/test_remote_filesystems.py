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
from typing import Any, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers_s3 import S3Server
from varstore.errors import MissingFileError, StorageError
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
    assert read_ranges(fs, "object", wanted, url="s3://b/k", max_gap=max_gap) == [DATA[s:e] for s, e in wanted]
    requested = fs.calls[0] if fs.calls else []
    assert sum(end - start for start, end in requested) <= len(DATA)  # each byte fetched at most once
    assert len(fs.calls) <= 1


def test_near_ranges_share_a_request_and_far_ranges_do_not() -> None:
    fs = FakeFilesystem(DATA)
    wanted = [(9000, 9100), (0, 10), (20, 30), (29, 40), (5000, 5010)]  # unsorted, one overlap, gaps 10 and 4960
    result = read_ranges(fs, "object", wanted, url="s3://b/k", max_gap=100)
    assert result == [DATA[s:e] for s, e in wanted]
    assert fs.calls == [[(0, 40), (5000, 5010), (9000, 9100)]]


def test_empty_ranges_need_no_request() -> None:
    fs = FakeFilesystem(DATA)
    assert read_ranges(fs, "object", [(7, 7), (0, 0)], url="s3://b/k") == [b"", b""]
    assert fs.calls == []


def test_a_short_body_is_retried_and_only_missing_spans_are_fetched_again() -> None:
    fs = FakeFilesystem(DATA, truncate_calls=1)
    sleep = SleepRecorder()
    assert read_range(fs, "object", 100, 200, url="s3://b/k", sleep=sleep) == DATA[100:200]
    assert fs.calls == [[(100, 200)], [(100, 200)]] and len(sleep.delays) == 1


def test_a_failed_span_is_fetched_again_and_the_good_ones_are_not() -> None:
    class OneSpanFails(FakeFilesystem):
        def cat_ranges(self, paths: list[str], starts: list[int], ends: list[int], on_error: str) -> list[Any]:
            results = super().cat_ranges(paths, starts, ends, on_error)
            return [ConnectionResetError()] + results[1:] if len(self.calls) == 1 else results

    fs = OneSpanFails(DATA)
    wanted = [(0, 10), (8000, 8010)]
    assert read_ranges(fs, "object", wanted, url="s3://b/k", max_gap=0, sleep=SleepRecorder()) == [
        DATA[0:10],
        DATA[8000:8010],
    ]
    assert fs.calls == [[(0, 10), (8000, 8010)], [(0, 10)]]


def test_a_body_that_stays_short_is_a_storage_error_after_bounded_attempts() -> None:
    fs = FakeFilesystem(DATA, truncate_calls=99)
    with pytest.raises(StorageError, match="s3://b/k") as raised:
        read_range(fs, "object", 0, 50, url="s3://b/k", sleep=SleepRecorder())
    assert len(fs.calls) == 5
    assert "came back as 49 bytes" in str(raised.value)


def test_a_permanent_failure_of_one_span_is_not_retried() -> None:
    class Mixed(FakeFilesystem):
        def cat_ranges(self, paths: list[str], starts: list[int], ends: list[int], on_error: str) -> list[Any]:
            self.calls.append(list(zip(starts, ends)))
            return [ConnectionResetError(), PermissionError("AccessDenied")]

    fs = Mixed(DATA)
    with pytest.raises(StorageError, match="AccessDenied"):
        read_ranges(fs, "object", [(0, 10), (8000, 8010)], url="s3://b/k", max_gap=0, sleep=SleepRecorder())
    assert len(fs.calls) == 1


def test_read_ranges_through_memory_filesystem(memory_url: str) -> None:
    fs, path = open_filesystem(memory_url)
    assert read_ranges(fs, path, [(3, 9), (16000, 16384)], url=memory_url) == [DATA[3:9], DATA[16000:16384]]


def test_a_missing_memory_object_is_a_missing_file_error_naming_the_url(memory_url: str) -> None:
    missing = memory_url + "-missing"
    fs, path = open_filesystem(missing)
    with pytest.raises(MissingFileError, match=missing):
        read_range(fs, path, 0, 10, url=missing)


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
    assert read_ranges(fs, path, wanted, url=url, max_gap=100) == [DATA[s:e] for s, e in wanted]
    assert read_range(fs, path, 100, 4196, url=url) == DATA[100:4196]
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
        read_range(fs, path, 0, 10, url=url)
    with pytest.raises(MissingFileError, match=url):
        download_file(fs, path, str(tmp_path / "target"), url=url)
    assert not (tmp_path / "target").exists()


def test_s3_read_past_the_end_is_retried_as_a_short_body_then_a_storage_error(
    s3_server: S3Server, s3_object: tuple[str, str, Any, str]
) -> None:
    bucket, url, fs, path = s3_object
    with pytest.raises(StorageError, match="came back as 84 bytes"):
        read_range(fs, path, len(DATA) - 84, len(DATA) + 16, url=url, sleep=SleepRecorder())
    assert len(s3_server.requests(bucket, method="GET")) == 5
