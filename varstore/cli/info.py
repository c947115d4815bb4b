"""``varstore info``: what a shard or dataset holds, from each index's first 4 KiB and the manifest (instant at
any size; `varstore.operations.describe`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from ..errors import FAILURE_EXIT_CODE, listing
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
stores), sizes, checksums, metadata and shards. Reads only each index's first 4 KiB (its header and metadata) and
the manifest, so it is instant at any size (at a URL: one request for the manifest and one for each shard's first
4 KiB, all at once, besides the open's checks).
A dataset with damaged shards (a file truncated, missing or not as the manifest lists it) is described all the
same, its damaged shards named with what is wrong, and info then exits 1."""


def add_parser(commands: Any) -> None:
    parser = command_parser(commands, "info", run, help="describe a shard or dataset",
                            description=_DESCRIPTION, epilog=REMOTE_EPILOG)
    add_store_arguments(parser)
    add_location_options(parser)


# What an empty dataset says for the facts each shard records (format version, checksums); and one whose every
# shard is damaged.
_NO_SHARDS = "none yet: the dataset has no shards"
_ALL_DAMAGED = "unknown: every shard is damaged"
_DAMAGE_ADVICE = "; varstore verify checks every record, varstore repair --write drops damaged shards from the manifest"


def _lengths_text(facts: Description) -> str:
    """``3,316,349 (663.3 tokens per record on average)``, and for rows of a shape the elements they hold."""
    text = format_count(facts.rows)
    if facts.shape:
        text += f" of shape {tuple(facts.shape)}, {format_count(facts.elements)} elements"
    if facts.record_count:
        text += f" ({facts.rows / facts.record_count:,.1f} {facts.length_unit} per record on average)"
    return text


def _intact_shards_note(facts: Description) -> str:
    """`` (of the 3 intact shards)`` when some shards are damaged: what the format and checksums lines count."""
    if not facts.damaged_shards:
        return ""
    return f" (of the {plural(len(facts.shards) - len(facts.damaged_shards), 'intact shard')})"


def _checksums_text(facts: Description) -> str:
    if facts.kind == "dataset" and not facts.shards:
        return _NO_SHARDS
    if facts.kind == "dataset" and len(facts.damaged_shards) == len(facts.shards):
        return _ALL_DAMAGED
    each = "each" if facts.kind == "dataset" else "the"
    whole = f"of {each} whole data file"
    unrecorded = facts.data_crc_unrecorded
    intact = len(facts.shards) - len(facts.damaged_shards) if facts.kind == "dataset" else 1
    if unrecorded == intact:  # §1.2: the header then holds the CRC32C of the data file's edges only
        whole = f"of {each} data file's first and last 4 KiB (the whole file's is not recorded)"
    elif unrecorded:
        shards = plural(intact, "intact shard" if facts.damaged_shards else "shard")
        whole += f" (not recorded in {unrecorded} of {shards})"
    if facts.record_checksums is None:
        intact = [shard for shard in facts.shards if shard.damage is None]
        with_checksums = sum(bool(shard.record_checksums) for shard in intact)
        shards = plural(len(intact), "intact shard" if facts.damaged_shards else "shard")
        return f"CRC32C per record in {with_checksums} of {shards}; CRC32C {whole}"
    if facts.record_checksums:
        return f"CRC32C per record and {whole}{_intact_shards_note(facts)}"
    if facts.block_count and facts.format_version == (3, 0):  # every 3.x shard: §1.7's block checksums
        return f"CRC32C per block and {whole}{_intact_shards_note(facts)}"
    return f"no per-record checksums; CRC32C {whole} only{_intact_shards_note(facts)}"


def _format_text(facts: Description) -> str:
    if facts.kind == "dataset" and not facts.shards:
        return _NO_SHARDS
    if facts.kind == "dataset" and len(facts.damaged_shards) == len(facts.shards):
        return _ALL_DAMAGED
    version = facts.format_version
    if version is None:
        return "mixed (see shards)"
    return f"varstore {version[0]}.{version[1]}{_intact_shards_note(facts)}"


def _compression_text(facts: Description) -> str:
    """How the records are stored: ``uncompressed``, or ``zstd-dict (dictionary 108.4 KiB); data 0.274 of the
    2.1 MiB the records decode to``; for a dataset whose shards differ, how many shards have each compression."""
    if facts.kind == "dataset" and not facts.shards:
        return _NO_SHARDS
    if facts.kind == "dataset" and len(facts.damaged_shards) == len(facts.shards):
        return _ALL_DAMAGED
    if facts.compression is None:
        counts = Counter(shard.compression for shard in facts.shards if shard.damage is None)
        text = "mixed: " + ", ".join(f"{name} in {plural(count, 'shard')}" for name, count in sorted(counts.items()))
    elif facts.compression == "none":
        return "uncompressed" + _intact_shards_note(facts)
    else:
        text = facts.compression + _intact_shards_note(facts)
    if facts.dictionary_size:
        dictionaries = "dictionary" if facts.kind == "shard" else "dictionaries"
        text += f" ({dictionaries} {format_size(facts.dictionary_size)})"
    if facts.raw_size is not None and facts.compression != "none":
        text += f"; data {_ratio_text(facts.ratio)} of the {format_size(facts.raw_size)} the records decode to"
    return text + _blocks_text(facts)


def _blocks_text(facts: Description) -> str:
    """``; in 1,204 blocks of 16.0 KiB on average`` for shards of compressed blocks (§1.7), else nothing."""
    if not facts.block_count:
        return ""
    average = f" of {format_size(facts.raw_size / facts.block_count)} on average" if facts.raw_size is not None else ""
    return f"; in {facts.block_count:,} {'block' if facts.block_count == 1 else 'blocks'}{average}"


def _ratio_text(ratio: float | None) -> str:
    return "?" if ratio is None else f"{ratio:.3f}"


def _damage_summary(facts: Description) -> str:
    """``1 of 4 shards (shard-000001)``: the damaged shards, counted and named."""
    damaged = facts.damaged_shards
    return f"{len(damaged)} of {plural(len(facts.shards), 'shard')} ({listing([shard.name for shard in damaged])})"


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
        ("stored", _compression_text(facts)),
        ("metadata", json.dumps(facts.metadata, ensure_ascii=False, sort_keys=True)),
        *([("damaged", _damage_summary(facts) + _DAMAGE_ADVICE)] if facts.damaged_shards else []),
    ])
    if facts.kind == "dataset" and facts.shards:
        print("shards")
        compressed = any(shard.compression not in ("none", None) for shard in facts.shards)
        rows = [
            [shard.name, format_count(shard.record_count), format_size(shard.data_size),
             format_size(shard.index_size), _record_checksums_cell(shard.record_checksums, shard.damage),
             *([shard.compression or "DAMAGED", format_size(shard.dictionary_size) if shard.dictionary_size else "-",
                _ratio_text(shard.ratio)] if compressed else [])]
            for shard in facts.shards
        ]
        columns = ["name", "records", "payload", "index", "record CRCs"]
        if compressed:  # the payload column is then the stored frames; the ratio compares them with the records
            columns += ["compression", "dictionary", "stored/raw"]
        print_table(columns, rows, align="lrrrrlrr"[: len(columns)], indent="  ")
    if facts.damaged_shards:
        print("damaged shards (records, payload and index as the manifest lists them)")
        for shard in facts.damaged_shards:
            print(f"  {shard.name}: {shard.damage}")


def _record_checksums_cell(record_checksums: bool | None, damage: str | None) -> str:
    if damage is not None:
        return "DAMAGED"
    return "yes" if record_checksums else "no"


def run(args: argparse.Namespace) -> int:
    check_location_options(args, args.path)
    facts = describe(args.path, **location_options(args))
    with writing_to_standard_output():
        if args.json:
            print_json(facts.as_json())
        else:
            _print_text(facts)
    if facts.damaged_shards:
        print(f"varstore info: {facts.path}: damaged: {_damage_summary(facts)}{_DAMAGE_ADVICE}", file=sys.stderr)
        return FAILURE_EXIT_CODE
    return 0
