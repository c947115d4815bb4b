"""MosaicML Streaming: MDS shards written by `MDSWriter`, read by ``StreamingDataset(local=...)``.

``streaming/__init__`` imports its image datasets, which import torchvision; the
only torchvision wheel on this machine is a CUDA build that does not load beside
CPU torch 2.13. MDS reading uses none of it, so the adapter gives that import an
empty stand-in module (after `transformers` has checked for the real one).
"""

from __future__ import annotations

import sys
import types
from typing import Any, Iterator

from ..workloads import Workload
from .base import DatasetStore, Peer, Store

# The batch size a training loop would pass; with batch_size=1 its iterator pre-reads only 8 samples ahead.
BATCH_SIZE = 256
_COLUMNS = {
    "array": {"tokens": "ndarray:uint16"},
    "bytes": {"payload": "bytes"},
    "sample": {"array": "ndarray:float32", "label": "int", "text": "str"},
}


def _import_streaming() -> Any:
    try:
        import torchvision  # noqa: F401
    except Exception:
        import transformers.feature_extraction_utils  # noqa: F401  (streaming's loader needs it)
        stand_in = {name: types.ModuleType(name) for name in
                    ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional")}
        stand_in["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})  # type: ignore[attr-defined]
        stand_in["torchvision.transforms.functional"].to_tensor = None  # type: ignore[attr-defined]
        sys.modules.update(stand_in)
    import streaming
    return streaming


streaming = _import_streaming()


def _column(kind: str) -> str | None:
    columns = _COLUMNS[kind]
    return next(iter(columns)) if len(columns) == 1 else None


class MDSStore(DatasetStore):
    def __init__(self, directory: str, kind: str) -> None:
        dataset = streaming.StreamingDataset(local=directory, batch_size=BATCH_SIZE, shuffle=False)
        self._column = column = _column(kind)
        super().__init__(dataset, None if column is None else lambda index: dataset[index][column])

    def scan(self) -> Iterator[Any]:
        column = self._column
        return iter(self.dataset) if column is None else (sample[column] for sample in self.dataset)


class MDS(Peer):
    name, label = "mds", "MosaicML Streaming (MDS)"

    def write(self, workload: Workload, records: list[Any], directory: str) -> None:
        column = _column(workload.kind)
        with streaming.MDSWriter(out=directory, columns=_COLUMNS[workload.kind]) as writer:
            for record in records:
                writer.write(record if column is None else {column: record})

    def open(self, directory: str, workload: Workload, advice: str | None = None) -> Store:
        return MDSStore(directory, workload.kind)


PEER = MDS()
