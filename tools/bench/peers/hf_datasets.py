"""Hugging Face `datasets`: Arrow files written by ``Dataset.from_generator`` + ``save_to_disk``, read by ``load_from_disk``.

Arrays come back through the ``numpy`` format (the default ``python`` format
would turn every token into a Python int); bytes records as ``bytes``.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Iterator

import numpy as np
import datasets

from ..workloads import Workload, cached_records
from .base import DatasetStore, Peer, Store

DATASET_DIR, CACHE_DIR = "dataset", "generator-cache"
_COLUMN = {"array": "tokens", "bytes": "payload"}


def _features(kind: str) -> datasets.Features:
    if kind == "array":
        return datasets.Features({"tokens": datasets.Sequence(datasets.Value("uint16"))})
    if kind == "bytes":
        return datasets.Features({"payload": datasets.Value("binary")})
    return datasets.Features({
        "array": datasets.Sequence(datasets.Value("float32")), "label": datasets.Value("int64"), "text": datasets.Value("string"),
    })


def _rows(workload: Workload) -> Iterator[dict[str, Any]]:
    column = _COLUMN.get(workload.kind)
    for record in cached_records(workload):
        yield record if column is None else {column: record}


class HFStore(DatasetStore):
    def __init__(self, directory: str, kind: str) -> None:
        loaded = datasets.load_from_disk(os.path.join(directory, DATASET_DIR))
        dataset = loaded if kind == "bytes" else loaded.with_format("numpy")
        column = _COLUMN.get(kind)
        super().__init__(dataset, None if column is None else lambda index: dataset[index][column])

    def get_batch(self, indices: np.ndarray) -> Any:
        """One query for the batch; the result is by column."""
        return self.dataset[indices.tolist()]


class HFDatasets(Peer):
    name, label = "hf-datasets", "HF datasets (Arrow)"
    native_batch = True

    def write(self, workload: Workload, records: list[Any], directory: str) -> None:
        cache = os.path.join(directory, CACHE_DIR)
        built = datasets.Dataset.from_generator(_rows, features=_features(workload.kind), cache_dir=cache,
                                                gen_kwargs={"workload": workload})
        built.save_to_disk(os.path.join(directory, DATASET_DIR))
        del built
        shutil.rmtree(cache)

    def open(self, directory: str, workload: Workload, advice: str | None = None) -> Store:
        return HFStore(directory, workload.kind)


datasets.disable_progress_bars()
PEER = HFDatasets()
