"""`copy`: a dataset (or one shard) between any two locations, local paths or URLs, verified on arrival.

Shard by shard: each shard's files are brought to this machine (a local source is read where it is; a remote one
is downloaded into a temporary directory, one shard at a time, never into memory), checked against the manifest
entry and every record checksum, then copied or uploaded to the destination (data, then index). The manifest is
written last (`transfer`), then the destination is opened and verified in full, as `verify` does. Any failure
removes what the copy wrote, the manifest first: the destination is then left without a manifest, never with a
damaged dataset. The copy is byte for byte, so the destination's manifest, and with it the dataset's version, is
the source's.
"""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..dataset.local_source import open_listed_shard, verify_listed_shard
from ..dataset.reader import ShardedReader
from ..errors import CommandError, UsageError, VarstoreError
from ..format import header as fmt
from ..format.codecs import codec_from_stored
from ..format.manifest import Manifest, ShardEntry
from ..local.file_url import resolve_file_url
from ..local.publish import remove_quietly
from ..progress import Advance, Counter, ProgressBar, reporting
from ..remote.filesystems import download_file, upload_file, with_retries
from ..shard.reader import Reader
from .locations import Store, filesystem, is_url, open_store, remote_options, shard_prefix, store_path
from .transfer import copy_file, dataset_destination
from .verify import describe_damage, store_check

__all__ = ["CopyResult", "copy"]


@dataclass(frozen=True)
class CopyResult:
    """What `copy` brought from `source` to `destination`: `size` bytes of shard files, in `seconds`;
    `verified` says that the copy was verified in full on arrival."""

    source: str
    destination: str
    kind: str  # "dataset" or "shard"
    records: int
    shards: int
    size: int
    seconds: float
    verified: bool


def _same_location(source: str, destination: str) -> bool:
    if is_url(source) or is_url(destination):
        return source.rstrip("/") == destination.rstrip("/")
    return os.path.realpath(source) == os.path.realpath(destination)


class _SourceShards:
    """The shards of the source as local files, one at a time: where they are for a local source, downloaded
    into a temporary directory for a URL."""

    def __init__(self, storage_options: dict[str, Any] | None, staging: str) -> None:
        self._storage_options, self._staging = storage_options, staging

    def local(self, prefix: str) -> Iterator[str]:
        """The local prefix of the shard at `prefix` (a path or URL), valid while the generator is suspended."""
        if not is_url(prefix):
            yield prefix
            return
        fs, root = filesystem(prefix, self._storage_options)
        local = os.path.join(self._staging, os.path.basename(prefix))
        files = fmt.shard_paths(local)
        try:
            for path, suffix in zip(files, (fmt.DATA_SUFFIX, fmt.INDEX_SUFFIX)):
                download_file(fs, root + suffix, path, url=prefix + suffix)
            yield local
        finally:
            remove_quietly(list(files))


def _checked(check: Callable[[], None], source: str) -> None:
    """Run `check` of a shard's local copy; a failure names the shard at the source, not the temporary copy."""
    try:
        check()
    except VarstoreError as error:
        raise CommandError(f"{source}: damaged at the source, nothing was committed: {error}") from None


def _verify_arrival(location: str, options: dict[str, Any]) -> None:
    """Open the copy at `location` and check every byte, as `verify` does; a failure is a CommandError."""
    with ExitStack() as cleanup:
        _, _, check_all = store_check(location, options, cleanup)
        damage = describe_damage(check_all(Counter()))
    if damage is not None:
        raise CommandError(f"{location}: the copy failed verification on arrival and was removed: {damage}")


def _verify_listed(local: str, entry: ShardEntry, codec: Any, destination: str) -> None:
    with open_listed_shard(os.path.dirname(local) or ".", entry, codec) as reader:
        refuse_unrecorded_data_crc(reader, destination)
        verify_listed_shard(reader, entry)


def _verify_lone(local: str, destination: str) -> None:
    with Reader(local) as reader:
        refuse_unrecorded_data_crc(reader, destination)
        reader.verify()


def refuse_unrecorded_data_crc(reader: Reader, destination: str) -> None:
    """Object storage names and checks a downloaded data file by its data CRC32C, so a shard that records none
    (§1.2: a Megatron import without ``--data-crc``) cannot go there (by cp or merge); refused before its bytes
    are sent."""
    if is_url(destination) and not reader.header.data_crc_recorded:
        raise UsageError(f"{reader.index_path}: its data CRC32C is not recorded (imported without --data-crc), and object storage "
                         f"checks every download by it: import it again with --data-crc to copy it to {destination}")


class _ShardDestination:
    """A lone shard's new prefix, local or at a URL: refused if either file exists (unless `overwrite`, which
    removes them first, index first); on failure what was written is removed, index first."""

    def __init__(self, prefix: str, storage_options: dict[str, Any] | None, overwrite: bool) -> None:
        self.location, self._storage_options, self._overwrite = prefix.rstrip("/"), storage_options, overwrite
        self._written: list[str] = []

    def _names(self) -> list[str]:
        return list(reversed(fmt.shard_paths(self.location)))  # index first

    def __enter__(self) -> _ShardDestination:
        if is_url(self.location):
            self._fs, self._root = filesystem(self.location, self._storage_options)
        there = [name for name in self._names() if self._exists(name)]
        if there and not self._overwrite:
            raise CommandError(f"{there[0]}: already exists; pass --overwrite to replace the shard")
        for name in there:
            self._remove(name)
        return self

    def _path(self, name: str) -> str:
        return self._root + name[len(self.location):]

    def _exists(self, name: str) -> bool:
        if not is_url(name):
            return os.path.lexists(name)
        return with_retries(lambda: self._fs.exists(self._path(name)), what="looking for the shard", url=name)

    def _remove(self, name: str) -> None:
        if not is_url(name):
            remove_quietly([name])
        elif self._exists(name):
            with_retries(lambda: self._fs.rm_file(self._path(name)), what="deleting an object", url=name)

    def put(self, local: str, progress: Advance) -> None:
        """Copy or upload the shard at `local`: data file, then index."""
        for source, target in zip(fmt.shard_paths(local), fmt.shard_paths(self.location)):
            self._written.append(target)
            if is_url(target):
                upload_file(source, self._fs, self._path(target), url=target)
                progress(os.path.getsize(source))
            else:
                copy_file(source, target, progress)

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        if exc_type is not None:
            for name in reversed(self._written):
                self._remove(name)


def _copy_dataset(store: ShardedReader, destination: str, sources: _SourceShards, *, overwrite: bool, verify: bool,
                  options: dict[str, Any], progress: ProgressBar | None) -> tuple[int, int, int]:
    """Copy the dataset `store` reads to `destination`; (records, shards, bytes)."""
    manifest = store.manifest
    codec = codec_from_stored(manifest.codec, manifest.codec_params, path=store.path)
    total = sum(entry.data_size + entry.index_size for entry in manifest.shards)
    with dataset_destination(destination, options["storage_options"], command="cp", overwrite=overwrite) as target:
        with reporting(progress, total) as advance:
            for entry, prefix in zip(manifest.shards, store.shard_paths):
                for local in sources.local(prefix):
                    _checked(lambda: _verify_listed(local, entry, codec, destination), prefix)
                    target.put_shard(local, entry.name, advance)
        target.commit(Manifest(manifest.codec, manifest.codec_params, manifest.metadata, list(manifest.shards)))
        if verify:
            _verify_arrival(target.location, options)
    return len(store), len(manifest.shards), total


def _copy_shard(store: Store, destination: str, sources: _SourceShards, *, overwrite: bool, verify: bool,
                options: dict[str, Any], progress: ProgressBar | None) -> tuple[int, int, int]:
    """Copy the lone shard `store` reads to the prefix `destination`; (records, shards, bytes)."""
    prefix = shard_prefix(store.path)
    total = store.header.data_size + store.header.index_size
    with _ShardDestination(destination, options["storage_options"], overwrite) as target:
        with reporting(progress, total) as advance:
            for local in sources.local(prefix):
                _checked(lambda: _verify_lone(local, destination), prefix)
                target.put(local, advance)
        if verify:
            _verify_arrival(target.location, options)
    return len(store), 1, total


def copy(source: str | os.PathLike[str], destination: str | os.PathLike[str], *, overwrite: bool = False,
         verify: bool = True, storage_options: dict[str, Any] | None = None,
         cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | None = None,
         progress: ProgressBar | None = None) -> CopyResult:
    """Copy the dataset (or shard) at `source` to `destination`, either of them a local path or a URL of object
    storage (both reached with the same `storage_options`; `cache_dir` and `cache_limit` are the node cache's).

    Each shard is checked in full before it is written; the manifest is written last and, with `verify`, the
    copy is then verified in full (at a URL this downloads every object into the node cache). Any failure
    removes what was written, the manifest first, and raises. With `overwrite` the dataset (or shard) at
    `destination` is removed before the copy begins; otherwise one there is refused. `progress`
    (`varstore.progress`) is told the bytes to copy and each amount copied.
    """
    source, destination = store_path(source), resolve_file_url(destination)
    if _same_location(source, destination):
        raise UsageError(f"SRC and DST are the same place ({destination})")
    options = remote_options(storage_options, cache_dir, cache_limit)
    started = time.perf_counter()
    with open_store(source, other_locations=(destination,), **options) as store, \
            tempfile.TemporaryDirectory(prefix="varstore-cp-") as staging:
        sources = _SourceShards(storage_options, staging)
        how = {"overwrite": overwrite, "verify": verify, "options": options, "progress": progress}
        if isinstance(store, ShardedReader):
            kind, (records, shards, size) = "dataset", _copy_dataset(store, destination, sources, **how)
        else:
            kind, (records, shards, size) = "shard", _copy_shard(store, destination, sources, **how)
    return CopyResult(source, destination, kind, records, shards, size, time.perf_counter() - started, verify)
