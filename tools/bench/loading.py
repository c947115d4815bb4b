"""DataLoader throughput and memory: map-style datasets over each peer, random order, jagged collation."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler
from varstore.torch import RecordDataset, collate_jagged

from . import measure
from .peers.base import Peer, Store
from .peers.varstore_shard import SHARD_NAME
from .workloads import Workload

VARIANTS = {"default": {}, "flat": {"flat_batches": True}}
# Enough samples that no run ends its epoch (and its workers) before the budget: PSS is read with workers alive.
SAMPLES = 10**8


class PeerDataset(Dataset):
    """Record i of a peer's store is sample i. Workers use the store the parent opened (inherited by fork),
    except for peers that must open their own in each process (LMDB, HDF5): the parent then holds none."""

    def __init__(self, peer: Peer, directory: str, workload: Workload) -> None:
        self._peer, self._directory, self._workload = peer, directory, workload
        store = peer.open(directory, workload)
        self._count = len(store)
        if peer.reopen_in_workers:
            store.close()
        self._store: Store | None = None if peer.reopen_in_workers else store
        self._pid = os.getpid()

    def _local_store(self) -> Store:
        if self._store is None or (self._peer.reopen_in_workers and self._pid != os.getpid()):
            self._store = self._peer.open(self._directory, self._workload)
            self._pid = os.getpid()
        return self._store

    def __getitem__(self, index: int) -> Any:
        return self._local_store().get(index)

    def __len__(self) -> int:
        return self._count


def dataset_for(peer: Peer, workload: Workload, directory: str, variant: str) -> Dataset:
    """varstore's own `RecordDataset` (batches through ``__getitems__``), else a `PeerDataset`."""
    if peer.name == "varstore":
        return RecordDataset(os.path.join(directory, SHARD_NAME), **VARIANTS[variant])
    return PeerDataset(peer, directory, workload)


def loader_figures(peer: Peer, workload: Workload, directory: str, workers: int, variant: str,
                   batch_size: int, budget: float) -> dict[str, float]:
    """Samples/s after the first batch, the first batch's wait, and PSS over the process and its workers."""
    dataset = dataset_for(peer, workload, directory, variant)
    sampler = RandomSampler(dataset, num_samples=SAMPLES, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, collate_fn=collate_jagged)
    iterator = iter(loader)
    _, first = measure.timed(lambda: next(iterator))
    batches, seconds = measure.timed_iteration(iterator, budget)
    pss, processes = measure.pss_with_children()
    return {
        f"loader_samples_s@{workers}w": batches * batch_size / seconds,
        f"loader_first_batch_s@{workers}w": first,
        f"loader_pss_mb@{workers}w": pss / 1e6,
        f"loader_rss_main_mb@{workers}w": measure.rss_bytes() / 1e6,
        f"loader_processes@{workers}w": processes,
    }
