"""``varstore cp SRC DST``: a dataset (or one shard) between any two locations, local paths or URLs, verified on
arrival (`varstore.operations.copy`)."""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

from ..local.file_url import resolve_file_url
from ..operations.copy import copy
from .arguments import STORE_HELP, add_quiet_option, command_parser, store_path
from .output import format_size, plural, progress_bar
from .stores import REMOTE_EPILOG, add_location_options, check_location_options, location_options

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

_DESCRIPTION = """Copy the dataset (or shard) SRC to DST, either of them a local path or a URL of object storage,
shard by shard; the manifest is written last and DST is verified in full before cp succeeds."""


def add_parser(commands: Any) -> None:
    parser = command_parser(commands, "cp", run,
                            help="copy a dataset or shard between local paths and URLs, verified on arrival",
                            description=_DESCRIPTION, epilog=_EPILOG)
    parser.add_argument("source", metavar="SRC", type=store_path, help=STORE_HELP)
    parser.add_argument("destination", metavar="DST", type=resolve_file_url,
                        help="where the copy goes, a local directory or a URL (for a shard, its new prefix); it must "
                        "not hold a dataset (or that shard) unless --overwrite")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the dataset (or shard) at DST; it is removed before the copy begins")
    add_quiet_option(parser)
    add_location_options(parser)


def run(args: argparse.Namespace) -> int:
    check_location_options(args, args.source, args.destination)
    result = copy(args.source, args.destination, overwrite=args.overwrite, **location_options(args),
                  progress=partial(progress_bar, description="cp", quiet=args.quiet))
    print(f"copied {plural(result.records, 'record')} in {plural(result.shards, 'shard')} ({format_size(result.size)}) "
          f"from {args.source} to {args.destination} in {result.seconds:.2f} s; verified on arrival")
    return 0
