"""Ray Data on varstore: `VarstoreDatasink` writes a Ray Dataset as one varstore dataset, `read_varstore` reads one.

    ds.write_datasink(VarstoreDatasink("s3://bucket/tokens", codec="ndarray", dtype="int32", column="tokens"))
    ray_ds = read_varstore("s3://bucket/tokens")       # rows {"record": ...}, one block per shard

Each write task writes its own shards with a `varstore.dataset.parts.PartWriter`, named after the run, the task's index
(its part) and Ray's attempt number, directly into the destination (a local directory every node shares, or a
URL); it sends back only their manifest entries, as plain dicts. The driver then commits one manifest listing
the shards of each part's successful attempt in part order (`varstore.dataset.parts.commit_parts`), which removes the
leftovers of failed attempts; a failed write removes every shard of the run (`abandon_run`) and commits nothing.

Records are taken from one `column` of each block, or made from each row (a dict) by `record`. A list column
written as ``ndarray`` records, or a binary column as ``bytes`` records, goes through `extend_flat` without a
Python object per record. With ``DataContext.get_current().execution_options.preserve_order = True`` the
dataset's records are in the Ray Dataset's order; otherwise Ray may hand blocks to write tasks in any order.

This module imports Ray; ``import varstore`` never imports it (install the ``ray`` extra).
"""

from __future__ import annotations

import os
import secrets
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import ray
from ray.data import Dataset, from_items
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink, WriteResult

from ..dataset.opening import open as open_dataset
from ..dataset.parts import PartWriter, abandon_run, commit_parts, new_run_id, refuse_existing_dataset
from ..errors import VarstoreError
from ..format.codecs import make_codec
from ..format.compression import check_compression
from ..local.file_url import resolve_file_url
from ..remote.filesystems import is_url
from ..shard.reader_base import require_version

__all__ = ["VarstoreDatasink", "read_varstore"]


class VarstoreDatasink(Datasink[dict]):
    """A Ray Data datasink writing one varstore dataset at `path` (a local directory every worker can write,
    or a URL with its `storage_options`): ``ds.write_datasink(VarstoreDatasink(path, ...))``.

    Give exactly one of `column` (each row's value in that column is a record) and `record` (a function
    from a row, as a dict, to a record). `codec`, `dtype`, `shape`, `metadata`, `checksums`,
    `max_shard_bytes` and `max_shard_records` are `ShardedWriter`'s; an existing dataset is replaced only
    with `overwrite`. Every write task writes whole shards of its own, so a dataset has at least one shard
    per write task that received records.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        codec: str = "bytes",
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        column: str | None = None,
        record: Callable[[dict[str, Any]], Any] | None = None,
        metadata: dict[str, Any] | None = None,
        checksums: bool = True,
        max_shard_bytes: int = 256 << 20,
        max_shard_records: int | None = None,
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
        compression: str | None = None,
        compression_level: int = 3,
    ) -> None:
        if (column is None) == (record is None):
            raise VarstoreError("give exactly one of column= (the records' column) and record= (a function of a row)")
        make_codec(codec, dtype=dtype, shape=shape)  # a bad codec or compression is refused here, not in every write task
        check_compression(compression, compression_level)
        self.path = _absolute(path)
        self._codec_options = {"codec": codec, "dtype": dtype, "shape": shape}
        self._column = column
        self._record = record
        self._metadata = metadata
        self._shard_options = {"checksums": checksums, "max_shard_bytes": max_shard_bytes, "max_shard_records": max_shard_records,
                               "compression": compression, "compression_level": compression_level}
        self._overwrite = overwrite
        self._storage_options = storage_options
        self._run_id: str | None = None

    @property
    def min_bytes_per_write(self) -> int:
        """Ray bundles blocks until a write task has a shard's worth: full shards, and a manifest that stays
        small (one task per block would make a shard per block, ~190 for 100 MB of JSON Lines read by Ray)."""
        return self._shard_options["max_shard_bytes"]

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        """Start a run (on the driver, before the first write task is sent): an existing dataset is refused now
        unless `overwrite` (not after every record was made), and a fresh run id names its shards.
        (`schema` is not checked: when Ray fuses the write with the maps before it, it is their input's.)"""
        if not self._overwrite:
            refuse_existing_dataset(self.path, self._storage_options)
        self._run_id = new_run_id()

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict[str, Any]:
        """Write one task's blocks as the shards of part ``ctx.task_idx``; returns the part and its entries."""
        writer = PartWriter(
            self.path, run_id=self._run_id, part=ctx.task_idx, attempt=_attempt_number(),
            **self._codec_options, **self._shard_options, storage_options=self._storage_options,
        )
        try:
            for block in blocks:
                self._write_block(writer, BlockAccessor.for_block(block))
            entries = writer.close()
        except BaseException:
            writer.abort()
            raise
        return {"part": ctx.task_idx, "shards": entries}

    def _write_block(self, writer: PartWriter, block: BlockAccessor) -> None:
        if self._record is not None:
            for row in block.iter_rows(public_row_format=True):
                writer.append(self._record(dict(row)))
            return
        if self._column not in block.column_names():
            raise VarstoreError(f"the dataset has no column {self._column!r}; its columns are {block.column_names()}", path=writer.path)
        column = block.to_arrow().column(self._column).combine_chunks()
        flat = _flat_records(column, self._codec_options["codec"], writer.path)
        if flat is not None:
            writer.extend_flat(*flat)
        elif self._codec_options["codec"] == "ndarray":
            writer.extend(block.to_numpy(self._column))
        else:
            writer.extend(column.to_pylist())

    def on_write_complete(self, write_result: WriteResult[dict]) -> None:
        """Commit the manifest: the shards of every part's successful attempt, in part order."""
        by_part: dict[int, list[dict[str, Any]]] = {}
        for returned in write_result.write_returns:
            if returned["part"] in by_part:
                raise VarstoreError(f"two write tasks returned part {returned['part']}", path=self.path)
            by_part[returned["part"]] = returned["shards"]
        if sorted(by_part) != list(range(len(by_part))):
            raise VarstoreError(f"write tasks returned parts {sorted(by_part)}, not 0 to {len(by_part) - 1}: a part is missing", path=self.path)
        commit_parts(
            self.path, [by_part[part] for part in range(len(by_part))], run_id=self._run_id or new_run_id(),
            **self._codec_options, metadata=self._metadata, overwrite=self._overwrite, storage_options=self._storage_options,
        )

    def on_write_failed(self, error: Exception) -> None:
        """Remove every shard of the run. Ray has cancelled the run's other tasks by now; one still finishing a shard
        may yet publish it, a ``part-RUN-*`` leftover that no manifest lists (see `varstore.dataset.parts`)."""
        if self._run_id is not None:
            abandon_run(self.path, self._run_id, self._storage_options)


def _absolute(path: str | os.PathLike[str]) -> str:
    """A local path made absolute on the driver (tasks may run in another directory), a URL as it is."""
    path = resolve_file_url(path)
    return path if is_url(path) else os.path.abspath(path)


def _attempt_number() -> int:
    """Ray's attempt number of the running task (0, then 1 for its first retry...). Ray keeps the task id across
    retries and has no public API for the attempt; without the core worker's method (a future Ray), a random
    number above any real attempt still gives the attempt names of its own."""
    core_worker = ray._private.worker.global_worker.core_worker
    if hasattr(core_worker, "get_current_task_attempt_number"):
        return int(core_worker.get_current_task_attempt_number())
    return 1_000_000 + secrets.randbelow(1 << 40)


def _flat_records(column: pa.Array, codec: str, path: str) -> tuple[Any, np.ndarray] | None:
    """`column` as `extend_flat`'s values and lengths, without a Python object per record: a list column for
    ``ndarray`` records, a binary column for ``bytes`` records; None for any other column or codec."""
    list_column = codec == "ndarray" and (pa.types.is_list(column.type) or pa.types.is_large_list(column.type))
    binary_column = codec == "bytes" and (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type))
    if not (list_column or binary_column):
        return None
    if column.null_count:
        raise VarstoreError(f"the records' column holds {column.null_count} nulls; a record cannot be null", path=path)
    if list_column:
        return column.flatten().to_numpy(zero_copy_only=False), np.diff(column.offsets.to_numpy())
    offset_type = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    offsets = np.frombuffer(column.buffers()[1], offset_type)[column.offset : column.offset + len(column) + 1]
    data = column.buffers()[2]
    values = memoryview(data if data is not None else b"")[int(offsets[0]) : int(offsets[-1])]
    return values, np.diff(offsets)


def read_varstore(
    path: str | os.PathLike[str], *, column: str = "record", storage_options: dict[str, Any] | None = None
) -> Dataset:
    """The varstore dataset at `path` (a directory every worker can read, or a URL) as a Ray Dataset of rows
    ``{column: record}``, one block per shard, in dataset order when Ray's ``preserve_order`` is set: ``bytes`` and 1-D ``ndarray`` records as Arrow binary
    and list values built without a Python object per record, others as Arrow makes them (msgpack dicts as
    structs). Each read task reopens the dataset and refuses it (`DatasetReplacedError`) if it is no longer
    the version opened here."""
    path = _absolute(path)
    with open_dataset(path, storage_options=storage_options) as dataset:
        starts = [int(start) for start in dataset.shard_starts]
        version = dataset.version
    ranges = [{"start": start, "stop": stop} for start, stop in zip(starts[:-1], starts[1:])]
    read = _RangeReader(path, version, column, storage_options)
    return from_items(ranges, override_num_blocks=max(1, len(ranges))).map_batches(read, batch_size=1, batch_format="pyarrow")


class _RangeReader:
    """A read task's function: the records [start, stop) of each row of its batch, as a one-column table."""

    def __init__(self, path: str, version: int, column: str, storage_options: dict[str, Any] | None) -> None:
        self._path, self._version, self._column, self._storage_options = path, version, column, storage_options

    def __call__(self, ranges: pa.Table) -> pa.Table:
        with open_dataset(self._path, storage_options=self._storage_options) as dataset:
            require_version(dataset, self._version)
            tables = [self._read(dataset, start, stop) for start, stop in zip(ranges["start"].to_pylist(), ranges["stop"].to_pylist())]
        return pa.concat_tables(tables) if tables else pa.table({self._column: pa.array([], pa.binary())})

    def _read(self, dataset: Any, start: int, stop: int) -> pa.Table:
        indices = np.arange(start, stop)
        if dataset.codec == "bytes" or (dataset.codec == "ndarray" and not dataset.shape):
            flat = dataset.get_batch_flat(indices)
            offsets = pa.array(flat.offsets, pa.int64())
            if dataset.codec == "bytes":
                records = pa.LargeBinaryArray.from_buffers(pa.large_binary(), stop - start, [None, offsets.buffers()[1], pa.py_buffer(flat.values)])
            else:
                records = pa.LargeListArray.from_arrays(offsets, pa.array(flat.values))
            return pa.table({self._column: records})
        return pa.table({self._column: pa.array(dataset.get_batch(indices))})
