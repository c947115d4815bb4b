"""`convert`: build a dataset from what ``varstore convert`` reads (.npy, token files, JSON Lines, text, folders,
Parquet), in this process or in several worker processes on this machine.

With ``workers=N`` the input is cut into at most N contiguous parts (consecutive files of a folder, byte ranges
cut at line or document boundaries, rows of an array, row groups of a Parquet file), each part is written by a
worker process as `varstore.parts.PartWriter` shards, and this process commits them in part order with
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
from typing import Any, Sequence

from .cli.errors import CommandError, UsageError
from .cli.output import Progress, listing
from .cli.sources import Source, open_source, source_format
from .errors import VarstoreError
from .parts import PartWriter, abandon_run, commit_parts, new_run_id, refuse_existing_dataset
from .sharded_writer import ShardedWriter


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
    **source_options: Any,
) -> int:
    """Convert the file or folder `source` into a dataset at `destination` (a directory or URL), as
    ``varstore convert`` does, with `workers` processes; returns the number of records written.

    `format` is told by the name when None (see ``varstore convert --help``); `source_options` are that
    command's source options by their Python names (``field="text"``, ``dtype="uint16", separator=50256``,
    ``labels=True``, ``codec="bytes"``, ``skip_null=True``, ``offsets="offsets.npy"``, ``max_record_bytes``).
    Every error is a `VarstoreError`.
    """
    try:
        path = os.fspath(source)
        kind = source_format(path, format)
        opened = open_source(path, kind, source_options)
        writer_options = {"max_shard_bytes": max_shard_bytes, "max_shard_records": max_shard_records, "storage_options": storage_options}
        if workers == 1 and type(workers) is int:  # True and 1.0 are refused with the other non-integers
            with ShardedWriter(destination, **_codec_options(opened), metadata=dataset_metadata(opened, metadata),
                               overwrite=overwrite, **writer_options) as writer:
                opened.write_to(writer, Progress())
            return len(writer)
        records, _ = write_in_parts(
            opened, path, kind, source_options, os.fspath(destination), workers=workers, metadata=metadata,
            overwrite=overwrite, progress=Progress(), **writer_options,
        )
        return records
    except CommandError as error:
        raise VarstoreError(str(error)) from None


def dataset_metadata(source: Source, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The dataset's metadata: what the source writes itself (a folder's labels) and the user's `metadata`."""
    taken = sorted(set(source.metadata) & set(metadata or {}))
    if taken:
        raise UsageError(f"--metadata sets {listing(taken)}, which the source writes itself")
    return {**source.metadata, **(metadata or {})}


def write_in_parts(
    source: Source,
    path: str,
    kind: str,
    source_options: dict[str, Any],
    destination: str,
    *,
    workers: int,
    metadata: dict[str, Any] | None,
    overwrite: bool,
    max_shard_bytes: int,
    max_shard_records: int | None,
    storage_options: dict[str, Any] | None,
    progress: Progress,
) -> tuple[int, int]:
    """Write `source` (opened from `path`, `kind` and `source_options`) to `destination` in at most `workers`
    parts, one worker process each, and commit them in order; returns (records written, samples skipped)."""
    if type(workers) is not int or workers < 1:
        raise UsageError(f"workers must be a positive integer, not {workers!r}")
    metadata = dataset_metadata(source, metadata)
    if not overwrite:
        refuse_existing_dataset(destination, storage_options)
    run_id = new_run_id()
    writer_options = {**_codec_options(source), "max_shard_bytes": max_shard_bytes,
                      "max_shard_records": max_shard_records, "storage_options": storage_options}
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
        abandon_run(destination, run_id, storage_options)
        raise
    source.skipped = sum(result["skipped"] for result in results)
    return sum(entry["records"] for result in results for entry in result["entries"]), source.skipped


def _codec_options(source: Source) -> dict[str, Any]:
    return {"codec": source.codec, "dtype": source.dtype.str if source.dtype is not None else None, "shape": tuple(source.shape)}


def _run_workers(tasks: Sequence[dict[str, Any]], progress: Progress) -> list[dict[str, Any]]:
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
        progress = Progress()
        with PartWriter(task["destination"], run_id=task["run_id"], part=task["position"], attempt=0, **task["writer"]) as writer:
            source.write_part(writer, progress, task["part"])
        result = {"entries": writer.close(), "skipped": source.skipped, "done": progress.done}
    except (CommandError, VarstoreError) as error:
        result = {"error": str(error)}
    sender.send(result)
