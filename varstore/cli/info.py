"""``varstore info``: what a shard or dataset holds, from headers and the manifest alone (instant at any size;
`varstore.operations.describe`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..operations.describe import Description, describe, describe_codec
from .arguments import add_store_arguments, command_parser
from .output import (
    format_count,
    format_size,
    format_size_exactly,
    plural,
    print_fields,
    print_json,
    print_table,
    writing_to_standard_output,
)
from .stores import REMOTE_EPILOG, add_location_options, check_location_options, location_options

_DESCRIPTION = """Describe a shard or dataset: format version, codec, record count (and rows, or tokens, of ndarray
stores), sizes, checksums, metadata and shards. Reads only headers and the manifest, so it is instant at any size
(at a URL: one request for the manifest and one for each shard's header, all at once, besides the open's checks)."""


def add_parser(commands: Any) -> None:
    parser = command_parser(commands, "info", run, help="describe a shard or dataset",
                            description=_DESCRIPTION, epilog=REMOTE_EPILOG)
    add_store_arguments(parser)
    add_location_options(parser)


# What an empty dataset says for the facts each shard records (format version, checksums).
_NO_SHARDS = "none yet: the dataset has no shards"


def _lengths_text(facts: Description) -> str:
    """``3,316,349 (663.3 tokens per record on average)``, and for rows of a shape the elements they hold."""
    text = format_count(facts.rows)
    if facts.shape:
        text += f" of shape {tuple(facts.shape)}, {format_count(facts.elements)} elements"
    if facts.record_count:
        text += f" ({facts.rows / facts.record_count:,.1f} {facts.length_unit} per record on average)"
    return text


def _checksums_text(facts: Description) -> str:
    if facts.kind == "dataset" and not facts.shards:
        return _NO_SHARDS
    whole = "of each whole data file" if facts.kind == "dataset" else "of the whole data file"
    if facts.record_checksums is None:
        with_checksums = sum(shard.record_checksums for shard in facts.shards)
        return f"CRC32C per record in {with_checksums} of {plural(len(facts.shards), 'shard')}; CRC32C {whole}"
    if facts.record_checksums:
        return f"CRC32C per record and {whole}"
    return f"no per-record checksums; CRC32C {whole} only"


def _format_text(facts: Description) -> str:
    if facts.kind == "dataset" and not facts.shards:
        return _NO_SHARDS
    version = facts.format_version
    return "mixed (see shards)" if version is None else f"varstore {version[0]}.{version[1]}"


def _print_text(facts: Description) -> None:
    count, payload = facts.record_count, facts.data_size
    on_disk = f"{format_size_exactly(facts.file_size)}: data {payload:,} + index {facts.index_size:,}"
    if facts.kind == "dataset":
        on_disk += f" + manifest {facts.manifest_size:,}"
    on_disk += " bytes"
    if payload:
        on_disk += f" ({100 * (facts.file_size - payload) / payload:.2f}% over the payload)"
    payload_text = format_size_exactly(payload)
    if count:
        payload_text += f", {payload / count:,.1f} bytes per record on average"
    if facts.kind == "shard":
        kind = f"shard ({' + '.join(facts.files)})"
    else:
        kind = f"dataset ({facts.files[0]} version {facts.manifest_version}, {plural(len(facts.shards), 'shard')})"
    print_fields([
        ("path", facts.path),
        ("kind", kind),
        ("format", _format_text(facts)),
        ("codec", describe_codec(facts.codec, facts.dtype, facts.shape)),
        ("records", format_count(count)),
        *([(facts.length_unit, _lengths_text(facts))] if facts.length_unit else []),
        ("payload", payload_text),
        ("on disk", on_disk),
        ("checksums", _checksums_text(facts)),
        ("metadata", json.dumps(facts.metadata, ensure_ascii=False, sort_keys=True)),
    ])
    if facts.kind == "dataset" and facts.shards:
        print("shards")
        rows = [
            [shard.name, format_count(shard.record_count), format_size(shard.data_size),
             format_size(shard.index_size), "yes" if shard.record_checksums else "no"]
            for shard in facts.shards
        ]
        print_table(["name", "records", "payload", "index", "record CRCs"], rows, align="lrrrr", indent="  ")


def run(args: argparse.Namespace) -> int:
    check_location_options(args, args.path)
    facts = describe(args.path, **location_options(args))
    with writing_to_standard_output():
        if args.json:
            print_json(facts.as_json())
        else:
            _print_text(facts)
    return 0
