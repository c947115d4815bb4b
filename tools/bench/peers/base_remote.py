"""What a peer of the remote benchmark (tools/bench/remote.py) provides: write the records as that library's
shards, then read them back from an S3 URL as a map-style dataset (random access) and as a stream.

The S3 endpoint, credentials and a fresh local cache directory come from the harness; each adapter passes
them the way its library documents (storage options, environment variables, a cache path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from torch.utils.data import Dataset

from ..workloads import Workload


@dataclass(frozen=True)
class Remote:
    """Where a peer's dataset lives and how to reach it: `url` (s3://bucket/prefix), the S3 endpoint, keys,
    and a local cache directory that is empty when the measurement starts."""

    url: str
    endpoint_url: str
    key: str
    secret: str
    cache_dir: str


class IndexedDataset(Dataset):
    """A map-style view of a library's dataset object: sample i is ``read(i)`` (for peers whose datasets are
    iterable-style, which a DataLoader refuses to drive with a sampler)."""

    def __init__(self, source: Any, read: Any) -> None:
        self._source, self._read = source, read

    def __getitem__(self, index: int) -> Any:
        return self._read(self._source, index)

    def __len__(self) -> int:
        return len(self._source)


def keep_list(batch: list[Any]) -> list[Any]:
    """Collation that leaves a batch as the list of samples (records differ in length)."""
    return batch


class RemotePeer:
    """A record store read from object storage; samples come back as bytes-like objects or uint8 tensors."""

    name = ""
    label = ""
    # How DataLoader workers start (None: torch's default, fork on Linux).
    worker_start: str | None = None

    def write(self, workload: Workload, directory: str, shard_bytes: int) -> None:
        """Store the records of `workload` (bytes) under `directory` in shards of about `shard_bytes`, ready to
        upload as is."""
        raise NotImplementedError

    def map_dataset(self, remote: Remote) -> Dataset:
        """A map-style dataset over the remote records, for a DataLoader with a shuffling sampler."""
        raise NotImplementedError

    def stream(self, remote: Remote, batch_size: int, workers: int, seed: int, shuffle: bool) -> Iterable[Any]:
        """Batches (lists of samples) of one streaming epoch, shuffled or in order, the library's own way."""
        raise NotImplementedError
