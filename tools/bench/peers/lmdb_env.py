"""LMDB: one key per record (8-byte big-endian index), written with ``putmulti(append=True)`` in one transaction."""

from __future__ import annotations

import struct
from typing import Any, Iterator

import lmdb
import numpy as np

from ..workloads import Workload, payload_of, record_from_payload
from .base import Peer, Store

_KEY = struct.Struct(">Q")
MAP_HEADROOM = 1 << 30


class LmdbStore(Store):
    def __init__(self, directory: str, workload: Workload) -> None:
        self.env = lmdb.open(directory, readonly=True, lock=False)
        self.txn = self.env.begin()
        self._workload = workload
        self._count = self.env.stat()["entries"]

    def get(self, index: int) -> Any:
        return record_from_payload(self._workload, self.txn.get(_KEY.pack(index)))

    def get_batch(self, indices: np.ndarray) -> Any:
        """``Cursor.getmulti``: the batch in one call."""
        pairs = self.txn.cursor().getmulti([_KEY.pack(index) for index in indices.tolist()])
        return [record_from_payload(self._workload, value) for _, value in pairs]

    def scan(self) -> Iterator[Any]:
        workload = self._workload
        return (record_from_payload(workload, value) for _, value in self.txn.cursor())

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        self.txn.abort()
        self.env.close()


class Lmdb(Peer):
    name, label = "lmdb", "LMDB"
    reopen_in_workers = True
    native_batch = True

    def write(self, workload: Workload, records: list[Any], directory: str) -> None:
        env = lmdb.open(directory, map_size=2 * workload.payload_bytes + MAP_HEADROOM)
        with env.begin(write=True) as txn:
            txn.cursor().putmulti(
                ((_KEY.pack(index), payload_of(workload, record)) for index, record in enumerate(records)), append=True
            )
        env.close()

    def open(self, directory: str, workload: Workload, advice: str | None = None) -> Store:
        return LmdbStore(directory, workload)


PEER = Lmdb()
