"""`RemoteShardedWriter`: a `ShardedWriter` whose dataset lives at a URL (``s3://bucket/prefix``, ``memory://x``,
any fsspec URL). ``varstore.ShardedWriter(url, ..., storage_options=...)`` returns one.

Shards are written by the local writer in a staging directory on this node,
``default_cache_dir()/staging/<hash of the URL>``; each shard, once committed there, is uploaded (its data
object, then its index object, so an index object means a whole data object) to ``URL/NAME.data`` and
``URL/NAME.index``, and its staged copy deleted, so local disk holds at most the shard being written. The
manifest is uploaded last, to ``URL/manifest.json``: a reader never finds a manifest naming an object that
is not whole, and a killed writer leaves no manifest (or the previous one, untouched).

State that must outlive this node lives at the URL: the writer journal object ``URL/.varstore-journal``
(the format of `varstore.journal`), uploaded when the run begins and again before each shard's upload,
listing the run's shards with their manifest entries (sizes and checksums) and which manifest the run
replaces. It is what ``resume=True`` continues, from any machine: the staging directory is scratch,
emptied whenever a writer starts. A resume adopts the journal's shards after checking each one's objects
against its entry (data object size; index object size and CRC32C; the index header's record count and
data size); only the last one may be missing or partial (the upload a kill cut short), and its objects
are deleted. Readers ignore the journal (it is no shard name); the manifest commit deletes it.

What a kill leaves, at each point: before the first journal upload, nothing (or the previous dataset);
during a shard's upload, the journal naming that shard, the shards before it whole, the previous manifest
live; between the manifest upload and the clean-up, the new dataset committed with the journal and the
replaced version's objects left over (an ``overwrite=True`` writer later removes the journal; those
objects stay, unreferenced). With ``overwrite=True`` shard names continue past every name the live
manifest lists, so a reader of the old version finds its objects until the new manifest lands; then the
replaced shards' objects are deleted (a reader still on them gets `MissingFileError` or
`DatasetReplacedError`, never new records).

One writer per URL. On one machine the staging directory's lock refuses a second writer of the same URL
(`ConcurrentWriterError`). Object stores have no lock: writers on different machines must be kept apart
by the user. What the writer does check: a new dataset's manifest is uploaded with a create-only
conditional write (S3 ``If-None-Match: *``), so a dataset another writer committed meanwhile is never
replaced without ``overwrite=True``; an overwrite re-reads the live manifest just before its upload and
refuses if it changed since the start (a check, not an atomic compare-and-swap).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from typing import Any

from . import format as fmt
from .checksum import crc32c
from .errors import ConcurrentWriterError, FormatError, MissingFileError, ShardExistsError, StorageError, VarstoreError
from .journal import JOURNAL_NAME, Journal, Run, check_codec, journal_path, new_run, read_journal
from .locking import DIRECTORY_LOCK_NAME
from .manifest import MANIFEST_NAME, MAX_MANIFEST_SIZE, Manifest, ShardEntry, decode_manifest
from .remote.cache import default_cache_dir
from .remote.filesystems import open_filesystem, upload_file, with_retries
from .run_start import StartedRun, number_after
from .sharded_writer import ShardedWriter
from .storage import remove_quietly

# Inside the staging directory: where the journal object is built before upload and read after download.
_JOURNAL_STAGING = "remote-journal"


def staging_directory(url: str, storage_options: dict[str, Any] | None) -> str:
    """The node-local staging directory of the dataset at `url`: one per URL (and S3 endpoint) per user."""
    endpoint = (storage_options or {}).get("endpoint_url") or ""
    key = hashlib.sha256(f"{url}\0{endpoint}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return os.path.join(default_cache_dir(), "staging", key)


class RemoteShardedWriter(ShardedWriter):
    """`ShardedWriter` for a URL: the local writer in a staging directory, uploading at its commit points
    (module docstring). `path` is the URL; errors name it (or the object concerned)."""

    def __init__(self, url: str, *args: Any, **kwargs: Any) -> None:
        try:
            super().__init__(url, *args, **kwargs)
        except ConcurrentWriterError as error:
            raise ConcurrentWriterError(
                f"another writer on this machine is writing this dataset (it holds its staging directory's lock: {error})",
                path=self.path,
            ) from None

    def _locate(self, directory: Any, storage_options: dict[str, Any] | None) -> tuple[str, str]:
        url = str(directory).rstrip("/")
        self._fs, self._root = open_filesystem(url, storage_options)
        self._root = self._root.rstrip("/")
        return url, staging_directory(url, storage_options)

    def _object(self, name: str) -> str:
        return f"{self._root}/{name}"

    def _url(self, name: str) -> str:
        return f"{self.path}/{name}"

    # Starting a run: the object store says what is live and what an interrupted run left.

    def _start_run(self, overwrite: bool, resume: bool) -> StartedRun:
        self._clear_staging()
        self._fs.invalidate_cache(self._root)  # fsspec's listing cache may predate the objects this run checks
        raw = self._read_object(MANIFEST_NAME)
        replaces = crc32c(raw) if raw is not None else None
        previous = self._live_manifest(raw, replacing=overwrite or resume)
        live_names = {entry.name for entry in previous.shards} if previous is not None else set()
        interrupted = self._read_journal()
        # Names past every one the live manifest and the interrupted run used, a discarded upload's included: a
        # killed writer's request still in flight can then never land on a name this run writes.
        used = list(live_names) + (interrupted.begun if interrupted is not None else [])
        if resume and (interrupted is not None or replaces is not None):
            adopted = self._resume(interrupted, replaces)
        else:
            adopted = self._start_new(interrupted, replaces, overwrite, live_names)
        local_run = new_run(self._codec.name, self._codec.params(), None)
        local_run.begun = [entry.name for entry in adopted]
        local_run.committed = {entry.name: entry for entry in adopted}
        return StartedRun(
            previous=previous,
            live_names=live_names,
            adopted=adopted,
            record_count=sum(entry.records for entry in adopted),
            next_number=number_after(used),
            overwrite=replaces is not None,
            run=local_run,
            journal=Journal.start(self._directory, local_run),  # the staging directory's own, for the local writer
        )

    def _clear_staging(self) -> None:
        """Empty the staging directory but for its lock (held by this writer): what the object store holds is the truth."""
        for name in os.listdir(self._directory):
            if name == DIRECTORY_LOCK_NAME:
                continue
            path = os.path.join(self._directory, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        os.mkdir(os.path.join(self._directory, _JOURNAL_STAGING))

    def _live_manifest(self, raw: bytes | None, *, replacing: bool) -> Manifest | None:
        """The committed manifest, if any; a damaged one counts as a dataset whose shards are unknown."""
        if raw is None:
            return None
        try:
            if len(raw) > MAX_MANIFEST_SIZE:
                raise FormatError(f"manifest is {len(raw)} bytes, over the limit of {MAX_MANIFEST_SIZE}", path=self._url(MANIFEST_NAME))
            return decode_manifest(raw, path=self._url(MANIFEST_NAME))
        except FormatError as error:
            if not replacing:
                raise ShardExistsError(
                    f"a dataset already exists here (its manifest is damaged: {error}); pass overwrite=True to replace it",
                    path=self.path,
                ) from None
            return None

    def _start_new(self, interrupted: Run | None, replaces: int | None, overwrite: bool, live_names: set[str]) -> list[ShardEntry]:
        """Begin a new run (a new dataset or an overwrite); an interrupted run's objects are deleted."""
        if replaces is not None and not overwrite:
            raise ShardExistsError("a dataset already exists here; pass overwrite=True to replace it", path=self.path)
        if interrupted is not None and not overwrite:
            raise ShardExistsError(
                "an interrupted writer left shards here: pass resume=True to continue it, or overwrite=True to start again",
                path=self.path,
            )
        self._remote_run = new_run(self._codec.name, self._codec.params(), replaces)
        # The new journal replaces the old one before the old run's objects go: a kill in between leaves a
        # run that can be resumed (with nothing adopted) rather than a journal naming deleted objects.
        self._upload_journal()
        if interrupted is not None:
            for name in interrupted.begun:
                if name not in live_names:
                    self._delete_shard_objects(name)
        return []

    def _resume(self, interrupted: Run | None, replaces: int | None) -> list[ShardEntry]:
        """Continue the run the journal object describes, adopting the shards whose objects are whole."""
        if interrupted is None:
            raise ShardExistsError(
                "nothing to resume: resume=True continues only a writer that did not upload its manifest, and here a "
                "dataset is committed with no writer journal; open without resume=True (overwrite=True replaces it)",
                path=self.path,
            )
        check_codec(interrupted, self._codec.name, self._codec.params(), self.path)
        if interrupted.replaces != replaces:
            raise ShardExistsError(
                "a dataset is already committed here: resume=True continues only a writer that did not upload its manifest"
                if replaces is not None else "cannot resume: the manifest the interrupted run was replacing is gone",
                path=self.path,
            )
        adopted = self._adopt_uploaded_shards(interrupted)
        interrupted.begun = [entry.name for entry in adopted]
        interrupted.committed = {entry.name: entry for entry in adopted}
        self._remote_run = interrupted
        self._upload_journal()
        return adopted

    def _adopt_uploaded_shards(self, run: Run) -> list[ShardEntry]:
        """The run's shards in order whose objects match their journal entries; the last one's upload may have
        been cut short (its objects are deleted), an earlier one must be whole."""
        names = [name for name in run.begun if name in run.committed]
        adopted: list[ShardEntry] = []
        for position, name in enumerate(names):
            problem = self._uploaded_shard_problem(run.committed[name])
            if problem is None:
                adopted.append(run.committed[name])
                continue
            if position < len(names) - 1:
                raise FormatError(
                    f"cannot resume: shard {name}, which the writer journal says was uploaded before others, {problem}. "
                    "Write the dataset again with overwrite=True",
                    path=self.path,
                )
            self._delete_shard_objects(name)
        return adopted

    def _uploaded_shard_problem(self, entry: ShardEntry) -> str | None:
        """What is wrong with shard `entry`'s objects (None if they match it): data object size, index object size,
        CRC32C and header."""
        data_name, index_name = (os.path.basename(path) for path in fmt.shard_paths(entry.name))
        try:
            data_size = with_retries(lambda: self._fs.size(self._object(data_name)), what="checking an uploaded shard",
                                     url=self._url(data_name))
            index = with_retries(lambda: self._fs.cat_file(self._object(index_name)), what="checking an uploaded shard",
                                 url=self._url(index_name))
        except MissingFileError as error:
            return f"is missing an object ({error})"
        if data_size != entry.data_size:
            return f"has a data object of {data_size} bytes, not {entry.data_size}"
        if len(index) != entry.index_size or crc32c(index) != entry.index_crc32c:
            return f"has an index object of {len(index)} bytes that is not the one committed ({entry.index_size} bytes)"
        try:
            header = fmt.unpack_header(index[: fmt.HEADER_SIZE], index_size=len(index), path=self._url(index_name))
        except FormatError as error:
            return f"has a damaged index ({error})"
        if (header.record_count, header.data_size) != (entry.records, entry.data_size):
            return "has an index header that disagrees with the writer journal"
        return None

    # The commit points.

    def _publish_shard(self, entry: ShardEntry) -> None:
        """Journal the shard, upload its data then its index object, and delete the staged copy."""
        self._remote_run.begun.append(entry.name)
        self._remote_run.committed[entry.name] = entry
        self._upload_journal()
        staged = fmt.shard_paths(os.path.join(self._directory, entry.name))
        for local in staged:  # data first: an index object is only ever beside a whole data object
            name = os.path.basename(local)
            upload_file(local, self._fs, self._object(name), url=self._url(name))
        remove_quietly(list(staged))

    def _publish_manifest(self, raw: bytes) -> None:
        """Upload the manifest, the commit point: create-only for a new dataset, after re-checking the live one
        for an overwrite."""
        url, path = self._url(MANIFEST_NAME), self._object(MANIFEST_NAME)
        replaces = self._remote_run.replaces
        if replaces is not None:
            current = self._read_object(MANIFEST_NAME)
            if current is None or crc32c(current) != replaces:
                raise ShardExistsError(
                    "the dataset here changed since this writer started (another writer?); its manifest is left as it is",
                    path=url,
                )
        staged = os.path.join(self._directory, MANIFEST_NAME)
        with open(staged, "wb") as file:
            file.write(raw)

        def upload() -> None:
            try:
                self._fs.put_file(staged, path, mode="overwrite" if replaces is not None else "create")
            except FileExistsError:
                if self._fs.cat_file(path) != raw:  # not our own upload, answered after a lost response
                    raise ShardExistsError(
                        "a dataset was committed here meanwhile (by another writer); pass overwrite=True to replace it",
                        path=url,
                    ) from None

        with_retries(upload, what="uploading the manifest", url=url)

    def _manifest_committed(self) -> bool:
        if self._committing_version is None:
            return False
        try:
            raw = self._read_object(MANIFEST_NAME)
        except VarstoreError as error:
            # Unknown: neither clean up after a commit nor remove the run's shards; a resume finds out.
            self._failure = (
                f"whether the manifest upload committed could not be checked ({error}); the objects are left as they "
                f"are. Open ShardedWriter({self.path!r}, resume=True, ...) to continue if it did not"
            )
            return False
        return raw is not None and crc32c(raw) == self._committing_version

    # Ending a run.

    def _end_run(self) -> None:
        super()._end_run()
        self._delete_objects([JOURNAL_NAME])
        remove_quietly([os.path.join(self._directory, MANIFEST_NAME)])

    def _remove_replaced_shards(self) -> None:
        if self._previous is not None:
            for entry in self._previous.shards:
                self._delete_shard_objects(entry.name)

    def _abandon_run(self) -> None:
        super()._abandon_run()
        kept = self.shard_names[: self._adopted]
        dropped = [name for name in self._remote_run.begun if name not in kept]
        if self._adopted:
            self._remote_run.begun = kept
            self._remote_run.committed = {name: self._remote_run.committed[name] for name in kept}
            self._upload_journal()
        for name in dropped:
            self._delete_shard_objects(name)

    # Objects.

    def _read_object(self, name: str) -> bytes | None:
        """The bytes of object `name` under the URL, or None if there is none."""
        try:
            return with_retries(lambda: self._fs.cat_file(self._object(name)), what=f"reading {name}", url=self._url(name))
        except MissingFileError:
            return None

    def _read_journal(self) -> Run | None:
        raw = self._read_object(JOURNAL_NAME)
        if raw is None:
            return None
        staged = os.path.join(self._directory, _JOURNAL_STAGING)
        with open(journal_path(staged), "wb") as file:
            file.write(raw)
        return read_journal(staged)

    def _upload_journal(self) -> None:
        """Upload the journal of the remote run as it stands (built locally in the journal's own format)."""
        staged = os.path.join(self._directory, _JOURNAL_STAGING)
        Journal.start(staged, self._remote_run).close()
        upload_file(journal_path(staged), self._fs, self._object(JOURNAL_NAME), url=self._url(JOURNAL_NAME))

    def _delete_shard_objects(self, name: str) -> None:
        data, index = fmt.shard_paths(name)
        self._delete_objects([index, data])  # index first: an index object is never left without its data

    def _delete_objects(self, names: list[str]) -> None:
        """Delete objects that need not exist; a failure is a warning (what is left is unreferenced)."""
        for name in names:
            try:
                with_retries(lambda: self._fs.rm_file(self._object(name)), what="deleting an object", url=self._url(name))
            except MissingFileError:
                continue
            except StorageError as error:
                warnings.warn(f"{error}; the object is left behind, unreferenced", stacklevel=2)
