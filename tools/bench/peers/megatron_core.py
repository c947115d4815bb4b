"""Megatron-core's own `IndexedDataset` (``.bin`` + ``.idx``), written with its `IndexedDatasetBuilder`.

It stores 1-D arrays of one numeric dtype: tokens as uint16, bytes records as
uint8 arrays; dict samples are out of its scope.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterator

import numpy as np

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

from ..workloads import Workload
from .base import DatasetStore, Peer, Store

PREFIX = "tokens"
SCAN_SLICE = 4096


class MegatronStore(DatasetStore):
    def scan(self) -> Iterator[Any]:
        """Contiguous slices, its bulk read (one array split into records)."""
        for start in range(0, len(self), SCAN_SLICE):
            yield from self.dataset[start : start + SCAN_SLICE]


class Megatron(Peer):
    name, label = "megatron", "Megatron IndexedDataset"

    def unsupported(self, workload: Workload) -> str | None:
        return "stores numeric arrays only, not dict samples" if workload.kind == "sample" else None

    def write(self, workload: Workload, records: list[Any], directory: str) -> None:
        prefix = os.path.join(directory, PREFIX)
        dtype = np.uint16 if workload.kind == "array" else np.uint8
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that views of immutable bytes are read-only
            for record in records:
                builder.add_item(torch.from_numpy(np.frombuffer(record, dtype)))
                builder.end_document()
        builder.finalize(prefix + ".idx")

    def open(self, directory: str, workload: Workload, advice: str | None = None) -> Store:
        return MegatronStore(IndexedDataset(os.path.join(directory, PREFIX)))


PEER = Megatron()
