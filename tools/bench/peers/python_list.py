"""A Python list in RAM, the reference for reads with no storage layer: pickled to disk, loaded whole on open."""

from __future__ import annotations

import os
import pickle
from typing import Any

from ..workloads import Workload
from .base import DatasetStore, Peer, Store

FILE_NAME = "records.pickle"


class PythonList(Peer):
    name, label = "list", "Python list in RAM"

    def write(self, workload: Workload, records: list[Any], directory: str) -> None:
        with open(os.path.join(directory, FILE_NAME), "wb") as stream:
            pickle.dump(records, stream, protocol=pickle.HIGHEST_PROTOCOL)

    def open(self, directory: str, workload: Workload, advice: str | None = None) -> Store:
        with open(os.path.join(directory, FILE_NAME), "rb") as stream:
            return DatasetStore(pickle.load(stream))


PEER = PythonList()
