"""Lance over S3: a dataset written by ``lance.write_dataset`` and uploaded as is, read by ``lance.dataset("s3://...")``.

The records are one binary column; files (Lance's fragments) hold about `shard_bytes` of it each, so that a
stream has fragments to share among its workers. Lance reaches the endpoint through its own Rust object-store
client, whose options (``aws_endpoint``, keys, ``allow_http`` for the loopback server) go in `storage_options`.
It keeps no local cache: every read is a request (``cache_dir`` is not used).

- map-style: a DataLoader batch is one ``take(indices)``, Lance's own random access (it sorts and coalesces the
  rows' reads);
- streams: each DataLoader worker scans its share of the fragments (Lance's `ShardedFragmentSampler`, the
  worker's id as its rank), in Lance's shuffled order (the fragments' order randomised, rows in order within a
  fragment) or in stored order.

Lance is not fork-safe (its users report DataLoader deadlocks with forked workers), so workers are spawned, as
its own `get_safe_loader` does; each opens the dataset itself.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator

import lance
import pyarrow as pa
import torch.utils.data
from lance.sampler import ShardedFragmentSampler
from torch.utils.data import DataLoader, Dataset

from ..workloads import Workload, cached_records
from .base_remote import Remote, RemotePeer, keep_list

COLUMN = "payload"


def _storage_options(remote: Remote) -> dict[str, str]:
    return {"aws_endpoint": remote.endpoint_url, "aws_access_key_id": remote.key,
            "aws_secret_access_key": remote.secret, "aws_region": "us-east-1", "allow_http": "true"}


def _payloads(table: Any) -> list[bytes]:
    return table.column(COLUMN).to_pylist()


class LanceTakeDataset(Dataset):
    """Sample i is row i; a batch of indices is one ``take``. Opened lazily, so that each worker opens its own."""

    def __init__(self, remote: Remote) -> None:
        self._url, self._options = remote.url, _storage_options(remote)
        self._length = lance.dataset(self._url, storage_options=self._options).count_rows()
        self._dataset: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_dataset": None}

    def __len__(self) -> int:
        return self._length

    def __getitems__(self, indices: list[int]) -> list[bytes]:
        if self._dataset is None:
            self._dataset = lance.dataset(self._url, storage_options=self._options)
        return _payloads(self._dataset.take(indices, columns=[COLUMN]))

    def __getitem__(self, index: int) -> bytes:
        return self.__getitems__([index])[0]


class LanceScanStream(torch.utils.data.IterableDataset):
    """Batches of `batch_size` payloads from a scan of this worker's fragments."""

    def __init__(self, remote: Remote, batch_size: int, shuffle: bool, seed: int) -> None:
        self._url, self._options = remote.url, _storage_options(remote)
        self._batch_size, self._shuffle, self._seed = batch_size, shuffle, seed

    def __iter__(self) -> Iterator[list[bytes]]:
        worker = torch.utils.data.get_worker_info()
        rank, world = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        dataset = lance.dataset(self._url, storage_options=self._options)
        sampler = ShardedFragmentSampler(rank, world, randomize=self._shuffle, seed=self._seed)
        for batch in sampler(dataset, batch_size=self._batch_size, columns=[COLUMN]):
            yield _payloads(batch)


class LanceRemote(RemotePeer):
    name, label = "lance", "Lance"
    worker_start = "spawn"

    def write(self, workload: Workload, directory: str, shard_bytes: int) -> None:
        records = cached_records(workload)
        files = max(1, math.ceil(workload.payload_bytes / shard_bytes))
        table = pa.table({COLUMN: pa.array(records, pa.binary())})
        lance.write_dataset(table, directory, max_rows_per_file=math.ceil(len(records) / files), mode="overwrite")

    def map_dataset(self, remote: Remote) -> Dataset:
        return LanceTakeDataset(remote)

    def stream(self, remote: Remote, batch_size: int, workers: int, seed: int, shuffle: bool) -> Iterable[Any]:
        return DataLoader(LanceScanStream(remote, batch_size, shuffle, seed), batch_size=None, num_workers=workers,
                          collate_fn=keep_list, multiprocessing_context=self.worker_start if workers else None)


PEER = LanceRemote()
