"""varstore over S3: a `ShardedWriter` dataset uploaded as is, read by `RecordDataset` (ranged reads per batch
through ``__getitems__``) and `RecordStream` (whole shards fetched ahead) from its ``s3://`` URL.

The endpoint and keys go in `storage_options` (s3fs's keys; none over http://, the `varstore-http` peer); the
node cache is `cache_dir`.
"""

from __future__ import annotations

from typing import Any, Iterable

import varstore
from torch.utils.data import DataLoader, Dataset
from varstore.torch import RecordDataset, RecordStream

from ..workloads import Workload, cached_records
from .base_remote import Remote, RemotePeer, keep_list


def _options(remote: Remote) -> dict[str, Any]:
    """s3fs's endpoint and keys for an s3:// URL; an http:// URL (the nginx peer) needs none."""
    if not remote.url.startswith("s3://"):
        return {"cache_dir": remote.cache_dir}
    return {"storage_options": {"endpoint_url": remote.endpoint_url, "key": remote.key, "secret": remote.secret},
            "cache_dir": remote.cache_dir}


class VarstoreRemote(RemotePeer):
    name, label = "varstore", "varstore"

    def write(self, workload: Workload, directory: str, shard_bytes: int) -> None:
        with varstore.ShardedWriter(directory, "bytes", max_shard_bytes=shard_bytes, overwrite=True) as writer:
            writer.extend(cached_records(workload))

    def map_dataset(self, remote: Remote) -> Dataset:
        return RecordDataset(remote.url, **_options(remote))

    def stream(self, remote: Remote, batch_size: int, workers: int, seed: int, shuffle: bool) -> Iterable[Any]:
        stream = RecordStream(remote.url, batch_size=batch_size, collate_fn=keep_list, shuffle=shuffle, seed=seed,
                              **_options(remote))
        return DataLoader(stream, batch_size=None, num_workers=workers)


PEER = VarstoreRemote()
