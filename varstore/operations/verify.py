"""`verify`: check every structure and checksum of a shard or dataset, local or at a URL, shard by shard, so that
every damaged shard and record is listed rather than the first one refusing the open.

At a URL each shard's index and data object is fetched whole into the node cache (verified against the
manifest's CRC32C on arrival), then every record of the cached copy is checked.
"""

from __future__ import annotations

import glob
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate
from typing import Any, Callable

from ..dataset.local_source import open_listed_shard, verify_listed_shard
from ..dataset.remote_source import RemoteDatasetSource
from ..dataset.shard_threads import check_workers, in_order, serialised
from ..errors import CorruptRecordError, MissingFileError, UsageError, VarstoreError, listing
from ..format import header as fmt
from ..format.codecs import codec_from_stored
from ..format.manifest import MANIFEST_NAME, Manifest, ShardEntry
from ..local.locks import directory_lock_path, is_locked, shard_lock_path
from ..local.manifest_file import read_manifest
from ..local.publish import TEMP_MARK, remove_temporary_files
from ..progress import Advance, ProgressBar, reporting
from ..remote.location import RemoteLocation
from .locations import is_url, open_store, remote_options, shard_prefix, store_path

__all__ = ["ShardCheck", "VerifyReport", "verify"]


@dataclass
class ShardCheck:
    """The outcome for one shard; `bad_records` are indices within the shard, `first_record` its global index.
    `data_crc_recorded` is False for a shard whose header records no data CRC32C (§1.2: everything else was
    checked, not the whole data file's checksum)."""

    name: str
    first_record: int
    records: int
    error: str | None = None
    bad_records: list[int] = field(default_factory=list)
    data_crc_recorded: bool = True

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        """The shard's error, with its damaged records also numbered as in the dataset."""
        if not self.bad_records:
            return self.error or ""
        noun = "dataset record" if len(self.bad_records) == 1 else "dataset records"
        return f"{self.error} ({noun} {listing([self.first_record + index for index in self.bad_records])})"


@dataclass
class VerifyReport:
    """What `verify` found: each shard's outcome, what was checked and how fast, and the temporary files beside
    a local store (those removed first, those left, and whether a writer holding the store's lock is running)."""

    path: str
    is_dataset: bool
    shards: list[ShardCheck]
    checked_bytes: int
    seconds: float
    temporary_files: list[str] = field(default_factory=list)
    writer_running: bool = False
    removed_temporary_files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.shards)

    @property
    def records(self) -> int:
        return sum(check.records for check in self.shards)

    @property
    def bad_shards(self) -> list[ShardCheck]:
        return [check for check in self.shards if not check.ok]

    @property
    def data_crc_unrecorded(self) -> list[str]:
        """The shards whose data CRC32C is not recorded, so verification could not check it (§1.2)."""
        return [check.name for check in self.shards if not check.data_crc_recorded]

    @property
    def bad_records(self) -> list[int]:
        """The damaged records found, numbered as in the dataset (as in the shard, for a lone shard)."""
        return [check.first_record + index for check in self.shards for index in check.bad_records]

    @property
    def bytes_per_second(self) -> float:
        return self.checked_bytes / self.seconds if self.seconds > 0 else 0.0

    def damage(self) -> str | None:
        """What was found damaged, in one line, or None if everything is intact."""
        return describe_damage(self.shards)


def describe_damage(checks: list[ShardCheck]) -> str | None:
    """What `checks` found damaged, in one line, or None if everything is intact."""
    bad = [check for check in checks if not check.ok]
    if not bad:
        return None
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return "; ".join(f"{check.name}: {check.describe()}" for check in bad[:3]) + more


def _check(check: ShardCheck, verify_shard: Callable[[], None]) -> None:
    """Run `verify_shard`, which notes in `check` whether the shard's data CRC32C is recorded once it is open (so
    also for a shard found damaged), recording what it raises in `check`."""
    try:
        verify_shard()
    except CorruptRecordError as error:
        check.error, check.bad_records = str(error), list(error.records)
    except VarstoreError as error:
        check.error = str(error)


def _verified(shard: Any, check: ShardCheck, progress: Advance) -> None:
    """Verify `shard` (a reader) into `check`, noting first whether its data CRC32C is recorded, and so checked."""
    check.data_crc_recorded = shard.header.data_crc_recorded
    shard.verify(progress)


def _check_shard(reader: Any, progress: Advance) -> list[ShardCheck]:
    check = ShardCheck(reader.path, 0, len(reader))
    _check(check, partial(_verified, reader, check, progress))
    return [check]


def _check_shards(manifest: Manifest, verify_shard: Callable[[ShardEntry, ShardCheck], None],
                  workers: int) -> list[ShardCheck]:
    """Each shard of `manifest` checked by `verify_shard`, `workers` shards at once (on threads)."""
    firsts = [0, *accumulate(entry.records for entry in manifest.shards)]

    def check_one(position: int) -> ShardCheck:
        entry = manifest.shards[position]
        check = ShardCheck(entry.name, firsts[position], entry.records)
        _check(check, partial(verify_shard, entry, check))
        return check

    return in_order(check_one, range(len(manifest.shards)), workers)


def _check_dataset(directory: str, manifest: Manifest, workers: int, progress: Advance) -> list[ShardCheck]:
    codec = codec_from_stored(manifest.codec, manifest.codec_params, path=directory)
    progress = serialised(progress) if workers > 1 else progress  # type: ignore[assignment]

    def verify_shard(entry: ShardEntry, check: ShardCheck) -> None:
        with open_listed_shard(directory, entry, codec) as reader:
            check.data_crc_recorded = reader.header.data_crc_recorded
            verify_listed_shard(reader, entry, progress)

    return _check_shards(manifest, verify_shard, workers)


def _check_remote_dataset(source: RemoteDatasetSource, manifest: Manifest, workers: int, progress: Advance) -> list[ShardCheck]:
    """`_check_dataset` at a URL: each shard's index and data object fetched into the node cache, then checked."""
    codec = codec_from_stored(manifest.codec, manifest.codec_params, path=source.location.url)
    progress = serialised(progress) if workers > 1 else progress  # type: ignore[assignment]

    def verify_shard(entry: ShardEntry, check: ShardCheck) -> None:
        # The index is fetched verified against the entry's CRC32C, the data against the header's.
        with source.open_shard(manifest, entry, codec, verify_reads=False, replaced_check=_report_damage, whole=True) as shard:
            _verified(shard, check, progress)

    return _check_shards(manifest, verify_shard, workers)


def _report_damage() -> None:
    """A shard's object that is missing or fails its checksum is reported as damage, whatever replaced it."""


def _remote_dataset(url: str, options: dict[str, Any]) -> tuple[RemoteDatasetSource, Manifest] | None:
    """The dataset at `url` (its prefix or its manifest.json) and its manifest, or None if there is no manifest
    (a shard, or nothing: opening it as a shard says which)."""
    url = url.rstrip("/")
    if url.endswith((fmt.INDEX_SUFFIX, fmt.DATA_SUFFIX)):
        return None
    source = RemoteDatasetSource(RemoteLocation(url.removesuffix("/" + MANIFEST_NAME), **options))
    try:
        return source, source.read_manifest()
    except MissingFileError:
        return None


_StoreCheck = tuple[bool, int, Callable[[Advance], list[ShardCheck]]]


def store_check(location: str, options: dict[str, Any], cleanup: ExitStack, workers: int = 1) -> _StoreCheck:
    """(whether it is a dataset, the bytes to check, the check listing each shard's outcome) for the store at
    `location`, a local path or a URL (read with the `remote_options` `options`, which a local path ignores);
    what it opens joins `cleanup`. A dataset's shards are checked `workers` at once.

    A dataset's manifest alone is read first, so that every damaged shard is listed rather than the first one
    refusing the open."""
    if not is_url(location):
        if os.path.isdir(location):
            manifest = read_manifest(location)
            return True, sum(entry.data_size for entry in manifest.shards), partial(_check_dataset, location, manifest, workers)
        # A shard that cannot even be opened is reported as an error, like any unreadable input.
        reader = cleanup.enter_context(open_store(location))
        return False, reader.header.data_size, partial(_check_shard, reader)
    dataset = _remote_dataset(location, options)
    if dataset is None:
        store = cleanup.enter_context(open_store(location, **options))
        return False, store.header.data_size, partial(_check_shard, store)
    source, manifest = dataset
    return True, sum(entry.data_size for entry in manifest.shards), partial(_check_remote_dataset, source, manifest, workers)


def _run_checks(location: str, options: dict[str, Any], progress: ProgressBar | None,
                workers: int) -> tuple[bool, list[ShardCheck], float, int]:
    """(whether the store is a dataset, each shard's outcome, the seconds the checks took, the bytes checked)."""
    with ExitStack() as cleanup:
        is_dataset, total, check_all = store_check(location, options, cleanup, workers)
        started = time.perf_counter()
        with reporting(progress, total) as counter:
            checks = check_all(counter)
    return is_dataset, checks, time.perf_counter() - started, counter.done


def verify(path: str | os.PathLike[str], *, remove_temporary: bool = False,
           storage_options: dict[str, Any] | None = None, cache_dir: str | os.PathLike[str] | None = None,
           cache_limit: int | None = None, progress: ProgressBar | None = None, workers: int = 1) -> VerifyReport:
    """Check every header, offset, manifest entry and record checksum of the shard or dataset at `path` (a local
    path or a URL), each shard separately; damage is reported in the result, not raised.

    `remove_temporary` first deletes the temporary files that interrupted writers left beside a local store
    (a running writer's are left alone: it holds its lock). A store that cannot be opened at all (no shard or
    manifest there, a manifest that does not parse) raises its `VarstoreError`. A shard whose data CRC32C is not
    recorded (§1.2) is checked for everything else and named in `VerifyReport.data_crc_unrecorded`. `progress`
    (`varstore.progress`) is told the bytes of records to check and each amount checked. `workers` shards of a
    dataset are checked at once, on threads (at a URL, downloaded at once too).
    """
    check_workers(workers)
    path = store_path(path)
    options = remote_options(storage_options, cache_dir, cache_limit)
    if is_url(path):
        if remove_temporary:
            raise UsageError("--remove-temporary applies to local stores: object storage holds no temporary files of varstore's")
        is_dataset, checks, seconds, checked = _run_checks(path, options, progress, workers)
        return VerifyReport(path, is_dataset, checks, checked, seconds)
    is_dataset = os.path.isdir(path)
    directory = path if is_dataset else os.path.dirname(path) or "."
    # Lock-aware: the temporary files of a writer that is still running are left alone.
    removed = remove_temporary_files(directory) if remove_temporary else []
    writer_lock = directory_lock_path(directory) if is_dataset else shard_lock_path(shard_prefix(path))
    is_dataset, checks, seconds, checked = _run_checks(path, options, progress, workers)
    leftovers = sorted(glob.glob(os.path.join(glob.escape(directory), f"*{TEMP_MARK}*")))
    return VerifyReport(path, is_dataset, checks, checked, seconds, temporary_files=leftovers,
                        writer_running=is_locked(writer_lock), removed_temporary_files=removed)
