"""``varstore merge``: one dataset from many shards and datasets, hard-linking their files (or copying them) and
writing a manifest (`varstore.operations.merge`)."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any

from ..local.file_url import resolve_file_url
from ..operations.merge import merge
from .arguments import (
    LOCAL_STORE_HELP,
    add_allow_other_files_option,
    add_quiet_option,
    command_parser,
    json_object,
    store_path,
)
from .output import format_size, plural, progress_bar
from .stores import REMOTE_EPILOG, add_location_options, check_location_options

_DESCRIPTION = """Combine shards and datasets into a new dataset directory DST, in the order given. Shard files are
hard-linked into DST (no payload is copied) where the filesystem allows, copied otherwise or with --copy; datasets
contribute their manifest entries unchanged. All sources must share one codec. DST may be a URL of object storage:
each shard is uploaded (data, then index) and the manifest last, so a reader never finds a partial dataset; a failed
merge deletes what it uploaded."""


def add_parser(commands: Any) -> None:
    parser = command_parser(commands, "merge", run, help="combine shards and datasets into one dataset",
                            description=_DESCRIPTION, epilog=REMOTE_EPILOG)
    parser.add_argument("sources", nargs="+", metavar="SRC", type=store_path,
                        help=LOCAL_STORE_HELP + "; each at most once (copy a remote one here first with varstore cp)")
    parser.add_argument("destination", metavar="DST", type=resolve_file_url,
                        help="the new dataset directory (must not exist, or be empty unless --allow-other-files); locked for one "
                        "writer while merge runs; or a URL holding no dataset")
    parser.add_argument("--copy", action="store_true", help="copy the files even where hard links are possible")
    parser.add_argument("--metadata", metavar="JSON", type=json_object,
                        help="user metadata of the merged dataset, a JSON object (default: the sources' when they all agree)")
    add_allow_other_files_option(parser)
    add_quiet_option(parser)
    add_location_options(parser, cache=False)


def run(args: argparse.Namespace) -> int:
    check_location_options(args, args.destination)
    result = merge(args.sources, args.destination, copy=args.copy, metadata=args.metadata,
                   allow_other_files=args.allow_other_files, storage_options=args.storage_options,
                   progress=partial(progress_bar, description="merge", quiet=args.quiet))
    if result.metadata_differ:
        print("varstore merge: the sources' metadata differ; the merged dataset gets none (set it with --metadata)",
              file=sys.stderr)
    how = (f"{result.files:,} files uploaded" if result.uploaded
           else f"{result.linked:,} files hard-linked, {result.files - result.linked:,} copied")
    print(f"merged {plural(result.sources, 'source')} into {args.destination}: {plural(result.shards, 'shard')}, "
          f"{plural(result.records, 'record')}, {format_size(result.data_size)}; {how}")
    return 0
