"""`repair`: verify every shard of a local dataset and, with ``write=True``, commit a manifest without the
damaged ones.

Without `write` nothing is changed. With it, the directory is locked against writers for the whole repair, the
new manifest is committed atomically, and the dropped shards' files are left in place (for salvage; a later
overwrite or ``rm`` removes them). A shard is dropped for damage only (a missing file, a bad header, a record
that fails its checksum): an error of the operating system (no file descriptors left, an I/O error) aborts the
repair, since it says nothing about the shard.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass

from ..dataset.local_source import open_listed_shard, verify_listed_shard
from ..errors import CorruptRecordError, FormatError, MissingFileError, UsageError
from ..format.codecs import codec_from_stored
from ..format.manifest import Manifest, ShardEntry
from ..local.locks import lock_directory
from ..local.manifest_file import commit_manifest_file, read_manifest
from ..local.publish import sync_directory
from .locations import is_url, store_path

__all__ = ["DamagedShard", "RepairReport", "repair"]


@dataclass(frozen=True)
class DamagedShard:
    """A shard that fails verification: its name and records as the manifest lists them, and why, in one line."""

    name: str
    records: int
    reason: str


@dataclass(frozen=True)
class RepairReport:
    """The shards that verify (`kept`, by name) and those that do not (`damaged`); `written` says whether a
    manifest without the damaged ones was committed (only with ``write=True``, and only if any is damaged)."""

    path: str
    kept: list[str]
    kept_records: int
    damaged: list[DamagedShard]
    written: bool

    @property
    def ok(self) -> bool:
        return not self.damaged

    @property
    def dropped_records(self) -> int:
        return sum(shard.records for shard in self.damaged)


def _damaged_shards(directory: str) -> tuple[list[ShardEntry], list[tuple[ShardEntry, str]], Manifest]:
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


def repair(path: str | os.PathLike[str], *, write: bool = False) -> RepairReport:
    """Verify every shard of the dataset directory `path` (or its manifest.json) and list those that fail; with
    `write`, under the dataset's writer lock, commit a manifest without them (their files are left in place)."""
    directory = store_path(path)
    if is_url(directory):
        raise UsageError(
            f"{directory}: repair works on a dataset in a local directory; copy it here (varstore cp URL DIR), "
            "repair it, and copy it back"
        )
    if not os.path.isdir(directory):
        raise UsageError(f"{directory} is not a dataset directory (repair drops shards from a dataset's manifest)")
    with lock_directory(directory) if write else contextlib.nullcontext():
        intact, damaged, manifest = _damaged_shards(directory)
        if damaged and write:
            commit_manifest_file(directory, dataclasses.replace(manifest, shards=intact), overwrite=True)
            sync_directory(directory)
    return RepairReport(
        path=directory,
        kept=[entry.name for entry in intact],
        kept_records=sum(entry.records for entry in intact),
        damaged=[DamagedShard(entry.name, entry.records, reason) for entry, reason in damaged],
        written=bool(damaged) and write,
    )
