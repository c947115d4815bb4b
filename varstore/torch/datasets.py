"""`RecordDataset`: a map-style torch Dataset over a varstore shard or dataset directory."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Literal, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import CorruptRecordError, VarstoreError
from ..format import DATA_SUFFIX, INDEX_SUFFIX
from ..reader import FlatBatch, Reader
from ..sharded_reader import ShardedReader
from .collate import JaggedBatch, writable_tensor
from .reading import ProcessLocalReader

Output = Literal["torch", "numpy"]
OUTPUTS = ("torch", "numpy")
DamagedPolicy = Literal["raise", "skip"]
_POLICIES = ("raise", "skip")

logger = logging.getLogger("varstore.torch")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise VarstoreError(f"{name} must be one of {', '.join(map(repr, choices))}, not {value!r}")


def _to_tensors(value: Any) -> Any:
    """Arrays become tensors (copied: the map is read-only); dicts and lists are converted inside; the rest is kept."""
    if isinstance(value, np.ndarray):
        return writable_tensor(value)
    if isinstance(value, dict):
        return {key: _to_tensors(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_tensors(item) for item in value]
    return value


def _shard_of(error: CorruptRecordError) -> str:
    path = error.path or "?"
    for suffix in (DATA_SUFFIX, INDEX_SUFFIX):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


class RecordDataset(Dataset):
    """Record i of the shard or dataset at `path` is sample i; works with any sampler and any number of workers.

    The DataLoader fetches each batch through `__getitems__`, one vectorised
    `get_batch`. Samples are tensors copied out of the read-only map (``ndarray``
    records; ``bytes`` records as uint8), str for ``str`` records, and for
    ``msgpack`` records the decoded structure with its arrays as tensors. With
    ``output="numpy"`` arrays stay zero-copy read-only views and `collate_padded` /
    `collate_jagged` make the one copy. `transform` runs on each sample in the worker.
    With ``flat_batches=True`` a batch comes back as one `JaggedBatch` (a `FlatBatch`
    for numpy output) read by `get_batch_flat`, for `collate_jagged` or `collate_padded`.

    ``on_damaged="skip"`` re-reads a batch that hits a damaged record one record at a
    time and leaves the damaged ones out (the batch comes back shorter), counting
    them per shard in `skipped_records` and logging once per shard, in each process
    (every DataLoader worker keeps its own count);
    `dataset[i]` of a damaged record raises whatever the policy. Catching a flipped
    payload byte needs ``verify_reads=True``; bad offsets and undecodable payloads are
    caught either way. Nothing mapped is pickled: workers map the files themselves.
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
    ) -> None:
        check_choice("output", output, OUTPUTS)
        check_choice("on_damaged", on_damaged, _POLICIES)
        if flat_batches and transform is not None:
            raise VarstoreError("flat_batches reads a batch as one buffer, so a per-sample transform cannot apply")
        self._source = ProcessLocalReader(path, verify_reads=verify_reads)
        self.path = self._source.path
        self.transform = transform
        self.output = output
        self.flat_batches = flat_batches
        self.on_damaged = on_damaged
        self.skipped_records: dict[str, int] = {}
        reader = self._source.get()
        self._length = len(reader)
        self._bytes_codec = reader.codec == "bytes"

    @property
    def reader(self) -> Reader | ShardedReader:
        """This process's reader of the data."""
        return self._source.get()

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"RecordDataset({self.path!r}, records={self._length})"

    def _sample(self, record: Any) -> Any:
        sample = np.frombuffer(record, np.uint8) if self._bytes_codec else record
        if self.output == "torch":
            sample = _to_tensors(sample)
        return sample if self.transform is None else self.transform(sample)

    def __getitem__(self, index: int) -> Any:
        return self._sample(self.reader[index])

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any] | JaggedBatch | FlatBatch:
        """The samples at `indices` (or, with `flat_batches`, one batch of them), read with one vectorised call."""
        reader = self.reader
        fetch = reader.get_batch_flat if self.flat_batches else reader.get_batch
        try:
            records = fetch(indices)
        except CorruptRecordError:
            if self.on_damaged == "raise":
                raise
            records = fetch(self._readable(reader, indices))
        if not self.flat_batches:
            return [self._sample(record) for record in records]
        if self.output == "numpy":
            return records
        return JaggedBatch(writable_tensor(records.values), torch.from_numpy(records.offsets))

    def _readable(self, reader: Reader | ShardedReader, indices: Sequence[int] | np.ndarray) -> list[int]:
        readable = []
        for index in np.asarray(indices).tolist():
            try:
                reader[index]
            except CorruptRecordError as error:
                self._count_damaged(index, error)
            else:
                readable.append(index)
        if not readable:
            raise CorruptRecordError(
                f"all {len(indices)} records of the batch are damaged; skipping cannot make a batch of them",
                path=reader.path,
                records=np.asarray(indices).tolist(),
            )
        return readable

    def _count_damaged(self, index: int, error: CorruptRecordError) -> None:
        shard = _shard_of(error)
        count = self.skipped_records.get(shard, 0) + 1
        self.skipped_records[shard] = count
        if count == 1:
            logger.warning(
                "skipping damaged record %d (%s); further damaged records of shard %s are skipped and counted "
                "without a message (process %d)", index, error, shard, os.getpid(),
            )
