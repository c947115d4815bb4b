"""A local 2-worker DataLoader epoch of `RecordDataset` where the batch crosses from the workers as the list of its
samples: what handing a batch to the main process costs, tensors against ``output="numpy"`` (bytes-like samples).

    python3 tools/bench/worker_handoff.py [--passes N] [--workers W]

Writes two datasets to a temporary directory ("blobs": 4,000 ``bytes`` records of 2-16 KB; "arrays": 20,000
``ndarray`` int32 records of 1-400 rows of 2), then runs epochs of each (shuffled, batch 64, fork workers, the
samples kept as a list) with ``output="torch"`` and ``output="numpy"`` in turn, `--passes` times, and prints the
median seconds per epoch and samples/s of each, with the load average before and after. Each epoch checks the
count and the bytes of the samples it read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler

import varstore
from varstore.torch import RecordDataset

BATCH = 64
SEED = 0


def keep_list(batch: list) -> list:
    return batch


def write(directory: Path) -> dict[str, int]:
    """The two datasets; their payload bytes, which every epoch must read back."""
    rng = np.random.default_rng(SEED)
    blobs = [rng.bytes(int(size)) for size in rng.integers(2000, 16000, 4000)]
    with varstore.ShardedWriter(directory / "blobs", "bytes", max_shard_bytes=8 << 20, overwrite=True) as writer:
        writer.extend(blobs)
    arrays = [rng.integers(0, 1 << 20, (int(rows), 2)).astype(np.int32) for rows in rng.integers(1, 400, 20000)]
    with varstore.ShardedWriter(directory / "arrays", "ndarray", dtype="int32", shape=(2,),
                                max_shard_bytes=8 << 20, overwrite=True) as writer:
        writer.extend(arrays)
    return {"blobs": sum(map(len, blobs)), "arrays": sum(array.size for array in arrays)}


def epoch(path: Path, output: str, workers: int, expected: int) -> float:
    """Seconds for one epoch of `path`; checks the samples' count and size (elements: the bytes of blobs)."""
    dataset = RecordDataset(path, output=output)
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(SEED))
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=workers, collate_fn=keep_list,
                        multiprocessing_context="fork" if workers else None)
    started = time.perf_counter()
    count = size = 0
    for batch in loader:
        count += len(batch)
        size += sum(sample.size if isinstance(sample, np.ndarray) else sample.numel() for sample in batch)
    seconds = time.perf_counter() - started
    if count != len(dataset) or size != expected:
        raise SystemExit(f"{path.name} {output}: read {count} samples of {size} elements, expected {len(dataset)} "
                         f"of {expected}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=5, help="epochs of each case, alternating (default 5)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    arguments = parser.parse_args()
    print(f"varstore from {Path(varstore.__file__).parent}; load before {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as directory:
        sizes = write(Path(directory))
        cases = [(name, output) for name in sizes for output in ("torch", "numpy")]
        seconds: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
        for _ in range(arguments.passes):
            for name, output in cases:
                seconds[name, output].append(epoch(Path(directory) / name, output, arguments.workers, sizes[name]))
        for name, output in cases:
            median = statistics.median(seconds[name, output])
            records = len(RecordDataset(Path(directory) / name))
            print(f"{name:6} output={output:5}: {median:.3f} s per epoch (median of {arguments.passes}), "
                  f"{records / median:,.0f} samples/s")
    print(f"load after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
