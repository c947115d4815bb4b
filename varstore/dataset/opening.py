"""`open`: what a path or URL names, opened with the reader that fits it — the one place that chooses.

A local shard prefix (or either of its files) opens as a `Reader`, a local dataset directory (or its manifest)
as a `ShardedReader` of its directory; a URL as a `RemoteShard` or a `ShardedReader` whose source is the
object store (`open_url`). A ``file://`` URL is the local path it names (`resolve_file_url`).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import MissingFileError, VarstoreError
from ..format import header as fmt
from ..format.manifest import MANIFEST_NAME
from ..local.file_url import resolve_file_url
from ..remote.filesystems import is_url, read_object
from ..remote.location import RemoteLocation
from ..shard.reader import Reader
from ..shard.remote_shard import RemoteShard
from .reader import ShardedReader


def _object_exists(fs: Any, path: str, url: str) -> bool:
    """Whether the object at `path` exists, asked by a GET of its first byte: fsspec's ``exists`` answers False
    for a missing bucket or refused credentials too, and a HEAD's answer carries no error code to tell them
    apart; this GET's does, and `read_object` raises the `StorageError` that says which."""
    try:
        read_object(fs, path, url=url, max_size=0)
    except MissingFileError:
        return False
    return True


def open_url(
    url: str,
    *,
    verify_reads: bool = False,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
    set_aside_damaged: bool = False,
) -> Any:
    """What `url` names: a dataset (its directory or its manifest.json) as a `ShardedReader`, or one shard
    (its prefix, or either of its objects) as a `RemoteShard`; `set_aside_damaged` as `open_setting_aside_damaged`."""

    options = {"storage_options": storage_options, "cache_dir": cache_dir, "cache_limit": cache_limit}
    url = url.rstrip("/")
    if url.endswith("/" + MANIFEST_NAME):
        return _dataset_reader(url[: -len(MANIFEST_NAME) - 1], set_aside_damaged, verify_reads=verify_reads, **options)
    for suffix in (fmt.INDEX_SUFFIX, fmt.DATA_SUFFIX):
        if url.endswith(suffix):
            return RemoteShard(url[: -len(suffix)], verify_reads=verify_reads, **options)
    location = RemoteLocation(url, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
    fs, path = location.filesystem()
    manifest_path, manifest_url = location.child(MANIFEST_NAME)
    fs.invalidate_cache(path)  # asked afresh: a listing fsspec cached earlier may predate the dataset
    if _object_exists(fs, manifest_path, manifest_url):
        return _dataset_reader(url, set_aside_damaged, verify_reads=verify_reads, **options)
    if _object_exists(fs, path + fmt.INDEX_SUFFIX, url + fmt.INDEX_SUFFIX):
        return RemoteShard(url, verify_reads=verify_reads, **options)
    raise MissingFileError(
        f"no varstore shard or dataset here: looked for {url}{fmt.INDEX_SUFFIX} and {url}/{MANIFEST_NAME}", path=url
    )


def _dataset_reader(directory: str, set_aside_damaged: bool, **options: Any) -> ShardedReader:
    if set_aside_damaged:
        return ShardedReader._open_quarantining(directory, **options)
    return ShardedReader(directory, **options)


def open(  # noqa: A001
    path: str | os.PathLike[str],
    *,
    verify_reads: bool = False,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
) -> Reader | ShardedReader | RemoteShard:
    """Open what a `Writer` or `ShardedWriter` wrote at `path`: a shard prefix (or either of its files) or a dataset
    (its directory, or its ``manifest.json``).

    `path` may be a URL of object storage (``s3://bucket/dataset``, ``memory://...``, any fsspec URL):
    `storage_options` go to its filesystem (for S3, s3fs's ``endpoint_url``, ``key``, ``secret``...), and what is
    fetched whole (index files; data files a stream or `verify` needs) is kept in the node cache at `cache_dir`
    (default `varstore.remote.cache.default_cache_dir()`), at most `cache_limit` bytes of it. A ``file://`` URL is
    the local path it names.

    The reader pins the version it opened: pickled (to a DataLoader worker, say) it
    reopens the same absolute path or URL, whatever the current directory then, and raises
    `DatasetReplacedError` if the files there are no longer that version.
    """
    return _open(path, False, verify_reads=verify_reads, storage_options=storage_options, cache_dir=cache_dir,
                 cache_limit=cache_limit)


def open_setting_aside_damaged(path: str | os.PathLike[str], **options: Any) -> Reader | ShardedReader | RemoteShard:
    """`open`, but a dataset whose listed shards fail their checks at the open opens anyway, with those shards set
    aside (`ShardedReader._open_quarantining`): its other records read, one of theirs raises the damage found.
    For commands that show what they can of a damaged dataset (``varstore info``, ``dump``)."""
    return _open(path, True, **options)


def _open(
    path: str | os.PathLike[str],
    set_aside_damaged: bool,
    *,
    verify_reads: bool = False,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
) -> Reader | ShardedReader | RemoteShard:
    path = resolve_file_url(path)
    if is_url(path):
        return open_url(path, verify_reads=verify_reads, storage_options=storage_options, cache_dir=cache_dir,
                        cache_limit=cache_limit, set_aside_damaged=set_aside_damaged)
    if storage_options is not None or cache_dir is not None or cache_limit is not None:
        raise VarstoreError("storage_options, cache_dir and cache_limit apply to URLs, not to a local path", path=path)
    if os.path.basename(path) == MANIFEST_NAME and os.path.isfile(path):
        return _dataset_reader(os.path.dirname(path) or ".", set_aside_damaged, verify_reads=verify_reads)
    if os.path.isdir(path):
        return _dataset_reader(path, set_aside_damaged, verify_reads=verify_reads)
    if not os.path.exists(path + fmt.INDEX_SUFFIX):
        for suffix in (fmt.INDEX_SUFFIX, fmt.DATA_SUFFIX):
            if path.endswith(suffix) and os.path.exists(path):
                return Reader(path[: -len(suffix)], verify_reads=verify_reads)
        raise MissingFileError(
            f"no varstore shard or dataset here: looked for {path}{fmt.INDEX_SUFFIX} and {os.path.join(path, MANIFEST_NAME)}",
            path=path,
        )
    return Reader(path, verify_reads=verify_reads)
