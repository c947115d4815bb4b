"""`merge`: one dataset from many local shards and datasets, in the order given, hard-linking their files into
the destination (no payload is copied) where the filesystem allows, copying them otherwise or with ``copy=True``.

Datasets contribute their manifest entries unchanged; all sources must share one codec, and no shard may be
brought twice. The destination may be a URL of object storage: each shard is uploaded (data, then index) and the
manifest last, so a reader never finds a partial dataset; a failed merge deletes what it wrote (`transfer`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Sequence

from ..dataset.reader import ShardedReader
from ..errors import CommandError, UsageError
from ..format import header as fmt
from ..format.codecs import make_codec
from ..format.manifest import Manifest, ShardEntry
from ..local.file_url import resolve_file_url
from ..local.manifest_file import describe_shard
from ..progress import ProgressBar, reporting
from ..shard.reader import Reader
from .copy import refuse_unrecorded_data_crc
from .describe import describe_codec
from .locations import is_url, open_store, store_path
from .transfer import LocalDestination, RemoteDestination, dataset_destination

__all__ = ["MergeResult", "merge"]


@dataclass(frozen=True)
class MergeResult:
    """What `merge` wrote at `destination`: `files` shard files (two a shard), `linked` of them hard-linked rather
    than copied (none at a URL: `uploaded`). `metadata_differ` says that the sources' metadata differed, so that
    the dataset got none (no `metadata` was given)."""

    destination: str
    sources: int
    shards: int
    records: int
    data_size: int
    files: int
    linked: int
    uploaded: bool
    metadata: dict[str, Any]
    metadata_differ: bool


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
    with open_store(path) as store:
        params = make_codec(store.codec, dtype=store.dtype, shape=store.shape).params()
        if not isinstance(store, ShardedReader):
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


def _bring_shards(shards: list[_Shard], destination: LocalDestination | RemoteDestination,
                  progress: ProgressBar | None) -> list[ShardEntry]:
    """Link, copy or upload every shard into DST as shard-000000, shard-000001, ...; their entries."""
    entries = []
    total = sum(os.path.getsize(path) for shard in shards for path in fmt.shard_paths(shard.prefix))
    with reporting(progress, total) as advance:
        for position, shard in enumerate(shards):
            name = f"shard-{position:06d}"
            destination.put_shard(shard.prefix, name, advance)
            entry = shard.entry or _describe(shard.prefix, destination, name)
            entries.append(dataclasses.replace(entry, name=name))
    return entries


def _describe(prefix: str, destination: LocalDestination | RemoteDestination, name: str) -> ShardEntry:
    """The manifest entry of a lone shard: of its copy in a local DST (a regular file even if the source is a
    link, as §3.1 requires), else of the source."""
    if isinstance(destination, LocalDestination):
        return describe_shard(destination.location, name)[0]
    return describe_shard(os.path.dirname(prefix) or ".", os.path.basename(prefix))[0]


def merge(sources: Sequence[str | os.PathLike[str]], destination: str | os.PathLike[str], *, copy: bool = False,
          metadata: dict[str, Any] | None = None, allow_other_files: bool = False,
          storage_options: dict[str, Any] | None = None, progress: ProgressBar | None = None) -> MergeResult:
    """Combine the local shards and datasets `sources`, in that order, into a new dataset at `destination` (a
    directory that must not exist or be empty, unless `allow_other_files`; or a URL holding no dataset, reached
    with `storage_options`).

    Shard files are hard-linked (or with `copy`, copied) into a local destination and uploaded to a URL, then the
    manifest is written; the destination's directory is locked for one writer meanwhile. `metadata` is the merged
    dataset's (default: the sources' when they all agree, else none). `progress`
    (`varstore.progress`) is told the bytes of shard files to bring and each amount brought.
    """
    paths = [store_path(source) for source in sources]
    destination = resolve_file_url(destination)
    if not paths:
        raise UsageError("merge needs at least one source")
    for path in paths:
        if is_url(path):
            raise UsageError(f"{path}: merge reads local shards and datasets; bring a remote one here first with "
                             "varstore cp, or merge into a URL from local sources")
    read = [_read_source(path) for path in paths]
    _check_no_shard_twice(read)
    _check_codecs(read)
    differ = metadata is None and any(source.metadata != read[0].metadata for source in read)
    merged_metadata = metadata if metadata is not None else {} if differ else read[0].metadata
    shards = [shard for source in read for shard in source.shards]
    if is_url(destination):
        for shard in shards:
            with Reader(shard.prefix) as reader:
                refuse_unrecorded_data_crc(reader, destination)
    with dataset_destination(destination, storage_options, command="merge", allow_other_files=allow_other_files,
                             copy=copy) as target:
        entries = _bring_shards(shards, target, progress)
        first = read[0]
        target.commit(Manifest(first.codec, first.codec_params, merged_metadata, entries))
    return MergeResult(
        destination=destination,
        sources=len(read),
        shards=len(shards),
        records=sum(entry.records for entry in entries),
        data_size=sum(source.data_size for source in read),
        files=2 * len(shards),
        linked=target.linked,
        uploaded=isinstance(target, RemoteDestination),
        metadata=merged_metadata,
        metadata_differ=differ,
    )
