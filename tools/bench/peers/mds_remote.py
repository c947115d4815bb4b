"""MosaicML Streaming over S3: `MDSWriter` shards uploaded as is, read by ``StreamingDataset(remote="s3://...")``.

MDS reaches a non-AWS S3 endpoint through the ``S3_ENDPOINT_URL`` environment variable and takes keys
from boto3's usual environment (both set by the harness). It downloads whole shards into `local`.
"""

from __future__ import annotations

from typing import Any, Iterable

from torch.utils.data import DataLoader, Dataset

from ..workloads import Workload, cached_records
from .base_remote import IndexedDataset, Remote, RemotePeer
from .mds import streaming

COLUMN = "payload"


def _payload(dataset: Any, index: int) -> bytes:
    return dataset[index][COLUMN]


def _payloads(batch: list[dict[str, Any]]) -> list[bytes]:
    return [sample[COLUMN] for sample in batch]


class MDSRemote(RemotePeer):
    name, label = "mds", "MosaicML Streaming (MDS)"

    def write(self, workload: Workload, directory: str, shard_bytes: int) -> None:
        with streaming.MDSWriter(out=directory, columns={COLUMN: "bytes"}, size_limit=shard_bytes) as writer:
            for record in cached_records(workload):
                writer.write({COLUMN: record})

    def _dataset(self, remote: Remote, batch_size: int | None, shuffle: bool, seed: int = 0) -> Any:
        return streaming.StreamingDataset(remote=remote.url, local=remote.cache_dir, batch_size=batch_size,
                                          shuffle=shuffle, shuffle_seed=seed)

    def map_dataset(self, remote: Remote) -> Dataset:
        return IndexedDataset(self._dataset(remote, None, shuffle=False), _payload)

    def stream(self, remote: Remote, batch_size: int, workers: int, seed: int, shuffle: bool) -> Iterable[Any]:
        dataset = self._dataset(remote, batch_size, shuffle=shuffle, seed=seed)
        return DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=_payloads,
                          multiprocessing_context=self.worker_start if workers else None)


PEER = MDSRemote()
