"""The raw floor: payloads back to back in one file, N + 1 uint64 offsets in another, both memory-mapped.

A read is two offsets from `struct.unpack_from` on the offsets map and one slice
of the data map: the least work any Python API can do per record. Writing is a
plain ``f.write`` loop (then fsync, as durable as varstore's commit).
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any, Callable

import numpy as np
from crc32c import crc32c

from ..workloads import Workload, payload_of, unpack_sample
from .base import Peer, Store

_PAIR = struct.Struct("<QQ")
DATA_NAME, OFFSETS_NAME = "data.bin", "offsets.u64"
VERIFY_PIECE = 8 << 20
TOKEN = np.dtype("<u2")


def _map(path: str, advice: str | None) -> mmap.mmap:
    with open(path, "rb") as stream:
        mapped = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
    if advice is not None:
        mapped.madvise(mmap.MADV_RANDOM if advice == "random" else mmap.MADV_NORMAL)
    return mapped


def _reader(kind: str, data: mmap.mmap, offsets: mmap.mmap) -> Callable[[int], Any]:
    unpack = _PAIR.unpack_from
    if kind == "array":
        def get(index: int) -> Any:
            start, end = unpack(offsets, index << 3)
            return np.frombuffer(data, TOKEN, (end - start) >> 1, start)
    elif kind == "sample":
        def get(index: int) -> Any:
            start, end = unpack(offsets, index << 3)
            return unpack_sample(data[start:end])
    else:
        def get(index: int) -> Any:
            start, end = unpack(offsets, index << 3)
            return data[start:end]
    return get


class FloorStore(Store):
    def __init__(self, directory: str, workload: Workload, advice: str | None) -> None:
        self._data = _map(os.path.join(directory, DATA_NAME), advice)
        self._offsets = _map(os.path.join(directory, OFFSETS_NAME), advice)
        self._count = len(self._offsets) // 8 - 1
        self.get = _reader(workload.kind, self._data, self._offsets)  # type: ignore[method-assign]

    def verify(self) -> int:
        """CRC32C of the whole data file in 8 MiB pieces: the cost of checksumming the bytes, nothing else."""
        view, value = memoryview(self._data), 0
        for start in range(0, len(view), VERIFY_PIECE):
            value = crc32c(view[start : start + VERIFY_PIECE], value)
        view.release()
        return len(self._data)

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        del self.get
        self._data.close()
        self._offsets.close()


class Floor(Peer):
    name, label = "floor", "raw floor (mmap + offsets)"
    advice_variants = ("random",)

    def write(self, workload: Workload, records: list[Any], directory: str) -> None:
        offsets = [0]
        with open(os.path.join(directory, DATA_NAME), "wb") as data:
            write = data.write
            for record in records:
                offsets.append(offsets[-1] + write(payload_of(workload, record)))
            data.flush()
            os.fsync(data.fileno())
        with open(os.path.join(directory, OFFSETS_NAME), "wb") as index:
            index.write(np.array(offsets, "<u8").tobytes())
            index.flush()
            os.fsync(index.fileno())

    def open(self, directory: str, workload: Workload, advice: str | None = None) -> Store:
        return FloorStore(directory, workload, advice)

    def token_windows(self, directory: str, seq_len: int) -> tuple[Callable[[np.ndarray], Any], int]:
        """Windows sliced from one uint16 memmap of all tokens, widened to int64 tensors."""
        import torch

        tokens = np.memmap(os.path.join(directory, DATA_NAME), np.uint16, mode="r")

        def read(indices: np.ndarray) -> list[Any]:
            return [torch.from_numpy(tokens[start : start + seq_len + 1].astype(np.int64))
                    for start in (indices * seq_len).tolist()]

        return read, (len(tokens) - 1) // seq_len


PEER = Floor()
