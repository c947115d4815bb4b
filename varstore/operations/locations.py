"""Where an operation finds a store: a local path or a URL of object storage, and the options that reach a URL
(``storage_options``: the filesystem's keyword arguments, as fsspec passes them; ``cache_dir`` and
``cache_limit``: the node cache that remote readers fill)."""

from __future__ import annotations

import os
from typing import Any

from ..dataset import opening
from ..dataset.reader import ShardedReader
from ..format import header as fmt
from ..format.manifest import MANIFEST_NAME
from ..local.file_url import resolve_file_url
from ..remote.filesystems import is_url, open_filesystem
from ..shard.reader import Reader
from ..shard.remote_shard import RemoteShard

__all__ = ["Store", "filesystem", "is_url", "open_store", "shard_prefix", "store_path"]

Store = Reader | ShardedReader | RemoteShard


def store_path(path: str | os.PathLike[str]) -> str:
    """The path to open for what a user named: a dataset's ``manifest.json`` stands for its directory, a
    ``file://`` URL for the local path it names (`resolve_file_url`)."""
    path = resolve_file_url(path)
    if not is_url(path) and os.path.basename(path) == MANIFEST_NAME and os.path.isfile(path):
        return os.path.dirname(path) or "."
    return path


def shard_prefix(path: str) -> str:
    """A shard's prefix, from its prefix or either of its files' names."""
    return path.removesuffix(fmt.INDEX_SUFFIX).removesuffix(fmt.DATA_SUFFIX)


def remote_options(storage_options: dict[str, Any] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                   cache_limit: int | None = None) -> dict[str, Any]:
    """The keyword arguments of `varstore.open` for a URL."""
    return {"storage_options": storage_options, "cache_dir": cache_dir, "cache_limit": cache_limit}


def open_store(location: str, *, other_locations: tuple[str, ...] = (), **options: Any) -> Store:
    """The reader of what `location` names (a shard or a dataset, local or at a URL), as `varstore.open` opens it.

    `options` (`remote_options`) reach a URL; given for a local path they are refused as `varstore.open`
    refuses them, unless one of `other_locations` (the operation's other stores) is a URL."""
    if is_url(location):
        return opening.open(location, **options)
    if any(is_url(other) for other in other_locations):
        return opening.open(location)
    return opening.open(location, **options)


def filesystem(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """The fsspec filesystem of `url` (with `storage_options`) and the path of `url` in it, without a trailing slash."""
    fs, path = open_filesystem(url.rstrip("/"), storage_options)
    return fs, path.rstrip("/")
