"""Where merge and copy write a dataset, a local directory or a URL: shards first, each from a local copy, then the
manifest, the commit point. After a failure what the operation wrote is removed again, the manifest first, so a
reader never finds a manifest naming objects that are not whole.

A local directory is written as merge always did: under its writer lock, files linked or copied durably,
the manifest committed with `commit_manifest_file`. At a URL each shard is uploaded data object first, then
index object (the order the remote writer uses: an index object means a whole data object), and the manifest
last with a create-only write (S3 ``If-None-Match: *``). Object stores have no lock: two operations writing one
URL at once must be kept apart by the user; the create-only manifest write refuses the second one's commit.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import CommandError, MissingFileError, ShardExistsError, StorageError, VarstoreError, listing
from ..format import header as fmt
from ..format.manifest import MANIFEST_NAME, Manifest, checked_manifest_bytes
from ..local.destination import check_destination, is_dataset_file, removed_if_created_and_failed
from ..local.locks import LOCK_SUFFIX, WriterLock, lock_directory
from ..local.manifest_file import commit_manifest_file
from ..local.publish import (
    fsync_directory,
    hard_link,
    make_directories,
    publish,
    remove_quietly,
    storage_error,
    sync_directory,
    temporary_path,
    write_all,
)
from ..progress import Advance
from ..remote.filesystems import is_url, list_sizes, upload_file, upload_manifest_bytes, with_retries
from .locations import filesystem

_COPY_CHUNK_BYTES = 8 << 20


def copy_file(source: str, destination: str, progress: Advance) -> None:
    """Copy durably: into a temporary name, fsync, then rename to `destination` (which must not exist)."""
    temporary = temporary_path(destination)
    try:
        with open(source, "rb") as reader:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                while chunk := reader.read(_COPY_CHUNK_BYTES):
                    write_all(fd, chunk)
                    progress(len(chunk))
                os.fsync(fd)
            finally:
                os.close(fd)
        publish([(temporary, destination)], overwrite=False)
    except OSError as error:
        if isinstance(error, VarstoreError):
            raise
        # A failed write or fsync (a full disk) names no file: say which copy failed.
        raise StorageError(f"copying {source} failed: {error.strerror or error}", path=destination) from None
    finally:
        remove_quietly([temporary])


def link_or_copy(source: str, destination: str, copy: bool, progress: Advance) -> bool:
    """Bring one file to `destination`; True if it was hard-linked, False if copied."""
    if not copy:
        try:
            if hard_link(source, destination):
                progress(os.path.getsize(destination))
                return True
        except OSError as error:
            raise StorageError(f"linking {source} failed: {error.strerror or error}", path=destination) from None
    copy_file(source, destination, progress)
    return False


class LocalDestination:
    """A dataset directory, created if missing (and removed again, if created, when the command fails), locked
    for one writer from `__enter__` to `__exit__`.

    `overwrite`: a dataset already there is replaced; its manifest is removed first, then its files, so that a
    failure leaves no dataset rather than a damaged one. Otherwise a directory holding a dataset's files is refused
    (pointing at ``--overwrite`` if the command has it: `overwrite` is not None).
    """

    def __init__(self, directory: str, *, command: str, overwrite: bool | None = None, allow_other_files: bool = False,
                 copy: bool = True) -> None:
        self.location = directory
        self._command, self._overwrite, self._allow_other_files, self._copy = command, overwrite, allow_other_files, copy
        self._created: list[str] = []
        self.linked = 0
        self._lock: WriterLock | None = None

    def __enter__(self) -> LocalDestination:
        self._removed_if_failed = removed_if_created_and_failed(self.location)
        self._removed_if_failed.__enter__()
        try:
            if os.path.lexists(self.location) and not os.path.isdir(self.location):
                raise CommandError(f"{self.location}: exists and is not a directory")
            try:
                make_directories(self.location)
            except OSError as error:
                raise storage_error(error, "creating the destination directory") from None
            # One writer per directory: the lock is held until the manifest is committed and synced.
            self._lock = lock_directory(self.location)
            if self._overwrite is False and os.path.exists(os.path.join(self.location, MANIFEST_NAME)):
                raise CommandError(f"{self.location}: a dataset is already there; pass --overwrite to replace it")
            check_destination(self.location, command=self._command, keeps_dataset=bool(self._overwrite),
                              allow_other_files=self._allow_other_files)
            if self._overwrite:
                self._remove_dataset()
        except BaseException as error:
            self._release()
            self._removed_if_failed.__exit__(type(error), error, error.__traceback__)
            raise
        return self

    def _remove_dataset(self) -> None:
        """Remove the dataset's files here, the manifest first (and durably) so no reader sees it without them."""
        names = [name for name in os.listdir(self.location) if is_dataset_file(name) and not name.endswith(LOCK_SUFFIX)]
        ordered = sorted(names, key=lambda name: name != MANIFEST_NAME)
        for name in ordered:
            remove_quietly([os.path.join(self.location, name)])
            if name == MANIFEST_NAME:
                sync_directory(self.location)

    def put_shard(self, local_prefix: str, name: str, progress: Advance) -> None:
        """Link or copy the shard at `local_prefix` here as `name`, data file first."""
        for source, target in zip(fmt.shard_paths(local_prefix), fmt.shard_paths(os.path.join(self.location, name))):
            self.linked += link_or_copy(source, target, self._copy, progress)
            self._created.append(target)

    def commit(self, manifest: Manifest) -> None:
        try:
            fsync_directory(self.location)  # the shards' names are durable before the manifest that lists them
        except OSError as error:
            raise StorageError(f"fsync of the directory failed: {error.strerror or error}", path=self.location) from None
        self._created.append(os.path.join(self.location, MANIFEST_NAME))
        commit_manifest_file(self.location, manifest)
        sync_directory(self.location)

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        try:
            if exc_type is not None:
                manifest = [path for path in self._created if os.path.basename(path) == MANIFEST_NAME]
                remove_quietly(manifest)  # first: a reader must not find the manifest without its shards
                remove_quietly([path for path in self._created if path not in manifest])
        finally:
            self._release()
            self._removed_if_failed.__exit__(exc_type, exc, traceback)


class RemoteDestination:
    """A dataset at a URL, written with `storage_options`.

    A URL already holding a dataset's objects (a manifest, shards, an interrupted writer's journal) is refused
    unless `overwrite` (pointing at ``--overwrite`` if the command has it: `overwrite` is not None); then they are
    deleted first, the manifest before the rest, so that a failure leaves no dataset rather than a damaged one.
    Other objects under the URL are left alone.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None, *, command: str,
                 overwrite: bool | None = None) -> None:
        self.location = url.rstrip("/")
        self._storage_options, self._command, self._overwrite = storage_options, command, overwrite
        self._created: list[str] = []  # object names, in the order they were uploaded
        self.linked = 0

    def __enter__(self) -> RemoteDestination:
        self._fs, self._root = filesystem(self.location, self._storage_options)
        try:
            names = sorted(name for name in list_sizes(self._fs, self._root, url=self.location) if is_dataset_file(name))
        except MissingFileError:
            names = []
        if names and not self._overwrite:
            advice = "pass --overwrite to replace it" if self._overwrite is not None else f"{self._command} writes a new dataset"
            raise CommandError(f"{self.location}: a dataset, or an interrupted writer's objects, is already there "
                               f"({listing(names, 5)}); {advice}")
        # Manifest first, then index objects before their data: nothing left ever names what is gone.
        for name in sorted(names, key=lambda name: (name != MANIFEST_NAME, not name.endswith(fmt.INDEX_SUFFIX))):
            self._delete(name)
        return self

    def _object(self, name: str) -> str:
        return f"{self._root}/{name}"

    def _url(self, name: str) -> str:
        return f"{self.location}/{name}"

    def _delete(self, name: str) -> None:
        try:
            with_retries(lambda: self._fs.rm_file(self._object(name)), what="deleting an object", url=self._url(name))
        except MissingFileError:
            pass

    def put_shard(self, local_prefix: str, name: str, progress: Advance) -> None:
        """Upload the shard at `local_prefix` as `name`: its data object, then its index object."""
        for source, target in zip(fmt.shard_paths(local_prefix), fmt.shard_paths(name)):
            self._created.append(target)
            upload_file(source, self._fs, self._object(target), url=self._url(target))
            progress(os.path.getsize(source))

    def commit(self, manifest: Manifest) -> None:
        """Upload the manifest, create-only: a dataset another writer committed meanwhile is never replaced."""
        url = self._url(MANIFEST_NAME)
        raw = checked_manifest_bytes(manifest, path=url)
        self._created.append(MANIFEST_NAME)
        try:
            upload_manifest_bytes(self._fs, self._object(MANIFEST_NAME), raw, url=url, create_only=True)
        except ShardExistsError:
            self._created.remove(MANIFEST_NAME)  # another writer's: never delete it
            raise

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        if exc_type is None:
            return
        # The manifest first, then index objects before data: a failure never leaves a manifest or a lone index.
        for name in sorted(self._created, key=lambda name: (name != MANIFEST_NAME, not name.endswith(fmt.INDEX_SUFFIX))):
            try:
                self._delete(name)
            except VarstoreError as error:
                if name == MANIFEST_NAME:
                    raise CommandError(f"{exc}; removing the manifest again failed too, so it is still there, naming "
                                       f"what may be damaged: {error}") from exc
                # A shard object left over is unreferenced: no manifest names it.


def dataset_destination(location: str, storage_options: dict[str, Any] | None, *, command: str,
                        overwrite: bool | None = None, allow_other_files: bool = False,
                        copy: bool = True) -> LocalDestination | RemoteDestination:
    """Where `command` writes its dataset: `location` is a local directory or a URL (reached with `storage_options`)."""
    if is_url(location):
        return RemoteDestination(location, storage_options, command=command, overwrite=overwrite)
    return LocalDestination(location, command=command, overwrite=overwrite, allow_other_files=allow_other_files, copy=copy)
