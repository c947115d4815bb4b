"""What ExactlyOnceSampler's block shuffle costs in randomness, and saves in reads, against the full shuffle.

    python3 tools/bench/shuffle_randomness.py [--records N] [--shard-records R] [--batch B]

For one epoch order of N records (1,000,000 by default) stored in shards of R records (1,000), per setting:

- the distance between consecutive samples' records, |record(i + 1) - record(i)|: 10th percentile, median, 90th;
- per batch of B (64) consecutive samples: distinct shards; contiguous runs of records (the requests if each
  run costs one); the requests and the records read per record used when runs less than `MERGE_GAP` records
  apart share a request (a 64 KiB gap, as varstore's ranged reads merge, over records of ~9 KB);
- label mix, for data stored sorted by label (10 labels, N / 10 records each: the worst case for any local
  shuffle): distinct labels per batch and the total variation distance of a batch's label mix from the
  epoch's (0 is a perfect mix; 0.9 is a batch of one label).

Batch figures are means over the whole batches of the epoch. Needs numpy and torch (varstore.torch).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from varstore.torch import ExactlyOnceSampler  # noqa: E402

LABELS = 10
MERGE_GAP = 7
# (block_size, shuffle_window, world_size): None for the full shuffle; rank 0's order is measured.
SETTINGS = [(None, None, 1), (8, 8, 1), (16, 16, 1), (64, 64, 1), (1000, 1000, 1), (1000, 64, 1), (16, 256, 1), (64, 512, 1),
            (256, 4096, 1), (None, None, 8), (16, 16, 8), (128, 128, 8)]


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--shard-records", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    return parser.parse_args()


def epoch_order(records: int, block_size: int | None, shuffle_window: int | None, world_size: int) -> np.ndarray:
    sampler = ExactlyOnceSampler(records, seed=0, block_size=block_size, shuffle_window=shuffle_window, rank=0,
                                 world_size=world_size)
    return np.fromiter(sampler, np.int64, len(sampler))


def figures(order: np.ndarray, records: int, shard_records: int, batch: int) -> dict[str, float]:
    steps = np.abs(np.diff(order))
    batches = np.sort(order[: len(order) // batch * batch].reshape(-1, batch), axis=1)
    gaps = np.diff(batches, axis=1)  # records from one sample to the next in the batch, in storage order
    shards = 1 + np.count_nonzero(np.diff(batches // shard_records, axis=1), axis=1)
    merged = gaps <= MERGE_GAP + 1
    labels = batches * LABELS // records
    counts = np.zeros((len(batches), LABELS))
    np.add.at(counts, (np.repeat(np.arange(len(batches)), batch), labels.ravel()), 1)
    epoch_mix = np.bincount(order * LABELS // records, minlength=LABELS) / len(order)
    return {
        "p10": np.percentile(steps, 10), "median": np.median(steps), "p90": np.percentile(steps, 90),
        "shards": shards.mean(), "runs": (1 + np.count_nonzero(gaps != 1, axis=1)).mean(),
        "requests": (1 + np.count_nonzero(~merged, axis=1)).mean(),
        "read": ((batch + np.where(merged, gaps - 1, 0).sum(axis=1)) / batch).mean(),
        "labels": np.count_nonzero(counts, axis=1).mean(),
        "label_tv": (0.5 * np.abs(counts / batch - epoch_mix).sum(axis=1)).mean(),
    }


def _setting(block_size: int | None, shuffle_window: int | None, world_size: int) -> str:
    name = "full shuffle" if block_size is None else f"block {block_size}, window {shuffle_window}"
    return name if world_size == 1 else f"{name}, rank 0 of {world_size}"


def main() -> int:
    arguments = _arguments()
    records, shard_records, batch = arguments.records, arguments.shard_records, arguments.batch
    print(f"{records:,} records, shards of {shard_records:,}, batches of {batch}; runs closer than "
          f"{MERGE_GAP + 1} records merge into one request; {LABELS} labels stored sorted.\n")
    print("| setting | \\|Δ record\\| p10 / median / p90 | shards / batch | runs / batch | requests / batch "
          "| records read / used | labels / batch | label TV |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for block_size, shuffle_window, world_size in SETTINGS:
        result = figures(epoch_order(records, block_size, shuffle_window, world_size), records, shard_records, batch)
        print(f"| {_setting(block_size, shuffle_window, world_size)} "
              f"| {result['p10']:,.0f} / {result['median']:,.0f} / {result['p90']:,.0f} | {result['shards']:.1f} "
              f"| {result['runs']:.1f} | {result['requests']:.1f} | {result['read']:.2f} | {result['labels']:.1f} "
              f"| {result['label_tv']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
