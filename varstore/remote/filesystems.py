"""fsspec filesystems for URLs, and the transfers varstore makes through them: ranged reads, whole-file
uploads and downloads, each retrying transient faults with bounded backoff.

fsspec and its backends are imported only when a URL is opened: they are optional (`varstore[remote]`,
`varstore[s3]`), and `import varstore` needs neither. Every failure leaves as a `VarstoreError` naming the URL
and what was being done: `MissingFileError` for an object that does not exist, `StorageError` otherwise.

Retries: `with_retries` is the only retry loop. For s3:// `open_filesystem` turns off s3fs's own retry loop
and botocore's, which would otherwise multiply with it (5 x 5 x 5 requests for one persistent 503), so a
persistent fault costs exactly `attempts` requests per helper call. Transient: connection resets and
timeouts, HTTP 408/429/5xx, a body that is not the length asked for (cut short, or longer: a server that
ignored Range), a body that fails botocore's own checksum check, and a request that outlives its deadline.

Deadlines: on asynchronous backends (s3://, gs://, az://, http(s)://) every request these helpers make has an
overall deadline, `request_deadline`: `VARSTORE_REQUEST_DEADLINE` seconds (default 300) plus one second per
MiB the request carries, so a server that trickles a body (a byte a second) cannot keep a read alive forever
(a socket timeout never fires on it); a request past its deadline is cancelled and counts as transient.

Bounded bodies: on s3:// ranged reads, whole-object reads and downloads stream the body and never ask it for
more than one byte past the length wanted (the range, the download's size when the caller knows it, a
manifest's limit): a body whose headers already say it is not that length is refused before it is read, and
one that runs longer is refused at that byte, so a server that ignores Range costs the bytes asked for plus
what the HTTP client reads ahead on the connection (a few hundred KiB at most), never the whole object in
memory or on disk. A ranged response also names the object's size (Content-Range): one that is not the size
the caller gave is a `FormatError` at once, never retried (so readers learn an object's size from their first
read of it, without a HEAD: `checks_object_size`). Other backends read through fsspec (`cat_ranges`, `cat_file`), which holds a whole body
before its length can be checked.

A missing bucket and refused credentials are `StorageError`s that say so (not "no such object"), never retried.

Request cost, when nothing fails (each transient failure adds one request for what failed):
- `open_filesystem`: none (clients connect on first use).
- `read_range`: one GET; `read_ranges`: one GET per request of `read_plan.plan_reads` (ranges within 64 KiB of
  each other merged, at most 8 MiB each), concurrent; none for empty ranges; `read_planned`: the same over the
  ranges of many objects at once (a batch's shards), at most the connection pool (32 unless the caller sets
  botocore's `max_pool_connections`) in flight. All take the objects' sizes from the caller (the manifest knows
  them) and refuse ranges outside them unsent.
- `read_heads`: one GET per object, concurrent. `read_object`: one GET. `list_sizes`: one LIST per 1,000 objects.
- `upload_file`: one PUT; s3fs uploads a large file (twice its block size, 50 MiB, or more) in parts, a
  request each plus two. A retry sends the whole file again.
- `download_file`: one GET; for an object larger than s3fs's block size (50 MiB) whose size the caller gives,
  a HEAD (its size must be that one) and one ranged GET per block instead, `fs.max_concurrency` at once (other backends: one GET, and for a large
  object what the backend does). A retry fetches only the blocks still missing (s3://) or the whole object.

Fork safety: a filesystem holds sockets and, for async backends (s3fs), an event loop thread, neither of
which survives `fork`. Never keep a filesystem across a fork: in the child, call `open_filesystem` again
(fsspec drops its instance cache in a forked child, so that builds a fresh client, from the session the parent
made and the child inherits: `_shared_session`). An s3fs filesystem
used in the child anyway fails at once (fsspec refuses it: "not fork-safe"), a `StorageError` here.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import http.client
import math
import os
import random
import re
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Sequence, TypeVar

from ..errors import FormatError, MissingFileError, ShardExistsError, StorageError, VarstoreError
from . import read_plan
from .read_plan import ObjectRanges, ReadPlan

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

T = TypeVar("T")

DEFAULT_MAX_GAP = read_plan.DEFAULT_MAX_GAP
DEFAULT_ATTEMPTS = 5
# Cap of one backoff delay: a retried read should fail in seconds, not minutes.
_MAX_DELAY = 2.0
_FIRST_DELAY = 0.05
# The overall deadline of one request: this many seconds (the environment variable, if set) plus
# `_DEADLINE_SECONDS_PER_MIB` per MiB the request carries.
DEADLINE_VARIABLE = "VARSTORE_REQUEST_DEADLINE"
DEFAULT_REQUEST_DEADLINE = 300.0
_DEADLINE_SECONDS_PER_MIB = 1.0
# A streamed body is read at most this many bytes at a time (and never more than one byte past what is wanted).
_READ_CHUNK = 1 << 20
# Requests of one batch in flight at once on s3://, the connection pool varstore asks of botocore unless the
# caller sets `config_kwargs["max_pool_connections"]` (botocore's own default is 10).
_DEFAULT_POOL_CONNECTIONS = 32
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
# S3 error codes for credentials the store does not accept (s3fs makes them PermissionError, as AccessDenied).
_CREDENTIAL_ERROR_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired",
     "InvalidClientTokenId", "AuthorizationHeaderMalformed"}
)


class _TruncatedBody(ConnectionError):
    """A response carried fewer (or more) bytes than the range asked for: a cut connection, or a server that
    ignored the Range header; retried (and never read past the length asked for on s3://)."""


class _WrongObjectSize(Exception):
    """A ranged response of an object whose size is not the one the caller knows: not retried, and raised as a
    `FormatError` naming the URL (the object is not the one a manifest or index describes)."""


class ObjectFailure(Exception):
    """The failure `error` of a request of the object `url`, in a call that reads several objects: `with_retries`
    judges `error` and names `url` in what it raises."""

    def __init__(self, url: str, error: BaseException) -> None:
        super().__init__(url, error)
        self.url, self.error = url, error


class _DeadlineExceeded(Exception):
    """A request that had no complete answer within its deadline (`request_deadline`); retried. (Not a
    TimeoutError: fsspec would replace it, message and all, by a bare FSTimeoutError on its way out of the
    event loop.)"""


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
    _opened_filesystems.add(fs)
    return fs, path


def _keep_inherited_filesystems() -> None:
    """In a forked child, hold every filesystem the parent opened for the child's life. The child opens its own
    (fsspec drops the parent's from its cache), and the parent's, once collected, would run s3fs's finalizer,
    which closes its client through the parent's event loop: that loop does not run in the child, and fsspec
    waits a whole second for it (`sync` waits in steps of 1 s) in whichever thread the garbage collector ran,
    a DataLoader worker's batch handoff among them. Its sockets are the parent's: the child has nothing to close."""
    _inherited_filesystems.extend(_opened_filesystems)


_opened_filesystems: weakref.WeakSet[Any] = weakref.WeakSet()
_inherited_filesystems: list[Any] = []
os.register_at_fork(after_in_child=_keep_inherited_filesystems)


def _backend_options(scheme: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """`storage_options` with, for s3://, botocore's retries turned off unless the caller set them, and this
    process's shared aiobotocore session (`_shared_session`) unless the caller gave a session or options of one."""
    if scheme not in _S3_SCHEMES:
        return storage_options
    config = dict(storage_options.get("config_kwargs") or {})
    config.setdefault("retries", dict(_BOTOCORE_SINGLE_ATTEMPT))
    config.setdefault("max_pool_connections", _DEFAULT_POOL_CONNECTIONS)
    options = {**storage_options, "config_kwargs": config}
    if "session" not in options and not any(name in options for name in _SESSION_OPTIONS):
        options["session"] = _shared_session()
    return options


def _shared_session() -> Any:
    """One aiobotocore session for every S3 filesystem varstore opens, made on first use and inherited by forked
    children. A client is made from a session, and the session keeps the service descriptions it parsed for the
    first one: a second client costs 20-50 ms instead of 0.3-0.9 s (on the test machine), and a DataLoader worker
    forked after its parent opened a dataset makes its own client at that price. (fsspec makes a new filesystem,
    and so a new client, in every forked child: the parent's sockets and event loop do not survive a fork.)"""
    global _session
    with _session_lock:
        if _session is None:
            from aiobotocore.session import AioSession

            _session = AioSession()
        return _session


def _forget_session_lock() -> None:
    global _session_lock
    _session_lock = threading.Lock()  # a thread of the parent may have held it at the fork


# s3fs options that it gives to the aiobotocore session it makes: a caller who sets one gets s3fs's own session.
_SESSION_OPTIONS = ("profile", "session_vars", "event_hooks", "include_builtin_handlers")
_session: Any = None
_session_lock = threading.Lock()
os.register_at_fork(after_in_child=_forget_session_lock)


def with_retries(
    action: Callable[[], T],
    *,
    what: str,
    url: str,
    attempts: int = DEFAULT_ATTEMPTS,
    first_delay: float = _FIRST_DELAY,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`action()`, tried up to `attempts` times while it fails transiently (connection reset, timeout, HTTP
    5xx or SlowDown, a body of the wrong length or failing botocore's checksum, a request past its deadline),
    waiting a random time up to `first_delay * 2**n` before retry n (exponential backoff with full jitter,
    `backoff_delay`). `what` says what was being done, for the error.

    A missing object raises `MissingFileError`; a missing bucket, refused credentials, any other permanent
    failure, or a transient one that outlasts the attempts, raises `StorageError`; a `VarstoreError` from
    `action` passes unchanged.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    attempt = 1
    while True:
        try:
            return action()
        except VarstoreError:
            raise
        except Exception as caught:
            error, failed_url = (caught.error, caught.url) if isinstance(caught, ObjectFailure) else (caught, url)
            try:
                _raise_unless_retried(error, what, failed_url, attempt == attempts, attempts)
            finally:
                del error  # else this frame, in the traceback of what is raised, would keep its cause: a cycle
            sleep(backoff_delay(attempt, first_delay))
            attempt += 1


def _raise_unless_retried(error: Exception, what: str, url: str, last: bool, attempts: int) -> None:
    """Raise the `VarstoreError` that `error`, a failure of `what` on the object `url`, calls for; return if it is
    transient and not the `last` of `attempts`, to be tried again."""
    if isinstance(error, _WrongObjectSize):
        raise FormatError(f"{what}: {error}", path=url) from None
    if _error_code(error)[0] == "InvalidRange":  # S3's 416: a range this code checked against the size given
        raise FormatError(f"{what}: the object is shorter than the size expected", path=url) from error
    refusal = _refusal(error, what, url)
    if refusal is not None:
        raise refusal from error
    if isinstance(error, FileNotFoundError):
        raise MissingFileError(f"{what}: no such object", path=url) from error
    if not is_transient(error):
        raise StorageError(f"{what} failed: {_describe(error)}", path=url) from error
    if last:
        raise StorageError(f"{what} failed {attempts} times, the last with: {_describe(error)}", path=url) from error


def backoff_delay(attempt: int, first_delay: float = _FIRST_DELAY) -> float:
    """How long to wait before retry number `attempt` (1 for the first): a random time up to `first_delay *
    2**(attempt - 1)`, at most `_MAX_DELAY` (exponential backoff with full jitter)."""
    return random.uniform(0, min(_MAX_DELAY, first_delay * 2 ** (attempt - 1)))


def _refusal(error: BaseException, what: str, url: str) -> StorageError | None:
    """A `StorageError` that says what is wrong when `error` is a missing bucket or credentials the store
    refused (neither is retried, and neither is a missing object); else None."""
    code, message, bucket = _error_code(error)
    bucketless = isinstance(error, FileNotFoundError) and "bucket does not exist" in str(error)
    if code == "NoSuchBucket" or (code is None and bucketless):
        name = bucket or _bucket_of(url)
        return StorageError(
            f"{what}: the bucket {name!r} does not exist; create it first (varstore creates no buckets), "
            "or check the URL and the endpoint",
            path=url,
        )
    if code in _CREDENTIAL_ERROR_CODES:
        return StorageError(
            f"{what}: the store refused the credentials ({code}: {message}); check the key and secret given "
            "(storage_options, or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE for S3) and the endpoint",
            path=url,
        )
    if code == "AccessDenied":
        return StorageError(
            f"{what}: access denied ({message}): these credentials may not make this request here",
            path=url,
        )
    if _is_no_credentials(error):
        return StorageError(
            f"{what}: no credentials were found ({error}); pass them in storage_options or set them in the "
            "environment (for S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)",
            path=url,
        )
    return None


def _error_code(error: BaseException) -> tuple[str | None, str, str | None]:
    """The store's error code, message and bucket name, from `error` or the errors it was raised from
    (botocore's ClientError under s3fs's OSError)."""
    for current in _chain(error):
        response = getattr(current, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            details = response["Error"]
            return details.get("Code"), str(details.get("Message") or ""), details.get("BucketName")
    return None, "", None


def _is_no_credentials(error: BaseException) -> bool:
    return any(type(current).__name__ in ("NoCredentialsError", "PartialCredentialsError") for current in _chain(error))


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and the errors it was raised from or during, each once."""
    found: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in found):
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _bucket_of(url: str) -> str:
    """The bucket (or container, or host) a URL names: what follows the scheme, up to the first '/'."""
    match = _URL_SCHEME.match(url)
    rest = url[match.end() :] if match else url
    return rest.split("/", 1)[0]


def is_transient(error: BaseException) -> bool:
    """Whether `error` is a fault that a retry may not meet again; an error that does not tell is judged
    by the error it was raised from (s3fs raises OSErrors from botocore's and aiohttp's)."""
    for current in _chain(error):
        verdict = _transient_verdict(current)
        if verdict is not None:
            return verdict
    return False


def _transient_verdict(error: BaseException) -> bool | None:
    """True if `error` itself is transient, False if it is permanent, None if it does not tell."""
    if isinstance(error, _PERMANENT_OS_ERRORS):
        return False
    if isinstance(error, _TRANSIENT_BUILTIN_ERRORS + (_DeadlineExceeded,) + _backend_transient_types()):
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
        # A body that failed botocore's own checksum check (FlexibleChecksumError, ChecksumError).
        for name in ("FlexibleChecksumError", "ChecksumError"):
            if hasattr(botocore_errors, name):
                types.append(getattr(botocore_errors, name))
    except ImportError:
        pass
    try:
        from botocore.parsers import ResponseParserError  # a reply cut inside its XML

        types += [ResponseParserError]
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


def request_deadline(nbytes: int = 0) -> float:
    """The overall deadline, in seconds, of one request that carries about `nbytes` bytes: `VARSTORE_REQUEST_DEADLINE`
    (default 300) plus one second per MiB. A value that is not a positive number of seconds is a `VarstoreError`."""
    raw = os.environ.get(DEADLINE_VARIABLE, "").strip()
    if raw:
        try:
            base = float(raw)
        except ValueError:
            base = math.nan
        if not (math.isfinite(base) and base > 0):
            raise VarstoreError(f"{DEADLINE_VARIABLE} must be a positive number of seconds, not {raw!r}")
    else:
        base = DEFAULT_REQUEST_DEADLINE
    return base + max(0, nbytes) / (1 << 20) * _DEADLINE_SECONDS_PER_MIB


@dataclass(frozen=True)
class StoredObject:
    """What a listing or a HEAD says of one object: its size, and `tag`, what the store gives that tells this
    version of the object from another (its ETag, version id or generation; else its modification time; "" if
    the store gives nothing), for cache keys: `object_tag`."""

    size: int
    tag: str


_IDENTITY_FIELDS = ("ETag", "etag", "VersionId", "version_id", "generation")
_TIME_FIELDS = ("LastModified", "last_modified", "mtime", "updated", "created")


def object_tag(entry: Mapping[str, Any]) -> str:
    """What the listing or info `entry` of an object says identifies its content: its ETag (S3, GCS, Azure; an
    S3 ETag is the MD5 of the bytes, or of the parts' MD5s), version id or generation where there is one; else
    its modification time (memory://, file://); "" if none. A time is spelled as a POSIX timestamp, so that a
    listing's float and a HEAD's datetime agree."""
    tags = [f"{name}={_spelled(entry[name])}" for name in _IDENTITY_FIELDS if entry.get(name) not in (None, "")]
    if not tags:
        tags = [f"{name}={_spelled(entry[name])}" for name in _TIME_FIELDS if entry.get(name) not in (None, "")][:1]
    return " ".join(tags)


def _spelled(value: Any) -> str:
    timestamp = getattr(value, "timestamp", None)
    return repr(float(timestamp())) if callable(timestamp) else str(value)


@dataclass(frozen=True)
class _Span:
    """One request: bytes [start, end) of the object at `path` (named `url` in errors), covering one or more
    wanted ranges; `object_size` is the size the caller knows the object has (a response that says otherwise is
    refused)."""

    path: str
    start: int
    end: int
    object_size: int
    url: str


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
    """Bytes [start, end) of the object at `path`, `size` bytes long, exactly `end - start` of them (a body of
    another length is retried)."""
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
    caller knows it from the manifest): `read_planned` of `read_plan.plan_reads`'s requests (ranges that
    overlap or lie within `max_gap` bytes of each other share one request).

    A range that is not integers with 0 <= start <= end <= size is a `VarstoreError`, raised before any
    request: a range past the end can only come back short, and retrying it would fetch it again and again.
    """
    plan = read_plan.plan_reads([ObjectRanges(url, size, ranges)], max_gap=max_gap)
    return read_planned(fs, plan, {url: path}, sleep=sleep)[0]


def read_planned(
    fs: AbstractFileSystem, plan: ReadPlan, paths: Mapping[str, str], *, sleep: Callable[[float], None] = time.sleep
) -> list[list[bytes]]:
    """Each object's wanted ranges of `plan` (whose objects are named by URL; `paths` gives each one's path in
    `fs`), in order: all its requests at once (at most the client's connection pool in flight), every response
    checked for its exact length (a body longer than its range is refused as a short one is); a retry fetches only
    the requests still missing. An error names the object whose request failed."""
    spans = [_Span(paths[request.name], request.start, request.end, request.size, request.name) for request in plan.requests]
    objects = len({request.name for request in plan.requests})
    what = f"reading {len(spans)} byte range(s)" + (f" of {objects} objects" if objects > 1 else "")
    first_url = plan.requests[0].name if plan.requests else ""
    bodies = _fetch_spans(fs, spans, what=what, url=first_url, sleep=sleep)
    return read_plan.cut_pieces(plan, bodies)


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
    spans = [_Span(path, 0, min(length, size), size, url) for path, size in sized_paths]
    bodies = iter(_fetch_spans(fs, [span for span in spans if span.end > 0], what=f"reading {len(spans)} headers", url=url, sleep=sleep))
    return [next(bodies) if span.end > 0 else b"" for span in spans]


def _fetch_spans(
    fs: AbstractFileSystem, spans: Sequence[_Span], *, what: str, url: str, sleep: Callable[[float], None]
) -> list[bytes]:
    """The bytes of each span, in order, fetched concurrently; a retry fetches only those still missing. A failure
    names its span's URL when the spans are of more than one object, else `url`."""
    fetched: dict[int, bytes] = {}
    several = len({span.url for span in spans}) > 1

    def fetch_missing() -> None:
        missing = [position for position in range(len(spans)) if position not in fetched]
        failures: list[tuple[BaseException, str]] = []
        for position, result in zip(missing, _request_spans(fs, [spans[position] for position in missing])):
            span = spans[position]
            if isinstance(result, BaseException):
                failures.append((result, span.url))
            elif len(result) != span.end - span.start:
                failures.append((_wrong_length(span.start, span.end, len(result)), span.url))
            else:
                fetched[position] = bytes(result)
        if failures:
            error, failed_url = min(failures, key=lambda failure: is_transient(failure[0]))  # a permanent one first
            raise ObjectFailure(failed_url, error) if several else error

    if spans:
        with_retries(fetch_missing, what=what, url=url, sleep=sleep)
    return [fetched[position] for position in range(len(spans))]


def _request_spans(fs: AbstractFileSystem, spans: Sequence[_Span]) -> list[Any]:
    """One request per span, concurrent, each under its deadline: its bytes, or the exception it failed with.
    On s3:// a body is streamed and never read past its span's length; on other asynchronous backends through
    `_cat_file`; on synchronous ones (memory://, file://) through `cat_ranges`."""
    if _is_s3(fs):
        makers = [functools.partial(_s3_read_span, fs, span) for span in spans]
    elif _is_async(fs):
        cat_file = fs._cat_file  # type: ignore[attr-defined]
        makers = [functools.partial(cat_file, span.path, start=span.start, end=span.end) for span in spans]
    else:
        return list(fs.cat_ranges(
            [span.path for span in spans], [span.start for span in spans], [span.end for span in spans], on_error="return"
        ))
    return _run(fs, _gather_within(makers, [request_deadline(span.end - span.start) for span in spans], _pool_size(fs)))


def _wrong_length(start: int, end: int, found: int) -> _TruncatedBody:
    detail = ": the server ignored the Range header, or the object changed" if found > end - start else ""
    return _TruncatedBody(f"bytes [{start}, {end}) came back as {found} bytes{detail}")


def list_sizes(fs: AbstractFileSystem, path: str, *, url: str, sleep: Callable[[float], None] = time.sleep) -> dict[str, int]:
    """The size of every object directly under the directory `path`, by name (`list_objects`)."""
    return {name: stored.size for name, stored in list_objects(fs, path, url=url, sleep=sleep).items()}


def list_objects(
    fs: AbstractFileSystem, path: str, *, url: str, sleep: Callable[[float], None] = time.sleep
) -> dict[str, StoredObject]:
    """The size and tag (`object_tag`) of every object directly under the directory `path`, by name: a fresh
    listing (one LIST request per 1,000 objects on S3), never fsspec's cached one, which misses what was
    written since."""

    def listing() -> dict[str, StoredObject]:
        fs.invalidate_cache(path)
        entries = _call(fs, "ls", path, detail=True)
        return {
            entry["name"].rstrip("/").rsplit("/", 1)[-1]: StoredObject(int(entry.get("size") or 0), object_tag(entry))
            for entry in entries
            if entry.get("type") == "file"
        }

    return with_retries(listing, what="listing the objects", url=url, sleep=sleep)


def object_info(fs: AbstractFileSystem, path: str, *, url: str, sleep: Callable[[float], None] = time.sleep) -> StoredObject:
    """The size and tag of the object at `path`, asked afresh (one HEAD on S3; fsspec caches listings)."""

    def info() -> StoredObject:
        fs.invalidate_cache(path)
        entry = _call(fs, "info", path)
        return StoredObject(int(entry["size"]), object_tag(entry))

    return with_retries(info, what="finding the object's size", url=url, sleep=sleep)


def read_object(
    fs: AbstractFileSystem, path: str, *, url: str, max_size: int, sleep: Callable[[float], None] = time.sleep
) -> bytes:
    """The object at `path` read whole in one GET, for small objects where ranged reads could mix two versions
    (a manifest): at most `max_size + 1` bytes, so a caller sees an object over `max_size` without fetching it
    (on s3:// not even from a server that ignores the Range header). An empty object is b"" (S3 answers a
    ranged GET of one with 416, which costs a HEAD to tell apart)."""

    def read() -> bytes:
        try:
            if _is_s3(fs):
                return _run(fs, _within(_s3_read_prefix(fs, path, max_size + 1), request_deadline(max_size + 1)))
            return bytes(_call(fs, "cat_file", path, start=0, end=max_size + 1, nbytes=max_size + 1))
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            fs.invalidate_cache(path)
            if int(_call(fs, "info", path)["size"]) != 0:
                raise
            return b""

    return with_retries(read, what="reading the object", url=url, sleep=sleep)


def upload_file(
    local_path: str, fs: AbstractFileSystem, path: str, *, url: str, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Copy the local file `local_path` to `path` on `fs` (the object `url`), whole, retrying transient faults."""

    def upload() -> None:
        _call(fs, "put_file", local_path, path, nbytes=_local_size(local_path))

    with_retries(upload, what=f"uploading {local_path}", url=url, sleep=sleep)


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
                _call(fs, "put_file", staged, path, mode="create" if create_only else "overwrite", nbytes=len(raw))
            except FileExistsError:
                if bytes(_call(fs, "cat_file", path, nbytes=len(raw))) != raw:
                    raise ShardExistsError("a dataset was committed here meanwhile (by another writer)", path=url) from None

        with_retries(upload, what="uploading the manifest", url=url, sleep=sleep)


def download_file(
    fs: AbstractFileSystem,
    path: str,
    local_path: str,
    *,
    url: str,
    size: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Copy the object at `path` on `fs` (the object `url`) to the local file `local_path`, retrying transient
    faults. With `size` (the caller knows it: a manifest, an index), on s3:// a body that is not `size` bytes is
    refused (before it is read, when its headers say so; else one byte past `size`), so a hostile or broken
    server cannot fill the disk, and an object over s3fs's block size comes in blocks, a retry fetching only
    those still missing. A failed download may leave a partial file: download to a temporary name and rename."""
    what = f"downloading to {local_path}"
    if size is None or not _is_s3(fs):
        with_retries(lambda: _call(fs, "get_file", path, local_path, nbytes=size or 0), what=what, url=url, sleep=sleep)
        return
    block = max(1, int(getattr(fs, "default_block_size", None) or 50 << 20))
    if size > block:  # one HEAD before planning the blocks: a size from a forged manifest may be 2**62 bytes
        found = object_info(fs, path, url=url, sleep=sleep).size
        if found != size:
            raise FormatError(f"{what}: the object is {found} bytes, not the {size} expected", path=url)
    parts = [(start, min(start + block, size)) for start in range(0, size, block)] or [(0, 0)]
    whole = len(parts) == 1  # one GET without a Range: botocore then checks the object's own checksum, if stored
    done: set[tuple[int, int]] = set()
    fd = os.open(local_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:

        def fetch_missing() -> None:
            missing = [part for part in parts if part not in done]
            makers = [functools.partial(_s3_download_part, fs, path, fd, start, end, not whole, size) for start, end in missing]
            deadlines = [request_deadline(end - start) for start, end in missing]
            concurrency = max(1, min(int(getattr(fs, "max_concurrency", 1) or 1), _pool_size(fs)))
            failures: list[BaseException] = []
            for part, result in zip(missing, _run(fs, _gather_within(makers, deadlines, concurrency))):
                if isinstance(result, BaseException):
                    failures.append(result)
                else:
                    done.add(part)
            if failures:
                raise min(failures, key=is_transient)

        with_retries(fetch_missing, what=what, url=url, sleep=sleep)
    finally:
        os.close(fd)


def _local_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# -- requests under a deadline, and bounded bodies on s3:// ------------------------------------------------------


def _is_async(fs: Any) -> bool:
    return bool(getattr(fs, "async_impl", False))


def checks_object_size(fs: Any) -> bool:
    """Whether ranged reads through `fs` refuse a response of an object that is not the size the caller gave (s3://:
    each response's Content-Range names the object's size); elsewhere a caller who must know asks with a HEAD."""
    return _is_s3(fs)


def _is_s3(fs: Any) -> bool:
    return _is_async(fs) and type(fs).__module__.partition(".")[0] == "s3fs" and hasattr(fs, "_call_s3")


def _pool_size(fs: Any) -> int:
    """How many requests of one batch run at once: the client's connection pool (botocore's
    `max_pool_connections`), so that a request's deadline does not run while it waits for a connection."""
    config = getattr(fs, "config_kwargs", None) or {}
    return max(1, int(config.get("max_pool_connections") or _DEFAULT_POOL_CONNECTIONS))


def _call(fs: Any, name: str, *args: Any, nbytes: int = 0, **kwargs: Any) -> Any:
    """`fs.<name>(*args, **kwargs)`; on an asynchronous backend its coroutine, under the deadline of a request
    carrying `nbytes` bytes."""
    if _is_async(fs) and hasattr(fs, "_" + name):
        deadline = request_deadline(nbytes)
        return _run(fs, _within(getattr(fs, "_" + name)(*args, **kwargs), deadline))
    return getattr(fs, name)(*args, **kwargs)


def _run(fs: Any, coroutine: Awaitable[T]) -> T:
    """Run `coroutine` on the event loop of the asynchronous filesystem `fs`, from this (another) thread; on
    s3:// once the client exists, so that making it (a second or more, the first time) counts against no
    request's deadline."""
    from fsspec.asyn import sync

    try:
        loop = fs.loop  # fsspec refuses a filesystem used in a forked child here ("not fork-safe")
    except BaseException:
        with contextlib.suppress(Exception):
            coroutine.close()  # type: ignore[attr-defined]
        raise
    return sync(loop, _with_client, fs, coroutine)


async def _with_client(fs: Any, coroutine: Awaitable[T]) -> T:
    if _is_s3(fs):
        try:
            await fs.set_session()  # at once, once it exists
        except BaseException:
            with contextlib.suppress(Exception):
                coroutine.close()  # type: ignore[attr-defined]
            raise
    return await coroutine


async def _within(awaitable: Awaitable[T], seconds: float) -> T:
    """`await awaitable`, cancelled after `seconds`: then `_DeadlineExceeded`. (A timeout raised inside, a socket's,
    passes as itself.)"""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise _DeadlineExceeded(
            f"no complete answer within {seconds:.6g} s, the request's deadline ({DEADLINE_VARIABLE} seconds plus "
            f"{_DEADLINE_SECONDS_PER_MIB:g} per MiB)"
        )
    return task.result()


async def _gather_within(
    makers: Sequence[Callable[[], Awaitable[Any]]], deadlines: Sequence[float], concurrency: int
) -> list[Any]:
    """Each `makers[i]()` awaited under `deadlines[i]`, at most `concurrency` at once (a request's deadline runs
    from its start): the results, or the exceptions raised, in order."""
    slots = asyncio.Semaphore(concurrency)

    async def one(make: Callable[[], Awaitable[Any]], seconds: float) -> Any:
        async with slots:
            return await _within(make(), seconds)

    runs = [one(make, seconds) for make, seconds in zip(makers, deadlines)]
    return list(await asyncio.gather(*runs, return_exceptions=True))


async def _s3_get_object(fs: Any, path: str, byte_range: tuple[int, int] | None) -> dict[str, Any]:
    """S3's GetObject of `path` (bytes [start, end) of it if `byte_range`): the response, its body not yet read."""
    bucket, key, version = fs.split_path(path)
    extra: dict[str, Any] = {"VersionId": version} if version else {}
    if byte_range is not None:
        extra["Range"] = f"bytes={byte_range[0]}-{byte_range[1] - 1}"
    return await fs._call_s3("get_object", Bucket=bucket, Key=key, **extra)


def _check_declared(response: dict[str, Any], start: int, end: int, ranged: bool, object_size: int) -> None:
    """Refuse, before reading a byte of it, a response whose headers say its body is not bytes [start, end) of an
    object of `object_size` bytes. A range of an object of another size is no fault of the way: `_WrongObjectSize`,
    never retried (the object is not the one the caller knows, and asking again cannot change that)."""
    declared = response.get("ContentLength")
    content_range = str(response.get("ContentRange") or "") if ranged else ""
    total = content_range.rpartition("/")[2]
    if content_range and total != str(object_size):  # first: a shorter object also answers with fewer bytes
        raise _WrongObjectSize(f"the object is {total} bytes, not the {object_size} expected")
    if isinstance(declared, int) and declared != end - start:
        if not ranged:  # the whole object's length is its size
            raise _WrongObjectSize(f"the object is {declared} bytes, not the {object_size} expected")
        raise _wrong_length(start, end, declared)
    if content_range and not content_range.startswith(f"bytes {start}-{end - 1}/"):
        raise _TruncatedBody(
            f"bytes [{start}, {end}) came back as {content_range}: the object changed, or the server ignored the Range header"
        )


async def _stream_body(body: Any, start: int, end: int, sink: Callable[[int, bytes], None]) -> None:
    """Read `body`, which must be bytes [start, end), to its end, giving each chunk to `sink(offset, chunk)`;
    never asking for more than one byte past `end`. Reading on to the end of the stream lets botocore check the body's
    checksum and length (it does so at the end only)."""
    position = start
    while True:
        chunk = await body.read(min(_READ_CHUNK, end - position + 1))
        if not chunk:
            break
        if position + len(chunk) > end:
            raise _TruncatedBody(
                f"bytes [{start}, {end}) came back as more than {end - start} bytes: the server ignored the Range "
                "header, or the object changed"
            )
        sink(position, chunk)
        position += len(chunk)
    if position != end:
        raise _wrong_length(start, end, position - start)


async def _s3_read_span(fs: Any, span: _Span) -> bytes:
    response = await _s3_get_object(fs, span.path, (span.start, span.end))
    body = response["Body"]
    try:
        _check_declared(response, span.start, span.end, True, span.object_size)
        buffer = bytearray()
        await _stream_body(body, span.start, span.end, lambda _, chunk: buffer.extend(chunk))
        return bytes(buffer)
    finally:
        body.close()


async def _s3_read_prefix(fs: Any, path: str, limit: int) -> bytes:
    """The object at `path` whole if it has at most `limit` bytes, else its first `limit` bytes: one GET of bytes
    [0, limit), never more than `limit` bytes read, even from a server that ignores the Range header."""
    response = await _s3_get_object(fs, path, (0, limit))
    body = response["Body"]
    try:
        buffer = bytearray()
        while len(buffer) < limit:
            chunk = await body.read(min(_READ_CHUNK, limit - len(buffer)))
            if not chunk:
                break  # the end of the stream: botocore has checked the checksum, if the object has one
            buffer += chunk
        return bytes(buffer)
    finally:
        body.close()


async def _s3_download_part(fs: Any, path: str, fd: int, start: int, end: int, ranged: bool, size: int) -> None:
    """Bytes [start, end) of the object at `path`, `size` bytes long, written at their offsets in the file `fd`
    (the whole object, in one GET without a Range, unless `ranged`)."""
    response = await _s3_get_object(fs, path, (start, end) if ranged else None)
    body = response["Body"]
    try:
        _check_declared(response, start, end, ranged, size)
        await _stream_body(body, start, end, functools.partial(_write_at, fd))
    finally:
        body.close()


def _write_at(fd: int, offset: int, chunk: bytes) -> None:
    view = memoryview(chunk)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
