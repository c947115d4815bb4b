"""``varstore verify``: check every structure and checksum of a shard or dataset, shard by shard, and list what is damaged."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from functools import partial
from typing import Any

from ..errors import CommandError, VarstoreError, listing
from ..operations.verify import VerifyReport, verify
from .arguments import add_quiet_option, add_store_arguments, command_parser, positive_int
from .output import format_size, one_line, plural, print_json, progress_bar, writing_to_standard_output
from .stores import REMOTE_EPILOG, add_location_options, location_options

_DESCRIPTION = """Check a shard or dataset: headers, offsets, the manifest against each shard, and every record
checksum. Each shard is checked separately, so all damaged shards and records are listed. Exits 0 when everything is
intact, 1 when anything is damaged or missing."""
_EPILOG = ("cost at a URL:\n"
           "  verify reads every byte, so at a URL it downloads each shard's index and data\n"
           "  object whole into the node cache (--cache-dir), verified against the manifest's\n"
           "  CRC32C on arrival, then checks every record of the cached copy: the transfer and\n"
           "  the cache space are the dataset's size (objects already cached on this machine are\n"
           "  not downloaded again; --cache-limit evicts checked shards to stay under a limit).\n"
           "  The progress bar counts the bytes checked; it pauses while each shard downloads.\n\n"
           + REMOTE_EPILOG)


def add_parser(commands: Any) -> None:
    parser = command_parser(commands, "verify", run,
                            help="check structure and checksums; exit 1 if anything is damaged",
                            description=_DESCRIPTION, epilog=_EPILOG)
    add_store_arguments(parser)
    add_quiet_option(parser)
    add_location_options(parser)
    parser.add_argument("--workers", type=positive_int, default=1, metavar="N",
                        help="check N shards of a dataset at once, on threads (default 1)")
    parser.add_argument("--remove-temporary", action="store_true",
                        help="first delete the temporary files that interrupted writers left beside the store "
                        "(a running writer's files are left alone: it holds its lock)")


def _print_text(report: VerifyReport, measured: str) -> None:
    bad = report.bad_shards
    for path in report.removed_temporary_files:
        print(f"removed {path}")
    for check in bad:
        print(f"FAILED {check.name}: {check.describe()}" if report.is_dataset else f"FAILED: {check.error}")
    leftovers = report.temporary_files
    if report.writer_running:
        print(f"note: a writer is running here; {len(leftovers)} temporary files beside the store may be its own "
              "(--remove-temporary never deletes a running writer's files)")
    elif leftovers:
        print(f"note: {len(leftovers)} temporary files left by interrupted writers beside the store "
              "(--remove-temporary deletes them when no writer is running)")
    if not bad:
        print(f"ok: {plural(report.records, 'record')} in {plural(len(report.shards), 'shard')}; {measured}")
    elif report.is_dataset:
        print(f"FAILED: {len(bad)} of {plural(len(report.shards), 'shard')} damaged "
              f"({listing([check.name for check in bad])}); {measured}")
    else:
        print(measured)
    unrecorded = report.data_crc_unrecorded
    if unrecorded:
        print(f"note: the data CRC32C of {plural(len(unrecorded), 'shard')} ({listing(unrecorded)}) is not recorded "
              "(e.g. a Megatron import without --data-crc): the structure, edges and record checksums (when present) "
              "were checked, not the whole data file's checksum")


def _print_json(report: VerifyReport) -> None:
    print_json({
        "path": report.path,
        "ok": report.ok,
        "error": None,
        "records": report.records,
        "checked_bytes": report.checked_bytes,
        "seconds": report.seconds,
        "bytes_per_second": report.bytes_per_second,
        "shards": [{**asdict(check), "ok": check.ok} for check in report.shards],
        "data_crc_unrecorded": report.data_crc_unrecorded,
        "temporary_files": report.temporary_files,
        "writer_running": report.writer_running,
        "removed_temporary_files": report.removed_temporary_files,
    })


def run(args: argparse.Namespace) -> int:
    try:
        report = verify(args.path, remove_temporary=args.remove_temporary, workers=args.workers, **location_options(args),
                        progress=partial(progress_bar, description="verify", quiet=args.quiet or args.json))
    except (VarstoreError, CommandError, OSError) as error:
        if args.json:  # a pipeline into a JSON parser gets its document; the error line and exit code are as ever
            with writing_to_standard_output():
                print_json({"path": args.path, "ok": False, "error": one_line(error)})
        raise
    with writing_to_standard_output():
        if args.json:
            _print_json(report)
        else:
            checked, rate = format_size(report.checked_bytes), format_size(report.bytes_per_second)
            _print_text(report, f"{checked} of records checked in {report.seconds:.2f} s ({rate}/s)")
    return 0 if report.ok else 1
