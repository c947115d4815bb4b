"""litdata: chunks written by ``optimize`` (one worker process, inputs of 1000 records each), read by `StreamingDataset`."""

from __future__ import annotations

import functools
from typing import Any, Iterator

import litdata

from ..workloads import Workload, cached_records
from .base import DatasetStore, Peer, Store

RECORDS_PER_INPUT = 1000
CHUNK_BYTES = "64MB"


def _records_of_input(workload: Workload, first: int) -> Iterator[Any]:
    yield from cached_records(workload)[first : first + RECORDS_PER_INPUT]


class Litdata(Peer):
    name, label = "litdata", "litdata"

    def write(self, workload: Workload, records: list[Any], directory: str) -> None:
        litdata.optimize(
            fn=functools.partial(_records_of_input, workload),
            inputs=list(range(0, len(records), RECORDS_PER_INPUT)),
            output_dir=directory,
            chunk_bytes=CHUNK_BYTES,
            num_workers=1,
            start_method="fork",  # its default, spawn, would make the worker regenerate the workload
            mode="overwrite",
            verbose=False,
        )

    def open(self, directory: str, workload: Workload, advice: str | None = None) -> Store:
        return DatasetStore(litdata.StreamingDataset(directory))


PEER = Litdata()
