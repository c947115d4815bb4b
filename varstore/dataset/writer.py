"""`ShardedWriter` and `write_manifest`: datasets of many shards, committed by writing the manifest last."""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from ..errors import ClosedError, FormatError, RecordTypeError, ShardExistsError, StorageError, VarstoreError
from ..format import header as fmt
from ..format import manifest as manifest_rules
from ..format.checksum import crc32c
from ..format.codecs import codec_from_stored, make_codec
from ..format.manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardEntry,
    checked_manifest_bytes,
    is_valid_shard_name,
    shard_entry_size_bound,
)
from ..local.file_url import resolve_file_url
from ..local.journal import Journal
from ..local.locks import is_locked, lock_directory, shard_lock_path
from ..local.manifest_file import commit_manifest_file, describe_shard
from ..local.publish import (
    TEMP_MARK,
    make_directories,
    refuse_in_a_forked_child,
    remove_quietly,
    storage_error,
    sync_directory,
)
from ..remote.filesystems import is_url
from ..shard.reader import Reader
from ..shard.writer import CommitsOnExit, Writer, extend_in_chunks, flat_payloads, refused_record
from .local_target import LocalTarget
from .remote_target import RemoteTarget
from .run_start import numbered_shard_name

_DIGITS = re.compile(r"(\d+)")


class ShardedWriter(CommitsOnExit):
    """Writes a dataset directory: shards named ``shard-000000``, ``shard-000001``, ... and ``manifest.json``.

    A new shard starts when the next record would take the current one past
    `max_shard_bytes` of payload, or past `max_shard_records` records. The
    dataset exists for readers only once `close` commits the manifest; an
    exception in a ``with`` block removes every shard this writer made.

    One writer at a time: the writer holds the directory's lock from its start to
    `close` or `abort` (`ConcurrentWriterError` for a second one). It keeps a
    journal of the shards it begins and commits (`varstore.local.journal`), removed
    when the manifest commits.

    With ``overwrite=True`` the new shards take numbers after every shard the
    live manifest lists, so the old dataset stays whole until the new manifest
    replaces it, and a shard name is never reused for other records. A damaged
    manifest can be overwritten too; its shards are then unknown and left in place.
    With ``resume=True`` the writer continues the run that the journal describes
    (a new dataset or an overwrite): it removes temporary files, adopts the
    shards that run committed after verifying them (a damaged or half-published
    last one is discarded) and starts with ``len(writer)`` equal to the records
    they hold, so the caller continues its input from there.

    The manifest's size limit (`varstore.format.manifest.MAX_MANIFEST_SIZE`) bounds the
    number of shards: the writer refuses to start a shard the manifest might not
    have room for (`FormatError`, before that shard takes a record), and can still
    be closed with the records it holds.

    If a shard cannot be committed or written (a full disk, say), the writer
    fails: it accepts nothing more, never commits a manifest, keeps the shards
    already committed, and its errors say how to resume.

    Given a URL (``s3://bucket/prefix``, ``memory://x``, any fsspec URL) with its
    `storage_options`, the writer's target is a `varstore.dataset.remote_target.RemoteTarget`:
    the same writer on a local staging directory, uploading each shard as it
    commits and the manifest last (see that module).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        codec: str = "bytes",
        *,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        metadata: dict[str, Any] | None = None,
        checksums: bool = True,
        max_shard_bytes: int = 256 << 20,
        max_shard_records: int | None = None,
        overwrite: bool = False,
        resume: bool = False,
        storage_options: dict[str, Any] | None = None,
        compression: str | None = None,
        compression_level: int = 3,
    ) -> None:
        self._target = self._make_target(directory, storage_options)
        self.path, self._directory = self._target.path, self._target.directory
        self._pid = os.getpid()
        if max_shard_bytes < 1 or (max_shard_records is not None and max_shard_records < 1):
            raise VarstoreError("max_shard_bytes and max_shard_records must be positive")
        self._codec = make_codec(codec, dtype=dtype, shape=shape)
        self._writer_options = {"codec": codec, "dtype": dtype, "shape": shape, "metadata": metadata, "checksums": checksums,
                                "compression": compression, "compression_level": compression_level}
        self._metadata = dict(metadata or {})
        self._max_shard_bytes = max_shard_bytes
        self._max_shard_records = max_shard_records
        self._writer: Writer | None = None
        self._failure: str | None = None
        self._closed = False
        self._committing_version: int | None = None
        self._manifest_size_bound = len(
            checked_manifest_bytes(Manifest(self._codec.name, self._codec.params(), self._metadata), path=self.path)
        )
        try:
            make_directories(self._directory)
        except OSError as error:
            raise storage_error(error, "preparing the dataset directory") from None
        self._lock = self._target.lock()
        try:
            started = self._target.start_run(self._codec, overwrite=overwrite, resume=resume)
            self._previous = started.previous
            self._live_names = started.live_names
            self._overwrite = started.overwrite
            self._run = started.run
            self._journal: Journal | None = started.journal
            self._entries: list[ShardEntry] = started.adopted
            self._adopted = len(started.adopted)
            self._manifest_size_bound += sum(shard_entry_size_bound(entry.name) for entry in started.adopted)
            self._record_count = started.record_count
            self._next_number = started.next_number
        except BaseException as error:
            self._lock.release()
            if isinstance(error, OSError) and not isinstance(error, VarstoreError):
                raise storage_error(error, "starting the dataset writer") from None
            raise

    def _make_target(self, directory: Any, storage_options: dict[str, Any] | None) -> LocalTarget | RemoteTarget:
        """Where the shards are written and the commit points act: a URL's objects, else a local directory (a
        ``file://`` URL's too: there fsspec would write the manifest in place, not atomically)."""
        directory = resolve_file_url(directory)
        if is_url(directory):
            return RemoteTarget(directory, storage_options)
        return LocalTarget(directory, storage_options)

    def __len__(self) -> int:
        return self._record_count

    @property
    def shard_names(self) -> list[str]:
        """Names of the shards committed so far."""
        return [entry.name for entry in self._entries]

    def _check_writable(self, action: str) -> None:
        if self._failure is not None:
            raise VarstoreError(f"{action} refused: {self._failure}", path=self.path)
        if self._closed:
            raise ClosedError(f"{action} on a closed writer", path=self.path)

    def append(self, record: Any) -> int:
        """Add one record; returns its index in the whole dataset."""
        if self._failure is not None or self._closed:
            self._check_writable("append")
        try:
            payload = self._codec.encode(record)
        except RecordTypeError as error:
            raise refused_record(error, self._record_count, self.path) from None
        return self._append_payload(payload)

    def _append_payload(self, payload: bytes | bytearray | memoryview) -> int:
        """Add one record given as its payload, encoded by this writer's codec already (nothing checks it decodes);
        one too large to buffer is written as it is, not copied (`convert` reads a folder's file into its record)."""
        if self._failure is not None or self._closed:
            self._check_writable("append")
        size = len(payload)
        writer = self._writer
        # The shard in progress takes the record unless a limit says otherwise (_writer_for decides then).
        if writer is None or writer._data_size + size > self._max_shard_bytes or (
            self._max_shard_records is not None and writer._record_count >= self._max_shard_records
        ):
            writer = self._writer_for(size)
        try:
            writer._add_payload(payload, size)
        except StorageError as error:
            raise self._fail(writer, error) from None
        self._record_count += 1
        return self._record_count - 1

    def extend(self, records: Iterable[Any]) -> None:
        """Append every record of an iterable, as `append` would one by one, but a chunk at a time (`extend_in_chunks`)."""
        extend_in_chunks(records, self._codec, self.append, self._add_payloads)

    def _add_payloads(self, payloads: list[bytes]) -> None:
        if self._failure is not None or self._closed:
            self._check_writable("extend")
        for writer, first, stop in self._shard_runs(np.cumsum(np.fromiter(map(len, payloads), np.int64, len(payloads)))):
            try:
                writer._add_payloads(payloads[first:stop])
            except StorageError as error:
                raise self._fail(writer, error) from None
            self._record_count += stop - first

    def extend_flat(self, values: Any, lengths: Any) -> None:
        """Append many records given as one flat buffer and their lengths, as `Writer.extend_flat` does, starting new shards as needed."""
        self._check_writable("extend_flat")
        payload, ends = flat_payloads(self._codec, values, lengths, self._record_count, self.path)
        for writer, first, stop in self._shard_runs(ends):
            start = int(ends[first - 1]) if first else 0
            try:
                writer._add_flat(payload[start : int(ends[stop - 1])], ends[first:stop] - start)
            except StorageError as error:
                raise self._fail(writer, error) from None
            self._record_count += stop - first

    def _shard_runs(self, ends: np.ndarray) -> Iterator[tuple[Writer, int, int]]:
        """Records ending at byte `ends[k]` split into runs [first, stop), each going whole to the shard yielded with
        it under the limits; shards roll over between runs (`_writer_for`), and a record never splits."""
        first, start = 0, 0
        while first < len(ends):
            # _writer_for rolls over if record `first` does not fit; then every record up to the limits goes in one run.
            writer = self._writer_for(int(ends[first]) - start)
            stop = int(np.searchsorted(ends, start + self._max_shard_bytes - writer.data_size, side="right"))
            if self._max_shard_records is not None:
                stop = min(stop, first + self._max_shard_records - len(writer))
            stop = max(stop, first + 1)
            yield writer, first, stop
            first, start = stop, int(ends[stop - 1])

    def _writer_for(self, size: int) -> Writer:
        writer = self._writer
        finished = None
        if writer is not None and len(writer) and (
            writer.data_size + size > self._max_shard_bytes
            or (self._max_shard_records is not None and len(writer) >= self._max_shard_records)
        ):
            finished = self._finish_shard()
            writer = None
        if writer is None:
            try:
                name = self._new_shard_name()
            except (OSError, VarstoreError) as error:
                raise self._fail("the next shard", error) from None
            self._refuse_if_no_manifest_room(name, finished)
            try:
                # The name is journaled only once its Writer holds its lock and found it free: a resume then
                # never adopts a shard another writer took between our probe and our lock.
                writer = Writer(os.path.join(self._directory, name), **self._writer_options)
                assert self._journal is not None
                self._journal.record(finished, name)
            except BaseException as error:  # an interrupt too: the shard begun is abandoned with its lock
                if writer is not None:
                    writer.abort()
                if not isinstance(error, (OSError, VarstoreError)):
                    raise
                raise self._fail(f"shard {name}", error) from None
            self._writer = writer
            self._manifest_size_bound += shard_entry_size_bound(name)
        return writer

    def _refuse_if_no_manifest_room(self, name: str, finished: ShardEntry | None) -> None:
        """Refuse to begin shard `name` if the manifest might then exceed its limit; the writer stays closable."""
        if self._manifest_size_bound + shard_entry_size_bound(name) <= manifest_rules.MAX_MANIFEST_SIZE:
            return
        if finished is not None:
            self._record_committed(finished)
        raise FormatError(
            f"cannot start shard {name}: the manifest would exceed its limit of {manifest_rules.MAX_MANIFEST_SIZE} "
            f"bytes with {len(self._entries) + 1} shards. The writer accepts no more records; close() commits the "
            f"{self._record_count} records it holds. Write larger shards (max_shard_bytes, max_shard_records) "
            "to store more",
            path=self.path,
        )

    def _record_committed(self, entry: ShardEntry) -> None:
        """Journal that `entry` was committed (when no next shard is begun with it)."""
        assert self._journal is not None
        try:
            self._journal.record(entry, None)
        except OSError as error:
            raise self._fail(f"shard {entry.name}", error) from None

    def _new_shard_name(self) -> str:
        """The next number after every name the live manifest and this run used, skipping names taken on disk
        (by files, or by a live writer's lock; a killed writer's lock file is no claim)."""
        while True:
            name = numbered_shard_name(self._next_number, self.path)
            self._next_number += 1
            prefix = os.path.join(self._directory, name)
            taken = any(map(os.path.lexists, fmt.shard_paths(prefix))) or is_locked(shard_lock_path(prefix))
            if name not in self._live_names and not taken:
                return name

    def _finish_shard(self) -> ShardEntry:
        assert self._writer is not None
        writer, self._writer = self._writer, None
        try:
            writer.close()
            entry, _, _ = describe_shard(self._directory, os.path.basename(writer.path))
        except (OSError, VarstoreError) as error:
            raise self._fail(writer, error) from None
        try:
            self._target.publish_shard(entry)
        except (OSError, VarstoreError) as error:
            raise self._fail(f"publishing shard {entry.name}", error) from None
        self._entries.append(entry)
        return entry

    def _fail(self, failed: Writer | str, error: BaseException) -> VarstoreError:
        """Enter the failed state after a shard (its `Writer`, or a description such as "shard NAME")
        or the manifest commit failed; returns the error to raise."""
        if isinstance(failed, Writer):
            failed.abort()
            failed = f"shard {os.path.basename(failed.path)}"
        safe = sum(entry.records for entry in self._entries)
        where = f"shards {self._entries[0].name} to {self._entries[-1].name}" if self._entries else "no shard"
        self._failure = (
            f"{failed} failed ({error}). The writer accepts no more records and writes no manifest; "
            f"{safe} records are safely committed in {where}. To continue, open "
            f"ShardedWriter({self.path!r}, resume=True, ...): its len() is the number of records stored, "
            "so continue your input from there"
        )
        if self._journal is not None:
            self._journal.close()
        self._lock.release()  # a failed writer changes nothing more: a resume may start at once
        return (type(error) if isinstance(error, VarstoreError) else StorageError)(self._failure, path=self.path)

    def close(self) -> None:
        """Commit the last shard, then the manifest: from this moment readers see the dataset."""
        if self._closed and self._failure is None:
            return
        self._check_writable("close")
        refuse_in_a_forked_child(self._pid, self.path)
        try:
            self._commit()
        except BaseException:
            # An interrupt (Ctrl-C) or an error: once the manifest is named the dataset stands and only the
            # cleanup after it is left to do; before that, the run is abandoned as `abort` does (a failed
            # writer keeps its shards for a resume).
            if not self._closed:
                self.abort()
            raise

    def _commit(self) -> None:
        if self._writer is not None:
            self._finish_shard()
        manifest = Manifest(self._codec.name, self._codec.params(), self._metadata, self._entries)
        try:
            raw = checked_manifest_bytes(manifest, path=os.path.join(self.path, MANIFEST_NAME))
            # From the moment the manifest is named, the dataset is committed, even if an interrupt lands before
            # commit_manifest_bytes returns: abort() recognises our manifest by this version and keeps its shards.
            self._committing_version = crc32c(raw)
            self._target.publish_manifest(raw, overwrite=self._overwrite)
        except (OSError, VarstoreError) as error:
            raise self._fail("the manifest commit", error) from None
        self._closed = True
        try:
            sync_directory(self._directory)
        finally:
            self._finish_committed_run()

    def _manifest_committed(self) -> bool:
        if self._committing_version is None:
            return False
        try:
            return self._target.manifest_committed(self._committing_version)
        except VarstoreError as error:
            # Unknown: neither clean up after a commit nor remove the run's shards; a resume finds out.
            self._failure = (
                f"whether the manifest commit went through could not be checked ({error}); the shards are left as "
                f"they are. Open ShardedWriter({self.path!r}, resume=True, ...) to continue if it did not"
            )
            return False

    def _finish_committed_run(self) -> None:
        """After the manifest commit: end the journal, remove the replaced version's shards, let go of the directory."""
        try:
            self._end_run()
            self._remove_replaced_shards()
        finally:
            self._lock.release()

    def abort(self) -> None:
        """Stop writing and let go of the directory.

        Normally the shard in progress and every shard this writer committed are
        removed (not those it resumed from), so the directory is as before. After
        a failure the committed shards are kept, so ``resume=True`` adopts them.
        The manifest is untouched either way. In a forked child (leaving a ``with``
        block on its way out, say) this does nothing: the files are the parent's.
        """
        if self._closed or self._pid != os.getpid():
            return
        self._closed = True
        if self._failure is None and self._manifest_committed():
            self._finish_committed_run()  # close() was interrupted after its commit point: the dataset stands
            return
        try:
            if self._writer is not None:
                self._writer.abort()
            if self._failure is None:
                self._abandon_run()
            elif self._journal is not None:
                self._journal.close()
        finally:
            self._lock.release()

    def _abandon_run(self) -> None:
        """For `abort` without a failure: remove the shards this writer committed; a run it resumed goes on
        existing as it was before this writer, anything else ends."""
        self._target.abandon(self.shard_names[self._adopted :])
        if self._adopted:
            self._journal.close()
            self._run.begun = self.shard_names[: self._adopted]
            Journal.start(self._directory, self._run).close()  # replaces the journal atomically
            self._journal = None
        else:
            self._end_run()
        for entry in self._entries[self._adopted :]:
            remove_quietly(list(fmt.shard_paths(os.path.join(self._directory, entry.name))))

    def _end_run(self) -> None:
        if self._journal is not None:
            self._journal.remove()
            self._journal = None
        self._target.end_run()

    def _remove_replaced_shards(self) -> None:
        if self._previous is not None:
            self._target.remove_shards([entry.name for entry in self._previous.shards])

    def __del__(self) -> None:
        """A writer dropped without close or abort lets go of its lock; its committed shards stay for a resume."""
        if getattr(self, "_journal", None) is not None:
            self._journal.close()
        if getattr(self, "_lock", None) is not None:
            self._lock.release()


def natural_order(name: str) -> tuple[Any, ...]:
    """Sort key comparing digit runs as numbers, so ``shard-999999`` comes before ``shard-1000000``."""
    parts = _DIGITS.split(name)
    return tuple(int(part) if position % 2 else part for position, part in enumerate(parts)) + (name,)


def write_manifest(
    directory: str | os.PathLike[str],
    shard_names: Sequence[str] | None = None,
    *,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> list[str]:
    """Make a dataset of shards already in `directory` (written by separate processes, say) without copying them.

    With no `shard_names`, every committed shard in the directory is listed, in
    natural name order: runs of digits compare as numbers, so ``shard-999999``
    precedes ``shard-1000000``. All shards must share one codec. Returns the names listed. An
    existing manifest is replaced only with ``overwrite=True``; the directory's
    writer lock is held throughout.
    """
    directory = resolve_file_url(directory)
    with lock_directory(directory):
        if shard_names is None:
            pattern = os.path.join(glob.escape(directory), "*" + fmt.INDEX_SUFFIX)
            index_names = (os.path.basename(path) for path in glob.glob(pattern))  # the mark may be in `directory`
            shard_names = sorted(
                (name[: -len(fmt.INDEX_SUFFIX)] for name in index_names if TEMP_MARK not in name), key=natural_order
            )
        entries, codec_id, codec_params = [], None, None
        for name in shard_names:
            if not is_valid_shard_name(name):
                raise FormatError(f"shard name {name!r} is not a plain file name", path=directory)
            entry, header, params = describe_shard(directory, name)
            Reader(os.path.join(directory, name)).close()  # every open check of §1.3, as a reader of the dataset makes
            if codec_id is None:
                codec_id, codec_params = header.codec_id, params
            elif (header.codec_id, params) != (codec_id, codec_params):
                raise FormatError(f"shard {name!r} has a different codec from the first shard", path=directory)
            entries.append(entry)
        codec = codec_from_stored(codec_id, codec_params, path=directory) if codec_id is not None else make_codec("bytes")
        if not overwrite and os.path.lexists(os.path.join(directory, MANIFEST_NAME)):
            raise ShardExistsError("a dataset already exists here; pass overwrite=True to replace its manifest", path=directory)
        commit_manifest_file(directory, Manifest(codec.name, codec.params(), dict(metadata or {}), entries), overwrite=overwrite)
        sync_directory(directory)
    return [entry.name for entry in entries]
