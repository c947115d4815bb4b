"""``varstore repair``: verify every shard of a dataset and, with ``--write``, commit a manifest without the damaged
ones (`varstore.operations.repair`).

Without ``--write`` nothing is changed: it prints what it would drop and exits 1
if anything is damaged. With it, the directory is locked against writers, the
new manifest is committed atomically, and the dropped shards' files are left in
place (for salvage; a later overwrite or ``rm`` removes them).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import listing
from ..operations.repair import repair
from .arguments import command_parser, store_path
from .output import plural

_DESCRIPTION = """Verify every shard of a dataset directory and list those that fail. With --write, commit a new
manifest without them (their files are left in place) and exit 0; without it, change nothing and exit 1 if any shard
is damaged."""


def add_parser(commands: Any) -> None:
    parser = command_parser(commands, "repair", run,
                            help="drop the shards that fail verification from a dataset's manifest (only with --write)",
                            description=_DESCRIPTION)
    parser.add_argument("path", type=store_path, help="a dataset (its directory or its manifest.json)")
    parser.add_argument("--write", action="store_true",
                        help="commit the manifest without the damaged shards (takes the dataset's writer lock)")


def run(args: argparse.Namespace) -> int:
    report = repair(args.path, write=args.write)
    verb = "dropped" if args.write else "would drop"
    for shard in report.damaged:
        print(f"{verb} {shard.name} ({plural(shard.records, 'record')}): {shard.reason}")
    if report.ok:
        print(f"ok: all {plural(len(report.kept), 'shard')} verify; nothing to drop")
        return 0
    summary = (f"{plural(len(report.damaged), 'damaged shard')} ({listing([shard.name for shard in report.damaged])}), "
               f"{plural(report.dropped_records, 'record')}")
    if not args.write:
        print(f"would drop {summary}; run again with --write to commit a manifest without them")
        return 1
    print(f"dropped {summary}; the manifest now lists {plural(len(report.kept), 'shard')} and "
          f"{plural(report.kept_records, 'record')}; the dropped shards' files are left in place")
    return 0
