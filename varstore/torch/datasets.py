"""`RecordDataset`: a map-style torch Dataset over a varstore shard or dataset directory."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Literal, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..dataset.reader import ShardedReader
from ..errors import CorruptRecordError, VarstoreError
from ..shard.reader import FlatBatch, Reader, check_indices
from .collate import JaggedBatch, naming_records, stored_tensor, stored_tensor_batch, stored_tensors, writable_tensor
from .reading import AnyReader, ProcessLocalReader
from .skipped import SkippedRecords

Output = Literal["torch", "numpy"]
OUTPUTS = ("torch", "numpy")
DamagedPolicy = Literal["raise", "skip"]
_POLICIES = ("raise", "skip")

logger = logging.getLogger("varstore.torch")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise VarstoreError(f"{name} must be one of {', '.join(map(repr, choices))}, not {value!r}")


def check_keep_dtype(keep_dtype: bool, output: str) -> None:
    """Refuse ``keep_dtype=True`` where it could do nothing: numpy output is never converted."""
    if keep_dtype and output == "numpy":
        raise VarstoreError(
            "output='numpy' always keeps the stored dtype; pass keep_dtype=True to the collate function instead"
        )


def _shard_paths(reader: AnyReader) -> list[str]:
    return reader.shard_paths if isinstance(reader, ShardedReader) else [reader.path]


def _shard_positions(reader: AnyReader, indices: np.ndarray) -> np.ndarray:
    """The shard number of each of the resolved record `indices`."""
    if not isinstance(reader, ShardedReader):
        return np.zeros(len(indices), np.int64)
    return np.searchsorted(reader.shard_starts, indices, side="right") - 1


class RecordDataset(Dataset):
    """Record i of the shard or dataset at `path` is sample i; works with any sampler and any number of workers.

    The DataLoader fetches each batch through `__getitems__`, one vectorised
    `get_batch`. Samples are tensors copied out of the read-only map (``ndarray``
    records; ``bytes`` records as uint8: a batch of either is one `SampleBatch`, one buffer
    from a worker to the main process), str for ``str`` records, and for
    ``msgpack`` records the decoded structure with its arrays as tensors. Integer
    arrays (records, and arrays inside ``msgpack`` records) become int64 tensors, which
    embeddings and losses take; ``keep_dtype=True`` keeps the stored dtype (uint64
    values of 2**63 or more need it: without it they are refused, naming the record
    and field). With ``output="numpy"`` arrays stay zero-copy read-only views in
    the stored dtype and `collate_padded` / `collate_jagged` make the one copy (and the
    int64 conversion: pass `keep_dtype` to them). `transform` runs on each sample in the worker.
    With ``flat_batches=True`` a batch comes back as one `JaggedBatch` (a `FlatBatch`
    for numpy output) read by `get_batch_flat`, for `collate_jagged` or `collate_padded`.

    ``on_damaged="skip"`` re-reads a batch that hits a damaged record one record at a
    time and leaves the damaged ones out (the batch comes back shorter). A shard of a
    dataset that cannot be opened or fails its manifest checks (a damaged header, a
    truncated or missing file) is quarantined: all its records are left out. Skipped
    records are counted per shard in `skipped_records`, summed over the main process
    and every DataLoader worker (fork or spawn), and each shard is logged once on the
    ``varstore.torch`` logger; a batch with no readable record left still raises.
    `dataset[i]` of a damaged record raises whatever the policy. Catching a flipped
    payload byte needs ``verify_reads=True``; bad offsets and undecodable payloads are
    caught either way. Over object storage, a dataset the node cache can hold has each
    shard fetched whole at its first read (`ShardedReader.read_shards_whole`). Nothing
    mapped is pickled: workers map the files themselves, at the absolute path and the
    version this dataset opened, and raise `DatasetReplacedError` if the dataset was
    replaced since (never another version's records).

    `path` may be a URL of object storage (see `varstore.open`): `storage_options`, `cache_dir` and
    `cache_limit` go to the reader, and workers reopen the URL with them (never a client across a fork).
    A batch costs one merged, concurrent ranged read per shard it touches, each record checked against
    its CRC32C.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        transform: Callable[[Any], Any] | None = None,
        output: Output = "torch",
        flat_batches: bool = False,
        on_damaged: DamagedPolicy = "raise",
        verify_reads: bool = False,
        keep_dtype: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        check_choice("output", output, OUTPUTS)
        check_choice("on_damaged", on_damaged, _POLICIES)
        check_keep_dtype(keep_dtype, output)
        if flat_batches and transform is not None:
            raise VarstoreError("flat_batches reads a batch as one buffer, so a per-sample transform cannot apply")
        self._source = ProcessLocalReader(
            path, verify_reads=verify_reads, quarantine=on_damaged == "skip", whole_shards=True,
            storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit,
        )
        self.path = self._source.path
        self.transform = transform
        self.output = output
        self.flat_batches = flat_batches
        self.on_damaged = on_damaged
        self.keep_dtype = keep_dtype
        reader = self._source.get()
        self._skipped = SkippedRecords(_shard_paths(reader)) if on_damaged == "skip" else None
        self._length = len(reader)
        self._bytes_codec = reader.codec == "bytes"
        self._array_codec = reader.codec == "ndarray"

    @property
    def skipped_records(self) -> dict[str, int]:
        """Records ``on_damaged="skip"`` left out so far, per shard path, in this process and all its DataLoader workers."""
        return self._skipped.as_dict() if self._skipped is not None else {}

    @property
    def reader(self) -> AnyReader:
        """This process's reader of the data."""
        return self._source.get()

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"RecordDataset({self.path!r}, records={self._length})"

    def _sample(self, record: Any, index: int) -> Any:
        sample = np.frombuffer(record, np.uint8) if self._bytes_codec else record
        if self.output == "torch" and self._bytes_codec:
            sample = writable_tensor(sample)
        elif self.output == "torch":
            sample = stored_tensors(sample, self.keep_dtype, f"record {index % self._length}", self.path)
        return sample if self.transform is None else self.transform(sample)

    def __getitem__(self, index: int) -> Any:
        return self._sample(self.reader[index], index)

    def will_need(self, indices: Sequence[int] | np.ndarray) -> None:
        """Start reading the pages of records `indices` of a local shard or dataset into the page cache, or the
        shards of a remote dataset into the node cache (`ShardedReader.will_need`), without waiting: what
        `ExactlyOnceSampler` calls ahead of its batches."""
        reader = self.reader
        if isinstance(reader, (Reader, ShardedReader)):
            reader.will_need(indices)

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any] | JaggedBatch | FlatBatch:
        """The samples at `indices` (or, with `flat_batches`, one batch of them), read with one vectorised call."""
        return self._samples_from(self.reader, indices)

    def _samples_from(self, reader: Any, indices: Sequence[int] | np.ndarray) -> list[Any] | JaggedBatch | FlatBatch:
        """`__getitems__` reading from `reader` (this dataset's, or `RecordStream`'s records held in memory)."""
        fetch = reader.get_batch_flat if self.flat_batches else reader.get_batch
        if self.on_damaged == "skip":
            indices = self._outside_quarantine(reader, indices)
        try:
            records = fetch(indices)
        except CorruptRecordError:
            if self.on_damaged == "raise":
                raise
            indices = self._readable(reader, indices)
            records = fetch(indices)
        if not self.flat_batches:
            positions = np.asarray(indices).tolist()
            if not ((self._array_codec or self._bytes_codec) and self.output == "torch" and records):
                return [self._sample(record, index) for record, index in zip(records, positions)]
            arrays = records if self._array_codec else [np.frombuffer(record, np.uint8) for record in records]
            samples = stored_tensor_batch(
                arrays, self.keep_dtype or self._bytes_codec, lambda k: f"record {positions[k] % self._length}", self.path
            )
            return samples if self.transform is None else [self.transform(sample) for sample in samples]
        if self.output == "numpy":
            return records
        resolved = np.asarray(indices) % self._length
        where = naming_records(records.values, records.offsets, lambda k: f"record {resolved[k]}")
        values = stored_tensor(records.values, self.keep_dtype, where, self.path)
        return JaggedBatch(values, torch.from_numpy(records.offsets))

    def _outside_quarantine(self, reader: AnyReader, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """`indices` without the records of quarantined shards, which are counted as skipped."""
        resolved = check_indices(indices, len(reader), reader.path)
        if not isinstance(reader, ShardedReader) or reader._quarantine is None:
            return resolved
        shards = _shard_positions(reader, resolved)
        unusable = [position for position in np.unique(shards).tolist() if not reader._shard_usable(position)]
        if not unusable:
            return resolved
        set_aside = np.isin(shards, unusable)
        for position in unusable:
            count = int(np.count_nonzero(shards == position))
            if self._skipped.add(position, count):  # type: ignore[union-attr]
                logger.warning(
                    "skipping shard %s, which cannot be read (%s): its records are left out of every batch and "
                    "counted in skipped_records", reader.shard_paths[position], reader._quarantine[position],
                )
        if set_aside.all():
            raise CorruptRecordError(
                f"all {len(resolved)} records of the batch are in damaged shards; skipping cannot make a batch of them",
                path=reader.path,
                records=resolved.tolist(),
            )
        return resolved[~set_aside]

    def _readable(self, reader: AnyReader, indices: Sequence[int] | np.ndarray) -> list[int]:
        readable = []
        for index in np.asarray(indices).tolist():
            try:
                reader[index]
            except CorruptRecordError as error:
                self._count_damaged(reader, index, error)
            else:
                readable.append(index)
        if not readable:
            raise CorruptRecordError(
                f"all {len(indices)} records of the batch are damaged; skipping cannot make a batch of them",
                path=reader.path,
                records=np.asarray(indices).tolist(),
            )
        return readable

    def _count_damaged(self, reader: AnyReader, index: int, error: CorruptRecordError) -> None:
        position = int(_shard_positions(reader, np.array([index]))[0])
        if self._skipped.add(position, 1):  # type: ignore[union-attr]
            logger.warning(
                "skipping damaged record %d (%s); further damaged records of shard %s are skipped and counted "
                "without a message", index, error, _shard_paths(reader)[position],
            )
