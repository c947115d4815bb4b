"""Datasets written by many tasks at once (Ray, Spark, worker processes) and committed by one driver.

Each task attempt writes its records with a `PartWriter`: shards named
``part-RUN-PART-ATTEMPT-NNNNNN`` (RUN from `new_run_id`, PART the task's position in the output, ATTEMPT its
retry number), placed directly in the destination (a local directory or a URL) and no manifest. `close`
returns the shards' manifest entries as plain JSON-able dicts, for the engine to send back to the driver.
The driver then calls `commit_parts` with the entries of one successful attempt per part, in part order:
it checks every listed shard against its entry, writes the manifest last (the commit point), and removes
every ``part-RUN-*`` file or object it does not list (failed or duplicate attempts); in a local directory with
``overwrite``, the part shards of every run it does not list (what earlier runs, killed before or during their
commit, left; not at a URL, where no lock keeps another run's commit from landing during that cleanup).
Until that manifest is written readers see nothing new, so a killed driver leaves no manifest (or the
previous one); `abandon_run` removes what a failed conversion wrote.

A shard is written as `ShardedWriter` writes one, in a staging directory of its own (inside the destination
for a local one, so publishing is a rename on one filesystem; in the node cache for a URL, see
`varstore.dataset.remote_target`), then published: hard-linked to its final name (never replacing a file), or for
a URL uploaded data object first, then index object.

Cleanup assumes the attempts of a run have ended when the driver commits or abandons it: an attempt still
writing then (a speculative duplicate, say) may leave ``part-RUN-*`` shards no manifest lists (in a local
directory, until the next commit there with ``overwrite``). Of two conversions into one local directory at
once, the first to commit wins: the other is refused at its commit, without ``overwrite`` because a dataset
exists, with it because the first commit removed its part shards (a missing shard). At a URL, without
``overwrite`` the second manifest upload is refused (a conditional write); with it the last one wins and the
shards of the replaced run stay, listed by none.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import secrets
import shutil
import warnings
from typing import Any, Sequence

from ..errors import FormatError, MissingFileError, ShardExistsError, StorageError, VarstoreError
from ..format import header as fmt
from ..format.codecs import Codec, codec_from_stored, make_codec
from ..format.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_SIZE,
    Manifest,
    ShardEntry,
    check_codec_params,
    check_header_against_entry,
    checked_manifest_bytes,
    decode_manifest,
)
from ..format.metadata import decode_metadata
from ..local.locks import lock_directory
from ..local.manifest_file import commit_manifest_file, describe_shard, read_manifest
from ..local.publish import TEMP_MARK, make_directories, publish, remove_quietly, sync_directory
from ..remote.filesystems import (
    is_url,
    list_sizes,
    open_filesystem,
    read_heads,
    read_object,
    read_range,
    upload_file,
    upload_manifest_bytes,
    with_retries,
)
from ..shard.reader import Reader
from .local_target import LocalTarget
from .remote_target import staging_directory
from .run_start import StartedRun, begin_run
from .writer import ShardedWriter

_RUN_ID = re.compile(r"[0-9a-f]{1,32}")
# The name of any run's attempt (`part_prefix`), and of a shard of one: what a commit may remove unlisted.
_ATTEMPT_NAME = re.compile(r"part-[0-9a-f]{1,32}-[0-9]{6,}-[0-9]+")
_PART_SHARD_NAME = re.compile(_ATTEMPT_NAME.pattern + r"-[0-9]{6,}")
_STAGING_SUFFIX = TEMP_MARK + "staging"
# Bytes of each index object fetched to check it at commit: its header and, nearly always, its metadata.
_INDEX_HEAD_BYTES = fmt.HEADER_SIZE + 4096


def new_run_id() -> str:
    """A random id for one conversion (12 hex digits), made once by the driver and given to every task."""
    return secrets.token_hex(6)


def _check_run_id(run_id: Any) -> None:
    """Refuse a run id that is not `new_run_id`'s kind: it is put in names, prefixes and a glob pattern."""
    if not isinstance(run_id, str) or _RUN_ID.fullmatch(run_id) is None:
        raise VarstoreError(f"run_id must be 1 to 32 lowercase hex digits (new_run_id()), not {run_id!r}")


def part_prefix(run_id: str, part: int, attempt: int) -> str:
    """The name every shard of attempt `attempt` of part `part` of run `run_id` starts with."""
    _check_run_id(run_id)
    for what, value in (("part", part), ("attempt", attempt)):
        if type(value) is not int or value < 0:
            raise VarstoreError(f"{what} must be a non-negative integer, not {value!r}")
    return f"part-{run_id}-{part:06d}-{attempt}"


class PartWriter(ShardedWriter):
    """The writer of one task attempt: shards ``part-RUN-PART-ATTEMPT-NNNNNN`` in `destination`, no manifest.

    `append`, `extend` and `extend_flat` behave as `ShardedWriter`'s (the same shard boundaries for the same
    limits). `close()` publishes the last shard and returns every shard's manifest entry as a dict, in order;
    `abort()` (or an exception in a ``with`` block) removes every shard this attempt wrote.
    """

    def __init__(
        self,
        destination: str | os.PathLike[str],
        *,
        run_id: str,
        part: int,
        attempt: int,
        codec: str = "bytes",
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        checksums: bool = True,
        max_shard_bytes: int = 256 << 20,
        max_shard_records: int | None = None,
        storage_options: dict[str, Any] | None = None,
        compression: str | None = None,
        compression_level: int = 3,
    ) -> None:
        self._prefix = part_prefix(run_id, part, attempt)
        self._returned = False  # close() handed the entries back: the shards are the driver's now
        super().__init__(
            destination, codec, dtype=dtype, shape=shape, checksums=checksums, max_shard_bytes=max_shard_bytes,
            max_shard_records=max_shard_records, storage_options=storage_options, compression=compression,
            compression_level=compression_level,
        )

    def _make_target(self, directory: Any, storage_options: dict[str, Any] | None) -> PartTarget:
        return PartTarget(directory, storage_options, self._prefix)

    def _new_shard_name(self) -> str:
        name = f"{self._prefix}-{self._next_number:06d}"
        self._next_number += 1
        return name

    def close(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Publish the last shard; returns every shard's manifest entry (plain dicts, in order) for `commit_parts`."""
        super().close()
        self._returned = True
        shutil.rmtree(self._directory, ignore_errors=True)
        return [dataclasses.asdict(entry) for entry in self._entries]

    def abort(self) -> None:
        """Remove every shard this attempt wrote, published or not, and its staging directory."""
        if self._returned or self._pid != os.getpid():
            return
        super().abort()
        _remove_shards(self.path, self._target.published, self._target.storage())
        self._target.published = []
        shutil.rmtree(self._directory, ignore_errors=True)


class PartTarget(LocalTarget):
    """A task attempt's target: shards written in a staging directory of its own (emptied: an attempt number is used
    once), each published to the destination as it commits, data first; no manifest (the driver commits one)."""

    def __init__(self, destination: Any, storage_options: dict[str, Any] | None, prefix: str) -> None:
        self.published: list[str] = []
        if is_url(destination):
            self.path = str(destination).rstrip("/")
            self._fs, self._root = open_filesystem(self.path, storage_options)
            self._root = self._root.rstrip("/")
            self._destination: str | None = None
            self.directory = f"{staging_directory(self.path, storage_options)}-{prefix}"
        else:
            super().__init__(destination, storage_options)
            self._destination = self.path
            self.directory = os.path.join(self.path, prefix + _STAGING_SUFFIX)
        shutil.rmtree(self.directory, ignore_errors=True)

    def start_run(self, codec: Codec, *, overwrite: bool, resume: bool) -> StartedRun:
        return begin_run(self.directory, codec, overwrite=False, resume=False)

    def publish_shard(self, entry: ShardEntry) -> None:
        """Move the committed shard from staging to the destination: data first, so an index means whole data."""
        staged = fmt.shard_paths(os.path.join(self.directory, entry.name))
        self.published.append(entry.name)
        if self._destination is not None:
            final = fmt.shard_paths(os.path.join(self._destination, entry.name))
            publish(list(zip(staged, final)), overwrite=False)
            return
        for local in staged:
            name = os.path.basename(local)
            upload_file(local, self._fs, f"{self._root}/{name}", url=f"{self.path}/{name}")
        remove_quietly(list(staged))

    def publish_manifest(self, raw: bytes, *, overwrite: bool) -> None:
        """Nothing: the driver's `commit_parts` writes the one manifest."""

    def storage(self) -> tuple[Any, str] | None:
        """The destination's (filesystem, root) for a URL, None for a local directory."""
        return None if self._destination is not None else (self._fs, self._root)


def commit_parts(
    destination: str | os.PathLike[str],
    parts: Sequence[Sequence[dict[str, Any]]],
    *,
    run_id: str,
    codec: str = "bytes",
    dtype: Any = None,
    shape: Sequence[int] | None = None,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Commit the dataset at `destination` made of the shards `parts` lists: ``parts[k]`` holds the entries
    `PartWriter.close` returned for the successful attempt of part k. Returns the shard names, in order.

    Every listed shard must belong to run `run_id` and part k, and its files or objects must match its entry
    (sizes, index header, codec), else `FormatError` and no manifest. An existing dataset is replaced only
    with `overwrite` (`ShardExistsError`). The manifest is written last; then every ``part-RUN-*`` file or
    object not listed is removed, and with `overwrite` the replaced dataset's shards and, in a local directory
    (whose lock the commit holds), every other run's unlisted part shards (what killed conversions left, under
    run ids nobody knows any more).
    """
    _check_run_id(run_id)
    stored = make_codec(codec, dtype=dtype, shape=shape)
    entries = [_listed_entry(item, run_id, part) for part, items in enumerate(parts) for item in items]
    manifest = Manifest(stored.name, stored.params(), dict(metadata or {}), entries)
    if is_url(destination):
        url = str(destination).rstrip("/")
        fs, root = open_filesystem(url, storage_options)
        root = root.rstrip("/")
        raw = checked_manifest_bytes(manifest, path=f"{url}/{MANIFEST_NAME}")
        previous = _remote_manifest(fs, root, url, overwrite)
        _check_remote_shards(fs, root, url, entries, stored)
        upload_manifest_bytes(fs, f"{root}/{MANIFEST_NAME}", raw, url=f"{url}/{MANIFEST_NAME}", create_only=not overwrite)
        _remove_leftovers(url, run_id, entries, previous, (fs, root))
        _remove_node_staging(url, run_id, storage_options)
        return [entry.name for entry in entries]
    if storage_options is not None:
        raise VarstoreError("storage_options apply to URLs only, and this is a local path", path=os.fspath(destination))
    directory = os.path.abspath(os.fspath(destination))
    make_directories(directory)  # no task ran for an empty input: nothing has created it
    with lock_directory(directory):
        checked_manifest_bytes(manifest, path=os.path.join(directory, MANIFEST_NAME))
        previous = _local_manifest(directory, overwrite)
        for entry in entries:
            _check_local_shard(directory, entry, stored)
        commit_manifest_file(directory, manifest, overwrite=overwrite)
        sync_directory(directory)
        _remove_leftovers(directory, run_id, entries, previous, None, every_run=overwrite)
    return [entry.name for entry in entries]


def refuse_existing_dataset(destination: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
    """`ShardExistsError` if a dataset is committed at `destination`: a driver without ``overwrite`` asks before any
    task runs, since `commit_parts` would refuse it only after all of their work."""
    if is_url(destination):
        url = str(destination).rstrip("/")
        fs, root = open_filesystem(url, storage_options)
        fs.invalidate_cache(root)  # fsspec's listing cache may predate the manifest
        manifest = f"{root.rstrip('/')}/{MANIFEST_NAME}"
        try:
            exists = with_retries(lambda: fs.exists(manifest), what="looking for a manifest", url=f"{url}/{MANIFEST_NAME}")
        except MissingFileError:
            exists = False
    else:
        exists = os.path.lexists(os.path.join(os.fspath(destination), MANIFEST_NAME))
    if exists:
        raise ShardExistsError("a dataset already exists here; pass overwrite=True to replace it", path=os.fspath(destination))


def abandon_run(destination: str | os.PathLike[str], run_id: str, storage_options: dict[str, Any] | None = None) -> None:
    """Remove every ``part-RUN-*`` file or object of run `run_id` at `destination` (the driver failed), but for
    those the live manifest lists: a commit that failed after its manifest was written stands."""
    _check_run_id(run_id)
    if is_url(destination):
        path = str(destination).rstrip("/")
        fs, root = open_filesystem(path, storage_options)
        root = root.rstrip("/")
        _remove_node_staging(path, run_id, storage_options)
        live = _remote_manifest(fs, root, path, replacing=True)
        _remove_leftovers(path, run_id, live.shards if live is not None else [], None, (fs, root))
        return
    path = os.path.abspath(os.fspath(destination))
    live = _local_manifest(path, replacing=True)
    _remove_leftovers(path, run_id, live.shards if live is not None else [], None, None)


def _remove_node_staging(url: str, run_id: str, storage_options: dict[str, Any] | None) -> None:
    """Remove this node's staging directories of run `run_id`'s attempts writing to `url` (a killed worker's)."""
    pattern = glob.escape(staging_directory(url, storage_options)) + f"-part-{run_id}-*"
    for staging in glob.glob(pattern):
        shutil.rmtree(staging, ignore_errors=True)


def _listed_entry(item: Any, run_id: str, part: int) -> ShardEntry:
    """A task's entry dict as a `ShardEntry`, refused unless it has exactly the entry's members and names a
    shard of part `part` of this run (a task cannot make the driver list another file)."""
    members = {entry_field.name for entry_field in dataclasses.fields(ShardEntry)}
    if not isinstance(item, dict) or set(item) != members:
        raise FormatError(f"part {part}: a shard entry must be a dict with the members {sorted(members)}, found {item!r}")
    name = item["name"]
    if not isinstance(name, str) or not name.startswith(f"part-{run_id}-{part:06d}-"):
        raise FormatError(f"part {part}: shard {name!r} is not a shard of run {run_id}, part {part}")
    return ShardEntry(**item)  # values are checked with the whole manifest (checked_manifest_bytes)


def _local_manifest(directory: str, replacing: bool) -> Manifest | None:
    """The dataset committed in `directory` (None if none, or damaged: its shards are then unknown), refused unless `replacing`."""
    if not os.path.lexists(os.path.join(directory, MANIFEST_NAME)):
        return None
    if not replacing:
        raise ShardExistsError("a dataset already exists here; pass overwrite=True to replace it", path=directory)
    try:
        return read_manifest(directory)
    except (FormatError, StorageError):
        return None


def _remote_manifest(fs: Any, root: str, url: str, replacing: bool) -> Manifest | None:
    """The dataset committed at `url` (None if none, or damaged), refused unless `replacing`."""
    manifest_url = f"{url}/{MANIFEST_NAME}"
    try:
        raw = read_object(fs, f"{root}/{MANIFEST_NAME}", url=manifest_url, max_size=MAX_MANIFEST_SIZE)
    except MissingFileError:
        return None
    if not replacing:
        raise ShardExistsError("a dataset already exists here; pass overwrite=True to replace it", path=url)
    try:
        return decode_manifest(raw, path=manifest_url)
    except FormatError:
        return None


def _check_local_shard(directory: str, entry: ShardEntry, codec: Codec) -> None:
    """Refuse a shard whose files are not those its entry describes, or that a reader would refuse at open."""
    found, header, params = describe_shard(directory, entry.name)
    index_path = os.path.join(directory, entry.name + fmt.INDEX_SUFFIX)
    if found != entry:
        raise FormatError(f"shard does not match the entry its task returned: found {found}, the entry says {entry}", path=index_path)
    check_header_against_entry(header, entry, codec, index_path)
    check_codec_params(codec_from_stored(header.codec_id, params, path=index_path), codec, index_path)
    Reader(os.path.join(directory, entry.name)).close()  # every open check of §1.3


def _check_remote_shards(fs: Any, root: str, url: str, entries: list[ShardEntry], codec: Codec) -> None:
    """Refuse a shard whose objects' sizes, index header or codec differ from its entry: one LIST, one GET per index."""
    sizes = list_sizes(fs, root, url=url) if entries else {}
    for entry in entries:
        for suffix, expected in ((fmt.DATA_SUFFIX, entry.data_size), (fmt.INDEX_SUFFIX, entry.index_size)):
            if sizes.get(entry.name + suffix) != expected:
                raise FormatError(
                    f"object is {sizes.get(entry.name + suffix, 'missing')} bytes, the entry its task returned says {expected}",
                    path=f"{url}/{entry.name}{suffix}",
                )
    heads = read_heads(fs, [(f"{root}/{entry.name}{fmt.INDEX_SUFFIX}", entry.index_size) for entry in entries], _INDEX_HEAD_BYTES, url=url)
    for entry, head in zip(entries, heads):
        index_url = f"{url}/{entry.name}{fmt.INDEX_SUFFIX}"
        header = fmt.unpack_header(head[: fmt.HEADER_SIZE], index_size=entry.index_size, path=index_url)
        check_header_against_entry(header, entry, codec, index_url)
        end = fmt.HEADER_SIZE + header.metadata_size
        if end > len(head):
            head = read_range(fs, f"{root}/{entry.name}{fmt.INDEX_SUFFIX}", 0, end, url=index_url, size=entry.index_size)
        params, _ = decode_metadata(head[fmt.HEADER_SIZE : end], path=index_url)
        check_codec_params(codec_from_stored(header.codec_id, params, path=index_url), codec, index_url)


def _remove_leftovers(
    path: str,
    run_id: str,
    listed: list[ShardEntry],
    previous: Manifest | None,
    storage: tuple[Any, str] | None,
    *,
    every_run: bool = False,
) -> None:
    """Remove the shards (and local staging directories) of run `run_id` not `listed` (of every run with
    `every_run`: a local overwrite commit, under the directory lock), and those of the replaced dataset
    `previous` not listed again."""
    keep = {entry.name for entry in listed}
    prefix = f"part-{run_id}-"

    def removable(name: str | None, pattern: re.Pattern[str]) -> bool:
        return name is not None and pattern.fullmatch(name) is not None and (every_run or name.startswith(prefix))

    if storage is None:
        try:
            names = os.listdir(path)
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(_STAGING_SUFFIX) and removable(name[: -len(_STAGING_SUFFIX)], _ATTEMPT_NAME):
                shutil.rmtree(os.path.join(path, name), ignore_errors=True)
    else:
        fs, root = storage
        try:
            names = list(list_sizes(fs, root, url=path))
        except MissingFileError:
            names = []
    shards = {shard for shard in map(_shard_name, names) if removable(shard, _PART_SHARD_NAME)}
    shards |= {entry.name for entry in previous.shards} if previous is not None else set()
    _remove_shards(path, sorted(shards - keep), storage)


def _shard_name(file_name: str) -> str | None:
    for suffix in (fmt.DATA_SUFFIX, fmt.INDEX_SUFFIX):
        if file_name.endswith(suffix):
            return file_name[: -len(suffix)]
    return None


def _remove_shards(path: str, names: Sequence[str], storage: tuple[Any, str] | None) -> None:
    """Remove shards by name, index first (an index is never left without its data); missing ones are fine."""
    for name in names:
        data, index = fmt.shard_paths(name)
        if storage is None:
            remove_quietly([os.path.join(path, index), os.path.join(path, data)])
            continue
        fs, root = storage
        for object_name in (index, data):
            try:
                with_retries(lambda: fs.rm_file(f"{root}/{object_name}"), what="deleting an object", url=f"{path}/{object_name}")
            except MissingFileError:
                continue
            except StorageError as error:  # what is left is listed by no manifest
                warnings.warn(f"{error}; the object is left behind, unreferenced", stacklevel=2)
