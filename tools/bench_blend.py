"""Measure `BlendedDataset` against a Megatron-style blend index: construction time, peak memory, lookups per second.

    .venv/bin/python tools/bench_blend.py [--index-samples N] [--lookups N] [--batch N]

The blend: four sources (web, code, books, math) weighted 5:3:1:1 with 10**9, 10**8, 10**7 and 10**6 records
(stand-ins that return the record index, so only the blending is timed).

- `BlendedDataset` is built at ``num_samples = 10**12``.
- The Megatron-style index is what megatron-core builds for a blend: ``dataset_index`` (int16, which source)
  and ``dataset_sample_index`` (int64, the how-many-th use of that source) per sample, chosen by the greedy
  rule "the source furthest behind weight x samples" (a loop in C++ there; here one period of that rule,
  which repeats every 10 samples for weights 5:3:1:1, is tiled with numpy), plus one shuffled record index
  per source (a permutation array), as its per-dataset sample index is. It is built at `--index-samples`
  (10**7 by default: 10**12 would need ~10 TB) and its time and memory are scaled linearly to 10**12,
  marked "extrapolated".

Lookups: random sample numbers in [0, samples), one at a time (a DataLoader without `__getitems__`) and
in batches of `--batch` (`__getitems__`), best of three runs. Memory is tracemalloc's peak (numpy
allocations included); times are wall-clock on whatever else the machine is doing, so compare within a run.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from typing import Callable

import numpy as np

from varstore.torch import BlendedDataset

WEIGHTS = {"web": 5, "code": 3, "books": 1, "math": 1}
LENGTHS = {"web": 10**9, "code": 10**8, "books": 10**7, "math": 10**6}
BLEND_SAMPLES = 10**12


class RecordNumbers:
    """A source whose sample i is i: reading costs nothing, so the measurement is the blending alone."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index

    def __getitems__(self, indices: list[int]) -> list[int]:
        return indices


class MegatronStyleIndex:
    """Per-sample arrays (which source, which use of it) and a shuffled record array per source."""

    def __init__(self, samples: int, seed: int = 0) -> None:
        names = list(WEIGHTS)
        period = self._greedy_period([WEIGHTS[name] for name in names])
        self.dataset_index = np.resize(np.array(period, np.int16), samples)
        self.dataset_sample_index = np.empty(samples, np.int64)
        for source in range(len(names)):
            chosen = self.dataset_index == source
            self.dataset_sample_index[chosen] = np.arange(int(chosen.sum()), dtype=np.int64)
        rng = np.random.default_rng(seed)
        used = [int((self.dataset_index == source).sum()) for source in range(len(names))]
        # One shuffled epoch per source, only as long as the uses need (megatron builds whole epochs).
        self.shuffles = [rng.permutation(min(LENGTHS[name], max(count, 1))) for name, count in zip(names, used)]

    @staticmethod
    def _greedy_period(weights: list[int]) -> list[int]:
        """Megatron's rule for one period (sum of integer weights): each sample to the source furthest behind."""
        total = sum(weights)
        counts = [0] * len(weights)
        period = []
        for sample in range(total):
            errors = [weight * (sample + 1) / total - count for weight, count in zip(weights, counts)]
            source = errors.index(max(errors))
            counts[source] += 1
            period.append(source)
        return period

    def __getitem__(self, sample: int) -> tuple[int, int]:
        source = int(self.dataset_index[sample])
        shuffle = self.shuffles[source]
        return source, int(shuffle[int(self.dataset_sample_index[sample]) % len(shuffle)])

    def __getitems__(self, samples: np.ndarray) -> list[int]:
        sources = self.dataset_index[samples]
        uses = self.dataset_sample_index[samples]
        records = np.empty(len(samples), np.int64)
        for source, shuffle in enumerate(self.shuffles):
            chosen = sources == source
            records[chosen] = shuffle[uses[chosen] % len(shuffle)]
        return records.tolist()


def built(make: Callable[[], object]) -> tuple[object, float, int]:
    """(the object, seconds to build it, tracemalloc peak bytes while building)."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        thing = make()
        seconds = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return thing, seconds, peak


def lookups_per_second(read_one: Callable[[int], object], read_batch: Callable[[np.ndarray], object],
                       samples: int, lookups: int, batch: int) -> tuple[float, float]:
    rng = np.random.default_rng(1)
    singles = rng.integers(0, samples, lookups // 10).tolist()
    batches = rng.integers(0, samples, (max(1, lookups // batch), batch))
    best_one = best_batch = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for sample in singles:
            read_one(sample)
        best_one = min(best_one, time.perf_counter() - start)
        start = time.perf_counter()
        for row in batches:
            read_batch(row)
        best_batch = min(best_batch, time.perf_counter() - start)
    return len(singles) / best_one, batches.size / best_batch


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if count < 1024 or unit == "TB":
            return f"{count:,.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index-samples", type=int, default=10**7, help="samples of the Megatron-style index built")
    parser.add_argument("--lookups", type=int, default=200_000, help="batched lookups per run (a tenth one at a time)")
    parser.add_argument("--batch", type=int, default=4096)
    args = parser.parse_args()

    sources = {name: RecordNumbers(length) for name, length in LENGTHS.items()}
    blend, blend_seconds, blend_peak = built(lambda: BlendedDataset(sources, WEIGHTS, num_samples=BLEND_SAMPLES))
    index, index_seconds, index_peak = built(lambda: MegatronStyleIndex(args.index_samples))
    blend_rates = lookups_per_second(blend.__getitem__, lambda row: blend.__getitems__(row), BLEND_SAMPLES, args.lookups, args.batch)
    index_rates = lookups_per_second(index.__getitem__, index.__getitems__, args.index_samples, args.lookups, args.batch)
    scale = BLEND_SAMPLES / args.index_samples

    print(f"Blend of {len(WEIGHTS)} sources, weights {WEIGHTS}; batches of {args.batch}.\n")
    print("| | samples built | construction | peak memory | lookups/s one at a time | lookups/s batched |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| BlendedDataset | 10^12 | {blend_seconds * 1e3:.2f} ms | {human_bytes(blend_peak)} | "
          f"{blend_rates[0]:,.0f} | {blend_rates[1]:,.0f} |")
    print(f"| Megatron-style index | {args.index_samples:,} | {index_seconds:.2f} s | {human_bytes(index_peak)} | "
          f"{index_rates[0]:,.0f} | {index_rates[1]:,.0f} |")
    print(f"| Megatron-style index, extrapolated | 10^12 | {index_seconds * scale / 3600:,.1f} h | "
          f"{human_bytes(index_peak * scale)} | | |")


if __name__ == "__main__":
    main()
