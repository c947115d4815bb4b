"""`RemoteLocation`: a URL in object storage, the options of the filesystem that reaches it, and this node's
cache for what is read from it.

Readers keep one and pickle it as plain values (`state`): the filesystem and the transport's client are
opened again, lazily, in each process that uses them, since clients hold sockets and event loops that do not
survive ``fork``.
"""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any

from .cache import NodeCache, default_cache_dir
from .transport import FsspecTransport, Transport, transport_for

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem


class RemoteLocation:
    """The object storage at `url` (a dataset's directory or a shard's prefix) and the node cache for it."""

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.cache = NodeCache(os.fspath(cache_dir) if cache_dir is not None else default_cache_dir(), limit_bytes=cache_limit)
        self._fsspec = FsspecTransport(self.url, self.storage_options)
        self._transport = transport_for(self.url, self.storage_options, self._fsspec)
        self._subpath = ""

    def at(self, name: str) -> RemoteLocation:
        """The location of `name` under this one, sharing its filesystem, transport and cache."""
        child = copy.copy(self)
        child.url = f"{self.url}/{name}"
        child._subpath = f"{self._subpath}/{name}"
        return child

    def filesystem(self) -> tuple[AbstractFileSystem, str]:
        """The filesystem and the path of `url` in it, opened in this process on first use (again after a fork)."""
        fs, root = self._fsspec.filesystem()
        return fs, root + self._subpath

    def transport(self) -> Transport:
        """What reads the objects under this location (and its parent's), by their URLs."""
        return self._transport

    def child(self, name: str) -> tuple[str, str]:
        """The filesystem path and the URL of the object `name` under `url`."""
        return f"{self.filesystem()[1]}/{name}", f"{self.url}/{name}"

    def sibling(self, suffix: str) -> tuple[str, str]:
        """The filesystem path and the URL of `url` + `suffix` (a shard's ``.data`` or ``.index`` object)."""
        return self.filesystem()[1] + suffix, self.url + suffix

    def options(self) -> dict[str, Any]:
        """The keyword arguments that reach this location again from its URL, in another process: plain values."""
        return {"storage_options": self.storage_options, "cache_dir": self.cache.directory, "cache_limit": self.cache.limit_bytes}

    def state(self) -> dict[str, Any]:
        """What rebuilds this location in another process (`from_state`): plain values, no client."""
        return {"url": self.url, **self.options()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RemoteLocation:
        return cls(state["url"], **{name: value for name, value in state.items() if name != "url"})
