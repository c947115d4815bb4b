"""``varstore info``: what a shard or dataset holds, from headers and the manifest alone (instant at any size)."""

from __future__ import annotations

import argparse
import json
from typing import Any
import math
import os

import varstore

from .. import format as fmt
from ..codecs import make_codec
from ..manifest import MANIFEST_NAME, MANIFEST_VERSION
from ..remote.filesystems import read_heads, with_retries
from .arguments import add_store_arguments
from .stores import REMOTE_EPILOG, add_location_options, filesystem, open_store
from .output import describe_codec, format_count, length_unit, format_size, format_size_exactly, plural, print_fields, print_json, print_table, writing_to_standard_output


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "info",
        help="describe a shard or dataset",
        description="Describe a shard or dataset: format version, codec, record count (and rows, or tokens, of "
        "ndarray stores), sizes, checksums, "
        "metadata and shards. Reads only headers and the manifest, so it is instant at any size (at a URL: one "
        "request for the manifest and one for each shard's header, all at once, besides the open's checks).",
        epilog=REMOTE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_arguments(parser)
    add_location_options(parser)
    parser.set_defaults(run=run)


def _read_header(index_path: str) -> fmt.Header:
    with open(index_path, "rb") as file:
        return fmt.unpack_header(file.read(fmt.HEADER_SIZE), index_size=os.fstat(file.fileno()).st_size, path=index_path)


def _listed_headers(store: varstore.ShardedReader, args: argparse.Namespace) -> tuple[list[fmt.Header], int]:
    """The header of every shard the manifest lists, and the manifest's size in bytes: read from the files, or at
    a URL by one concurrent request per header (each shard's index is not fetched)."""
    entries = store.manifest.shards
    if not store.is_remote:
        headers = [_read_header(fmt.shard_paths(prefix)[1]) for prefix in store.shard_paths]
        return headers, os.path.getsize(os.path.join(store.path, MANIFEST_NAME))
    fs, root = filesystem(store.path, args)
    heads = read_heads(fs, [(f"{root}/{entry.name}{fmt.INDEX_SUFFIX}", entry.index_size) for entry in entries],
                       fmt.HEADER_SIZE, url=store.path)
    headers = [fmt.unpack_header(head, index_size=entry.index_size, path=f"{prefix}{fmt.INDEX_SUFFIX}")
               for head, entry, prefix in zip(heads, entries, store.shard_paths)]
    manifest_url = f"{store.path.rstrip('/')}/{MANIFEST_NAME}"
    manifest_size = with_retries(lambda: fs.size(f"{root}/{MANIFEST_NAME}"), what="finding the manifest's size", url=manifest_url)
    return headers, int(manifest_size)


def _shard_facts(header: fmt.Header) -> dict[str, Any]:
    return {
        "format_version": [fmt.MAJOR_VERSION, header.minor_version],
        "record_checksums": header.has_record_checksums,
        "record_count": header.record_count,
        "data_size": header.data_size,
        "index_size": header.index_size,
    }


def _uniform(values: list[Any]) -> Any:
    """The value every shard shares, or None when they differ."""
    return values[0] if values and all(value == values[0] for value in values) else None


# What an empty dataset says for the facts each shard records (format version, checksums).
_NO_SHARDS = "none yet: the dataset has no shards"


def _describe(store: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The facts `info` reports about `store` (a shard's reader, local or remote, or a dataset's), as JSON-ready values."""
    facts: dict[str, Any] = {"path": store.path}
    if not isinstance(store, varstore.ShardedReader):
        facts["kind"] = "shard"
        facts.update(_shard_facts(store.header))
        facts["data_crc32c"] = store.header.data_crc32c
        facts["file_size"] = store.header.data_size + store.header.index_size
    else:
        headers, manifest_size = _listed_headers(store, args)
        shards = [{"name": entry.name, **_shard_facts(header)} for entry, header in zip(store.manifest.shards, headers)]
        facts["kind"] = "dataset"
        facts["manifest_version"] = MANIFEST_VERSION
        facts["format_version"] = _uniform([shard["format_version"] for shard in shards])
        facts["record_checksums"] = _uniform([shard["record_checksums"] for shard in shards])
        facts["record_count"] = len(store)
        facts["data_size"] = sum(shard["data_size"] for shard in shards)
        facts["index_size"] = sum(shard["index_size"] for shard in shards)
        facts["file_size"] = facts["data_size"] + facts["index_size"] + manifest_size
        facts["shards"] = shards
    facts["codec"] = store.codec
    facts["codec_params"] = make_codec(store.codec, dtype=store.dtype, shape=store.shape).params()
    facts.update(_lengths(store, facts["data_size"]))
    facts["metadata"] = store.metadata
    return facts


def _lengths(store: Any, data_size: int) -> dict[str, Any]:
    """For ndarray stores, the rows (tokens of a token store) and array elements the payload holds; None otherwise."""
    unit = length_unit(store.codec, store.dtype, store.shape)
    if unit is None:
        return {"length_unit": None, "rows": None, "elements": None}
    rows = data_size // unit[1]
    return {"length_unit": unit[0], "rows": rows, "elements": rows * math.prod(store.shape or ())}


def _lengths_text(facts: dict[str, Any], shape: tuple[int, ...] | None) -> str:
    """``3,316,349 (663.3 tokens per record on average)``, and for rows of a shape the elements they hold."""
    text = format_count(facts["rows"])
    if shape:
        text += f" of shape {tuple(shape)}, {format_count(facts['elements'])} elements"
    if facts["record_count"]:
        text += f" ({facts['rows'] / facts['record_count']:,.1f} {facts['length_unit']} per record on average)"
    return text


def _checksums_text(facts: dict[str, Any]) -> str:
    if facts["kind"] == "dataset" and not facts["shards"]:
        return _NO_SHARDS
    whole = "of each whole data file" if facts["kind"] == "dataset" else "of the whole data file"
    if facts["record_checksums"] is None:
        with_checksums = sum(shard["record_checksums"] for shard in facts["shards"])
        return f"CRC32C per record in {with_checksums} of {plural(len(facts['shards']), 'shard')}; CRC32C {whole}"
    if facts["record_checksums"]:
        return f"CRC32C per record and {whole}"
    return f"no per-record checksums; CRC32C {whole} only"


def _format_text(facts: dict[str, Any]) -> str:
    if facts["kind"] == "dataset" and not facts["shards"]:
        return _NO_SHARDS
    version = facts["format_version"]
    return "mixed (see shards)" if version is None else f"varstore {version[0]}.{version[1]}"


def _print_text(facts: dict[str, Any], store: Any) -> None:
    count, payload = facts["record_count"], facts["data_size"]
    on_disk = f"{format_size_exactly(facts['file_size'])}: data {payload:,} + index {facts['index_size']:,}"
    if facts["kind"] == "dataset":
        on_disk += f" + manifest {facts['file_size'] - payload - facts['index_size']:,}"
    on_disk += " bytes"
    if payload:
        on_disk += f" ({100 * (facts['file_size'] - payload) / payload:.2f}% over the payload)"
    payload_text = format_size_exactly(payload)
    if count:
        payload_text += f", {payload / count:,.1f} bytes per record on average"
    if facts["kind"] == "shard":
        kind = f"shard ({os.path.basename(store.index_path)} + {os.path.basename(store.data_path)})"
    else:
        kind = f"dataset ({MANIFEST_NAME} version {facts['manifest_version']}, {plural(len(facts['shards']), 'shard')})"
    print_fields([
        ("path", facts["path"]),
        ("kind", kind),
        ("format", _format_text(facts)),
        ("codec", describe_codec(store.codec, store.dtype, store.shape)),
        ("records", format_count(count)),
        *([(facts["length_unit"], _lengths_text(facts, store.shape))] if facts["length_unit"] else []),
        ("payload", payload_text),
        ("on disk", on_disk),
        ("checksums", _checksums_text(facts)),
        ("metadata", json.dumps(facts["metadata"], ensure_ascii=False, sort_keys=True)),
    ])
    if facts["kind"] == "dataset" and facts["shards"]:
        print("shards")
        rows = [
            [shard["name"], format_count(shard["record_count"]), format_size(shard["data_size"]),
             format_size(shard["index_size"]), "yes" if shard["record_checksums"] else "no"]
            for shard in facts["shards"]
        ]
        print_table(["name", "records", "payload", "index", "record CRCs"], rows, align="lrrrr", indent="  ")


def run(args: argparse.Namespace) -> int:
    with open_store(args.path, args) as store:
        facts = _describe(store, args)
        with writing_to_standard_output():
            if args.json:
                print_json(facts)
            else:
                _print_text(facts, store)
    return 0
