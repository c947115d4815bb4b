"""`statistics`: the distribution of record sizes of a shard or dataset, read from every record offset and never
from a payload (at a URL: each shard's index, fetched whole into the node cache). A compressed shard's sizes are
those its records decode to, from its index (§1.6), and each shard's stored ÷ raw ratio is given beside them."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..dataset.reader import ShardedReader
from ..errors import UsageError
from ..format import compression as zstd_format
from ..format.header import Header
from .describe import compression_ratio, length_unit
from .locations import open_store, remote_options

__all__ = ["PERCENTILES", "RecordStatistics", "statistics"]

PERCENTILES = (50, 90, 99, 99.9)
_POWERS_OF_TWO = 64


@dataclass(frozen=True)
class RecordStatistics:
    """Record sizes in bytes: `min`, `mean`, `max` and `percentiles` (``{"p50": ...}``) are None and empty for a
    store of no records. `histogram` holds bins ``{"low", "high", "count"}``, each counting the sizes in
    [low, high). `lengths` gives the same figures in rows (tokens of a token store) for ndarray stores, else None.
    `shards` lists each shard's ``{"name", "compression", "stored_bytes", "raw_bytes", "ratio"}``: its data file's
    bytes, those its records decode to (`total_bytes` counts these), and stored ÷ raw."""

    records: int
    total_bytes: int
    min: int | None
    mean: float | None
    max: int | None
    percentiles: dict[str, int]
    histogram: list[dict[str, int]]
    lengths: dict[str, Any] | None
    shards: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        """The figures as JSON-ready values, as ``varstore stats --json`` prints them."""
        return {"records": self.records, "total_bytes": self.total_bytes, "min": self.min, "mean": self.mean,
                "max": self.max, "percentiles": self.percentiles, "histogram": self.histogram, "lengths": self.lengths,
                "shards": self.shards}


def _histogram(sizes: np.ndarray, bins: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(counts, edges): bin k holds the sizes in [edges[k], edges[k + 1]), all integers.

    Without `bins`, the edges are 0, 1, 2, 4, 8, ... from the smallest size's bin to the largest's.
    """
    low, high = int(sizes.min()), int(sizes.max())
    if bins is None:
        edges = np.array([0] + [1 << power for power in range(_POWERS_OF_TWO - 1)], np.int64)
        positions = np.searchsorted(edges, sizes, side="right") - 1
        first, last = int(positions.min()), int(positions.max())
        counts = np.bincount(positions - first, minlength=last - first + 1)
        top = int(edges[last + 1]) if last + 1 < len(edges) else high + 1
        return counts, np.append(edges[first : last + 1], top)
    width = -(-(high - low + 1) // bins)
    edges = low + width * np.arange(bins + 1, dtype=np.int64)
    return np.bincount((sizes - low) // width, minlength=bins), edges


def _percentiles(sizes: np.ndarray) -> list[int]:
    """The p-th percentile is the smallest size that at least p% of records do not exceed, in exact arithmetic."""
    positions = [max(1, math.ceil(Fraction(str(percent)) * len(sizes) / 100)) - 1 for percent in PERCENTILES]
    return np.partition(sizes, positions)[positions].tolist()


def _length_statistics(facts: dict[str, Any], unit: tuple[str, int] | None) -> dict[str, Any] | None:
    """The byte figures of an ndarray store again in rows (tokens of a token store), JSON-ready; None for other codecs."""
    if unit is None:
        return None
    name, row_bytes = unit
    lengths: dict[str, Any] = {"unit": name, "total": facts["total_bytes"] // row_bytes}
    if facts["records"]:
        lengths.update({key: facts[key] // row_bytes for key in ("min", "max")})
        lengths["mean"] = facts["mean"] / row_bytes
        lengths["percentiles"] = {key: value // row_bytes for key, value in facts["percentiles"].items()}
    return lengths


def _size_statistics(sizes: np.ndarray, bins: int | None) -> dict[str, Any]:
    facts: dict[str, Any] = {"records": len(sizes), "total_bytes": int(sizes.sum())}
    if not len(sizes):
        return {**facts, "min": None, "mean": None, "max": None, "percentiles": {}, "histogram": []}
    values = _percentiles(sizes)
    counts, edges = _histogram(sizes, bins)
    return {
        **facts,
        "min": int(sizes.min()),
        "mean": float(sizes.mean()),
        "max": int(sizes.max()),
        "percentiles": {f"p{percent:g}": value for percent, value in zip(PERCENTILES, values)},
        "histogram": [
            {"low": int(low), "high": int(high), "count": int(count)} for low, high, count in zip(edges, edges[1:], counts)
        ],
    }


def statistics(path: str | os.PathLike[str], *, bins: int | None = None, storage_options: dict[str, Any] | None = None,
               cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | None = None) -> RecordStatistics:
    """The record sizes of the shard or dataset at `path` (a local path or a URL): total, min, mean, percentiles,
    max and a histogram (bins between powers of two, or `bins` bins of equal width)."""
    if bins is not None and (type(bins) is not int or bins < 1):
        raise UsageError(f"bins must be a positive integer, not {bins!r}")
    with open_store(os.fspath(path), **remote_options(storage_options, cache_dir, cache_limit)) as store:
        if isinstance(store, ShardedReader):
            named = [(entry.name, store.shard(position)) for position, entry in enumerate(store.manifest.shards)]
        else:
            named = [(store.path, store)]
        shard_sizes = [shard.record_sizes() for _, shard in named]
        facts = _size_statistics(np.concatenate(shard_sizes) if shard_sizes else np.zeros(0, np.int64), bins)
        facts["lengths"] = _length_statistics(facts, length_unit(store.codec, store.dtype, store.shape))
        facts["shards"] = [_shard_ratio(name, shard.header, sizes) for (name, shard), sizes in zip(named, shard_sizes)]
    return RecordStatistics(**facts)


def _shard_ratio(name: str, header: Header, sizes: np.ndarray) -> dict[str, Any]:
    raw = int(sizes.sum())
    return {"name": name, "compression": zstd_format.NAMES[header.compression], "stored_bytes": header.data_size,
            "raw_bytes": raw, "ratio": compression_ratio(header.data_size, raw)}
