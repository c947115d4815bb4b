"""`describe`: what a shard or dataset holds, from headers and the manifest alone (instant at any size: at a URL,
one request for the manifest and one for each shard's header, all at once, besides the open's checks)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dataset.reader import ShardedReader
from ..format import header as fmt
from ..format.codecs import make_codec
from ..format.manifest import MANIFEST_NAME, MANIFEST_VERSION
from ..remote.filesystems import read_heads, with_retries
from .locations import Store, filesystem, open_store, remote_options

__all__ = ["Description", "ShardDescription", "describe", "describe_codec", "length_unit"]


@dataclass(frozen=True)
class ShardDescription:
    """One shard as its index header describes it (`name` as the manifest lists it, or the shard's path)."""

    name: str
    format_version: tuple[int, int]
    record_checksums: bool
    record_count: int
    data_size: int
    index_size: int

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "format_version": list(self.format_version),
                "record_checksums": self.record_checksums, "record_count": self.record_count,
                "data_size": self.data_size, "index_size": self.index_size}


@dataclass(frozen=True)
class Description:
    """What a shard (`kind` "shard") or dataset (`kind` "dataset") holds.

    `format_version` and `record_checksums` are None for a dataset whose shards differ (or that has none);
    `length_unit`, `rows` and `elements` are None but for ndarray stores (rows are tokens of a token store);
    `files` names what holds the store: a shard's index and data file, a dataset's manifest (its shards are in
    `shards`). `file_size` counts every byte of them, the manifest included."""

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
    data_crc32c: int | None = None  # a shard's
    manifest_version: int | None = None  # a dataset's
    shards: list[ShardDescription] = field(default_factory=list)  # a dataset's

    @property
    def manifest_size(self) -> int:
        return self.file_size - self.data_size - self.index_size

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
        if self.kind == "dataset":
            facts["shards"] = [shard.as_json() for shard in self.shards]
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


def _read_header(index_path: str) -> fmt.Header:
    with open(index_path, "rb") as file:
        return fmt.unpack_header(file.read(fmt.HEADER_SIZE), index_size=os.fstat(file.fileno()).st_size, path=index_path)


def _listed_headers(store: ShardedReader, storage_options: dict[str, Any] | None) -> tuple[list[fmt.Header], int]:
    """The header of every shard the manifest lists, and the manifest's size in bytes: read from the files, or at
    a URL by one concurrent request per header (each shard's index is not fetched)."""
    entries = store.manifest.shards
    if not store.is_remote:
        headers = [_read_header(fmt.shard_paths(prefix)[1]) for prefix in store.shard_paths]
        return headers, os.path.getsize(os.path.join(store.path, MANIFEST_NAME))
    fs, root = filesystem(store.path, storage_options)
    heads = read_heads(fs, [(f"{root}/{entry.name}{fmt.INDEX_SUFFIX}", entry.index_size) for entry in entries],
                       fmt.HEADER_SIZE, url=store.path)
    headers = [fmt.unpack_header(head, index_size=entry.index_size, path=f"{prefix}{fmt.INDEX_SUFFIX}")
               for head, entry, prefix in zip(heads, entries, store.shard_paths)]
    manifest_url = f"{store.path.rstrip('/')}/{MANIFEST_NAME}"
    manifest_size = with_retries(lambda: fs.size(f"{root}/{MANIFEST_NAME}"), what="finding the manifest's size", url=manifest_url)
    return headers, int(manifest_size)


def _shard_description(name: str, header: fmt.Header) -> ShardDescription:
    return ShardDescription(name, (fmt.MAJOR_VERSION, header.minor_version), header.has_record_checksums,
                            header.record_count, header.data_size, header.index_size)


def _uniform(values: list[Any]) -> Any:
    """The value every shard shares, or None when they differ."""
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
        shard = _shard_description(store.path, header)
        return Description(
            path=store.path, kind="shard", files=(os.path.basename(store.index_path), os.path.basename(store.data_path)),
            format_version=shard.format_version, record_checksums=shard.record_checksums,
            record_count=shard.record_count, data_size=shard.data_size, index_size=shard.index_size,
            file_size=header.data_size + header.index_size, data_crc32c=header.data_crc32c,
            **common, **_lengths(store, shard.data_size),
        )
    headers, manifest_size = _listed_headers(store, storage_options)
    shards = [_shard_description(entry.name, header) for entry, header in zip(store.manifest.shards, headers)]
    data_size = sum(shard.data_size for shard in shards)
    index_size = sum(shard.index_size for shard in shards)
    return Description(
        path=store.path, kind="dataset", files=(MANIFEST_NAME,), manifest_version=MANIFEST_VERSION,
        format_version=_uniform([shard.format_version for shard in shards]),
        record_checksums=_uniform([shard.record_checksums for shard in shards]),
        record_count=len(store), data_size=data_size, index_size=index_size,
        file_size=data_size + index_size + manifest_size, shards=shards,
        **common, **_lengths(store, data_size),
    )


def describe(path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
             cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | None = None) -> Description:
    """What the shard or dataset at `path` (a local path or a URL) holds: format version, codec, record count
    (and rows, or tokens, of ndarray stores), sizes, checksums, metadata and shards, read from headers and the
    manifest alone, never from a record."""
    with open_store(os.fspath(path), **remote_options(storage_options, cache_dir, cache_limit)) as store:
        return _describe(store, storage_options)
