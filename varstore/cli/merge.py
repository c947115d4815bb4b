"""``varstore merge``: one dataset from many shards and datasets, hard-linking their files (or copying them) and writing a manifest."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import Any

import varstore

from .. import format as fmt
from ..codecs import make_codec
from ..manifest import Manifest, ShardEntry, describe_shard
from ..remote.filesystems import is_url
from .arguments import LOCAL_STORE_HELP, add_quiet_option, json_object, store_path
from .destination import add_allow_other_files_option
from .errors import CommandError, UsageError
from .output import describe_codec, format_size, plural, progress_bar
from .stores import REMOTE_EPILOG, add_location_options, check_location_options
from .transfer import LocalDestination, RemoteDestination, dataset_destination


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "merge",
        help="combine shards and datasets into one dataset",
        description="Combine shards and datasets into a new dataset directory DST, in the order given. Shard files "
        "are hard-linked into DST (no payload is copied) where the filesystem allows, copied otherwise or with --copy; "
        "datasets contribute their manifest entries unchanged. All sources must share one codec. DST may be a URL "
        "of object storage: each shard is uploaded (data, then index) and the manifest last, so a reader never "
        "finds a partial dataset; a failed merge deletes what it uploaded.",
        epilog=REMOTE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sources", nargs="+", metavar="SRC", type=store_path,
                        help=LOCAL_STORE_HELP + "; each at most once (copy a remote one here first with varstore cp)")
    parser.add_argument("destination", metavar="DST",
                        help="the new dataset directory (must not exist, or be empty unless --allow-other-files); locked for one "
                        "writer while merge runs; or a URL holding no dataset")
    parser.add_argument("--copy", action="store_true", help="copy the files even where hard links are possible")
    parser.add_argument("--metadata", metavar="JSON", type=json_object,
                        help="user metadata of the merged dataset, a JSON object (default: the sources' when they all agree)")
    add_allow_other_files_option(parser)
    add_quiet_option(parser)
    add_location_options(parser, cache=False)
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
        if not isinstance(store, varstore.ShardedReader):
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


def _bring_shards(shards: list[_Shard], destination: LocalDestination | RemoteDestination, quiet: bool) -> list[ShardEntry]:
    """Link, copy or upload every shard into DST as shard-000000, shard-000001, ...; their entries."""
    entries = []
    total = sum(os.path.getsize(path) for shard in shards for path in fmt.shard_paths(shard.prefix))
    with progress_bar(total, description="merge", quiet=quiet) as progress:
        for position, shard in enumerate(shards):
            name = f"shard-{position:06d}"
            destination.put_shard(shard.prefix, name, progress)
            entry = shard.entry or _describe(shard.prefix, destination, name)
            entries.append(dataclasses.replace(entry, name=name))
    return entries


def _describe(prefix: str, destination: LocalDestination | RemoteDestination, name: str) -> ShardEntry:
    """The manifest entry of a lone shard: of its copy in a local DST (a regular file even if the source is a
    link, as §3.1 requires), else of the source."""
    if isinstance(destination, LocalDestination):
        return describe_shard(destination.location, name)[0]
    return describe_shard(os.path.dirname(prefix) or ".", os.path.basename(prefix))[0]


def run(args: argparse.Namespace) -> int:
    for path in args.sources:
        if is_url(path):
            raise UsageError(f"{path}: merge reads local shards and datasets; bring a remote one here first with "
                             "varstore cp, or merge into a URL from local sources")
    check_location_options(args, args.destination)
    sources = [_read_source(path) for path in args.sources]
    _check_no_shard_twice(sources)
    _check_codecs(sources)
    metadata = _merged_metadata(sources, args.metadata)
    shards = [shard for source in sources for shard in source.shards]
    with dataset_destination(args.destination, args, command="merge", allow_other_files=args.allow_other_files,
                             copy=args.copy) as destination:
        entries = _bring_shards(shards, destination, args.quiet)
        first = sources[0]
        destination.commit(Manifest(first.codec, first.codec_params, metadata, entries))
    records = sum(entry.records for entry in entries)
    payload = sum(source.data_size for source in sources)
    brought = 2 * len(shards)
    how = (f"{brought:,} files uploaded" if isinstance(destination, RemoteDestination)
           else f"{destination.linked:,} files hard-linked, {brought - destination.linked:,} copied")
    print(f"merged {plural(len(sources), 'source')} into {args.destination}: {plural(len(shards), 'shard')}, "
          f"{plural(records, 'record')}, {format_size(payload)}; {how}")
    return 0
