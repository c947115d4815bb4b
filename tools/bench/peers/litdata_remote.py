"""litdata over S3: chunks written by ``optimize`` and uploaded as is, read by ``StreamingDataset("s3://...")``.

The endpoint and keys go in `storage_options`, which litdata passes to its boto3 client. It downloads whole
chunks into `cache_dir`.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable

import litdata
from torch.utils.data import Dataset

from ..workloads import Workload
from .base_remote import IndexedDataset, Remote, RemotePeer
from .litdata_chunks import RECORDS_PER_INPUT, _records_of_input


def _item(dataset: Any, index: int) -> bytes:
    return dataset[index]


def _as_bytes(batch: list[Any]) -> list[bytes]:
    """litdata returns a bytes item as a memoryview of its chunk, which a DataLoader worker cannot send back."""
    return [bytes(item) for item in batch]


class LitdataRemote(RemotePeer):
    name, label = "litdata", "litdata"

    def write(self, workload: Workload, directory: str, shard_bytes: int) -> None:
        """`optimize` with one worker process over inputs of 1000 records (as the local benchmark does)."""
        litdata.optimize(
            fn=functools.partial(_records_of_input, workload),
            inputs=list(range(0, workload.count, RECORDS_PER_INPUT)),
            output_dir=directory,
            chunk_bytes=shard_bytes,
            num_workers=1,
            start_method="fork",
            mode="overwrite",
            verbose=False,
        )

    def _dataset(self, remote: Remote, shuffle: bool, seed: int = 42) -> Any:
        options = {"endpoint_url": remote.endpoint_url, "aws_access_key_id": remote.key,
                   "aws_secret_access_key": remote.secret}
        return litdata.StreamingDataset(remote.url, cache_dir=remote.cache_dir, storage_options=options,
                                        shuffle=shuffle, seed=seed)

    def map_dataset(self, remote: Remote) -> Dataset:
        return IndexedDataset(self._dataset(remote, shuffle=False), _item)

    def stream(self, remote: Remote, batch_size: int, workers: int, seed: int, shuffle: bool) -> Iterable[Any]:
        dataset = self._dataset(remote, shuffle=shuffle, seed=seed)
        return litdata.StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=_as_bytes)


PEER = LitdataRemote()
