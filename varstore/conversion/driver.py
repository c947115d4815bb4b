"""`convert`: build a dataset from what ``varstore convert`` reads (.npy, token files, JSON Lines, text, folders,
Parquet), in this process or in several worker processes on this machine.

With ``workers=N`` the input is cut into at most N contiguous parts (consecutive files of a folder, byte ranges
cut at line or document boundaries, rows of an array, row groups of a Parquet file), each part is written by a
worker process as `varstore.dataset.parts.PartWriter` shards, and this process commits them in part order with
`commit_parts`. The dataset's records are the serial writer's, in the same order; shard boundaries differ
(each part starts a shard). Workers are started with ``forkserver`` and exchange plain values only: the paths
and options of the source and destination one way, the shards' manifest entries the other.

A worker that fails fails the conversion with its error: the other workers are stopped and every part shard
is removed (`abandon_run`). A killed driver leaves no manifest (or the dataset that was there before); the part
shards its workers wrote stay, named ``part-RUN-*``, until ``abandon_run`` or, in a local directory, the next
conversion into it with ``overwrite`` (at a URL they stay: remove ``part-RUN-*`` objects no manifest lists).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Sequence

from ..dataset.parts import PartWriter, abandon_run, commit_parts, new_run_id, refuse_existing_dataset
from ..dataset.writer import ShardedWriter
from ..errors import CommandError, UsageError, VarstoreError, listing
from ..format.compression import check_compression
from ..local.destination import check_destination, make_directories, removed_if_created_and_failed
from ..local.file_url import resolve_file_url
from ..progress import Counter, ProgressBar, reporting
from ..remote.filesystems import is_url
from .input_files import names_many_files
from .sources import FolderSource, Source, open_source, source_format


def convert(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    workers: int = 1,
    format: str | None = None,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
    max_shard_bytes: int = 256 << 20,
    max_shard_records: int | None = None,
    storage_options: dict[str, Any] | None = None,
    compression: str | None = None,
    compression_level: int = 3,
    **source_options: Any,
) -> int:
    """Convert the file or folder `source` into a dataset at `destination` (a directory or URL), as
    ``varstore convert`` does, with `workers` processes; returns the number of records written.

    `format` is told by the name when None (see ``varstore convert --help``); `source_options` are that
    command's source options by their Python names (``field="text"``, ``dtype="uint16", separator=50256``,
    ``labels=True``, ``codec="bytes"``, ``skip_null=True``, ``offsets="offsets.npy"``, ``max_record_bytes``, and for
    WebDataset and TFRecord sources ``decode=True``, ``compression_type="GZIP"`` and ``source_storage_options``,
    the filesystem options of a `source` URL, and for MDS and litdata folders ``allow_pickle=True``).
    `compression` and `compression_level` are `ShardedWriter`'s, applied to every shard. Every error is a
    `VarstoreError`.
    """
    try:
        return run_conversion(
            resolve_file_url(source), resolve_file_url(destination), format=format, source_options=source_options,
            workers=workers,
            metadata=metadata, overwrite=overwrite, max_shard_bytes=max_shard_bytes, max_shard_records=max_shard_records,
            storage_options=storage_options, allow_other_files=True, compression=compression,
            compression_level=compression_level,
        ).records
    except CommandError as error:
        raise VarstoreError(str(error)) from None


@dataclass(frozen=True)
class Conversion:
    """What a conversion wrote: `records`, and `skipped` samples left out (``skip_null``)."""

    records: int
    skipped: int


def run_conversion(
    source: str,
    destination: str,
    *,
    format: str | None,
    source_options: dict[str, Any],
    workers: int,
    metadata: dict[str, Any] | None,
    overwrite: bool,
    max_shard_bytes: int,
    max_shard_records: int | None,
    storage_options: dict[str, Any] | None,
    allow_other_files: bool,
    compression: str | None = None,
    compression_level: int = 3,
    progress: ProgressBar | None = None,
) -> Conversion:
    """`convert` in the command line's terms: refusals are `CommandError` (`UsageError` for arguments), and a dataset
    already at `destination` is a `ShardExistsError` without `overwrite`. A local `destination` holding files that
    are not a dataset's is refused unless `allow_other_files`, and it is removed again if this created it and fails."""
    check_compression(compression, compression_level)
    opened, kind = _opened_source(source, format, source_options, destination)
    writer_options = {"max_shard_bytes": max_shard_bytes, "max_shard_records": max_shard_records,
                      "storage_options": storage_options, "compression": compression,
                      "compression_level": compression_level}
    local = not is_url(destination)
    with removed_if_created_and_failed(destination) if local else nullcontext():
        if workers == 1 and type(workers) is int:  # True and 1.0 are refused with the other non-integers
            # The writer locks the destination for the whole run, and on an error removes every shard it wrote.
            with ShardedWriter(destination, **_codec_options(opened), metadata=dataset_metadata(opened, metadata),
                               overwrite=overwrite, **writer_options) as writer:
                if local:
                    check_destination(destination, command="convert", keeps_dataset=True, allow_other_files=allow_other_files)
                with reporting(progress, opened.total, opened.unit) as counter:
                    opened.write_to(writer, counter)
            return Conversion(len(writer), opened.skipped)
        if local:
            make_directories(destination)
            check_destination(destination, command="convert", keeps_dataset=True, allow_other_files=allow_other_files)
        with reporting(progress, opened.total, opened.unit) as counter:
            records, skipped = _write_in_parts(opened, source, kind, source_options, destination, workers, metadata,
                                               overwrite, writer_options, counter)
        return Conversion(records, skipped)


def _opened_source(path: str, format: str | None, options: dict[str, Any], destination: str) -> tuple[Source, str]:
    """The source at `path` with every option checked against its format, and its format; refused if `destination`
    lies in a folder it reads."""
    if not os.path.exists(path) and not names_many_files(path):  # a pattern's files are found by its source
        raise CommandError(f"{path}: no such file or folder")
    kind = source_format(path, format)
    if kind == "folder" and os.path.isdir(path):
        _check_destination_outside(destination, path, "the source folder")
    source = open_source(path, kind, options)
    if isinstance(source, FolderSource):
        for class_folder in source.class_folders:  # a linked one may lead anywhere, DST included
            _check_destination_outside(destination, class_folder, "the class folder")
    return source, kind


def _check_destination_outside(destination: str, folder: str, role: str) -> None:
    """Refuse to write DST into a folder convert reads, `role` (the source folder, or a class folder, which may be a
    link to anywhere): its own files (shards, journal, lock) would become records."""
    if is_url(destination):
        return
    real, target = os.path.realpath(folder), os.path.realpath(destination)
    if os.path.commonpath([real, target]) == real:
        where = "is" if real == target else "lies inside"
        linked = f" (a link to {real})" if os.path.islink(folder) else ""
        raise UsageError(f"DST {destination} {where} {role} {folder}{linked}; convert would read its own output: "
                         "write the dataset outside the folders it reads")


def dataset_metadata(source: Source, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The dataset's metadata: what the source writes itself (a folder's labels) and the user's `metadata`."""
    taken = sorted(set(source.metadata) & set(metadata or {}))
    if taken:
        raise UsageError(f"--metadata sets {listing(taken)}, which the source writes itself")
    return {**source.metadata, **(metadata or {})}


def _write_in_parts(source: Source, path: str, kind: str, source_options: dict[str, Any], destination: str,
                    workers: int, metadata: dict[str, Any] | None, overwrite: bool, writer_options: dict[str, Any],
                    progress: Counter) -> tuple[int, int]:
    """Write `source` (opened from `path`, `kind` and `source_options`) to `destination` in at most `workers`
    parts, one worker process each, and commit them in order; returns (records written, samples skipped).
    `writer_options` are the writers' shard limits and storage options."""
    if type(workers) is not int or workers < 1:
        raise UsageError(f"workers must be a positive integer, not {workers!r}")
    metadata = dataset_metadata(source, metadata)
    if not overwrite:
        refuse_existing_dataset(destination, writer_options["storage_options"])
    run_id = new_run_id()
    writer_options = {**_codec_options(source), **writer_options}
    tasks = [
        {"source": path, "format": kind, "options": source_options, "part": part, "position": position,
         "destination": destination, "run_id": run_id, "writer": writer_options}
        for position, part in enumerate(source.split(workers))
    ]
    try:
        results = _run_workers(tasks, progress)
        commit_parts(destination, [result["entries"] for result in results], run_id=run_id, metadata=metadata,
                     overwrite=overwrite, **{name: writer_options[name] for name in ("codec", "dtype", "shape", "storage_options")})
    except BaseException:
        abandon_run(destination, run_id, writer_options["storage_options"])
        raise
    source.skipped = sum(result["skipped"] for result in results)
    return sum(entry["records"] for result in results for entry in result["entries"]), source.skipped


def _codec_options(source: Source) -> dict[str, Any]:
    return {"codec": source.codec, "dtype": source.dtype.str if source.dtype is not None else None, "shape": tuple(source.shape)}


def _run_workers(tasks: Sequence[dict[str, Any]], progress: Counter) -> list[dict[str, Any]]:
    """Each task's result, in task order, each task run by a forkserver process of its own. The first failure
    (an error the worker reports, or a worker that dies) stops the others and is raised."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # each worker forks with varstore imported, in milliseconds
    results: list[dict[str, Any] | None] = [None] * len(tasks)
    running: dict[Any, tuple[Any, int]] = {}  # the driver's end of each worker's pipe: (worker, position)
    try:
        for position, task in enumerate(tasks):
            receiver, sender = context.Pipe(duplex=False)
            worker = context.Process(target=_write_part, args=(task, sender), name=f"varstore-convert-part-{position}")
            worker.start()
            sender.close()
            running[receiver] = (worker, position)
        while running:
            for receiver in multiprocessing.connection.wait(list(running)):
                worker, position = running.pop(receiver)
                try:
                    result = receiver.recv()
                except EOFError:
                    worker.join()
                    raise CommandError(f"the worker converting part {position} died (exit code {worker.exitcode})") from None
                if "error" in result:
                    raise CommandError(result["error"])
                results[position] = result
                progress(result["done"])
                worker.join()
    finally:
        for worker, _ in running.values():
            worker.kill()
        for worker, _ in running.values():
            worker.join()
    return [result for result in results if result is not None]


def _write_part(task: dict[str, Any], sender: Any) -> None:
    """In a worker: write one part of the source as part shards; sends their entries, or the error's message."""
    try:
        source = open_source(task["source"], task["format"], task["options"])
        progress = Counter()
        with PartWriter(task["destination"], run_id=task["run_id"], part=task["position"], attempt=0, **task["writer"]) as writer:
            source.write_part(writer, progress, task["part"])
        result = {"entries": writer.close(), "skipped": source.skipped, "done": progress.done}
    except (CommandError, VarstoreError) as error:
        result = {"error": str(error)}
    sender.send(result)
