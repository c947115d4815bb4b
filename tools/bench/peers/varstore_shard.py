"""varstore: one shard written with `Writer` (``extend``, ``append`` per record, or ``extend_flat``), read with `varstore.open`."""

from __future__ import annotations

import mmap
import os
from typing import Any, Callable

import numpy as np
import varstore

from ..workloads import Workload
from .base import Peer, Store

SHARD_NAME = "shard"
# The harness's madvise variants: which of the reader's maps go back to MADV_NORMAL (it opens both MADV_RANDOM).
_NORMAL_MAPS = {"normal": ("_data_map", "_index_map"), "index-normal": ("_index_map",)}
_CODECS = {"array": {"codec": "ndarray", "dtype": "uint16"}, "bytes": {"codec": "bytes"}, "sample": {"codec": "msgpack"}}


class VarstoreStore(Store):
    def __init__(self, directory: str, advice: str | None) -> None:
        self.reader = varstore.open(os.path.join(directory, SHARD_NAME))
        for name in _NORMAL_MAPS.get(advice or "", ()):
            getattr(self.reader, name).madvise(mmap.MADV_NORMAL)
        self.get = self.reader.__getitem__  # type: ignore[method-assign]
        self.get_batch = self.reader.get_batch  # type: ignore[method-assign]

    def get_batch_flat(self, indices: np.ndarray) -> Any:
        return self.reader.get_batch_flat(indices)

    def scan(self) -> Any:
        return iter(self.reader)

    def scan_flat(self) -> Any:
        """`Reader.iter_flat`: consecutive records 4,096 at a time as zero-copy views of the map."""
        return self.reader.iter_flat()

    def verify(self) -> int:
        self.reader.verify()
        return self.reader.header.data_size

    def __len__(self) -> int:
        return len(self.reader)

    def close(self) -> None:
        del self.get, self.get_batch
        self.reader.close()


class Varstore(Peer):
    name, label = "varstore", "varstore"
    native_batch = True
    advice_variants = tuple(_NORMAL_MAPS)

    def write(self, workload: Workload, records: list[Any], directory: str) -> None:
        with varstore.Writer(os.path.join(directory, SHARD_NAME), **_CODECS[workload.kind]) as writer:
            writer.extend(records)

    def write_append(self, workload: Workload, records: list[Any], directory: str) -> None:
        """One `append` call per record, the loop a caller writes around a source."""
        with varstore.Writer(os.path.join(directory, SHARD_NAME), **_CODECS[workload.kind]) as writer:
            append = writer.append
            for record in records:
                append(record)

    def write_flat(self, workload: Workload, flat: tuple[Any, np.ndarray], directory: str) -> None:
        """`Writer.extend_flat`: one flat buffer and the lengths, no Python object per record."""
        with varstore.Writer(os.path.join(directory, SHARD_NAME), **_CODECS[workload.kind]) as writer:
            writer.extend_flat(*flat)

    def open(self, directory: str, workload: Workload, advice: str | None = None) -> Store:
        return VarstoreStore(directory, advice)

    def token_windows(self, directory: str, seq_len: int) -> tuple[Callable[[np.ndarray], Any], int]:
        from varstore.torch import TokenWindowDataset

        dataset = TokenWindowDataset(os.path.join(directory, SHARD_NAME), seq_len)
        return dataset.__getitems__, len(dataset)


PEER = Varstore()
