"""Shared by the varstore.torch tests: datasets whose records name their own index, and reading indices back."""

from __future__ import annotations

import os

import numpy as np

import varstore
from varstore.torch import JaggedBatch, PaddedBatch


def record_length(index: int) -> int:
    return 1 + index % 5


def write_indexed_dataset(path: str | os.PathLike[str], count: int, *, max_shard_records: int | None = None) -> None:
    """Record i is ``record_length(i)`` int32 copies of i; a directory when `max_shard_records` is given, else one shard."""
    records = (np.full(record_length(index), index, np.int32) for index in range(count))
    if max_shard_records is None:
        with varstore.Writer(path, codec="ndarray", dtype="int32") as writer:
            writer.extend(records)
    else:
        with varstore.ShardedWriter(path, codec="ndarray", dtype="int32", max_shard_records=max_shard_records) as writer:
            writer.extend(records)


def batch_indices(batch: PaddedBatch | JaggedBatch) -> list[int]:
    """The record indices in a collated batch of an indexed dataset, checking each sample is whole."""
    if isinstance(batch, PaddedBatch):
        samples = [row[:length] for row, length in zip(batch.values, batch.lengths.tolist())]
    else:
        samples = [batch.values[start:stop] for start, stop in zip(batch.offsets[:-1].tolist(), batch.offsets[1:].tolist())]
    indices = [int(sample[0]) for sample in samples]
    for index, sample in zip(indices, samples):
        assert sample.tolist() == [index] * record_length(index)
    return indices
