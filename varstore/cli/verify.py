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

from .. import format as fmt
from ..codecs import codec_from_stored
from ..errors import CorruptRecordError, MissingFileError, VarstoreError
from ..locking import directory_lock_path, is_locked, shard_lock_path
from ..manifest import MANIFEST_NAME, Manifest, ShardEntry, read_manifest
from ..sharded_reader import open_listed_shard, verify_listed_shard
from ..remote.filesystems import is_url
from ..remote.location import RemoteLocation
from ..remote_dataset import RemoteDatasetSource
from ..storage import TEMP_MARK
from .arguments import add_quiet_option, add_store_arguments
from .errors import UsageError
from .stores import REMOTE_EPILOG, add_location_options, open_store, reader_options
from .output import Progress, format_size, listing, plural, print_json, progress_bar, writing_to_standard_output


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "verify",
        help="check structure and checksums; exit 1 if anything is damaged",
        description="Check a shard or dataset: headers, offsets, the manifest against each shard, and every "
        "record checksum. Each shard is checked separately, so all damaged shards and records are listed. "
        "Exits 0 when everything is intact, 1 when anything is damaged or missing.",
        epilog="cost at a URL:\n"
        "  verify reads every byte, so at a URL it downloads each shard's index and data\n"
        "  object whole into the node cache (--cache-dir), verified against the manifest's\n"
        "  CRC32C on arrival, then checks every record of the cached copy: the transfer and\n"
        "  the cache space are the dataset's size (objects already cached on this machine are\n"
        "  not downloaded again; --cache-limit evicts checked shards to stay under a limit).\n"
        "  The progress bar counts the bytes checked; it pauses while each shard downloads.\n\n"
        + REMOTE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_arguments(parser)
    add_quiet_option(parser)
    add_location_options(parser)
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


def _check_remote_dataset(source: RemoteDatasetSource, manifest: Manifest, progress: Progress) -> list[_ShardCheck]:
    """`_check_dataset` at a URL: each shard's index and data object fetched into the node cache, then checked."""
    codec = codec_from_stored(manifest.codec, manifest.codec_params, path=source.location.url)
    checks, first_record = [], 0
    for entry in manifest.shards:
        check = _ShardCheck(entry.name, first_record, entry.records)

        def verify_shard(entry: ShardEntry = entry) -> None:
            # The index is fetched verified against the entry's CRC32C, the data against the header's.
            with source.open_shard(manifest, entry, codec, verify_reads=False, replaced_check=_report_damage, whole=True) as shard:
                shard.verify(progress)

        _check(check, verify_shard)
        checks.append(check)
        first_record += entry.records
    return checks


def _report_damage() -> None:
    """A shard's object that is missing or fails its checksum is reported as damage, whatever replaced it."""


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


def _remote_dataset(url: str, args: argparse.Namespace) -> tuple[RemoteDatasetSource, Manifest] | None:
    """The dataset at `url` (its prefix or its manifest.json) and its manifest, or None if there is no manifest
    (a shard, or nothing: opening it as a shard says which)."""
    url = url.rstrip("/")
    if url.endswith((fmt.INDEX_SUFFIX, fmt.DATA_SUFFIX)):
        return None
    source = RemoteDatasetSource(RemoteLocation(url.removesuffix("/" + MANIFEST_NAME), **reader_options(args)))
    try:
        return source, source.read_manifest()
    except MissingFileError:
        return None


_StoreCheck = tuple[bool, int, Callable[[Progress], list[_ShardCheck]]]


def store_check(location: str, args: argparse.Namespace, cleanup: ExitStack) -> _StoreCheck:
    """(whether it is a dataset, the bytes to check, the check listing each shard's outcome) for the store at
    `location`, a local path or a URL (read with the location options in `args`); what it opens joins `cleanup`.

    A dataset's manifest alone is read first, so that every damaged shard is listed rather than the first one
    refusing the open."""
    if not is_url(location):
        if os.path.isdir(location):
            manifest = read_manifest(location)
            return True, sum(entry.data_size for entry in manifest.shards), partial(_check_dataset, location, manifest)
        # A shard that cannot even be opened is reported as an error, like any unreadable input.
        reader = cleanup.enter_context(varstore.open(location))
        return False, reader.header.data_size, partial(_check_shard, reader)
    dataset = _remote_dataset(location, args)
    if dataset is None:
        store = cleanup.enter_context(open_store(location, args))
        return False, store.header.data_size, partial(_check_shard, store)
    source, manifest = dataset
    return True, sum(entry.data_size for entry in manifest.shards), partial(_check_remote_dataset, source, manifest)


def describe_damage(checks: list[_ShardCheck]) -> str | None:
    """What `checks` found damaged, in one line, or None if everything is intact."""
    bad = [check for check in checks if not check.ok]
    if not bad:
        return None
    return "; ".join(f"{check.name}: {_describe_bad(check)}" for check in bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")


def _run_checks(args: argparse.Namespace) -> tuple[bool, list[_ShardCheck], float, Progress]:
    """(whether the store is a dataset, each shard's outcome, the seconds the checks took, the bytes checked)."""
    with ExitStack() as cleanup:
        is_dataset, total, check_all = store_check(args.path, args, cleanup)
        started = time.perf_counter()
        with progress_bar(total, description="verify", quiet=args.quiet or args.json) as progress:
            checks = check_all(progress)
    return is_dataset, checks, time.perf_counter() - started, progress


def run(args: argparse.Namespace) -> int:
    if is_url(args.path):
        if args.remove_temporary:
            raise UsageError("--remove-temporary applies to local stores: object storage holds no temporary files of varstore's")
        is_dataset, checks, seconds, progress = _run_checks(args)
        _report(args, checks, is_dataset, seconds, progress, removed=[], leftovers=[], writer_running=False)
        return 0 if all(check.ok for check in checks) else 1
    is_dataset = os.path.isdir(args.path)
    directory = args.path if is_dataset else os.path.dirname(args.path) or "."
    # Lock-aware: the temporary files of a writer that is still running are left alone.
    removed = varstore.remove_temporary_files(directory) if args.remove_temporary else []
    prefix = args.path.removesuffix(fmt.INDEX_SUFFIX).removesuffix(fmt.DATA_SUFFIX)
    writer_lock = directory_lock_path(directory) if is_dataset else shard_lock_path(prefix)
    is_dataset, checks, seconds, progress = _run_checks(args)
    leftovers = sorted(glob.glob(os.path.join(glob.escape(directory), f"*{TEMP_MARK}*")))
    _report(args, checks, is_dataset, seconds, progress, removed=removed, leftovers=leftovers,
            writer_running=is_locked(writer_lock))
    return 0 if all(check.ok for check in checks) else 1


def _report(args: argparse.Namespace, checks: list[_ShardCheck], is_dataset: bool, seconds: float, progress: Progress, *,
            removed: list[str], leftovers: list[str], writer_running: bool) -> None:
    rate = progress.done / seconds if seconds > 0 else 0.0
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
