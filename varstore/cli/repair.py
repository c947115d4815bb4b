"""``varstore repair``: verify every shard of a dataset and, with ``--write``, commit a manifest without the damaged ones.

Without ``--write`` nothing is changed: it prints what it would drop and exits 1
if anything is damaged. With it, the directory is locked against writers, the
new manifest is committed atomically, and the dropped shards' files are left in
place (for salvage; a later overwrite or ``rm`` removes them).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from typing import Any

from ..codecs import codec_from_stored
from ..errors import CorruptRecordError, FormatError, MissingFileError
from ..locking import lock_directory
from ..manifest import ShardEntry, commit_manifest_file, read_manifest
from ..sharded_reader import open_listed_shard, verify_listed_shard
from ..storage import sync_directory
from .arguments import store_path
from .errors import UsageError
from .output import listing, plural


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "repair",
        help="drop the shards that fail verification from a dataset's manifest (only with --write)",
        description="Verify every shard of a dataset directory and list those that fail. With --write, commit a "
        "new manifest without them (their files are left in place) and exit 0; without it, change nothing and "
        "exit 1 if any shard is damaged.",
    )
    parser.add_argument("path", type=store_path, help="a dataset (its directory or its manifest.json)")
    parser.add_argument("--write", action="store_true",
                        help="commit the manifest without the damaged shards (takes the dataset's writer lock)")
    parser.set_defaults(run=run)


def _damaged_shards(directory: str) -> tuple[list[ShardEntry], list[tuple[ShardEntry, str]], Any]:
    """(shards that verify, [(damaged shard, why)], the manifest) of the dataset in `directory`."""
    manifest = read_manifest(directory)
    codec = codec_from_stored(manifest.codec, manifest.codec_params, path=directory)
    intact, damaged = [], []
    for entry in manifest.shards:
        try:
            with open_listed_shard(directory, entry, codec) as reader:
                verify_listed_shard(reader, entry)
        except (FormatError, CorruptRecordError, MissingFileError) as error:  # damage; a StorageError aborts the repair
            damaged.append((entry, " ".join(str(error).split())))
        else:
            intact.append(entry)
    return intact, damaged, manifest


def run(args: argparse.Namespace) -> int:
    directory = args.path
    if not os.path.isdir(directory):
        raise UsageError(f"{directory} is not a dataset directory (repair drops shards from a dataset's manifest)")
    with lock_directory(directory) if args.write else contextlib.nullcontext():
        intact, damaged, manifest = _damaged_shards(directory)
        verb = "dropped" if args.write else "would drop"
        for entry, reason in damaged:
            print(f"{verb} {entry.name} ({plural(entry.records, 'record')}): {reason}")
        if not damaged:
            print(f"ok: all {plural(len(intact), 'shard')} verify; nothing to drop")
            return 0
        dropped_records = sum(entry.records for entry, _ in damaged)
        summary = (
            f"{plural(len(damaged), 'damaged shard')} ({listing([entry.name for entry, _ in damaged])}), "
            f"{plural(dropped_records, 'record')}"
        )
        if not args.write:
            print(f"would drop {summary}; run again with --write to commit a manifest without them")
            return 1
        commit_manifest_file(directory, dataclasses.replace(manifest, shards=intact), overwrite=True)
        sync_directory(directory)
    kept_records = sum(entry.records for entry in intact)
    print(f"dropped {summary}; the manifest now lists {plural(len(intact), 'shard')} and "
          f"{plural(kept_records, 'record')}; the dropped shards' files are left in place")
    return 0
