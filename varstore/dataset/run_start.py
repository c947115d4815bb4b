"""`begin_run`: which run a `ShardedWriter` writes, a new one or the interrupted one its journal describes.

Kept apart from the writer so that routing records into shards does not also
have to know how a directory left by earlier (perhaps killed) writers is read.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Iterable

from ..errors import (
    CorruptRecordError,
    FormatError,
    MissingFileError,
    RecordTypeError,
    ShardExistsError,
    StorageError,
    VarstoreError,
)
from ..format import header as fmt
from ..format.codecs import Codec
from ..format.manifest import MANIFEST_NAME, Manifest, ShardEntry, damaged_manifest_refusal, is_valid_shard_name
from ..local.journal import Journal, Run, check_codec, manifest_identity, new_run, read_journal
from ..local.locks import DIRECTORY_LOCK_NAME, LOCK_SUFFIX, is_locked, lock_shard, shard_lock_path
from ..local.manifest_file import describe_shard, read_manifest
from ..local.publish import TEMP_MARK, remove_quietly, remove_temporary_files
from ..shard.reader import Reader

_NUMBERED_SHARD = re.compile(r"shard-(\d{6,})")


def refuse_unless_overwrite(interrupted: Run | None, replaces: int | None, overwrite: bool, path: str) -> None:
    """A new run (not a resume) may replace a dataset (`replaces`) or discard an interrupted run's shards only
    with ``overwrite=True``."""
    if replaces is not None and not overwrite:
        raise ShardExistsError("a dataset already exists here; pass overwrite=True to replace it", path=path)
    if interrupted is not None and not overwrite:
        raise ShardExistsError(
            "an interrupted writer left shards here: pass resume=True to continue it, or overwrite=True to start again",
            path=path,
        )


def check_resumable(run: Run, codec: Codec, replaces: int | None, path: str, *, commit: str) -> None:
    """Refuse to continue the interrupted `run` unless it wrote `codec` and was replacing the manifest live now
    (`replaces`, None for none); `commit` is how that writer commits its manifest ("write", "upload")."""
    check_codec(run, codec.name, codec.params(), path)
    if run.replaces != replaces:
        raise ShardExistsError(
            "a dataset is already committed here: resume=True continues only a writer that did not "
            f"{commit} its manifest" if replaces is not None else "cannot resume: the manifest the interrupted run was replacing is gone",
            path=path,
        )


@dataclass
class StartedRun:
    """What a writer continues from once its run has begun: the dataset it replaces and the shards it adopted."""

    previous: Manifest | None  # the live manifest, whose shards go once the new one commits
    live_names: set[str]  # shard names the live manifest lists, never to be reused
    adopted: list[ShardEntry]  # shards of the interrupted run, verified and kept
    record_count: int
    next_number: int  # the first shard number past every name used before
    overwrite: bool  # whether a committed dataset is replaced
    run: Run
    journal: Journal


def begin_run(directory: str, codec: Codec, *, overwrite: bool, resume: bool) -> StartedRun:
    """Start a new run in `directory`, or with `resume` continue the interrupted one, and open its journal.

    The caller holds the directory lock. Raises as `ShardedWriter` documents when
    the directory holds a dataset or run this may not replace or continue.
    """
    return _RunStart(directory, codec).begin(overwrite, resume)


class _RunStart:
    """The state gathered while a run begins, so that an interrupt midway can end the journal it started."""

    _next_number: int
    _overwrite: bool
    _run: Run

    def __init__(self, directory: str, codec: Codec) -> None:
        self.path = directory
        self._codec = codec
        self._previous: Manifest | None = None
        self._live_names: set[str] = set()
        self._entries: list[ShardEntry] = []
        self._journal: Journal | None = None

    def begin(self, overwrite: bool, resume: bool) -> StartedRun:
        try:
            self._previous = self._live_manifest(overwrite or resume)
            self._live_names = {entry.name for entry in self._previous.shards} if self._previous is not None else set()
            replaces = manifest_identity(self.path)
            if resume:
                self._resume(read_journal(self.path), replaces)
            else:
                self._start_run(read_journal(self.path), replaces, overwrite)
        except BaseException:
            if self._journal is not None and not self._entries:
                self._journal.remove()  # interrupted (Ctrl-C, say) before it took a record: a run with nothing to resume
            raise
        return StartedRun(
            previous=self._previous,
            live_names=self._live_names,
            adopted=self._entries,
            record_count=sum(entry.records for entry in self._entries),
            next_number=self._next_number,
            overwrite=self._overwrite,
            run=self._run,
            journal=self._journal,
        )

    @property
    def shard_names(self) -> list[str]:
        return [entry.name for entry in self._entries]

    def _live_manifest(self, replacing: bool) -> Manifest | None:
        """The committed manifest, if any; a damaged one counts as a dataset whose shards are unknown."""
        if not os.path.lexists(os.path.join(self.path, MANIFEST_NAME)):
            return None
        try:
            return read_manifest(self.path)
        except (FormatError, StorageError) as error:
            if not replacing:
                raise damaged_manifest_refusal(error, self.path) from None
            return None

    def _start_run(self, interrupted: Run | None, replaces: int | None, overwrite: bool) -> None:
        """Begin a new run (a new dataset or an overwrite); an interrupted run's shards are discarded."""
        refuse_unless_overwrite(interrupted, replaces, overwrite, self.path)
        numbered = list(self._live_names)
        if interrupted is not None:
            numbered += interrupted.begun
        self._next_number = number_after(numbered)
        numbered_shard_name(self._next_number, self.path)  # refuse a name past the limit before removing anything
        self._overwrite = replaces is not None
        self._run = new_run(self._codec.name, self._codec.params(), replaces)
        # The new journal replaces the old one before the old run's files go: a kill in between leaves a run
        # that can be resumed (with nothing adopted) rather than a journal naming deleted shards.
        self._journal = Journal.start(self.path, self._run)
        if interrupted is not None:
            self._remove_dead_writer_state()
            for name in interrupted.begun:
                if name not in self._live_names:
                    self._remove_shard_files(name)

    def _resume(self, interrupted: Run | None, replaces: int | None) -> None:
        """Continue the run the journal describes, adopting the shards it committed."""
        self._remove_dead_writer_state()
        if interrupted is None:
            if replaces is not None:
                raise ShardExistsError(
                    "nothing to resume: resume=True continues only a writer that did not write its manifest, and here "
                    "a dataset is committed with no writer journal (its writer finished, or an overwrite was stopped "
                    "before it began its journal); open without resume=True (overwrite=True replaces the dataset)",
                    path=self.path,
                )
            if _shard_files(self.path):
                raise VarstoreError(
                    "cannot resume: there is no writer journal here, so these shards cannot be told apart from those "
                    "of other runs; write the dataset again with overwrite=True",
                    path=self.path,
                )
            self._start_run(None, None, overwrite=False)
            return
        check_resumable(interrupted, self._codec, replaces, self.path, commit="write")
        self._run = interrupted
        self._overwrite = replaces is not None
        self._adopt_committed_shards()
        self._next_number = number_after(list(self._live_names) + self.shard_names)
        # A new file of exactly the valid lines: never append after a torn line or through a hard link to a snapshot.
        self._journal = Journal.start(self.path, self._run)

    def _adopt_committed_shards(self) -> None:
        """Adopt the run's shards in order; the last one begun may be damaged or half published (it is removed)."""
        begun = self._run.begun
        for position, name in enumerate(begun):
            last = position == len(begun) - 1
            if not last and name not in self._run.committed:
                raise FormatError(
                    f"cannot resume: the journal says shard {name} was begun but not committed, yet a later shard was "
                    "begun; this journal was not written by one writer run here. Write the dataset again with overwrite=True",
                    path=self.path,
                )
            try:
                entry = self._verified_shard(name)
            except (FormatError, CorruptRecordError, MissingFileError) as error:
                if not last:
                    raise FormatError(
                        f"cannot resume: shard {name}, which the journal says this run committed, is missing or "
                        f"damaged ({error}); the journal does not describe this directory (copied from elsewhere?). "
                        "Write the dataset again with overwrite=True",
                        path=self.path,
                    ) from None
                self._remove_shard_files(name)
                break
            self._entries.append(entry)
            self._run.committed[name] = entry
        self._run.begun = self.shard_names  # a discarded last shard is no longer part of the run

    def _verified_shard(self, name: str) -> ShardEntry:
        """The entry of shard `name` after reading it whole; it must match this codec and what the journal recorded."""
        with Reader(os.path.join(self.path, name)) as reader:
            reader.verify()
            stored = (reader.codec, reader._codec.params())
        if stored != (self._codec.name, self._codec.params()):
            raise RecordTypeError(
                f"cannot resume: the shard stores codec {stored[0]} {stored[1]}, "
                f"this writer was given {self._codec.name} {self._codec.params()}",
                path=os.path.join(self.path, name),
            )
        entry, _, _ = describe_shard(self.path, name)
        journaled = self._run.committed.get(name)
        if journaled is not None and journaled != entry:
            raise FormatError("the shard differs from the one the interrupted run committed", path=os.path.join(self.path, name))
        return entry

    def _remove_dead_writer_state(self) -> None:
        """Remove the temporary files and unheld lock files that killed writers left here (this writer holds the
        directory lock; a lock file is removed by taking its lock, so a live writer's is never touched)."""
        remove_temporary_files(self.path, holding_directory_lock=True)
        for name in os.listdir(self.path):
            if name.endswith(LOCK_SUFFIX) and name != DIRECTORY_LOCK_NAME and _is_regular_file(os.path.join(self.path, name)):
                try:
                    lock_shard(os.path.join(self.path, name[: -len(LOCK_SUFFIX)])).release()
                except VarstoreError:
                    continue  # a live writer holds it, or it cannot be locked: not ours to remove

    def _remove_shard_files(self, name: str) -> None:
        """Remove a shard of an abandoned run, unless a live writer holds its name."""
        prefix = os.path.join(self.path, name)
        if not is_locked(shard_lock_path(prefix)):
            remove_quietly(list(fmt.shard_paths(prefix)))


def numbered_shard_name(number: int, directory: str) -> str:
    """``shard-NNNNNN`` for `number`; `FormatError` when that is no longer a valid shard name (over 200 characters)."""
    name = f"shard-{number:06d}"
    if not is_valid_shard_name(name):
        raise FormatError(f"shard number {number} makes the name {name[:40]}... longer than 200 characters", path=directory)
    return name


def shard_number(name: str) -> int | None:
    """NNNNNN of a ``shard-NNNNNN`` name; None for any other name."""
    match = _NUMBERED_SHARD.fullmatch(name)
    return int(match.group(1)) if match else None


def number_after(names: Iterable[str]) -> int:
    """One more than the highest number of a ``shard-NNNNNN`` name among `names` (0 if none)."""
    numbers = [number for number in map(shard_number, names) if number is not None]
    return max(numbers, default=-1) + 1


def _is_regular_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _shard_files(directory: str) -> list[str]:
    """Committed or half-published shard files in `directory` (not temporary files)."""
    return [name for name in os.listdir(directory)
            if name.endswith((fmt.DATA_SUFFIX, fmt.INDEX_SUFFIX)) and TEMP_MARK not in name]
