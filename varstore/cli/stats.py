"""``varstore stats``: the distribution of record sizes, as figures, a text histogram and optionally a PNG."""

from __future__ import annotations

import argparse
import math
from fractions import Fraction
from typing import Any

import numpy as np

from .arguments import add_store_arguments, positive_int
from .errors import require_extra
from .output import format_count, length_unit, format_size, format_size_exactly, print_fields, print_json, print_table, writing_to_standard_output
from .stores import REMOTE_EPILOG, add_location_options, open_store

_PERCENTILES = (50, 90, 99, 99.9)
_BAR_WIDTH = 50
_POWERS_OF_TWO = 64


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "stats",
        help="record size statistics and histogram",
        description="Record count and payload sizes: total, min, mean, percentiles, max, and a histogram of record "
        "sizes (bins between powers of two unless --bins asks for equal widths); for ndarray stores each figure "
        "also in rows (tokens for integer records of shape (L,)). Reads every record offset, "
        "never a payload (at a URL: each shard's index, fetched whole into the node cache).",
        epilog=REMOTE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_arguments(parser)
    add_location_options(parser)
    parser.add_argument("--bins", type=positive_int, metavar="N", help="N bins of equal width instead of powers of two")
    parser.add_argument("--plot", metavar="FILE.png", help="also draw the histogram into an image (needs matplotlib)")
    parser.set_defaults(run=run)


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
    positions = [max(1, math.ceil(Fraction(str(percent)) * len(sizes) / 100)) - 1 for percent in _PERCENTILES]
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
    """The figures `stats` reports, JSON-ready."""
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
        "percentiles": {f"p{percent:g}": value for percent, value in zip(_PERCENTILES, values)},
        "histogram": [
            {"low": int(low), "high": int(high), "count": int(count)} for low, high, count in zip(edges, edges[1:], counts)
        ],
    }


def _bin_label(low: int, high: int) -> str:
    return f"{low:,}" if high == low + 1 else f"{low:,} - {high - 1:,}"


def _in_rows(size_text: str, rows: float | None, unit: str | None) -> str:
    """``22 bytes, 11 tokens``: a size, followed for ndarray stores by the same figure in rows."""
    if unit is None or rows is None:
        return size_text
    count = f"{rows:,.1f}" if isinstance(rows, float) else format_count(rows)
    return f"{size_text}, {count} {unit.removesuffix('s') if rows == 1 else unit}"


def _print_text(facts: dict[str, Any]) -> None:
    lengths = facts["lengths"] or {}
    unit, row_percentiles = lengths.get("unit"), lengths.get("percentiles", {})
    fields = [("records", format_count(facts["records"])),
              ("total", _in_rows(format_size_exactly(facts["total_bytes"]), lengths.get("total"), unit))]
    if facts["records"]:
        fields += [("min", _in_rows(format_size_exactly(facts["min"]), lengths.get("min"), unit)),
                   ("mean", _in_rows(f"{facts['mean']:,.1f} bytes", lengths.get("mean"), unit))]
        fields += [(name, _in_rows(format_size_exactly(value), row_percentiles.get(name), unit))
                   for name, value in facts["percentiles"].items()]
        fields += [("max", _in_rows(format_size_exactly(facts["max"]), lengths.get("max"), unit))]
    print_fields(fields)
    if not facts["histogram"]:
        return
    print("record sizes in bytes")
    most = max(row["count"] for row in facts["histogram"])
    rows = []
    for row in facts["histogram"]:
        bar = "#" * (-(-row["count"] * _BAR_WIDTH // most))
        rows.append([_bin_label(row["low"], row["high"]), format_count(row["count"]), bar])
    print_table(["size", "records", ""], rows, align="lrl", indent="  ")


def _plot(facts: dict[str, Any], title: str, path: str) -> None:
    matplotlib = require_extra("matplotlib", "plot", "stats --plot")
    matplotlib.use("Agg")
    pyplot = require_extra("matplotlib.pyplot", "plot", "stats --plot")
    rows = facts["histogram"]
    figure, axes = pyplot.subplots(figsize=(10, 4.5))
    axes.bar(range(len(rows)), [row["count"] for row in rows], color="tab:blue")
    axes.set_xticks(range(len(rows)), [_bin_label(row["low"], row["high"]) for row in rows], rotation=45, ha="right")
    axes.set_xlabel("record size (bytes)")
    axes.set_ylabel("records")
    axes.set_title(f"{title}: {format_count(facts['records'])} records, {format_size(facts['total_bytes'])}")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def run(args: argparse.Namespace) -> int:
    with open_store(args.path, args) as store:
        facts = _size_statistics(store.record_sizes(), args.bins)
        facts["lengths"] = _length_statistics(facts, length_unit(store.codec, store.dtype, store.shape))
    if args.plot:
        _plot(facts, args.path, args.plot)
        facts["plot"] = args.plot
    with writing_to_standard_output():
        if args.json:
            print_json(facts)
        else:
            _print_text(facts)
            if args.plot:
                print(f"histogram drawn in {args.plot}")
    return 0
