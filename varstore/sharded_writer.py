"""`ShardedWriter` and `write_manifest`: datasets of many shards, committed by writing the manifest last."""

from __future__ import annotations

import glob
import os
from typing import Any, Iterable, Sequence

import numpy as np

from . import format as fmt
from .codecs import codec_from_stored, make_codec
from .errors import (
    ClosedError,
    CorruptRecordError,
    FormatError,
    MissingFileError,
    RecordTypeError,
    ShardExistsError,
    VarstoreError,
)
from .manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardEntry,
    commit_manifest_file,
    describe_shard,
    is_valid_shard_name,
    read_manifest,
)
from .reader import Reader
from .storage import (
    TEMP_MARK,
    make_directories,
    remove_quietly,
    remove_temporary_files,
    storage_error,
    sync_directory,
)
from .writer import Writer, flat_payloads


class ShardedWriter:
    """Writes a dataset directory: shards named ``shard-000000``, ``shard-000001``, ... and ``manifest.json``.

    A new shard starts when the next record would take the current one past
    `max_shard_bytes` of payload, or past `max_shard_records` records. The
    dataset exists for readers only once `close` commits the manifest; an
    exception in a ``with`` block removes every shard this writer made.

    With ``overwrite=True`` the new shards take numbers the existing manifest
    does not list, so the old dataset stays whole until the new manifest
    replaces it. With ``resume=True`` the writer continues one that was
    interrupted before writing its manifest: it removes temporary files, adopts
    the committed shards ``shard-000000``, ``shard-000001``, ... after verifying
    them (a damaged last one is discarded) and starts with ``len(writer)`` equal
    to the records they hold, so the caller continues its input from there.
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
    ) -> None:
        self.path = os.fspath(directory)
        if max_shard_bytes < 1 or (max_shard_records is not None and max_shard_records < 1):
            raise VarstoreError("max_shard_bytes and max_shard_records must be positive")
        manifest_path = os.path.join(self.path, MANIFEST_NAME)
        self._previous = read_manifest(self.path) if os.path.exists(manifest_path) else None
        if self._previous is not None and resume:
            raise ShardExistsError(
                "a dataset is already committed here: resume=True continues only a writer that did not write its manifest",
                path=self.path,
            )
        if self._previous is not None and not overwrite:
            raise ShardExistsError("a dataset already exists here; pass overwrite=True to replace it", path=self.path)
        self._live_names = {entry.name for entry in self._previous.shards} if self._previous is not None else set()
        self._codec = make_codec(codec, dtype=dtype, shape=shape)
        self._writer_options = {"codec": codec, "dtype": dtype, "shape": shape, "metadata": metadata, "checksums": checksums}
        self._metadata = dict(metadata or {})
        self._max_shard_bytes = max_shard_bytes
        self._max_shard_records = max_shard_records
        self._overwrite = overwrite
        self._entries: list[ShardEntry] = []
        self._writer: Writer | None = None
        self._record_count = 0
        self._next_number = 0
        self._adopted = 0
        self._closed = False
        try:
            make_directories(self.path)
            if resume:
                remove_temporary_files(self.path)
        except OSError as error:
            raise storage_error(error, "preparing the dataset directory") from None
        if resume:
            self._adopt_committed_shards()

    def _adopt_committed_shards(self) -> None:
        names = []
        while any(os.path.exists(path) for path in fmt.shard_paths(os.path.join(self.path, f"shard-{len(names):06d}"))):
            names.append(f"shard-{len(names):06d}")
        for position, name in enumerate(names):
            try:
                entry = self._verified_shard(name)
            except (FormatError, CorruptRecordError, MissingFileError):
                if position < len(names) - 1:
                    raise
                # The interrupted writer's last shard: half published, or damaged.
                remove_quietly(list(fmt.shard_paths(os.path.join(self.path, name))))
                break
            self._entries.append(entry)
            self._record_count += entry.records
        self._adopted = self._next_number = len(self._entries)

    def _verified_shard(self, name: str) -> ShardEntry:
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
        return entry

    def __len__(self) -> int:
        return self._record_count

    @property
    def shard_names(self) -> list[str]:
        """Names of the shards committed so far."""
        return [entry.name for entry in self._entries]

    def append(self, record: Any) -> int:
        """Add one record; returns its index in the whole dataset."""
        if self._closed:
            raise ClosedError("append to a closed writer", path=self.path)
        payload = self._codec.encode(record)
        writer = self._writer_for(len(payload))
        writer._add_payload(payload, len(payload))
        self._record_count += 1
        return self._record_count - 1

    def extend(self, records: Iterable[Any]) -> None:
        for record in records:
            self.append(record)

    def extend_flat(self, values: Any, lengths: Any) -> None:
        """Append many records given as one flat buffer and their lengths, as `Writer.extend_flat` does, starting new shards as needed."""
        if self._closed:
            raise ClosedError("extend_flat on a closed writer", path=self.path)
        payload, ends = flat_payloads(self._codec, values, lengths)
        first, start = 0, 0
        while first < len(ends):
            # _writer_for rolls over if record `first` does not fit; then every record up to the limits goes in one call.
            writer = self._writer_for(int(ends[first]) - start)
            stop = int(np.searchsorted(ends, start + self._max_shard_bytes - writer.data_size, side="right"))
            if self._max_shard_records is not None:
                stop = min(stop, first + self._max_shard_records - len(writer))
            stop = max(stop, first + 1)
            end = int(ends[stop - 1])
            writer._add_flat(payload[start:end], ends[first:stop] - start)
            self._record_count += stop - first
            first, start = stop, end

    def _writer_for(self, size: int) -> Writer:
        writer = self._writer
        if writer is not None and len(writer) and (
            writer.data_size + size > self._max_shard_bytes
            or (self._max_shard_records is not None and len(writer) >= self._max_shard_records)
        ):
            self._finish_shard()
            writer = None
        if writer is None:
            writer = self._writer = Writer(
                os.path.join(self.path, self._new_shard_name()), overwrite=self._overwrite, **self._writer_options
            )
        return writer

    def _new_shard_name(self) -> str:
        while True:
            name = f"shard-{self._next_number:06d}"
            self._next_number += 1
            if name not in self._live_names:
                return name

    def _finish_shard(self) -> None:
        assert self._writer is not None
        writer, self._writer = self._writer, None
        writer.close()
        entry, _, _ = describe_shard(self.path, os.path.basename(writer.path))
        self._entries.append(entry)

    def close(self) -> None:
        """Commit the last shard, then the manifest: from this moment readers see the dataset."""
        if self._closed:
            return
        try:
            if self._writer is not None:
                self._finish_shard()
            manifest = Manifest(self._codec.name, self._codec.params(), self._metadata, self._entries)
            commit_manifest_file(self.path, manifest)
        except BaseException:
            self.abort()
            raise
        self._closed = True
        sync_directory(self.path)
        self._remove_replaced_shards()

    def abort(self) -> None:
        """Discard the shard in progress and every shard this writer committed (not those it resumed from); the manifest is untouched."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._writer.abort()
        for entry in self._entries[self._adopted :]:
            remove_quietly(list(fmt.shard_paths(os.path.join(self.path, entry.name))))

    def _remove_replaced_shards(self) -> None:
        if self._previous is None:
            return
        for entry in self._previous.shards:
            remove_quietly(list(fmt.shard_paths(os.path.join(self.path, entry.name))))

    def __enter__(self) -> "ShardedWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_manifest(
    directory: str | os.PathLike[str], shard_names: Sequence[str] | None = None, *, metadata: dict[str, Any] | None = None
) -> list[str]:
    """Make a dataset of shards already in `directory` (written by separate processes, say) without copying them.

    With no `shard_names`, every committed shard in the directory is listed, in
    name order. All shards must share one codec. Returns the names listed.
    """
    directory = os.fspath(directory)
    if shard_names is None:
        pattern = os.path.join(glob.escape(directory), "*" + fmt.INDEX_SUFFIX)
        shard_names = sorted(
            os.path.basename(path)[: -len(fmt.INDEX_SUFFIX)] for path in glob.glob(pattern) if TEMP_MARK not in path
        )
    entries, codec_id, codec_params = [], None, None
    for name in shard_names:
        if not is_valid_shard_name(name):
            raise FormatError(f"shard name {name!r} is not a plain file name", path=directory)
        entry, header, params = describe_shard(directory, name)
        if codec_id is None:
            codec_id, codec_params = header.codec_id, params
        elif (header.codec_id, params) != (codec_id, codec_params):
            raise FormatError(f"shard {name!r} has a different codec from the first shard", path=directory)
        entries.append(entry)
    codec = codec_from_stored(codec_id, codec_params, path=directory) if codec_id is not None else make_codec("bytes")
    commit_manifest_file(directory, Manifest(codec.name, codec.params(), dict(metadata or {}), entries))
    sync_directory(directory)
    return [entry.name for entry in entries]
