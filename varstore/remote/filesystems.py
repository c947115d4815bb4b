"""fsspec filesystems for URLs, and the transfers varstore makes through them: ranged reads, whole-file
uploads and downloads, each retrying transient faults with bounded backoff.

fsspec and its backends are imported only when a URL is opened: they are optional (`varstore[remote]`,
`varstore[s3]`), and `import varstore` needs neither. Every failure leaves as a `VarstoreError` naming the URL
and what was being done: `MissingFileError` for an object that does not exist, `StorageError` otherwise.

Retries: `with_retries` is the only retry loop. For s3:// `open_filesystem` turns off s3fs's own retry loop
and botocore's, which would otherwise multiply with it (5 x 5 x 5 requests for one persistent 503), so a
persistent fault costs exactly `attempts` requests per helper call.

Request cost, when nothing fails (each transient failure adds one request for what failed):
- `open_filesystem`: none (clients connect on first use).
- `read_range`: one GET; `read_ranges`: one GET per span of merged ranges, concurrent; none for empty ranges.
  Both take the object's size from the caller (the manifest knows it) and refuse ranges outside it unsent.
- `read_heads`: one GET per object, concurrent. `read_object`: one GET. `list_sizes`: one LIST per 1,000 objects.
- `upload_file`: one PUT; s3fs uploads a large file (twice its block size, 50 MiB, or more) in parts, a
  request each plus two. A retry sends the whole file again.
- `download_file`: one GET; for an object larger than s3fs's block size, further concurrent ranged GETs for
  the rest. A retry fetches the whole object again.

Fork safety: a filesystem holds sockets and, for async backends (s3fs), an event loop thread, neither of
which survives `fork`. Never keep a filesystem across a fork: in the child, call `open_filesystem` again
(fsspec drops its instance cache in a forked child, so that builds a fresh client). An s3fs filesystem
used in the child anyway fails at once (fsspec refuses it: "not fork-safe"), a `StorageError` here.
"""

from __future__ import annotations

import asyncio
import bisect
import errno
import functools
import http.client
import operator
import os
import random
import re
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from ..errors import MissingFileError, ShardExistsError, StorageError, VarstoreError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

T = TypeVar("T")

# A hole between two wanted byte ranges up to this size is fetched rather than paid for with a second request.
DEFAULT_MAX_GAP = 64 * 1024
# Cap of one backoff delay: a retried read should fail in seconds, not minutes.
_MAX_DELAY = 2.0
# Two or more letters before "://": a Windows drive ("C:/") is never taken for a scheme.
_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
_S3_SCHEMES = frozenset({"s3", "s3a"})
_EXTRA_FOR_SCHEME = {scheme: "s3" for scheme in _S3_SCHEMES}
# botocore's client config for one request per call: `with_retries` does the retrying.
_BOTOCORE_SINGLE_ATTEMPT = {"total_max_attempts": 1}
_TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_ERROR_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError", "ServiceUnavailable"}
)
# How s3fs translates S3 answers into OSError: 503 SlowDown and 409 -> EBUSY, 500 InternalError -> EREMOTEIO.
_TRANSIENT_ERRNOS = frozenset(
    {errno.EBUSY, getattr(errno, "EREMOTEIO", errno.EIO), errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT,
     errno.EPIPE, errno.EAGAIN}
)
_TRANSIENT_BUILTIN_ERRORS = (ConnectionError, TimeoutError, asyncio.TimeoutError, http.client.IncompleteRead)
_PERMANENT_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)


class _TruncatedBody(ConnectionError):
    """A response carried fewer (or more) bytes than the range asked for: a cut connection, retried."""


def is_url(path: object) -> bool:
    """Whether `path` is a URL (`scheme://...`, `file://` included) rather than a local path."""
    return isinstance(path, str) and _URL_SCHEME.match(path) is not None


def open_filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem serving `url` and the path of `url` within it; `storage_options` go to the
    filesystem as fsspec passes them (for S3, s3fs's `endpoint_url`, `key`, `secret`, ...).

    For s3:// the backend makes one attempt per request, leaving retries to `with_retries`: s3fs's retry
    loop is off, and botocore's too unless `storage_options["config_kwargs"]["retries"]` sets it (an explicit
    setting wins; AWS_MAX_ATTEMPTS and config files do not). fsspec shares one instance among callers with the
    same options, and the retry settings are part of ours (`config_kwargs`): an S3FileSystem built elsewhere
    with other options is a different instance, whose retries are left alone.
    """
    match = _URL_SCHEME.match(url)
    scheme = match.group(1).lower() if match else "file"
    try:
        from fsspec.core import url_to_fs
    except ImportError as error:
        extra = _EXTRA_FOR_SCHEME.get(scheme, "remote")
        raise StorageError(f"opening a URL needs fsspec: pip install 'varstore[{extra}]'", path=url) from error
    try:
        fs, path = url_to_fs(url, **_backend_options(scheme, storage_options or {}))
    except ImportError as error:
        extra = _EXTRA_FOR_SCHEME.get(scheme)
        advice = f"pip install 'varstore[{extra}]'" if extra else "install the package fsspec names"
        message = f"{scheme}:// needs a package that is not installed: {advice} ({error})"
        raise StorageError(message, path=url) from error
    except ValueError as error:  # fsspec: "Protocol not known"
        raise StorageError(f"no filesystem for {scheme}:// ({error})", path=url) from error
    if scheme in _S3_SCHEMES:
        fs.retries = 1  # s3fs's own retry loop around each request (a class attribute, 5, not an option)
    return fs, path


def _backend_options(scheme: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """`storage_options` with, for s3://, botocore's retries turned off unless the caller set them."""
    if scheme not in _S3_SCHEMES:
        return storage_options
    config = dict(storage_options.get("config_kwargs") or {})
    config.setdefault("retries", dict(_BOTOCORE_SINGLE_ATTEMPT))
    return {**storage_options, "config_kwargs": config}


def with_retries(
    action: Callable[[], T],
    *,
    what: str,
    url: str,
    attempts: int = 5,
    first_delay: float = 0.05,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`action()`, tried up to `attempts` times while it fails transiently (connection reset, timeout, HTTP
    5xx or SlowDown, truncated body), waiting a random time up to `first_delay * 2**n` before retry n
    (exponential backoff with full jitter). `what` says what was being done, for the error.

    A missing object raises `MissingFileError`; a permanent failure, or a transient one that outlasts the
    attempts, raises `StorageError`; a `VarstoreError` from `action` passes unchanged.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    attempt = 1
    while True:
        try:
            return action()
        except VarstoreError:
            raise
        except FileNotFoundError as error:
            raise MissingFileError(f"{what}: no such object", path=url) from error
        except Exception as error:
            if not is_transient(error):
                raise StorageError(f"{what} failed: {_describe(error)}", path=url) from error
            if attempt == attempts:
                raise StorageError(
                    f"{what} failed {attempts} times, the last with: {_describe(error)}", path=url
                ) from error
            sleep(random.uniform(0, min(_MAX_DELAY, first_delay * 2 ** (attempt - 1))))
            attempt += 1


def is_transient(error: BaseException) -> bool:
    """Whether `error` is a fault that a retry may not meet again; an error that does not tell is judged
    by the error it was raised from (s3fs raises OSErrors from botocore's and aiohttp's)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        verdict = _transient_verdict(current)
        if verdict is not None:
            return verdict
        current = current.__cause__ or current.__context__
    return False


def _transient_verdict(error: BaseException) -> bool | None:
    """True if `error` itself is transient, False if it is permanent, None if it does not tell."""
    if isinstance(error, _PERMANENT_OS_ERRORS):
        return False
    if isinstance(error, _TRANSIENT_BUILTIN_ERRORS + _backend_transient_types()):
        return True
    if isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS:
        return True
    status = getattr(error, "status", None)  # aiohttp.ClientResponseError
    if isinstance(status, int):
        return status in _TRANSIENT_STATUSES
    response = getattr(error, "response", None)  # botocore.exceptions.ClientError
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code in _TRANSIENT_ERROR_CODES or status in _TRANSIENT_STATUSES
    return None


@functools.cache
def _backend_transient_types() -> tuple[type[BaseException], ...]:
    """The connection and truncated-body errors of the HTTP stacks under fsspec's backends, those installed."""
    types: list[type[BaseException]] = []
    try:
        from botocore import exceptions as botocore_errors

        types += [botocore_errors.ConnectionError, botocore_errors.HTTPClientError, botocore_errors.IncompleteReadError]
        types += [getattr(botocore_errors, "ResponseStreamingError", botocore_errors.HTTPClientError)]
    except ImportError:
        pass
    try:
        import aiohttp

        types += [aiohttp.ClientConnectionError, aiohttp.ClientPayloadError]
    except ImportError:
        pass
    return tuple(types)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@dataclass(frozen=True)
class _Span:
    """One request: bytes [start, end) of the object at `path`, covering one or more wanted ranges."""

    path: str
    start: int
    end: int


def read_range(
    fs: AbstractFileSystem,
    path: str,
    start: int,
    end: int,
    *,
    url: str,
    size: int,
    sleep: Callable[[float], None] = time.sleep,
) -> bytes:
    """Bytes [start, end) of the object at `path`, `size` bytes long, exactly `end - start` of them (a short
    body is retried)."""
    return read_ranges(fs, path, [(start, end)], url=url, size=size, sleep=sleep)[0]


def read_ranges(
    fs: AbstractFileSystem,
    path: str,
    ranges: Sequence[tuple[int, int]],
    *,
    url: str,
    size: int,
    max_gap: int = DEFAULT_MAX_GAP,
    sleep: Callable[[float], None] = time.sleep,
) -> list[bytes]:
    """The bytes of each [start, end) in `ranges`, in order, from the object at `path` of `size` bytes (the
    caller knows it from the manifest). Ranges that overlap or lie within `max_gap` bytes of each other share
    one request; the requests run concurrently (`fs.cat_ranges`) on filesystems that can. Every response is
    checked for its exact length; a retry fetches only the spans still missing.

    A range that is not integers with 0 <= start <= end <= size is a `VarstoreError`, raised before any
    request: a range past the end can only come back short, and retrying it would fetch it again and again.
    """
    ranges = [(_offset(start, url), _offset(end, url)) for start, end in ranges]
    for start, end in ranges:
        if not 0 <= start <= end <= size:
            raise VarstoreError(f"byte range [{start}, {end}) is not within the object's {size} bytes", path=url)
    spans = _merge_ranges(path, [(start, end) for start, end in ranges if end > start], max_gap)
    fetched = _fetch_spans(fs, spans, what=f"reading {len(spans)} byte range(s)", url=url, sleep=sleep)
    span_starts = [span.start for span in spans]
    return [_cut(fetched, spans, span_starts, start, end) for start, end in ranges]


def read_heads(
    fs: AbstractFileSystem,
    sized_paths: Sequence[tuple[str, int]],
    length: int,
    *,
    url: str,
    sleep: Callable[[float], None] = time.sleep,
) -> list[bytes]:
    """The first `length` bytes (all, if fewer) of each object in `sized_paths` (path, size), in order:
    one GET per object, all concurrent, each checked for its exact length and retried while missing."""
    spans = [_Span(path, 0, min(length, size)) for path, size in sized_paths]
    fetched = _fetch_spans(fs, [span for span in spans if span.end > 0], what=f"reading {len(spans)} headers", url=url, sleep=sleep)
    return [fetched.get(span, b"") for span in spans]


def _fetch_spans(
    fs: AbstractFileSystem, spans: Sequence[_Span], *, what: str, url: str, sleep: Callable[[float], None]
) -> dict[_Span, bytes]:
    """The bytes of each span, fetched concurrently (`fs.cat_ranges`); a retry fetches only those still missing."""
    fetched: dict[_Span, bytes] = {}

    def fetch_missing() -> None:
        missing = [span for span in spans if span not in fetched]
        results = fs.cat_ranges(
            [span.path for span in missing], [span.start for span in missing], [span.end for span in missing],
            on_error="return",
        )
        failures: list[BaseException] = []
        for span, result in zip(missing, results):
            if isinstance(result, BaseException):
                failures.append(result)
            elif len(result) != span.end - span.start:
                failures.append(
                    _TruncatedBody(f"bytes [{span.start}, {span.end}) came back as {len(result)} bytes")
                )
            else:
                fetched[span] = bytes(result)
        if failures:
            raise min(failures, key=is_transient)  # a permanent failure first: retrying cannot help it

    if spans:
        with_retries(fetch_missing, what=what, url=url, sleep=sleep)
    return fetched


def list_sizes(fs: AbstractFileSystem, path: str, *, url: str, sleep: Callable[[float], None] = time.sleep) -> dict[str, int]:
    """The size of every object directly under the directory `path`, by name: a fresh listing (one LIST
    request per 1,000 objects on S3), never fsspec's cached one, which misses what was written since."""

    def listing() -> dict[str, int]:
        fs.invalidate_cache(path)
        entries = fs.ls(path, detail=True)
        return {
            entry["name"].rstrip("/").rsplit("/", 1)[-1]: int(entry.get("size") or 0)
            for entry in entries
            if entry.get("type") == "file"
        }

    return with_retries(listing, what="listing the objects", url=url, sleep=sleep)


def read_object(
    fs: AbstractFileSystem, path: str, *, url: str, max_size: int, sleep: Callable[[float], None] = time.sleep
) -> bytes:
    """The object at `path` read whole in one GET, for small objects where ranged reads could mix two versions
    (a manifest): at most `max_size + 1` bytes, so a caller sees an object over `max_size` without fetching it.
    An empty object is b"" (S3 answers a ranged GET of one with 416, which costs a HEAD to tell apart)."""

    def read() -> bytes:
        try:
            return bytes(fs.cat_file(path, start=0, end=max_size + 1))
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            fs.invalidate_cache(path)
            if int(fs.info(path)["size"]) != 0:
                raise
            return b""

    return with_retries(read, what="reading the object", url=url, sleep=sleep)


def _offset(value: object, url: str) -> int:
    """`value` as a byte offset: an integer (numpy's too), not a bool, a float or a string."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise VarstoreError(f"a byte offset must be an integer, not {type(value).__name__} {value!r}", path=url)


def _merge_ranges(path: str, ranges: Sequence[tuple[int, int]], max_gap: int) -> list[_Span]:
    """The spans of `path` to request for non-empty `ranges`: sorted, overlapping or `max_gap`-near ranges joined."""
    spans: list[_Span] = []
    for start, end in sorted(ranges):
        if spans and start - spans[-1].end <= max_gap:
            spans[-1] = _Span(path, spans[-1].start, max(spans[-1].end, end))
        else:
            spans.append(_Span(path, start, end))
    return spans


def _cut(fetched: dict[_Span, bytes], spans: list[_Span], span_starts: list[int], start: int, end: int) -> bytes:
    """Bytes [start, end) out of the fetched span that contains them (`spans` sorted, `span_starts` theirs)."""
    if start == end:
        return b""
    span = spans[bisect.bisect_right(span_starts, start) - 1]
    return fetched[span][start - span.start : end - span.start]


def upload_file(
    local_path: str, fs: AbstractFileSystem, path: str, *, url: str, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Copy the local file `local_path` to `path` on `fs` (the object `url`), whole, retrying transient faults."""
    with_retries(lambda: fs.put_file(local_path, path), what=f"uploading {local_path}", url=url, sleep=sleep)


def upload_manifest_bytes(
    fs: AbstractFileSystem, path: str, raw: bytes, *, url: str, create_only: bool, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Upload `raw` as the object at `path`, the commit of a dataset. With `create_only`, a conditional write
    (S3 ``If-None-Match: *``): an object already there raises `ShardExistsError`, unless it holds exactly `raw`
    (this upload, whose answer was lost and retried)."""
    with tempfile.TemporaryDirectory(prefix="varstore-upload-") as staging:
        staged = os.path.join(staging, "object")
        with open(staged, "wb") as file:
            file.write(raw)

        def upload() -> None:
            try:
                fs.put_file(staged, path, mode="create" if create_only else "overwrite")
            except FileExistsError:
                if bytes(fs.cat_file(path)) != raw:
                    raise ShardExistsError("a dataset was committed here meanwhile (by another writer)", path=url) from None

        with_retries(upload, what="uploading the manifest", url=url, sleep=sleep)


def download_file(
    fs: AbstractFileSystem, path: str, local_path: str, *, url: str, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Copy the object at `path` on `fs` (the object `url`) to the local file `local_path`, retrying transient
    faults. A failed download may leave a partial file: download to a temporary name and rename."""
    with_retries(lambda: fs.get_file(path, local_path), what=f"downloading to {local_path}", url=url, sleep=sleep)
