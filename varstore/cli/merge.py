"""``varstore merge``: one dataset from many shards and datasets, hard-linking their files (or copying them) and writing a manifest."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import sys
from dataclasses import dataclass
from typing import Any

import varstore

from .. import format as fmt
from ..codecs import make_codec
from ..errors import StorageError, VarstoreError
from ..locking import lock_directory
from ..manifest import MANIFEST_NAME, Manifest, ShardEntry, commit_manifest_file, describe_shard
from ..storage import (
    fsync_directory, make_directories, publish, remove_quietly, storage_error, sync_directory, temporary_path, write_all,
)
from .arguments import STORE_HELP, add_quiet_option, json_object, store_path
from .destination import add_allow_other_files_option, check_destination, removed_if_created_and_failed
from .errors import CommandError, UsageError
from .output import Progress, describe_codec, format_size, plural, progress_bar

# Errors with which os.link says "not here" rather than "something is wrong": copy instead.
_LINK_IMPOSSIBLE = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES}
_COPY_CHUNK_BYTES = 8 << 20


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "merge",
        help="combine shards and datasets into one dataset",
        description="Combine shards and datasets into a new dataset directory DST, in the order given. Shard files "
        "are hard-linked into DST (no payload is copied) where the filesystem allows, copied otherwise or with --copy; "
        "datasets contribute their manifest entries unchanged. All sources must share one codec.",
    )
    parser.add_argument("sources", nargs="+", metavar="SRC", type=store_path, help=STORE_HELP + "; each at most once")
    parser.add_argument("destination", metavar="DST",
                        help="the new dataset directory (must not exist, or be empty unless --allow-other-files); locked for one "
                        "writer while merge runs")
    parser.add_argument("--copy", action="store_true", help="copy the files even where hard links are possible")
    parser.add_argument("--metadata", metavar="JSON", type=json_object,
                        help="user metadata of the merged dataset, a JSON object (default: the sources' when they all agree)")
    add_allow_other_files_option(parser)
    add_quiet_option(parser)
    parser.set_defaults(run=run)


@dataclass(frozen=True)
class _Shard:
    """A shard to bring into DST: where it is, and its manifest entry when it comes from a dataset."""

    prefix: str
    entry: ShardEntry | None


@dataclass(frozen=True)
class _Source:
    path: str
    codec: str
    codec_params: dict[str, Any]
    metadata: dict[str, Any]
    shards: list[_Shard]
    data_size: int


def _read_source(path: str) -> _Source:
    with varstore.open(path) as store:
        params = make_codec(store.codec, dtype=store.dtype, shape=store.shape).params()
        if isinstance(store, varstore.Reader):
            shards = [_Shard(store.path, None)]
            data_size = store.header.data_size
        else:
            shards = [_Shard(prefix, entry) for prefix, entry in zip(store.shard_paths, store.manifest.shards)]
            data_size = sum(entry.data_size for entry in store.manifest.shards)
        return _Source(path, store.codec, params, store.metadata, shards, data_size)


def _check_no_shard_twice(sources: list[_Source]) -> None:
    """Refuse a shard that two sources (or one source twice) bring: its records would be in the result twice.

    A shard is known by its index file's identity (device, inode), so that one reached through a link, or
    hard-linked into a dataset by an earlier merge, is the same shard.
    """
    brought_by: dict[tuple[int, int], tuple[str, str]] = {}
    for source in sources:
        for shard in source.shards:
            status = os.stat(fmt.shard_paths(shard.prefix)[1])
            identity = (status.st_dev, status.st_ino)
            if identity in brought_by:
                first, first_prefix = brought_by[identity]
                if first == source.path:
                    twice = f"{source.path} is given twice"
                else:
                    same_file = "" if first_prefix == shard.prefix else f" (the same file as {first_prefix})"
                    twice = f"{first} and {source.path} both hold {shard.prefix}{same_file}"
                raise UsageError(f"{twice}; merge would store the same records twice")
            brought_by[identity] = source.path, shard.prefix


def _check_codecs(sources: list[_Source]) -> None:
    first = sources[0]
    for source in sources[1:]:
        if (source.codec, source.codec_params) != (first.codec, first.codec_params):
            raise CommandError(
                f"cannot merge different codecs: {source.path} is {_codec_text(source)} but {first.path} is {_codec_text(first)}"
            )


def _codec_text(source: _Source) -> str:
    codec = make_codec(source.codec, **source.codec_params)
    return describe_codec(codec.name, getattr(codec, "dtype", None), getattr(codec, "shape", None))


def _merged_metadata(sources: list[_Source], given: dict[str, Any] | None) -> dict[str, Any]:
    if given is not None:
        return given
    if all(source.metadata == sources[0].metadata for source in sources):
        return sources[0].metadata
    print("varstore merge: the sources' metadata differ; the merged dataset gets none (set it with --metadata)",
          file=sys.stderr)
    return {}


def _copy(source: str, destination: str, progress: Progress) -> None:
    """Copy durably: into a temporary name, fsync, then rename to `destination`."""
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


def _link_or_copy(source: str, destination: str, copy: bool, progress: Progress) -> bool:
    """Bring one file into DST; True if it was hard-linked, False if copied."""
    if not copy:
        try:
            os.link(source, destination, follow_symlinks=True)
            progress(os.path.getsize(destination))
            return True
        except OSError as error:
            if error.errno not in _LINK_IMPOSSIBLE:
                raise StorageError(f"linking {source} failed: {error.strerror or error}", path=destination) from None
    _copy(source, destination, progress)
    return False


def _make_destination(destination: str) -> None:
    if os.path.lexists(destination) and not os.path.isdir(destination):
        raise CommandError(f"{destination}: exists and is not a directory")
    try:
        make_directories(destination)
    except OSError as error:
        raise storage_error(error, "creating the destination directory") from None


def _bring_shards(shards: list[_Shard], destination: str, copy: bool, quiet: bool, created: list[str]) -> tuple[list[ShardEntry], int]:
    """Link or copy every shard into DST as shard-000000, shard-000001, ...; (their entries, files linked).

    Each file brought is added to `created` as soon as it exists, so that the caller can remove them after a failure.
    """
    entries, linked = [], 0
    total = sum(os.path.getsize(path) for shard in shards for path in fmt.shard_paths(shard.prefix))
    with progress_bar(total, description="merge", quiet=quiet) as progress:
        for position, shard in enumerate(shards):
            name = f"shard-{position:06d}"
            for source_path, path in zip(fmt.shard_paths(shard.prefix), fmt.shard_paths(os.path.join(destination, name))):
                linked += _link_or_copy(source_path, path, copy, progress)
                created.append(path)
            entry = shard.entry or describe_shard(destination, name)[0]
            entries.append(dataclasses.replace(entry, name=name))
    return entries, linked


def run(args: argparse.Namespace) -> int:
    sources = [_read_source(path) for path in args.sources]
    _check_no_shard_twice(sources)
    _check_codecs(sources)
    metadata = _merged_metadata(sources, args.metadata)
    destination = args.destination
    shards = [shard for source in sources for shard in source.shards]
    with removed_if_created_and_failed(destination):
        _make_destination(destination)
        # One writer per directory: the lock is held until the manifest is committed and synced.
        with lock_directory(destination):
            check_destination(destination, command="merge", keeps_dataset=False, allow_other_files=args.allow_other_files)
            created: list[str] = []
            try:
                entries, linked = _bring_shards(shards, destination, args.copy, args.quiet, created)
                try:
                    fsync_directory(destination)  # the shards' names are durable before the manifest that lists them
                except OSError as error:
                    raise StorageError(f"fsync of the directory failed: {error.strerror or error}", path=destination) from None
                first = sources[0]
                commit_manifest_file(destination, Manifest(first.codec, first.codec_params, metadata, entries))
            except BaseException:
                remove_quietly(created + [os.path.join(destination, MANIFEST_NAME)])
                raise
            sync_directory(destination)
    records = sum(entry.records for entry in entries)
    payload = sum(source.data_size for source in sources)
    print(f"merged {plural(len(sources), 'source')} into {destination}: {plural(len(shards), 'shard')}, "
          f"{plural(records, 'record')}, {format_size(payload)}; {linked:,} files hard-linked, "
          f"{2 * len(shards) - linked:,} copied")
    return 0
