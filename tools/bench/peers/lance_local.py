"""Lance: a dataset written by ``lance.write_dataset`` from Arrow batches, read by ``lance.dataset`` on local files.

Columns by workload: tokens as one ``list<uint16>`` column, bytes as one ``binary`` column, dict samples as
``array`` (``list<float32>``), ``label`` and ``text``. A single read is ``take([i])``, a batch one ``take(indices)``
(Lance's own random access: it sorts and coalesces the rows' reads), a scan ``to_batches()``; tokens come back as
zero-copy numpy views of the Arrow values, bytes as ``bytes``. Lance keeps no madvise of its own to vary, and
runs its reads on its own Rust threads, which do not survive a fork: each DataLoader worker opens the dataset
itself (`reopen_in_workers`).
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import lance
import numpy as np
import pyarrow as pa

from ..workloads import Workload
from .base import Peer, Store

DATASET_DIR = "dataset.lance"
ROWS_PER_BATCH = 4096
_SCHEMAS = {
    "array": pa.schema([("tokens", pa.list_(pa.uint16()))]),
    "bytes": pa.schema([("payload", pa.binary())]),
    "sample": pa.schema([("array", pa.list_(pa.float32())), ("label", pa.int64()), ("text", pa.string())]),
}


def _arrow_batches(kind: str, records: list[Any]) -> Iterator[pa.RecordBatch]:
    """`records` as Arrow batches of `ROWS_PER_BATCH` rows in the workload's schema (the conversion is timed as
    part of the write: it is the encoding Lance's users do)."""
    schema = _SCHEMAS[kind]
    for start in range(0, len(records), ROWS_PER_BATCH):
        chunk = records[start : start + ROWS_PER_BATCH]
        if kind == "array":
            offsets = np.zeros(len(chunk) + 1, np.int32)
            np.cumsum([len(record) for record in chunk], out=offsets[1:])
            values = pa.array(np.concatenate(chunk), pa.uint16())
            columns = [pa.ListArray.from_arrays(pa.array(offsets), values)]
        elif kind == "bytes":
            columns = [pa.array(chunk, pa.binary())]
        else:
            columns = [pa.array([sample["array"] for sample in chunk], pa.list_(pa.float32())),
                       pa.array([sample["label"] for sample in chunk], pa.int64()),
                       pa.array([sample["text"] for sample in chunk], pa.string())]
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


def _records(kind: str, table: pa.Table | pa.RecordBatch) -> list[Any]:
    """Rows of `table` as the harness's records: uint16 arrays, bytes, or dicts of array, label and text."""
    if kind == "array":
        column = table.column(0)
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        rows = []
        for chunk in chunks:
            values = chunk.values.to_numpy(zero_copy_only=True)
            offsets = chunk.offsets.to_numpy()
            rows.extend(values[start:end] for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()))
        return rows
    if kind == "bytes":
        return table.column(0).to_pylist()
    arrays = table.column("array").to_pylist()
    return [{"array": np.asarray(array, np.float32), "label": label, "text": text}
            for array, label, text in zip(arrays, table.column("label").to_pylist(), table.column("text").to_pylist())]


class LanceStore(Store):
    def __init__(self, directory: str, kind: str) -> None:
        self._dataset = lance.dataset(os.path.join(directory, DATASET_DIR))
        self._kind = kind
        self._count = self._dataset.count_rows()

    def get(self, index: int) -> Any:
        return _records(self._kind, self._dataset.take([index]))[0]

    def get_batch(self, indices: np.ndarray) -> Any:
        return _records(self._kind, self._dataset.take(indices.tolist()))

    def scan(self) -> Iterator[Any]:
        for batch in self._dataset.to_batches(batch_size=ROWS_PER_BATCH):
            yield from _records(self._kind, batch)

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        self._dataset = None


class Lance(Peer):
    name, label = "lance", "Lance (pylance)"
    native_batch = True
    reopen_in_workers = True

    def write(self, workload: Workload, records: list[Any], directory: str) -> None:
        schema = _SCHEMAS[workload.kind]
        reader = pa.RecordBatchReader.from_batches(schema, _arrow_batches(workload.kind, records))
        lance.write_dataset(reader, os.path.join(directory, DATASET_DIR), schema=schema)
        for root, _, files in os.walk(os.path.join(directory, DATASET_DIR)):  # as durable as the others' fsync
            for name in files:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def open(self, directory: str, workload: Workload, advice: str | None = None) -> Store:
        return LanceStore(directory, workload.kind)


PEER = Lance()
