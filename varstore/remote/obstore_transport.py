"""`ObstoreTransport`: a `Transport` that reads s3:// objects through obstore, the Python binding of Rust's
object_store, whose requests cost less than half the client CPU of s3fs's (aiobotocore spends about 3 ms on a
small ranged GET), so one process keeps more of them in flight.

It keeps the rules of `filesystems`, on which it builds:
- Retries: obstore's own are off (`max_retries` 0) and every request runs in `filesystems.with_retries`;
  obstore's errors reach it translated (`_translated`) into the errors it judges: a missing object is a
  `FileNotFoundError`; a missing bucket, refused credentials and any HTTP error answer are `StoreAnswer`s
  (the store's status and error code), so they get the same `StorageError`s and the same transient statuses
  (408, 429, 5xx); connection errors, timeouts and bodies cut short are `ConnectionError`s, retried.
- Deadline: each request is cancelled past `filesystems.request_deadline` (obstore's own overall timeout is
  set beyond any such deadline), a transient failure.
- Bodies: a ranged answer must be exactly the range asked, of an object of the size the caller gave (another
  size is a `FormatError` at once); obstore refuses a 200 to a ranged GET (a server that ignored Range)
  before reading its body, and every body is streamed and refused at the first chunk past its length, so a
  body longer than asked costs at most one chunk (`filesystems._READ_CHUNK`, or the span) more.
- Concurrency: a batch's ranges, of every object it reads, are planned at once (`read_plan.plan_reads`: near
  ranges share a request, requests carry at most `PART_BYTES`) and `_REQUESTS_IN_FLIGHT` of its requests are in
  flight at once, on one event loop per process. A download larger than `PART_BYTES` comes in ranged parts written at their offsets,
  `_PARTS_IN_FLIGHT` at once (none started after one fails: a forged size costs one request), a retry fetching
  only the parts still missing; a smaller one in one GET.
- Fork: obstore's runtime (tokio) does not survive `fork`: in a child of a process that made an obstore
  request, obstore hangs, even through a new client. Such a child reads through the fallback transport
  (fsspec's). `read_object` (a manifest: one small GET) always goes through fsspec, so a process that only
  opened a dataset (a DataLoader's main process) forks workers that build their own obstore client on first
  use; botocore also checks the stored checksum of a whole body there, which obstore does not.

`refusal` says why obstore cannot serve a root URL with given options (not installed, not s3://, an option or
environment setting with no translation), for `transport.transport_for`, which uses this transport only when
`VARSTORE_TRANSPORT=obstore` asks for it: a process that has made requests through obstore's asynchronous API
(0.12.1) exits with SIGABRT after its last statement about one time in three (25-50% here, and the same from a
bare asyncio script with no varstore code; its synchronous calls exited cleanly 10 times in 10).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import importlib.util
import os
import re
import threading
from typing import Any, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from . import filesystems, read_plan
from .filesystems import ObjectFailure, StoredObject
from .read_plan import ObjectRanges, Request

T = TypeVar("T")
P = TypeVar("P")

# The most bytes one request carries: longer spans and downloads are cut into parts of this size.
PART_BYTES = read_plan.DEFAULT_REQUEST_BYTES
# A download's parts in flight at once.
_PARTS_IN_FLIGHT = 32
# A batch's ranged reads in flight at once.
_REQUESTS_IN_FLIGHT = 64
_SCHEMES = ("s3://", "s3a://")
# obstore's overall timeout of a request, beyond any deadline of `filesystems.request_deadline`: that is the one.
_CLIENT_TIMEOUT = datetime.timedelta(days=1)
# s3fs's storage options and their S3Store keys; `endpoint_url` and `client_kwargs` are translated apart.
_OPTION_KEYS = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token"}
_CLIENT_KWARGS = frozenset({"region_name", "endpoint_url"})
# AWS_* variables that obstore reads itself as botocore does.
_SHARED_VARIABLES = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
     "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
     "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
     "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"}
)
# ... and those that change no read here: varstore makes the retries; the files are checked to be absent;
# botocore's metadata switch matters only without credentials (checked); obstore's AWS_ALLOW_HTTP allows what
# botocore allows anyway (an http:// endpoint).
_INERT_VARIABLES = frozenset(
    {"AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
     "AWS_EC2_METADATA_DISABLED", "AWS_ALLOW_HTTP"}
)
_FILES = (("AWS_CONFIG_FILE", "~/.aws/config"), ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"))

# What obstore's error messages say (its exceptions carry nothing else).
_STATUS = re.compile(r"non-2xx status code: (\d{3})")
_CODE = re.compile(r"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
_BUCKET = re.compile(r"<BucketName>([^<]*)</BucketName>")
_HTTP_ERROR_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")
_TRANSIENT_HTTP_ERROR_KINDS = frozenset({"Connect", "Request", "Interrupted", "Decode"})
_WRONG_BODY = ("Received non-partial response", "UnexpectedRange", "Wanted range starting at")

# The process whose obstore runtime is running (the first to make a request through obstore), if any: in a
# process forked from it, obstore hangs.
_runtime_pid: int | None = None
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None
_loop_lock = threading.Lock()


class StoreAnswer(Exception):
    """An error answer of the store to an obstore request: its HTTP status and, from its body, the store's error
    code, message and bucket, in the shape of botocore's ClientError (`response`), which `filesystems` judges
    (transient or not, a missing bucket, refused credentials)."""

    def __init__(self, text: str, status: int, code: str | None, message: str, bucket: str | None) -> None:
        super().__init__(text)
        error = {"Code": code, "Message": message, **({"BucketName": bucket} if bucket else {})}
        self.response = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}


def refusal(root_url: str, storage_options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> str | None:
    """Why obstore cannot read under `root_url` with `storage_options` (s3fs's) and the AWS_* environment as
    fsspec would; None if it can."""
    if not root_url.startswith(_SCHEMES):
        return f"obstore serves s3:// here, not {root_url.partition('://')[0]}://"
    if importlib.util.find_spec("obstore") is None:
        return "obstore is not installed: pip install 'varstore[s3]'"
    try:
        _store_options(storage_options, environ)
    except _Untranslatable as error:
        return str(error)
    return None


class _Untranslatable(Exception):
    """A storage option or environment setting that obstore's S3 client has no equivalent for."""


def _store_options(storage_options: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """S3Store's keyword arguments for s3fs's `storage_options` (`endpoint_url`, `key`, `secret`, `token`,
    `anon`, `client_kwargs` with `region_name` or `endpoint_url`) over what obstore reads from the environment;
    `_Untranslatable` for anything else, or for settings only botocore reads (profiles, ~/.aws files)."""
    config: dict[str, Any] = {}
    endpoint = region = None
    for name, value in storage_options.items():
        if name in _OPTION_KEYS and isinstance(value, str):
            config[_OPTION_KEYS[name]] = value
        elif name == "anon" and isinstance(value, bool):
            config["skip_signature"] = value
        elif name == "endpoint_url" and isinstance(value, str):
            endpoint = value
        elif name == "client_kwargs" and _plain_client_kwargs(value):
            endpoint = value.get("endpoint_url", endpoint)
            region = value.get("region_name")
        else:
            raise _Untranslatable(f"the storage option {name}={value!r} has no obstore equivalent")
    understood = _SHARED_VARIABLES | _INERT_VARIABLES
    others = sorted(name for name in environ if name.startswith("AWS_") and name not in understood)
    if others:
        raise _Untranslatable(f"the environment sets {', '.join(others)}, which obstore does not read as botocore does")
    for variable, default in _FILES:
        path = os.path.expanduser(environ.get(variable) or default)
        if os.path.exists(path):
            raise _Untranslatable(f"botocore reads {path} ({variable}), obstore does not")
    credentials = "access_key_id" in config or "AWS_ACCESS_KEY_ID" in environ or config.get("skip_signature")
    if not credentials and environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        raise _Untranslatable(
            "no credentials, and AWS_EC2_METADATA_DISABLED keeps botocore (not obstore) from the instance's"
        )
    endpoint = endpoint or environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    region = region or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if not endpoint and not region:
        raise _Untranslatable(
            "no region nor endpoint: botocore follows a bucket's redirect to its region, obstore does not"
        )
    if endpoint:
        config["endpoint"] = config["aws_endpoint_url_s3"] = endpoint  # the latter: or AWS_ENDPOINT_URL_S3 would win
    if region:
        config["region"] = region
    client = {"timeout": _CLIENT_TIMEOUT, "allow_http": bool(endpoint) and endpoint.lower().startswith("http://")}
    return {**config, "client_options": client, "retry_config": {"max_retries": 0}}


def _plain_client_kwargs(value: Any) -> bool:
    """Whether `value` is a `client_kwargs` of only a region name and an endpoint, both strings."""
    if not isinstance(value, dict) or not value.keys() <= _CLIENT_KWARGS:
        return False
    return all(isinstance(item, str) for item in value.values())


class ObstoreTransport:
    """`Transport` of the objects under an s3:// root URL through obstore: one client per process, built on first
    use (again after a fork), never pickled; `fallback` (a `transport.FsspecTransport`) serves `read_object`, and
    every read in a process forked from one that used obstore."""

    name = "obstore"
    checks_object_size = True

    def __init__(self, root_url: str, storage_options: Mapping[str, Any], fallback: Any) -> None:
        self._root_url = root_url.rstrip("/")
        self._bucket = self._root_url.partition("://")[2].partition("/")[0]
        self._options = _store_options(storage_options, os.environ)
        self._fallback = fallback
        self._store: tuple[int, Any] | None = None
        self._lock = threading.Lock()

    def client_name(self) -> str:
        """Which client reads in this process: "obstore", or "fsspec" in a process forked from one that used obstore."""
        return "obstore" if _runtime_pid in (None, os.getpid()) else "fsspec"

    def _client(self) -> Any:
        """This process's S3Store (built now if need be), or None if obstore cannot run in this process."""
        global _runtime_pid
        pid = os.getpid()
        store = self._store
        if store is not None and store[0] == pid:
            return store[1]
        with self._lock:
            if _runtime_pid not in (None, pid):
                return None
            from obstore.store import S3Store

            self._store = (pid, S3Store(self._bucket, **self._options))
            _runtime_pid = pid
            return self._store[1]

    @staticmethod
    def _key(url: str) -> str:
        """The key of the object `url` in its bucket (the root URL's)."""
        return url.partition("://")[2].partition("/")[2]

    def read_ranges(self, url: str, ranges: Sequence[tuple[int, int]], *, size: int) -> list[bytes]:
        return self.read_batch([ObjectRanges(url, size, ranges)])[0]

    def read_batch(self, objects: Sequence[ObjectRanges]) -> list[list[bytes]]:
        store = self._client()
        if store is None:
            return self._fallback.read_batch(objects)
        plan = read_plan.plan_reads(objects, request_bytes=PART_BYTES)
        requests = plan.requests
        fetched: dict[int, bytes] = {}

        async def read(position: int) -> bytes:
            request = requests[position]
            try:
                return await _read_part(store, self._key(request.name), request.start, request.end, request.size)
            except Exception as error:
                raise ObjectFailure(request.name, error) from error

        def fetch_missing() -> None:
            missing = (position for position in range(len(requests)) if position not in fetched)
            _raise_first(_run(_fetch_parts(missing, read, functools.partial(_request_length, requests), fetched, window=_REQUESTS_IN_FLIGHT)))

        if requests:
            what = f"reading {len(requests)} byte range(s)"
            filesystems.with_retries(fetch_missing, what=what, url=requests[0].name)
        return read_plan.cut_pieces(plan, [fetched[position] for position in range(len(requests))])

    def read_object(self, url: str, *, max_size: int) -> bytes:
        return self._fallback.read_object(url, max_size=max_size)

    def download_file(self, url: str, local_path: str, *, size: int) -> None:
        store = self._client()
        if store is None:
            self._fallback.download_file(url, local_path, size=size)
            return
        key = self._key(url)
        ranged = size > PART_BYTES  # else one GET of the whole object
        done: dict[tuple[int, int], None] = {}
        fd = os.open(local_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:

            def fetch_missing() -> None:
                missing = (part for part in (_parts(0, size) if ranged else [(0, size)]) if part not in done)

                def write(part: tuple[int, int]) -> Awaitable[None]:
                    return _download_part(store, key, fd, *part, size=size, ranged=ranged)

                _raise_first(_run(_fetch_parts(missing, write, _part_length, done, window=_PARTS_IN_FLIGHT)))

            filesystems.with_retries(fetch_missing, what=f"downloading to {local_path}", url=url)
        finally:
            os.close(fd)

    def object_info(self, url: str) -> StoredObject:
        store = self._client()
        if store is None:
            return self._fallback.object_info(url)
        key = self._key(url)

        def info() -> StoredObject:
            meta = _run(filesystems._within(_head(store, key), filesystems.request_deadline()))
            entry = {"ETag": meta["e_tag"], "VersionId": meta["version"], "LastModified": meta["last_modified"]}
            return StoredObject(int(meta["size"]), filesystems.object_tag(entry))

        return filesystems.with_retries(info, what="finding the object's size", url=url)


def _parts(start: int, end: int) -> Iterator[tuple[int, int]]:
    """[start, end) cut into requests of at most `PART_BYTES`, in order."""
    for offset in range(start, end, PART_BYTES):
        yield offset, min(offset + PART_BYTES, end)


def _part_length(part: tuple[int, int]) -> int:
    return part[1] - part[0]


def _request_length(requests: Sequence[Request], position: int) -> int:
    return requests[position].end - requests[position].start


def _raise_first(failures: list[BaseException]) -> None:
    """Raise a permanent failure of `failures` if there is one (retrying cannot help it), else a transient one."""
    if failures:
        raise min(failures, key=filesystems.is_transient)


# -- requests on this process's event loop -----------------------------------------------------------------------


def _event_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop, running in a daemon thread, started on first use (again after a fork)."""
    global _loop
    running = _loop
    if running is not None and running[0] == os.getpid():
        return running[1]
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="varstore-obstore", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]



def _run(coroutine: Awaitable[T]) -> T:
    """`coroutine` run on this process's event loop, from this (another) thread."""
    return asyncio.run_coroutine_threadsafe(coroutine, _event_loop()).result()


async def _fetch_parts(
    parts: Iterable[P],
    fetch: Callable[[P], Awaitable[T]],
    length: Callable[[P], int],
    results: dict[P, T],
    *,
    window: int,
) -> list[BaseException]:
    """`results[part] = await fetch(part)` for each part, at most `window` at once, each under the deadline of a
    request of its `length`; no part is started after one fails. The failures."""
    failures: list[BaseException] = []

    async def one(part: P) -> None:
        try:
            results[part] = await filesystems._within(fetch(part), filesystems.request_deadline(length(part)))
        except Exception as error:  # noqa: BLE001 - the caller judges every failure (`_raise_first`)
            failures.append(error)

    running: set[asyncio.Future[None]] = set()
    for part in parts:
        while len(running) >= window:
            _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        if failures:
            break
        running.add(asyncio.ensure_future(one(part)))
    if running:
        await asyncio.wait(running)
    return failures


async def _get(store: Any, key: str, byte_range: tuple[int, int] | None) -> Any:
    import obstore

    try:
        return await obstore.get_async(store, key, options={"range": byte_range} if byte_range else None)
    except Exception as error:
        raise _translated(error) from error


async def _chunks(result: Any, chunk: int) -> Any:
    """The chunks of `result`'s body, at least `chunk` bytes each but the last, obstore's errors translated."""
    stream = result.stream(min_chunk_size=chunk)
    while True:
        try:
            piece = await stream.__anext__()
        except StopAsyncIteration:
            return
        except Exception as error:
            raise _translated(error) from error
        yield piece


def _check_size(result: Any, size: int) -> None:
    """Refuse, before reading its body, an answer about an object that is not `size` bytes, as `filesystems` does on
    fsspec: not retried, a `FormatError`. (obstore itself refuses an answer whose Content-Range is not the range.)"""
    found = int(result.meta["size"])
    if found != size:
        raise filesystems._WrongObjectSize(f"the object is {found} bytes, not the {size} expected")


async def _read_part(store: Any, key: str, start: int, end: int, size: int) -> bytes:
    """Bytes [start, end) of the object `key` of `size` bytes, in one ranged GET."""
    result = await _get(store, key, (start, end))
    _check_size(result, size)
    pieces = []
    length = 0
    # One chunk, unless the body runs past the range (a chunked answer carries no length that the client checks).
    async for piece in _chunks(result, end - start + 1):
        length += len(piece)
        if length > end - start:
            raise filesystems._wrong_length(start, end, length)
        pieces.append(piece)
    if length != end - start:
        raise filesystems._wrong_length(start, end, length)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


async def _download_part(store: Any, key: str, fd: int, start: int, end: int, size: int, ranged: bool) -> None:
    """Bytes [start, end) of the object `key` of `size` bytes written at their offsets in the file `fd`: by a
    ranged GET if `ranged`, else the whole object in one GET."""
    result = await _get(store, key, (start, end) if ranged else None)
    _check_size(result, size)
    position = start
    async for piece in _chunks(result, min(filesystems._READ_CHUNK, end - start + 1)):
        if position + len(piece) > end:
            raise filesystems._wrong_length(start, end, position + len(piece) - start)
        filesystems._write_at(fd, position, piece)
        position += len(piece)
    if position != end:
        raise filesystems._wrong_length(start, end, position - start)


async def _head(store: Any, key: str) -> Any:
    """The object's metadata (one HEAD). A HEAD's error answer has no body to say why: a missing object or a
    refusal is asked again as a one-byte GET, whose answer says whether the bucket exists and what the store
    made of the credentials."""
    import obstore

    try:
        return await obstore.head_async(store, key)
    except Exception as error:
        head_error = _translated(error)
        unexplained = isinstance(head_error, StoreAnswer) and head_error.response["Error"]["Code"] is None
        if not (isinstance(head_error, FileNotFoundError) or unexplained):
            raise head_error from error
        raise (await _explained(store, key) or head_error) from error


async def _explained(store: Any, key: str) -> BaseException | None:
    """What the store says, in the body of its answer to a one-byte GET of `key`, is wrong (the object or its
    bucket missing, the credentials refused); None if that GET says nothing more."""
    try:
        await _get(store, key, (0, 1))
    except (StoreAnswer, OSError) as answer:
        explained = isinstance(answer, StoreAnswer) and answer.response["Error"]["Code"] is not None
        if explained or isinstance(answer, FileNotFoundError):
            return answer
    return None


def _translated(error: BaseException) -> BaseException:
    """obstore's `error` as the error `filesystems` judges: a missing object stays a `FileNotFoundError`; a
    store's error answer (a missing bucket, refused credentials, 503 SlowDown...) is a `StoreAnswer`; a
    connection error, timeout or cut body a `ConnectionError` or `TimeoutError`; a body that is not the range
    asked a wrong-length error; anything else (a bad configuration) as it is, permanent."""
    text = str(error)
    summary = text.partition("\n\nDebug source:")[0]
    status = _STATUS.search(text)
    code = _CODE.search(text)
    if status is not None:
        if isinstance(error, FileNotFoundError) and (code is None or code.group(1) != "NoSuchBucket"):
            return error
        message, bucket = _MESSAGE.search(text), _BUCKET.search(text)
        said = f" {code.group(1)}: {message.group(1) if message else ''}" if code else ""
        return StoreAnswer(
            f"the store answered {status.group(1)}{said}", int(status.group(1)), code.group(1) if code else None,
            message.group(1) if message else "", bucket.group(1) if bucket else None,
        )
    if isinstance(error, FileNotFoundError):
        return error
    if any(marker in text for marker in _WRONG_BODY):
        return filesystems._TruncatedBody(f"{summary}: the server ignored the Range header, or the object changed")
    kind = _HTTP_ERROR_KIND.search(text)
    if kind is not None and kind.group(1) == "Timeout":
        return TimeoutError(summary)
    if kind is not None and kind.group(1) in _TRANSIENT_HTTP_ERROR_KINDS:
        return ConnectionError(summary)
    return error
