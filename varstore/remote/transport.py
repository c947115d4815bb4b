"""The reads a remote reader makes, behind one interface that more than one client serves.

A `Transport` reads objects under one root URL, each named by its own URL: ranged reads (those of a whole batch,
over many objects, planned at once by `read_plan.plan_reads` and issued concurrently), a small object whole,
a download to a local file, a HEAD. `FsspecTransport` makes them through fsspec (`filesystems`), for every
scheme fsspec knows; `ObstoreTransport` (obstore_transport.py) through obstore, for s3://. Every
transport follows the rules of `filesystems`: the same retries with backoff, the same deadline per request,
exact-length bodies, and the same errors (`MissingFileError`, `StorageError`, naming the URL).

Writes (uploads, listings, deletes) stay on fsspec: they are few and not on a training run's path.

Which transport reads (`transport_for`): fsspec's, unless `VARSTORE_TRANSPORT=obstore` asks for obstore's
(`=fsspec`, or unset, is fsspec's; any other value is an error), which then reads s3:// (and
s3a://) URLs whose storage options and AWS_* settings all translate into its client's (`obstore_transport.refusal`:
s3fs's `endpoint_url`, `key`, `secret`, `token`, `anon`, `client_kwargs` with `region_name` or `endpoint_url`; no
profile, no ~/.aws file, a region or an endpoint known), and is an error that says why anywhere else. Not the
default, though its requests cost less than half of s3fs's client CPU (1.2 ms against 2.9 ms for a 9 KB ranged
GET, 64 at once, on the test machine): end to end, tools/bench/remote.py (its varstore and varstore-obstore
peers, 20 ms per request) found obstore faster on shuffled map-style epochs (525 samples/s against 413) and
slower on streams (912 against 1,236), moto's own CPU being the bound there, and a process that used obstore's
asynchronous API may abort at exit (obstore_transport's docstring).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Protocol, Sequence

from ..errors import VarstoreError
from . import filesystems, obstore_transport, read_plan
from .filesystems import StoredObject
from .read_plan import ObjectRanges

# Chooses the transport of every remote read: "fsspec" (the default) or "obstore".
TRANSPORT_VARIABLE = "VARSTORE_TRANSPORT"
_TRANSPORTS = ("fsspec", "obstore")


class Transport(Protocol):
    """Reads of the objects under one root URL, retried and bounded as `filesystems` says."""

    checks_object_size: bool
    """Whether `read_ranges` refuses (`FormatError`) a response of an object that is not `size` bytes."""

    def read_ranges(self, url: str, ranges: Sequence[tuple[int, int]], *, size: int) -> list[bytes]:
        """The bytes of each [start, end) of the object `url`, `size` bytes long (ranges outside it are refused
        unsent); near ranges share a request, requests run concurrently."""
        ...

    def read_batch(self, objects: Sequence[ObjectRanges]) -> list[list[bytes]]:
        """`read_ranges` of every object of `objects` (named by URL) at once: one plan over all of them
        (`read_plan.plan_reads`), its requests in flight together, each object's pieces in its ranges' order."""
        ...

    def read_object(self, url: str, *, max_size: int) -> bytes:
        """The object `url` whole in one GET, or its first `max_size + 1` bytes if it is longer."""
        ...

    def download_file(self, url: str, local_path: str, *, size: int) -> None:
        """The object `url`, which must be `size` bytes, copied to `local_path` (never more than `size` bytes
        written; a failure may leave a partial file)."""
        ...

    def object_info(self, url: str) -> StoredObject:
        """The object's size and tag, asked afresh (one HEAD)."""
        ...


class FsspecTransport:
    """`Transport` through the fsspec filesystem of the root URL, opened on first use in each process."""

    name = "fsspec"

    def __init__(self, root_url: str, storage_options: dict[str, Any]) -> None:
        self._root_url = root_url.rstrip("/")
        self._storage_options = storage_options
        self._opened: tuple[int, Any, str] | None = None
        self._lock = threading.Lock()

    def filesystem(self) -> tuple[Any, str]:
        """The fsspec filesystem and the root URL's path in it, opened in this process (again after a fork)."""
        opened = self._opened
        if opened is None or opened[0] != os.getpid():
            with self._lock:
                fs, path = filesystems.open_filesystem(self._root_url, self._storage_options)
                self._opened = opened = (os.getpid(), fs, path.rstrip("/"))
        return opened[1], opened[2]

    @property
    def checks_object_size(self) -> bool:
        """On s3:// every ranged response's Content-Range names the object's size, and `filesystems` checks it."""
        return filesystems.checks_object_size(self.filesystem()[0])

    def path_of(self, url: str) -> str:
        """The filesystem path of the object `url`, which lies under the root URL."""
        fs, root = self.filesystem()
        return root + url[len(self._root_url) :]

    def read_ranges(self, url: str, ranges: Sequence[tuple[int, int]], *, size: int) -> list[bytes]:
        return self.read_batch([ObjectRanges(url, size, ranges)])[0]

    def read_batch(self, objects: Sequence[ObjectRanges]) -> list[list[bytes]]:
        fs, _ = self.filesystem()
        plan = read_plan.plan_reads(objects)
        return filesystems.read_planned(fs, plan, {wanted.name: self.path_of(wanted.name) for wanted in objects})

    def read_object(self, url: str, *, max_size: int) -> bytes:
        fs, _ = self.filesystem()
        return filesystems.read_object(fs, self.path_of(url), url=url, max_size=max_size)

    def download_file(self, url: str, local_path: str, *, size: int) -> None:
        fs, _ = self.filesystem()
        filesystems.download_file(fs, self.path_of(url), local_path, url=url, size=size)

    def object_info(self, url: str) -> StoredObject:
        fs, _ = self.filesystem()
        return filesystems.object_info(fs, self.path_of(url), url=url)


def transport_for(root_url: str, storage_options: dict[str, Any], fsspec_transport: FsspecTransport) -> Transport:
    """The transport that reads under `root_url`: obstore's if `VARSTORE_TRANSPORT=obstore` (an error if it cannot
    read there), else fsspec's (`fsspec_transport`, which the location also writes through)."""
    forced = os.environ.get(TRANSPORT_VARIABLE, "").strip()
    if forced not in ("", *_TRANSPORTS):
        raise VarstoreError(f"{TRANSPORT_VARIABLE} must be one of {', '.join(_TRANSPORTS)} (or unset), not {forced!r}")
    if forced != "obstore":
        return fsspec_transport
    refusal = obstore_transport.refusal(root_url, storage_options)
    if refusal is not None:
        raise VarstoreError(f"{TRANSPORT_VARIABLE}=obstore, but obstore cannot read here: {refusal}", path=root_url)
    return obstore_transport.ObstoreTransport(root_url, storage_options, fsspec_transport)
