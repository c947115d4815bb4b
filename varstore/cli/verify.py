"""``varstore verify``: check every structure and checksum of a shard or dataset, shard by shard, and list what is damaged."""

from __future__ import annotations

import argparse
import glob
import os
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Callable

import varstore

from ..codecs import codec_from_stored
from ..errors import CorruptRecordError, VarstoreError
from ..locking import directory_lock_path, is_locked, shard_lock_path
from ..manifest import Manifest, ShardEntry, read_manifest
from ..sharded_reader import open_listed_shard, verify_listed_shard
from ..storage import TEMP_MARK
from .arguments import add_quiet_option, add_store_arguments
from .output import Progress, format_size, listing, plural, print_json, progress_bar, writing_to_standard_output


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "verify",
        help="check structure and checksums; exit 1 if anything is damaged",
        description="Check a shard or dataset: headers, offsets, the manifest against each shard, and every "
        "record checksum. Each shard is checked separately, so all damaged shards and records are listed. "
        "Exits 0 when everything is intact, 1 when anything is damaged or missing.",
    )
    add_store_arguments(parser)
    add_quiet_option(parser)
    parser.add_argument("--remove-temporary", action="store_true",
                        help="first delete the temporary files that interrupted writers left beside the store "
                        "(a running writer's files are left alone: it holds its lock)")
    parser.set_defaults(run=run)


@dataclass
class _ShardCheck:
    """The outcome for one shard; `bad_records` are indices within the shard, `first_record` its global index."""

    name: str
    first_record: int
    records: int
    error: str | None = None
    bad_records: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


def _check(check: _ShardCheck, verify_shard: Callable[[], None]) -> None:
    try:
        verify_shard()
    except CorruptRecordError as error:
        check.error, check.bad_records = str(error), list(error.records)
    except VarstoreError as error:
        check.error = str(error)


def _check_shard(reader: varstore.Reader, progress: Progress) -> list[_ShardCheck]:
    check = _ShardCheck(reader.path, 0, len(reader))
    _check(check, partial(reader.verify, progress))
    return [check]


def _check_dataset(directory: str, manifest: Manifest, progress: Progress) -> list[_ShardCheck]:
    codec = codec_from_stored(manifest.codec, manifest.codec_params, path=directory)
    checks, first_record = [], 0
    for entry in manifest.shards:
        check = _ShardCheck(entry.name, first_record, entry.records)

        def verify_shard(entry: ShardEntry = entry) -> None:
            with open_listed_shard(directory, entry, codec) as reader:
                verify_listed_shard(reader, entry, progress)

        _check(check, verify_shard)
        checks.append(check)
        first_record += entry.records
    return checks


def _describe_bad(check: _ShardCheck) -> str:
    """The shard's error, with its damaged records also numbered as in the dataset."""
    if not check.bad_records:
        return check.error or ""
    noun = "dataset record" if len(check.bad_records) == 1 else "dataset records"
    return f"{check.error} ({noun} {listing([check.first_record + index for index in check.bad_records])})"


def _print_text(checks: list[_ShardCheck], is_dataset: bool, measured: str, removed: list[str], leftovers: list[str],
                writer_running: bool) -> None:
    bad = [check for check in checks if not check.ok]
    for path in removed:
        print(f"removed {path}")
    for check in bad:
        print(f"FAILED {check.name}: {_describe_bad(check)}" if is_dataset else f"FAILED: {check.error}")
    if writer_running:
        print(f"note: a writer is running here; {len(leftovers)} temporary files beside the store may be its own "
              "(--remove-temporary never deletes a running writer's files)")
    elif leftovers:
        print(f"note: {len(leftovers)} temporary files left by interrupted writers beside the store "
              "(--remove-temporary deletes them when no writer is running)")
    if not bad:
        print(f"ok: {plural(sum(check.records for check in checks), 'record')} in {plural(len(checks), 'shard')}; {measured}")
    elif is_dataset:
        print(f"FAILED: {len(bad)} of {plural(len(checks), 'shard')} damaged ({listing([check.name for check in bad])}); {measured}")
    else:
        print(measured)


def run(args: argparse.Namespace) -> int:
    is_dataset = os.path.isdir(args.path)
    directory = args.path if is_dataset else os.path.dirname(args.path) or "."
    # Lock-aware: the temporary files of a writer that is still running are left alone.
    removed = varstore.remove_temporary_files(directory) if args.remove_temporary else []
    with ExitStack() as cleanup:
        if is_dataset:
            manifest = read_manifest(args.path)
            total = sum(entry.data_size for entry in manifest.shards)
            check_all = partial(_check_dataset, args.path, manifest)
            writer_lock = directory_lock_path(directory)
        else:
            # A shard that cannot even be opened is reported as an error, like any unreadable input.
            reader = cleanup.enter_context(varstore.open(args.path))
            total = reader.header.data_size
            check_all = partial(_check_shard, reader)
            writer_lock = shard_lock_path(reader.path)
        started = time.perf_counter()
        with progress_bar(total, description="verify", quiet=args.quiet or args.json) as progress:
            checks = check_all(progress)
    seconds = time.perf_counter() - started
    rate = progress.done / seconds if seconds > 0 else 0.0
    leftovers = sorted(glob.glob(os.path.join(glob.escape(directory), f"*{TEMP_MARK}*")))
    writer_running = is_locked(writer_lock)
    with writing_to_standard_output():
        if args.json:
            print_json({
                "path": args.path,
                "ok": all(check.ok for check in checks),
                "records": sum(check.records for check in checks),
                "checked_bytes": progress.done,
                "seconds": seconds,
                "bytes_per_second": rate,
                "shards": [{**asdict(check), "ok": check.ok} for check in checks],
                "temporary_files": leftovers,
                "writer_running": writer_running,
                "removed_temporary_files": removed,
            })
        else:
            measured = f"{format_size(progress.done)} of records checked in {seconds:.2f} s ({format_size(rate)}/s)"
            _print_text(checks, is_dataset, measured, removed, leftovers, writer_running)
    return 0 if all(check.ok for check in checks) else 1
