"""`RemoteTarget`: a `ShardedWriter`'s dataset at a URL (``s3://bucket/prefix``, ``memory://x``, any fsspec URL).
``varstore.ShardedWriter(url, ..., storage_options=...)`` writes through one.

Shards are written by the local writer in a staging directory on this node,
``default_cache_dir()/staging/<hash of the URL>``; each shard, once committed there, is uploaded (its data
object, then its index object, so an index object means a whole data object) to ``URL/NAME.data`` and
``URL/NAME.index``, and its staged copy deleted, so local disk holds at most the shard being written. The
manifest is uploaded last, to ``URL/manifest.json``: a reader never finds a manifest naming an object that
is not whole, and a killed writer leaves no manifest (or the previous one, untouched).

State that must outlive this node lives at the URL, so that ``resume=True`` works from any machine (the
staging directory is scratch, emptied whenever a writer starts): the shard objects themselves, and the
writer journal object ``URL/.varstore-journal`` (the format of `varstore.local.journal`), uploaded once when the
run begins: the run's codec, which manifest it replaces (CRC32C of its bytes) and the run's first shard
name. Its shards are then the shard objects at the URL numbered from that name and not in the live
manifest, found with one listing: the journal stays a few hundred bytes and costs one PUT per run, not
one per shard. A resume adopts them in order after checking each one's objects (both present, the index
header's data size equal to the data object's size, the codec this writer's); only the last may lack its
index (the upload a kill cut short), and its objects are deleted; each adopted shard's manifest entry is
computed from its index object (one GET each). Readers ignore the journal (no manifest names it); the
manifest commit deletes it.

What a kill leaves, at each point: before the journal upload, nothing (or the previous dataset); during
a shard's upload, the journal, the shards before it whole and perhaps its data object, the previous
manifest live; between the manifest upload and the clean-up, the new dataset committed with the journal and the
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

from ..errors import ConcurrentWriterError, FormatError, MissingFileError, ShardExistsError, StorageError, VarstoreError
from ..format import header as fmt
from ..format.checksum import crc32c
from ..format.codecs import Codec, codec_from_stored
from ..format.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_SIZE,
    Manifest,
    ShardEntry,
    damaged_manifest_refusal,
    decode_manifest,
)
from ..format.metadata import decode_metadata
from ..local.journal import JOURNAL_NAME, Journal, Run, journal_path, max_journal_size, new_run, read_journal
from ..local.locks import DIRECTORY_LOCK_NAME, WriterLock, lock_directory
from ..local.publish import remove_quietly
from ..remote.cache import default_cache_dir
from ..remote.filesystems import open_filesystem, read_object, upload_file, upload_manifest_bytes, with_retries
from .run_start import (
    StartedRun,
    check_resumable,
    number_after,
    numbered_shard_name,
    refuse_unless_overwrite,
    shard_number,
)

# Inside the staging directory: where the journal object is built before upload and read after download.
_JOURNAL_STAGING = "remote-journal"


def staging_directory(url: str, storage_options: dict[str, Any] | None) -> str:
    """The node-local staging directory of the dataset at `url`: one per URL (and S3 endpoint) per user."""
    endpoint = (storage_options or {}).get("endpoint_url") or ""
    key = hashlib.sha256(f"{url}\0{endpoint}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return os.path.join(default_cache_dir(), "staging", key)


class RemoteTarget:
    """The dataset at `url`: shards are written in `directory`, this node's staging directory for it, and
    uploaded at the writer's commit points (module docstring). `path` is the URL; errors name it (or the object
    concerned)."""

    def __init__(self, url: Any, storage_options: dict[str, Any] | None) -> None:
        self._uploading: str | None = None  # the shard whose upload began last
        self.path = str(url).rstrip("/")
        self._fs, self._root = open_filesystem(self.path, storage_options)
        self._root = self._root.rstrip("/")
        self.directory = staging_directory(self.path, storage_options)

    def lock(self) -> WriterLock:
        """The staging directory's lock: one writer of a URL per machine (object stores have no lock)."""
        try:
            return lock_directory(self.directory)
        except ConcurrentWriterError as error:
            raise ConcurrentWriterError(
                f"another writer on this machine is writing this dataset (it holds its staging directory's lock: {error})",
                path=self.path,
            ) from None

    def _object(self, name: str) -> str:
        return f"{self._root}/{name}"

    def _url(self, name: str) -> str:
        return f"{self.path}/{name}"

    # Starting a run: the object store says what is live and what an interrupted run left.

    def start_run(self, codec: Codec, *, overwrite: bool, resume: bool) -> StartedRun:
        """Begin the run: what the object store holds (the live manifest, the journal object, the shard objects)
        says whether it is new, an overwrite or a resume, and which shards a resume adopts."""
        self._codec = codec
        self._clear_staging()
        self._fs.invalidate_cache(self._root)  # fsspec's listing cache may predate the objects this run checks
        raw = self._read_object(MANIFEST_NAME)
        replaces = crc32c(raw) if raw is not None else None
        previous = self._live_manifest(raw, replacing=overwrite or resume)
        live_names = {entry.name for entry in previous.shards} if previous is not None else set()
        interrupted = self._read_journal()
        listed = self._listed_shards()
        # Names past every one the live manifest lists and every shard object here (a discarded upload's too).
        next_number = number_after(list(live_names) + list(listed))
        adopted: list[ShardEntry] = []
        if resume and (interrupted is not None or replaces is not None):
            adopted = self._resume(interrupted, replaces, self._run_shards(interrupted, listed, live_names), listed)
        else:
            self._start_new(interrupted, replaces, overwrite, next_number)
            if interrupted is not None:
                for name in self._run_shards(interrupted, listed, live_names):
                    self._delete_shard_objects(name)
        local_run = new_run(self._codec.name, self._codec.params(), None)
        local_run.begun = [entry.name for entry in adopted]
        local_run.committed = {entry.name: entry for entry in adopted}
        return StartedRun(
            previous=previous,
            live_names=live_names,
            adopted=adopted,
            record_count=sum(entry.records for entry in adopted),
            next_number=next_number,
            overwrite=replaces is not None,
            run=local_run,
            journal=Journal.start(self.directory, local_run),  # the staging directory's own, for the local writer
        )

    def _clear_staging(self) -> None:
        """Empty the staging directory but for its lock (held by this writer): what the object store holds is the truth."""
        for name in os.listdir(self.directory):
            if name == DIRECTORY_LOCK_NAME:
                continue
            path = os.path.join(self.directory, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        os.mkdir(os.path.join(self.directory, _JOURNAL_STAGING))

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
                raise damaged_manifest_refusal(error, self.path) from None
            return None

    def _start_new(self, interrupted: Run | None, replaces: int | None, overwrite: bool, first_number: int) -> None:
        """Begin a new run (a new dataset or an overwrite) whose shards are numbered from `first_number`."""
        refuse_unless_overwrite(interrupted, replaces, overwrite, self.path)
        self._remote_run = new_run(self._codec.name, self._codec.params(), replaces)
        self._remote_run.begun = [numbered_shard_name(first_number, self.path)]
        # The new journal replaces the old one before the caller deletes the old run's objects: a kill in
        # between leaves a run that can be resumed (with nothing adopted), its shards numbered past them.
        self._upload_journal()

    def _resume(
        self, interrupted: Run | None, replaces: int | None, names: list[str], listed: dict[str, dict[str, int]]
    ) -> list[ShardEntry]:
        """Continue the run the journal object describes, adopting its shards `names` whose objects are whole."""
        if interrupted is None:
            raise ShardExistsError(
                "nothing to resume: resume=True continues only a writer that did not upload its manifest, and here a "
                "dataset is committed with no writer journal; open without resume=True (overwrite=True replaces it)",
                path=self.path,
            )
        check_resumable(interrupted, self._codec, replaces, self.path, commit="upload")
        self._remote_run = interrupted  # its journal object stands as it is: the run's shards are found by listing
        adopted: list[ShardEntry] = []
        for position, name in enumerate(names):
            entry, problem = self._uploaded_shard(name, listed[name])
            if entry is not None:
                adopted.append(entry)
                continue
            if position < len(names) - 1:
                raise FormatError(
                    f"cannot resume: shard {name}, uploaded before others of the interrupted run, {problem}. "
                    "Write the dataset again with overwrite=True",
                    path=self.path,
                )
            self._delete_shard_objects(name)  # the upload a kill cut short
        return adopted

    def _uploaded_shard(self, name: str, sizes: dict[str, int]) -> tuple[ShardEntry | None, str]:
        """The manifest entry of uploaded shard `name` (its objects' listed `sizes` by suffix), computed from its
        index object; or None and what is wrong with it."""
        if fmt.DATA_SUFFIX not in sizes or fmt.INDEX_SUFFIX not in sizes:
            return None, "lacks its data or index object"
        url = self._url(name + fmt.INDEX_SUFFIX)
        index = with_retries(lambda: self._fs.cat_file(self._object(name + fmt.INDEX_SUFFIX)), what="reading an uploaded index", url=url)
        try:
            header = fmt.unpack_header(index[: fmt.HEADER_SIZE], index_size=len(index), path=url)
            params, _ = decode_metadata(index[fmt.HEADER_SIZE : fmt.HEADER_SIZE + header.metadata_size], path=url)
            codec = codec_from_stored(header.codec_id, params, path=url)
        except FormatError as error:
            return None, f"has a damaged index ({error})"
        if header.data_size != sizes[fmt.DATA_SUFFIX]:
            return None, f"has a data object of {sizes[fmt.DATA_SUFFIX]} bytes, its index expects {header.data_size}"
        if (codec.name, codec.params()) != (self._codec.name, self._codec.params()):
            return None, f"stores codec {codec.name} {codec.params()}, this writer was given {self._codec.name} {self._codec.params()}"
        return ShardEntry(name, header.record_count, header.data_size, len(index), crc32c(index), header.data_crc32c), ""

    def _listed_shards(self) -> dict[str, dict[str, int]]:
        """The shard objects at the URL: for each ``shard-NNNNNN`` name, its objects' sizes by suffix (one listing)."""
        try:
            infos = with_retries(lambda: self._fs.ls(self._root, detail=True), what="listing the dataset", url=self.path)
        except MissingFileError:
            return {}
        listed: dict[str, dict[str, int]] = {}
        for info in infos:
            object_name = os.path.basename(str(info["name"]).rstrip("/"))
            for suffix in (fmt.DATA_SUFFIX, fmt.INDEX_SUFFIX):
                name = object_name[: -len(suffix)]
                if object_name.endswith(suffix) and shard_number(name) is not None:
                    listed.setdefault(name, {})[suffix] = int(info["size"])
        return listed

    @staticmethod
    def _run_shards(run: Run | None, listed: dict[str, dict[str, int]], live_names: set[str]) -> list[str]:
        """The shards of `run` among the objects `listed`: those numbered from its first shard that the live
        manifest does not list, in order."""
        if run is None or not run.begun or shard_number(run.begun[0]) is None:
            return []
        first = shard_number(run.begun[0])
        return sorted((name for name in listed if name not in live_names and shard_number(name) >= first), key=shard_number)

    # The commit points.

    def publish_shard(self, entry: ShardEntry) -> None:
        """Upload the shard's data then its index object, and delete the staged copy. An object already under
        its name is another writer's (this run's names come after every object listed at its start): refused,
        rather than replacing a shard that writer may have committed."""
        data_name = entry.name + fmt.DATA_SUFFIX
        self._fs.invalidate_cache(self._object(data_name))
        if with_retries(lambda: self._fs.exists(self._object(data_name)), what="looking for the shard", url=self._url(data_name)):
            raise ConcurrentWriterError(
                "another writer uploaded a shard under this name since this writer started: two writers are writing "
                "this dataset (with different staging directories, or on different machines); this one stops",
                path=self._url(data_name),
            )
        self._uploading = entry.name
        staged = fmt.shard_paths(os.path.join(self.directory, entry.name))
        for local in staged:  # data first: an index object is only ever beside a whole data object
            name = os.path.basename(local)
            upload_file(local, self._fs, self._object(name), url=self._url(name))
        remove_quietly(list(staged))

    def publish_manifest(self, raw: bytes, *, overwrite: bool) -> None:
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
        try:
            upload_manifest_bytes(self._fs, path, raw, url=url, create_only=replaces is None)
        except ShardExistsError:
            raise ShardExistsError(
                "a dataset was committed here meanwhile (by another writer); pass overwrite=True to replace it", path=url
            ) from None

    def manifest_committed(self, version: int) -> bool:
        """Whether the manifest stored now is the one whose CRC32C is `version`; a `VarstoreError` if the store
        cannot say."""
        raw = self._read_object(MANIFEST_NAME)
        return raw is not None and crc32c(raw) == version

    # Ending a run.

    def end_run(self) -> None:
        """Delete the journal object and the staged manifest (the writer removes its local journal itself)."""
        self._delete_objects([JOURNAL_NAME])
        remove_quietly([os.path.join(self.directory, MANIFEST_NAME)])

    def remove_shards(self, names: list[str]) -> None:
        """Delete the objects of shards `names` (a replaced version's)."""
        for name in names:
            self._delete_shard_objects(name)

    def abandon(self, names: list[str]) -> None:
        """Delete the objects of the shards `names` this writer uploaded, and of the one it was uploading; a
        resumed run keeps its journal object, which then finds only the adopted shards."""
        dropped = list(names)
        if self._uploading is not None and self._uploading not in names:
            dropped.append(self._uploading)
        live = self._live_names_now()
        for name in dropped:
            if name not in live:  # another writer's committed shard under a name this one also used: never delete it
                self._delete_shard_objects(name)

    def _live_names_now(self) -> set[str]:
        """The shard names the manifest stored now lists (none if there is none or it cannot be read or decoded)."""
        try:
            manifest = self._live_manifest(self._read_object(MANIFEST_NAME), replacing=True)
        except VarstoreError:
            return set()
        return {entry.name for entry in manifest.shards} if manifest is not None else set()

    # Objects.

    def _read_object(self, name: str) -> bytes | None:
        """The bytes of the manifest or journal object `name` under the URL, or None if there is none: at most one
        byte more than either may be (`max_journal_size`), so that a huge object planted there is refused by its
        size check, not read whole into memory."""
        try:
            return read_object(self._fs, self._object(name), url=self._url(name), max_size=max_journal_size())
        except MissingFileError:
            return None

    def _read_journal(self) -> Run | None:
        raw = self._read_object(JOURNAL_NAME)
        if raw is None:
            return None
        staged = os.path.join(self.directory, _JOURNAL_STAGING)
        with open(journal_path(staged), "wb") as file:
            file.write(raw)
        return read_journal(staged)

    def _upload_journal(self) -> None:
        """Upload the journal of the remote run as it stands (built locally in the journal's own format)."""
        staged = os.path.join(self.directory, _JOURNAL_STAGING)
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
