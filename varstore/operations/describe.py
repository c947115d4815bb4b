"""`describe`: what a shard or dataset holds, from each index's first 4 KiB (its header and, mostly, its metadata,
which says whether its data CRC32C is recorded, §1.2) and the manifest (instant at any size: at a URL, one request
for the manifest and one for each shard's first 4 KiB, all at once, besides the open's checks).

A dataset with damaged shards is described all the same, each damaged shard from its manifest entry and with the
damage found, so that a user can see what the dataset is before verify or repair."""

from __future__ import annotations

import dataclasses
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import numpy as np

from ..dataset.opening import open_setting_aside_damaged
from ..dataset.reader import ShardedReader
from ..errors import FormatError, VarstoreError
from ..format import compression as zstd_format
from ..format import header as fmt
from ..format.codecs import make_codec
from ..format.manifest import MANIFEST_NAME, MANIFEST_VERSION, ShardEntry
from ..format.metadata import MAX_METADATA_DEPTH, metadata_members, parse_strict_json
from ..local.mapping import pread_exactly
from ..remote.filesystems import read_heads, read_range, with_retries
from .locations import Store, filesystem, remote_options

__all__ = ["Description", "ShardDescription", "compression_ratio", "describe", "describe_codec", "length_unit"]

# What a shard that cannot be described from its header raises: its files are damaged or missing.
_DAMAGE_ERRORS = (FormatError, FileNotFoundError)


@dataclass(frozen=True)
class ShardDescription:
    """One shard as its index header describes it (`name` as the manifest lists it, or the shard's path); a
    damaged one (`damage` says how) as its manifest entry does, its format version and checksums unknown."""

    name: str
    format_version: tuple[int, int] | None
    record_checksums: bool | None
    record_count: int
    data_size: int
    index_size: int
    damage: str | None = None
    compression: str | None = None  # "none", "zstd", "zstd-dict", "zstd-blocks" or "zstd-dict-blocks"; None when damaged
    dictionary_size: int = 0
    raw_size: int | None = None  # the bytes its records decode to (its data_size when uncompressed); None when damaged
    block_count: int = 0  # a 3.x shard's blocks (§1.7; from its index size), else 0
    data_crc_recorded: bool | None = None  # False when its metadata says its data CRC32C is not (§1.2); None if damaged

    @property
    def ratio(self) -> float | None:
        """Stored ÷ raw: the data file's bytes over those its records decode to (1.0 uncompressed or empty)."""
        return compression_ratio(self.data_size, self.raw_size)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "format_version": None if self.format_version is None else list(self.format_version),
                "record_checksums": self.record_checksums, "record_count": self.record_count,
                "data_size": self.data_size, "index_size": self.index_size, "damage": self.damage,
                "data_crc_recorded": self.data_crc_recorded, **_compression_json(self)}


def compression_ratio(stored: int, raw: int | None) -> float | None:
    """`stored` ÷ `raw` bytes, 1.0 when both are 0, None when `raw` is unknown."""
    if raw is None:
        return None
    return stored / raw if raw else 1.0


def _compression_json(facts: Any) -> dict[str, Any]:
    return {"compression": facts.compression, "dictionary_size": facts.dictionary_size, "raw_size": facts.raw_size,
            "ratio": facts.ratio, "block_count": facts.block_count}


@dataclass(frozen=True)
class Description:
    """What a shard (`kind` "shard") or dataset (`kind` "dataset") holds.

    `format_version` and `record_checksums` are None for a dataset whose shards differ (or that has none);
    `length_unit`, `rows` and `elements` are None but for ndarray stores (rows are tokens of a token store);
    `files` names what holds the store: a shard's index and data file, a dataset's manifest (its shards are in
    `shards`). `file_size` counts every byte of them, the manifest included (a damaged shard's as the manifest
    lists them)."""

    path: str
    kind: str
    files: tuple[str, ...]
    format_version: tuple[int, int] | None
    record_checksums: bool | None
    record_count: int
    data_size: int
    index_size: int
    file_size: int
    codec: str
    codec_params: dict[str, Any]
    dtype: np.dtype | None
    shape: tuple[int, ...] | None
    length_unit: str | None
    rows: int | None
    elements: int | None
    metadata: dict[str, Any]
    compression: str | None  # "none", "zstd", "zstd-dict", "zstd-blocks" or "zstd-dict-blocks"; None for a dataset
    # whose intact shards differ (or none)
    dictionary_size: int  # every dictionary's bytes (in the index files)
    raw_size: int | None  # the bytes the records decode to; None when a shard is damaged
    block_count: int = 0  # the blocks of its 3.x shards (§1.7)
    data_crc32c: int | None = None  # a shard's; None when it records none (§1.2)
    manifest_version: int | None = None  # a dataset's
    shards: list[ShardDescription] = field(default_factory=list)  # a dataset's

    @property
    def manifest_size(self) -> int:
        return self.file_size - self.data_size - self.index_size

    @property
    def ratio(self) -> float | None:
        """Stored ÷ raw: the data files' bytes over those the records decode to (None when a shard is damaged)."""
        return compression_ratio(self.data_size, self.raw_size)

    @property
    def data_crc_unrecorded(self) -> int:
        """How many shards (a lone shard: 1 or 0) record no data CRC32C (§1.2)."""
        if self.kind == "shard":
            return int(self.data_crc32c is None)
        return sum(shard.data_crc_recorded is False for shard in self.shards)

    @property
    def damaged_shards(self) -> list[ShardDescription]:
        """A dataset's shards that failed the open's checks (their files truncated, missing or not as listed)."""
        return [shard for shard in self.shards if shard.damage is not None]

    def as_json(self) -> dict[str, Any]:
        """The facts as JSON-ready values, as ``varstore info --json`` prints them."""
        facts: dict[str, Any] = {"path": self.path, "kind": self.kind}
        version = None if self.format_version is None else list(self.format_version)
        if self.kind == "shard":
            facts.update({"format_version": version, "record_checksums": self.record_checksums,
                          "record_count": self.record_count, "data_size": self.data_size,
                          "index_size": self.index_size, "data_crc32c": self.data_crc32c})
        else:
            facts.update({"manifest_version": self.manifest_version, "format_version": version,
                          "record_checksums": self.record_checksums, "record_count": self.record_count,
                          "data_size": self.data_size, "index_size": self.index_size})
        facts["file_size"] = self.file_size
        facts.update(_compression_json(self))
        if self.kind == "dataset":
            facts["shards"] = [shard.as_json() for shard in self.shards]
            facts["damaged_shards"] = [shard.name for shard in self.damaged_shards]
        facts.update({"codec": self.codec, "codec_params": self.codec_params, "length_unit": self.length_unit,
                      "rows": self.rows, "elements": self.elements, "metadata": self.metadata})
        return facts


def describe_codec(codec: str, dtype: np.dtype | None, shape: tuple[int, ...] | None) -> str:
    """A codec and its parameters as a person reads them: ``ndarray: uint16, records of shape (L, 3)``."""
    if dtype is None:
        return codec
    dimensions = ", ".join(["L", *map(str, shape or ())])
    return f"{codec}: {dtype.name}, records of shape ({dimensions}{'' if shape else ','})"


def length_unit(codec: str, dtype: np.dtype | None, shape: tuple[int, ...] | None) -> tuple[str, int] | None:
    """(the plural name, bytes) of one row of an ndarray store's records, or None for other codecs.

    A record of shape (L,) is L tokens if its dtype is an integer (a token store), L elements otherwise;
    a record of shape (L, *shape) is L rows.
    """
    if codec != "ndarray" or dtype is None:
        return None
    if shape:
        return "rows", dtype.itemsize * int(np.prod(shape))
    return ("tokens" if dtype.kind in "iu" else "elements"), dtype.itemsize


_HEAD_SIZE = 4096  # the bytes of an index read for its header: its metadata too, unless that is longer


def _unpack_head(head: bytes, index_size: int, path: str, read: Callable[[int, int], bytes]) -> fmt.Header:
    """The header at the start of `head` (an index's first bytes), with whether its data CRC32C is recorded: in
    1.x its metadata says (§1.2), parsed from `head` or, when longer, from `read(start, end)` of the index."""
    header = fmt.unpack_header(head[: fmt.HEADER_SIZE], index_size=index_size, path=path)
    if header.major_version != fmt.MAJOR_VERSION:
        return header
    end = fmt.HEADER_SIZE + header.metadata_size
    raw = head[fmt.HEADER_SIZE : end] if end <= len(head) else read(fmt.HEADER_SIZE, end)
    metadata = parse_strict_json(raw, MAX_METADATA_DEPTH, what="metadata", path=path)
    metadata_members(metadata, path=path)
    return dataclasses.replace(header, data_crc_recorded=fmt.data_crc_recorded(header, metadata, path=path))


def _read_header(index_path: str) -> fmt.Header:
    with open(index_path, "rb") as file:
        def read(start: int, end: int) -> bytes:
            return pread_exactly(file.fileno(), end - start, start, index_path)

        return _unpack_head(file.read(_HEAD_SIZE), os.fstat(file.fileno()).st_size, index_path, read)


def _header_or_damage(read: Callable[[], fmt.Header]) -> fmt.Header | str:
    """The header `read` returns, or what makes it unreadable (a damaged or missing file)."""
    try:
        return read()
    except _DAMAGE_ERRORS as error:
        return str(error)


def _listed_headers(store: ShardedReader, storage_options: dict[str, Any] | None) -> tuple[list[fmt.Header | str], int]:
    """The header of every shard the manifest lists, or the damage that makes it unreadable (found at the open or
    now), and the manifest's size in bytes: read from the files, or at a URL by one concurrent request for each
    index's first 4 KiB (its header and, mostly, the metadata that says whether its data CRC32C is recorded, §1.2;
    each shard's index is not fetched; one at a time only to tell which shards fail, when some do)."""
    entries, set_aside = store.manifest.shards, store._quarantine or {}
    index_paths = [fmt.shard_paths(prefix)[1] for prefix in store.shard_paths]
    if not store.is_remote:
        headers = [set_aside[position] if position in set_aside else _header_or_damage(partial(_read_header, path))
                   for position, path in enumerate(index_paths)]
        return headers, os.path.getsize(os.path.join(store.path, MANIFEST_NAME))
    fs, root = filesystem(store.path, storage_options)
    wanted = [position for position in range(len(entries)) if position not in set_aside]
    sized = [(f"{root}/{entries[position].name}{fmt.INDEX_SUFFIX}", entries[position].index_size) for position in wanted]
    try:
        heads: list[bytes | str] = list(read_heads(fs, sized, _HEAD_SIZE, url=store.path))
    except _DAMAGE_ERRORS:  # some shard's index is missing or short: asked one by one, to tell which
        heads = [_head_or_damage(fs, one, index_paths[position]) for one, position in zip(sized, wanted)]
    found: dict[int, fmt.Header | str] = dict(set_aside)
    for position, (object_path, index_size), head in zip(wanted, sized, heads):
        url = index_paths[position]
        read = partial(read_range, fs, object_path, url=url, size=index_size)
        unpack = partial(_unpack_head, head, index_size, url, read)
        found[position] = head if isinstance(head, str) else _header_or_damage(unpack)
    headers = [found[position] for position in range(len(entries))]
    manifest_url = f"{store.path.rstrip('/')}/{MANIFEST_NAME}"
    manifest_size = with_retries(lambda: fs.size(f"{root}/{MANIFEST_NAME}"), what="finding the manifest's size", url=manifest_url)
    return headers, int(manifest_size)


def _head_or_damage(fs: Any, sized_path: tuple[str, int], url: str) -> bytes | str:
    """One shard's first bytes, or why they cannot be read (a missing or short index object, at `url`)."""
    try:
        return read_heads(fs, [sized_path], _HEAD_SIZE, url=url)[0]
    except _DAMAGE_ERRORS as error:
        return str(error)


def _shard_description(name: str, header: fmt.Header, raw_size: int) -> ShardDescription:
    return ShardDescription(name, header.version, header.has_record_checksums, header.record_count, header.data_size,
                            header.index_size, compression=zstd_format.NAMES[header.compression],
                            dictionary_size=header.dictionary_size, raw_size=raw_size,
                            data_crc_recorded=header.data_crc_recorded, block_count=header.block_count)


def _listed_description(entry: ShardEntry, header: fmt.Header | str, raw_size: int | str) -> ShardDescription:
    """A listed shard by its header, or by its manifest entry when `header` (or its decoded sizes, `raw_size`) is
    the damage that made it unreadable."""
    damage = header if isinstance(header, str) else raw_size if isinstance(raw_size, str) else None
    if damage is not None:
        return ShardDescription(entry.name, None, None, entry.records, entry.data_size, entry.index_size, damage=damage)
    return _shard_description(entry.name, header, raw_size)  # type: ignore[arg-type]


def _raw_sizes(store: ShardedReader, headers: list[fmt.Header | str], storage_options: dict[str, Any] | None) -> list[int | str]:
    """What each listed shard's records decode to: an uncompressed shard's data size, a compressed shard's sum of
    the decoded sizes its index ends with (§1.6) or a 3.x shard's last offset (§1.7), read from the file or at a
    URL by one ranged request per shard, all at once; or the damage that makes them unreadable."""
    index_paths = [fmt.shard_paths(prefix)[1] for prefix in store.shard_paths]
    if store.is_remote:
        fs, root = filesystem(store.path, storage_options)
        entries = store.manifest.shards

        def read(position: int, start: int, end: int) -> bytes:
            return read_range(fs, f"{root}/{entries[position].name}{fmt.INDEX_SUFFIX}", start, end,
                              url=index_paths[position], size=entries[position].index_size)
    else:
        def read(position: int, start: int, end: int) -> bytes:
            with open(index_paths[position], "rb") as file:
                return pread_exactly(file.fileno(), end - start, start, index_paths[position])

    def raw_size(position: int) -> int | str:
        header = headers[position]
        if isinstance(header, str):
            return header
        if not header.compression:
            return header.data_size
        try:
            if header.has_blocks:
                return int.from_bytes(read(position, header.blocks_start - fmt.OFFSET_SIZE, header.blocks_start), "little")
            return _sum_of_sizes(read(position, header.sizes_start, header.index_size))
        except (*_DAMAGE_ERRORS, VarstoreError) as error:
            return str(error)

    compressed = sum(1 for header in headers if not isinstance(header, str) and header.compression)
    if not compressed:
        return [raw_size(position) for position in range(len(headers))]
    with ThreadPoolExecutor(max_workers=min(_CONCURRENT_READS, compressed)) as pool:
        return list(pool.map(raw_size, range(len(headers))))


_CONCURRENT_READS = 16


def _sum_of_sizes(raw: bytes) -> int:
    return int(np.frombuffer(raw, "<u4").sum(dtype=np.int64))


def _uniform(values: list[Any]) -> Any:
    """The value every shard shares, or None when they differ (or there are none)."""
    return values[0] if values and all(value == values[0] for value in values) else None


def _lengths(store: Store, data_size: int) -> dict[str, Any]:
    """For ndarray stores, the rows (tokens of a token store) and array elements the payload holds; None otherwise."""
    unit = length_unit(store.codec, store.dtype, store.shape)
    if unit is None:
        return {"length_unit": None, "rows": None, "elements": None}
    rows = data_size // unit[1]
    return {"length_unit": unit[0], "rows": rows, "elements": rows * math.prod(store.shape or ())}


def _describe(store: Store, storage_options: dict[str, Any] | None) -> Description:
    common: dict[str, Any] = {
        "codec": store.codec,
        "codec_params": make_codec(store.codec, dtype=store.dtype, shape=store.shape).params(),
        "dtype": store.dtype,
        "shape": store.shape,
        "metadata": store.metadata,
    }
    if not isinstance(store, ShardedReader):
        header = store.header
        shard = _shard_description(store.path, header, store._index.raw_size())
        return Description(
            path=store.path, kind="shard", files=(os.path.basename(store.index_path), os.path.basename(store.data_path)),
            format_version=shard.format_version, record_checksums=shard.record_checksums,
            record_count=shard.record_count, data_size=shard.data_size, index_size=shard.index_size,
            file_size=header.data_size + header.index_size,
            data_crc32c=header.data_crc32c if header.data_crc_recorded else None,
            compression=shard.compression, dictionary_size=shard.dictionary_size, raw_size=shard.raw_size,
            block_count=shard.block_count, **common, **_lengths(store, shard.raw_size),
        )
    headers, manifest_size = _listed_headers(store, storage_options)
    raw_sizes = _raw_sizes(store, headers, storage_options)
    shards = [_listed_description(*listed) for listed in zip(store.manifest.shards, headers, raw_sizes)]
    intact = [shard for shard in shards if shard.damage is None]
    data_size = sum(shard.data_size for shard in shards)
    index_size = sum(shard.index_size for shard in shards)
    raw_size = None if len(intact) < len(shards) else sum(shard.raw_size or 0 for shard in shards)
    return Description(
        path=store.path, kind="dataset", files=(MANIFEST_NAME,), manifest_version=MANIFEST_VERSION,
        format_version=_uniform([shard.format_version for shard in intact]),
        record_checksums=_uniform([shard.record_checksums for shard in intact]),
        record_count=len(store), data_size=data_size, index_size=index_size,
        file_size=data_size + index_size + manifest_size, shards=shards,
        compression=_uniform([shard.compression for shard in intact]),
        dictionary_size=sum(shard.dictionary_size for shard in intact), raw_size=raw_size,
        block_count=sum(shard.block_count for shard in intact),
        **common, **_lengths(store, data_size if raw_size is None else raw_size),
    )


def describe(path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
             cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | None = None) -> Description:
    """What the shard or dataset at `path` (a local path or a URL) holds: format version, codec, record count
    (and rows, or tokens, of ndarray stores), sizes, checksums, metadata and shards, read from headers and the
    manifest alone, never from a record.

    A dataset whose shards fail the open's checks, or whose headers cannot be read, is described all the same:
    each such shard from its manifest entry, with the damage found (`Description.damaged_shards`); `verify`
    finds what only reading every record can (a flipped payload byte, say)."""
    with open_setting_aside_damaged(path, **remote_options(storage_options, cache_dir, cache_limit)) as store:
        return _describe(store, storage_options)
