"""``varstore cp SRC DST``: a dataset (or one shard) between any two locations, local paths or URLs, verified on arrival.

Shard by shard: each shard's files are brought to this machine (a local SRC is read where it is; a remote one
is downloaded into a temporary directory, one shard at a time, never into memory), checked against the manifest
entry and every record checksum, then copied or uploaded to DST (data, then index). The manifest is written last
(`varstore.cli.transfer`), then DST is opened and verified in full, as ``varstore verify`` does. Any failure
removes what cp wrote, the manifest first: DST is then left without a manifest, never with a damaged dataset.
The copy is byte for byte, so DST's manifest, and with it the dataset's version, is SRC's.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from contextlib import ExitStack
from typing import Any, Iterator

import varstore

from .. import format as fmt
from ..codecs import codec_from_stored
from ..errors import VarstoreError
from ..manifest import Manifest, ShardEntry
from ..remote.filesystems import download_file, is_url, upload_file, with_retries
from ..sharded_reader import open_listed_shard, verify_listed_shard
from ..storage import remove_quietly
from .arguments import STORE_HELP, add_quiet_option, store_path
from .errors import CommandError, UsageError
from .output import Progress, format_size, plural, progress_bar
from .stores import REMOTE_EPILOG, add_location_options, filesystem, open_store
from .transfer import copy_file, dataset_destination
from .verify import describe_damage, store_check

_EPILOG = """what cp does:
  1. each shard of SRC, one at a time: read locally (downloaded into a temporary
     directory if SRC is a URL), checked against the manifest and every record
     checksum, then copied or uploaded to DST (data file, then index);
  2. the manifest, last: until then no reader finds a dataset at DST;
  3. DST opened and verified in full, as 'varstore verify' does (at a URL this
     downloads every object into the node cache: the dataset's size again).
  Any failure removes what cp wrote, the manifest first, and exits 1 naming the
  file or URL at fault: DST is left without a manifest, never with a damaged dataset.
  With --overwrite the dataset at DST is removed first (manifest first), so a
  failed cp leaves no dataset there either. Files at DST that are not a
  dataset's are left alone. SRC and DST may use the same --storage-options only.

examples:
  varstore cp train/ s3://bucket/train
  varstore cp s3://bucket/train /scratch/train
  varstore cp s3://bucket/train s3://other-bucket/train --overwrite

""" + REMOTE_EPILOG


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "cp",
        help="copy a dataset or shard between local paths and URLs, verified on arrival",
        description="Copy the dataset (or shard) SRC to DST, either of them a local path or a URL of object storage, "
        "shard by shard; the manifest is written last and DST is verified in full before cp succeeds.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", metavar="SRC", type=store_path, help=STORE_HELP)
    parser.add_argument("destination", metavar="DST",
                        help="where the copy goes, a local directory or a URL (for a shard, its new prefix); it must "
                        "not hold a dataset (or that shard) unless --overwrite")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the dataset (or shard) at DST; it is removed before the copy begins")
    add_quiet_option(parser)
    add_location_options(parser)
    parser.set_defaults(run=run)


def _same_location(source: str, destination: str) -> bool:
    if is_url(source) or is_url(destination):
        return source.rstrip("/") == destination.rstrip("/")
    return os.path.realpath(source) == os.path.realpath(destination)


class _SourceShards:
    """The shards of SRC as local files, one at a time: where they are for a local SRC, downloaded into a
    temporary directory for a URL."""

    def __init__(self, args: argparse.Namespace, staging: str) -> None:
        self._args, self._staging = args, staging

    def local(self, prefix: str) -> Iterator[str]:
        """The local prefix of the shard at `prefix` (a path or URL), valid while the generator is suspended."""
        if not is_url(prefix):
            yield prefix
            return
        fs, root = filesystem(prefix, self._args)
        local = os.path.join(self._staging, os.path.basename(prefix))
        files = fmt.shard_paths(local)
        try:
            for path, suffix in zip(files, (fmt.DATA_SUFFIX, fmt.INDEX_SUFFIX)):
                download_file(fs, root + suffix, path, url=prefix + suffix)
            yield local
        finally:
            remove_quietly(list(files))


def _checked(check: Any, source: str) -> None:
    """Run `check` of a shard's local copy; a failure names the shard at SRC, not the temporary copy."""
    try:
        check()
    except VarstoreError as error:
        raise CommandError(f"{source}: damaged at the source, nothing was committed: {error}") from None


def _verify_arrival(location: str, args: argparse.Namespace) -> None:
    """Open the copy at `location` and check every byte, as ``varstore verify`` does; a failure is a CommandError."""
    with ExitStack() as cleanup:
        _, _, check_all = store_check(location, args, cleanup)
        damage = describe_damage(check_all(Progress()))
    if damage is not None:
        raise CommandError(f"{location}: the copy failed verification on arrival and was removed: {damage}")


def _copy_dataset(store: varstore.ShardedReader, args: argparse.Namespace, sources: _SourceShards) -> tuple[int, int, int]:
    """Copy the dataset `store` reads to DST; (records, shards, bytes)."""
    manifest = store.manifest
    codec = codec_from_stored(manifest.codec, manifest.codec_params, path=store.path)
    total = sum(entry.data_size + entry.index_size for entry in manifest.shards)
    with dataset_destination(args.destination, args, command="cp", overwrite=args.overwrite) as destination:
        with progress_bar(total, description="cp", quiet=args.quiet) as progress:
            for entry, prefix in zip(manifest.shards, store.shard_paths):
                for local in sources.local(prefix):
                    _checked(lambda: _verify_listed(local, entry, codec), prefix)
                    destination.put_shard(local, entry.name, progress)
        destination.commit(Manifest(manifest.codec, manifest.codec_params, manifest.metadata, list(manifest.shards)))
        _verify_arrival(destination.location, args)
    return len(store), len(manifest.shards), total


def _verify_listed(local: str, entry: ShardEntry, codec: Any) -> None:
    with open_listed_shard(os.path.dirname(local) or ".", entry, codec) as reader:
        verify_listed_shard(reader, entry)


class _ShardDestination:
    """A lone shard's new prefix, local or at a URL: refused if either file exists (unless `overwrite`, which
    removes them first, index first); on failure what was written is removed, index first."""

    def __init__(self, prefix: str, args: argparse.Namespace, overwrite: bool) -> None:
        self.location, self._args, self._overwrite = prefix.rstrip("/"), args, overwrite
        self._written: list[str] = []

    def _names(self) -> list[str]:
        return list(reversed(fmt.shard_paths(self.location)))  # index first

    def __enter__(self) -> _ShardDestination:
        if is_url(self.location):
            self._fs, self._root = filesystem(self.location, self._args)
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

    def put(self, local: str, progress: Progress) -> None:
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


def _copy_shard(store: Any, args: argparse.Namespace, sources: _SourceShards) -> tuple[int, int, int]:
    """Copy the lone shard `store` reads to the prefix DST; (records, shards, bytes)."""
    prefix = store.path.removesuffix(fmt.INDEX_SUFFIX).removesuffix(fmt.DATA_SUFFIX)
    total = store.header.data_size + store.header.index_size
    with _ShardDestination(args.destination, args, args.overwrite) as destination:
        with progress_bar(total, description="cp", quiet=args.quiet) as progress:
            for local in sources.local(prefix):
                _checked(lambda: _verify_lone(local), prefix)
                destination.put(local, progress)
        _verify_arrival(destination.location, args)
    return len(store), 1, total


def _verify_lone(local: str) -> None:
    with varstore.Reader(local) as reader:
        reader.verify()


def run(args: argparse.Namespace) -> int:
    if _same_location(args.source, args.destination):
        raise UsageError(f"SRC and DST are the same place ({args.destination})")
    started = time.perf_counter()
    with open_store(args.source, args, other_locations=(args.destination,)) as store, tempfile.TemporaryDirectory(prefix="varstore-cp-") as staging:
        sources = _SourceShards(args, staging)
        if isinstance(store, varstore.ShardedReader):
            records, shards, size = _copy_dataset(store, args, sources)
        else:
            records, shards, size = _copy_shard(store, args, sources)
    print(f"copied {plural(records, 'record')} in {plural(shards, 'shard')} ({format_size(size)}) from {args.source} "
          f"to {args.destination} in {time.perf_counter() - started:.2f} s; verified on arrival")
    return 0
