"""HDF5 through h5py: variable-length datasets (``h5py.vlen_dtype``), one per field, written in slices.

A read of one element returns a numpy array (uint8 for bytes records); a dict
sample is three reads (array, label, text).
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import h5py
import numpy as np

from ..workloads import Workload
from .base import Peer, Store

FILE_NAME = "records.h5"
WRITE_SLICE = 4096
_ELEMENT = {"array": np.uint16, "bytes": np.uint8}


def _object_array(values: list[Any]) -> np.ndarray:
    array = np.empty(len(values), object)
    array[:] = values
    return array


class H5Store(Store):
    def __init__(self, directory: str, kind: str) -> None:
        self.file = h5py.File(os.path.join(directory, FILE_NAME), "r")
        if kind == "sample":
            self._fields = {"array": self.file["array"], "label": self.file["label"], "text": self.file["text"].asstr()}
        else:
            self._fields = {"records": self.file["records"]}
        self._count = len(next(iter(self._fields.values())))

    def get(self, index: int) -> Any:
        fields = self._fields
        if len(fields) == 1:
            return fields["records"][index]
        return {name: field[index] for name, field in fields.items()}

    def scan(self) -> Iterator[Any]:
        """Slices of `WRITE_SLICE` elements, its bulk read."""
        for start in range(0, self._count, WRITE_SLICE):
            parts = {name: field[start : start + WRITE_SLICE] for name, field in self._fields.items()}
            if len(parts) == 1:
                yield from parts["records"]
            else:
                yield from (dict(zip(parts, values)) for values in zip(*parts.values()))

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        self._fields = {}
        self.file.close()


class H5py(Peer):
    name, label = "h5py", "HDF5 vlen (h5py)"
    reopen_in_workers = True

    def write(self, workload: Workload, records: list[Any], directory: str) -> None:
        count = len(records)
        with h5py.File(os.path.join(directory, FILE_NAME), "w") as file:
            if workload.kind == "sample":
                columns = {
                    "array": (h5py.vlen_dtype(np.float32), lambda part: _object_array([r["array"] for r in part])),
                    "label": (np.int64, lambda part: np.array([r["label"] for r in part], np.int64)),
                    "text": (h5py.string_dtype(), lambda part: _object_array([r["text"] for r in part])),
                }
            else:
                element = _ELEMENT[workload.kind]
                columns = {"records": (h5py.vlen_dtype(element),
                                       lambda part: _object_array([np.frombuffer(r, element) for r in part]))}
            for name, (dtype, column) in columns.items():
                dataset = file.create_dataset(name, (count,), dtype=dtype, chunks=True)
                for start in range(0, count, WRITE_SLICE):
                    dataset[start : start + WRITE_SLICE] = column(records[start : start + WRITE_SLICE])

    def open(self, directory: str, workload: Workload, advice: str | None = None) -> Store:
        return H5Store(directory, workload.kind)


PEER = H5py()
